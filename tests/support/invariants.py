"""The queue's promises, checked on SageMaker's side (the emulator's own state), not on the queue's.

An `InvariantMonitor` hooks the scheduler's SageMaker client and checks after every operation it makes,
and whenever a test calls `check()` (after the emulator's clock moved):

1. the instances SageMaker holds per pool (live jobs plus Available warm pools) never exceed its capacity;
2. no queue job has more than one live SageMaker job;
3. no SageMaker job of ours stays alive for longer than one reconcile period while the queue does not count
   it as its job's live attempt;
4. every start the queue calls warm (a job's `reused_warm_pool_of`) really reused that pool on SageMaker
   (checked by `check_settled()`, between invocations: a start names its pool before SageMaker answers).

Violations are collected as sentences, each reported once; tests assert the list is empty.

What the monitor reads from the table (pools' capacity, the job of each live training job) is read again
only once the table was written through the store's client or the clock moved: between two writes at one
moment the answers cannot differ, and a check after every SageMaker call would otherwise cost more table
reads than the queue itself makes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sagequeue_core.defaults import JOB_TAG
from sagequeue_core.domain import pool_demand_of

#: Statuses of a SageMaker training job that still holds its instances.
_LIVE_STATUSES = frozenset({"InProgress", "Stopping"})
#: DynamoDB operations that change nothing (every other one invalidates what the monitor read).
_READS = ("Get", "Query", "Scan", "Describe", "List", "BatchGet")


@dataclass
class InvariantMonitor:
    emulator: Any  # sagequeue.local.SageMakerEmulator
    store: Any  # sagequeue_core.store.Repository
    #: how long an attempt may run untracked: one reconcile period plus one step of the test's clock
    grace_seconds: float = 120.0
    violations: list[str] = field(default_factory=list)
    checks: int = 0
    _untracked_since: dict[str, datetime] = field(default_factory=dict)
    _reported: set[str] = field(default_factory=set)
    _client: Any = None
    #: bumped by every write through the store's client; the cached reads below belong to one generation
    _writes: int = 0
    _cache_key: tuple[int, datetime] | None = None
    _capacity: dict[str, int] = field(default_factory=dict)
    _jobs: dict[str, Any] = field(default_factory=dict)

    # --- wiring ------------------------------------------------------------------------------------------

    def attach(self, sagemaker_client: Any) -> InvariantMonitor:
        """Check after every call the queue makes on `sagemaker_client`."""
        self._client = sagemaker_client
        sagemaker_client.meta.events.register("after-call.sagemaker.*", self._after_call)
        self.store.client.meta.events.register("before-call.dynamodb.*", self._table_call)
        return self

    def detach(self) -> None:
        if self._client is not None:
            self._client.meta.events.unregister("after-call.sagemaker.*", self._after_call)
            self.store.client.meta.events.unregister("before-call.dynamodb.*", self._table_call)
            self._client = None

    def _after_call(self, **_: Any) -> None:
        self.check()

    def _table_call(self, event_name: str = "", **_: Any) -> None:
        if not event_name.rsplit(".", 1)[-1].startswith(_READS):
            self._writes += 1

    def _fresh(self, now: datetime) -> None:
        """Forget what was read from the table if it was written since, or the clock moved."""
        key = (self._writes, now)
        if key != self._cache_key:
            self._cache_key = key
            self._capacity = {
                status.pool.instance_type: status.pool.capacity for status in self.store.pools()
            }
            self._jobs = {}

    def _job(self, name: str) -> Any:
        if name not in self._jobs:
            try:
                self._jobs[name] = self.store.find_job(name)
            except (ValueError, KeyError, TypeError):
                self._jobs[name] = None  # an item the queue cannot read counts nothing
        return self._jobs[name]

    # --- checks ------------------------------------------------------------------------------------------

    def _report(self, key: str, sentence: str) -> None:
        if key not in self._reported:
            self._reported.add(key)
            self.violations.append(sentence)

    def _sagemaker_jobs(self) -> list[Any]:
        backend = self.emulator.backend
        with backend.lock:
            return [backend._jobs[name] for name in list(backend._jobs)]

    def _held_per_pool(self) -> dict[str, int]:
        """Instances SageMaker holds (live jobs and Available warm pools) per pool: a job on a training plan
        holds its plan's instances, counted in the plan's pool, not in its instance type's."""
        held: dict[str, int] = {}
        for training_job in self._sagemaker_jobs():
            if training_job.held_instances():
                for pool, count in pool_demand_of(training_job.request).items():
                    held[pool] = held.get(pool, 0) + count
        return held

    def check(self) -> None:
        """Invariants 1-3, at the emulator's current time."""
        self.checks += 1
        now = self.emulator.now()
        self._fresh(now)
        capacity = self._capacity
        held = self._held_per_pool()
        for instance_type, limit in capacity.items():
            if held.get(instance_type, 0) > limit:
                self._report(
                    f"capacity:{instance_type}:{now.isoformat()}",
                    f"{now:%H:%M:%S} SageMaker holds {held[instance_type]} {instance_type} on a pool of {limit}",
                )
        live_by_job: dict[str, list[str]] = {}
        for training_job in self._sagemaker_jobs():
            if training_job.status not in _LIVE_STATUSES:
                self._untracked_since.pop(training_job.name, None)
                continue
            owner = training_job.tags.get(JOB_TAG)
            if owner is None:
                continue
            if training_job.status == "InProgress":
                live_by_job.setdefault(owner, []).append(training_job.name)
            job = self._job(owner)
            counted = job is not None and job.training_job_name == training_job.name and job.state.is_live
            if counted:
                self._untracked_since.pop(training_job.name, None)
                continue
            since = self._untracked_since.setdefault(training_job.name, now)
            if (now - since).total_seconds() > self.grace_seconds:
                state = job.state.value if job is not None else "missing"
                self._report(
                    f"untracked:{training_job.name}",
                    f"{now:%H:%M:%S} {training_job.name} has run {int((now - since).total_seconds())} s while "
                    f"the queue does not count it (job {owner} is {state})",
                )
        for owner, names in live_by_job.items():
            if len(names) > 1:
                self._report(
                    f"twice:{owner}:{','.join(sorted(names))}",
                    f"{now:%H:%M:%S} job {owner} has {len(names)} live attempts: {sorted(names)}",
                )

    def check_settled(self) -> None:
        """Invariant 4 (and 1-3): between invocations, every warm start the queue records is real."""
        self.check()
        by_name = {training_job.name: training_job for training_job in self._sagemaker_jobs()}
        for job in self.store.live_jobs():
            if not job.reused_warm_pool_of or not job.training_job_name:
                continue
            training_job = by_name.get(job.training_job_name)
            if training_job is None:
                continue
            if training_job.reused_from != job.reused_warm_pool_of:
                self._report(
                    f"warm:{job.training_job_name}",
                    f"{job.training_job_name} was started on the warm pool of {job.reused_warm_pool_of} "
                    f"but SageMaker {'reused ' + training_job.reused_from if training_job.reused_from else 'cold-started it'}",
                )


def monitored(worlds: Iterator[Any]) -> Iterator[tuple[Any, InvariantMonitor]]:
    """A server-test world (from `make_world`) with a monitor on the scheduler's SageMaker client."""
    for world in worlds:
        monitor = InvariantMonitor(world.emulator, world.deps.store).attach(world.deps.sagemaker.client)
        try:
            yield world, monitor
        finally:
            monitor.detach()


def advance(
    world: Any,
    monitor: InvariantMonitor,
    seconds: float | None = None,
    *,
    until: Callable[[], bool] | None = None,
    step: float = 30,
    limit: float = 6 * 3600,
) -> None:
    """Let virtual time pass in steps (events delivered, the timer ticking), checking the invariants after
    each step: `seconds` of it, or until `until()` holds."""
    elapsed = 0.0
    while True:
        if until is not None and until():
            return
        if seconds is not None and elapsed >= seconds:
            return
        assert elapsed < limit, f"not done after {limit} simulated seconds"
        world.run(step, step)
        elapsed += step
        monitor.check_settled()
