"""Use cases the handlers call: submit, jobs (read, cancel, change; pools), schedule (events, reconcile,
one pass). Each takes the process's `Dependencies` and returns domain objects or raises named errors."""
