"""Job notices: tell a job's owner when it starts, is preempted, is requeued or ends, on an SNS topic whose
subscribers filter by owner (docs/adr/0020-operations-alarms-and-job-notices.md).

Every input has a writer. The event that triggers a notice comes from sagequeue's bus, which others may be
allowed to put events on: it is a hint naming a job, nothing more. The owner, the state and the reason a
notice carries are read from the table, which only the API (the owner, from the caller's IAM identity) and
sagequeue's functions write; an event that the table does not bear out sends nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sagequeue_core.domain import Job, JobState
from sagequeue_core.errors import JobNotFound
from sagequeue_core.events import EventType
from sagequeue_core.notify import notifier_for
from sagequeue_core.observability import logger
from sagequeue_core.runtime import Dependencies

#: What a notice's `event` attribute says, by the event that triggers it; JobFinished says how it ended.
NOTICE_OF_EVENT = {
    EventType.JOB_STARTED: "started",
    EventType.JOB_RESUMED: "started",
    EventType.JOB_PREEMPTED: "preempted",
    EventType.JOB_REQUEUED: "requeued",
}
#: How an ended job's notice names its end.
NOTICE_OF_END = {
    JobState.COMPLETED: "finished",
    JobState.FAILED: "failed",
    JobState.CANCELLED: "cancelled",
    JobState.IDLE_STOPPED: "idle_stopped",
}
#: Every notice kind, for subscription filters (the CLI's --events).
NOTICE_KINDS = ("started", "preempted", "requeued", "finished", "failed", "cancelled", "idle_stopped")
#: The events the notices function receives (template.yaml's rule on the bus lists the same).
NOTICE_EVENTS = frozenset({*NOTICE_OF_EVENT, EventType.JOB_FINISHED})


@dataclass(frozen=True)
class Notice:
    job: str
    owner: str
    kind: str
    state: str
    attempt: int
    reason: str | None
    team: str | None = None

    @property
    def subject(self) -> str:
        return f"sagequeue: job {self.job} {self.kind.replace('_', ' ')}"

    @property
    def text(self) -> str:
        lines = [
            f"Job {self.job} {self.kind.replace('_', ' ')} (attempt {self.attempt}); it is now {self.state}.",
        ]
        if self.reason:
            lines.append(f"Reason: {self.reason}")
        lines.append(f"Owner: {self.owner}")
        return "\n".join(lines)

    @property
    def attributes(self) -> dict[str, str]:
        """What subscription filter policies match on: owner above all."""
        out = {"owner": self.owner, "event": self.kind, "job": self.job, "state": self.state}
        if self.team:
            out["team"] = self.team
        return out


def notice_for(job: Job, event_type: EventType) -> Notice | None:
    """The notice an event about `job` warrants, judged from the job as the table holds it (None: the
    table does not bear the event out, e.g. a JobFinished about a job still running)."""
    if event_type is EventType.JOB_FINISHED:
        kind = NOTICE_OF_END.get(job.state)
        if kind is None:
            return None
    else:
        kind = NOTICE_OF_EVENT.get(event_type)
        if kind is None or job.attempt < 1:
            return None
        if event_type is EventType.JOB_PREEMPTED and job.preemptions < 1:
            return None
    return Notice(
        job=job.name,
        owner=job.owner,
        kind=kind,
        state=job.state.value,
        attempt=job.attempt,
        reason=job.reason,
        team=job.team,
    )


def send_notice(deps: Dependencies, event: Mapping[str, Any]) -> Notice | None:
    """Publish the notice of one event of sagequeue's bus to the job notices topic."""
    if event.get("source") != "sagequeue":
        return None
    try:
        event_type = EventType(str(event.get("detail-type")))
    except ValueError:
        return None
    detail = event.get("detail")
    name = detail.get("name") if isinstance(detail, Mapping) else None
    if event_type not in NOTICE_EVENTS or not isinstance(name, str) or not name:
        return None
    try:
        job = deps.store.get_job(name)
    except JobNotFound:
        logger.warning("a notice event names no job", extra={"job": name, "event": event_type.value})
        return None
    notice = notice_for(job, event_type)
    if notice is None:
        return None
    notifier_for(deps.client("sns"), deps.settings.job_notices_topic_arn).notify(
        notice.subject, notice.text, notice.attributes
    )
    return notice
