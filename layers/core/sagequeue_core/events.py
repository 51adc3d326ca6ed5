"""Events in and out: SageMaker's state changes parsed defensively, and sagequeue's own events published.

SageMaker's "Training Job State Change" detail mirrors DescribeTrainingJob, but its shape varies by source:
real events carry Tags as a `{key: value}` map and times as epoch milliseconds; the documentation's example
uses time strings; the schema registry models Tags as a `[{Key, Value}]` list. All of them parse here, and
a DescribeTrainingJob answer (the reconcile timer's view) parses the same way.

sagequeue publishes on its own bus, source `sagequeue`:

| detail-type     | when                                                      | triggers the scheduler |
|-----------------|-----------------------------------------------------------|------------------------|
| JobQueued       | a job was submitted                                       | yes                    |
| JobChanged      | a job was cancelled, held, released or re-prioritised, or | yes                    |
|                 | a pool's capacity changed                                 |                        |
| JobStarted      | an attempt was created (first attempt; `on_loan_for` when | no                     |
|                 | it runs on another job's reserved capacity)               |                        |
| JobResumed      | a later attempt was created (after preemption or a retry) | no                     |
| JobPreempted    | the scheduler stopped an attempt for a more important job | no                     |
|                 | (or its lender took back a loan: `taken_back` true)       |                        |
| JobFinished     | a job reached a final state                               | no                     |
| WarmPoolReused  | an attempt started on another attempt's warm pool         | no                     |
| PolicyViolation | governance stopped a job that breaks the tag/policy rules | no                     |
| IdleStopped     | governance stopped a job its idle alarm caught            | no                     |

Only JobQueued and JobChanged trigger the scheduler (template.yaml's QueueChanged rule); the others are
for users' rules and notifications, and would only make the scheduler run twice for its own actions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from botocore.exceptions import ClientError

from sagequeue_core.defaults import SAGEMAKER_EVENT_SOURCE, SAGEQUEUE_EVENT_SOURCE, TRAINING_JOB_STATE_CHANGE
from sagequeue_core.domain import (
    CapacityWait,
    CapacityWaitKind,
    DomainError,
    parse_time,
    pool_demand_of,
    tags_to_dict,
)
from sagequeue_core.errors import SageQueueError


class EventType(StrEnum):
    JOB_QUEUED = "JobQueued"
    JOB_CHANGED = "JobChanged"
    JOB_STARTED = "JobStarted"
    JOB_RESUMED = "JobResumed"
    JOB_PREEMPTED = "JobPreempted"
    JOB_FINISHED = "JobFinished"
    JOB_REQUEUED = "JobRequeued"  # an attempt ended and the job waits again (after a preemption or a retry)
    WARM_POOL_REUSED = "WarmPoolReused"
    JOB_RESERVED = "JobReserved"  # a waiting job was promised capacity, or its promise ended
    QUOTA_BORROWED = "QuotaBorrowed"  # a job started on capacity its team borrows beyond its quota
    QUOTA_RECLAIMED = "QuotaReclaimed"  # a team under its quota preempted another team's borrowing job
    POLICY_VIOLATION = "PolicyViolation"
    IDLE_STOPPED = "IdleStopped"
    #: a live attempt the table had lost, entered again with the lowest standing: for an admin to review
    JOB_ENTERED_AGAIN = "JobEnteredAgain"


#: The detail types of sagequeue's own events that make the scheduler run a pass.
SCHEDULER_TRIGGERS = frozenset({EventType.JOB_QUEUED, EventType.JOB_CHANGED})


class MalformedEvent(SageQueueError):
    """An event lacks what sagequeue needs from it (a training job name or status)."""


@dataclass(frozen=True)
class TrainingJobChange:
    """What a SageMaker state change (or a DescribeTrainingJob answer) says about one training job."""

    training_job_name: str
    status: str  # InProgress | Completed | Failed | Stopping | Stopped
    secondary_status: str = ""
    failure_reason: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    demand: Mapping[str, int] = field(default_factory=dict)
    keep_alive_seconds: int = 0
    warm_pool_status: str | None = None  # Available | InUse | Reused | Terminated
    creation_time: datetime | None = None
    training_start_time: datetime | None = None
    training_end_time: datetime | None = None
    last_modified_time: datetime | None = None
    #: when the job entered the Training phase (its SecondaryStatusTransitions), if it has
    training_phase_started_at: datetime | None = None
    #: seconds the job spent in the Training phase: the sum over its SecondaryStatusTransitions (a spot job
    #: may train, be interrupted and train again), or TrainingStartTime to TrainingEndTime when SageMaker
    #: gives no transitions; None while it is not known (still training, or no times given)
    seconds_trained: float | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)  # the whole detail, for the resource key
    #: accepted but not launched for want of capacity: EC2's (Starting, retrying) or its plan's (Pending)
    capacity_wait: CapacityWait | None = None

    @property
    def ended(self) -> bool:
        return self.status in ("Completed", "Failed", "Stopped")


def is_training_job_event(event: Mapping[str, Any]) -> bool:
    return (
        event.get("source") == SAGEMAKER_EVENT_SOURCE
        and event.get("detail-type") == TRAINING_JOB_STATE_CHANGE
    )


def parse_training_job_event(event: Mapping[str, Any]) -> TrainingJobChange:
    """The change an EventBridge event announces; MalformedEvent when it names no job or status."""
    detail = event.get("detail")
    if not isinstance(detail, Mapping):
        raise MalformedEvent("SageMaker event without a detail object")
    return parse_description(detail)


def parse_description(detail: Mapping[str, Any]) -> TrainingJobChange:
    """A DescribeTrainingJob answer or an event detail, whatever the shape of its tags and times."""
    name = detail.get("TrainingJobName")
    status = detail.get("TrainingJobStatus")
    if not isinstance(name, str) or not name:
        raise MalformedEvent("SageMaker event detail has no TrainingJobName")
    if not isinstance(status, str) or not status:
        raise MalformedEvent(f"SageMaker event for {name} has no TrainingJobStatus")
    try:
        tags = tags_to_dict(detail.get("Tags"))
    except DomainError:
        tags = {}
    try:
        demand = pool_demand_of(detail)
    except DomainError:
        demand = {}
    config = detail.get("ResourceConfig")
    keep_alive = config.get("KeepAlivePeriodInSeconds") if isinstance(config, Mapping) else None
    warm = detail.get("WarmPoolStatus")
    warm_status = warm.get("Status") if isinstance(warm, Mapping) else None
    reason = detail.get("FailureReason")
    return TrainingJobChange(
        training_job_name=name,
        status=status,
        secondary_status=str(detail.get("SecondaryStatus") or ""),
        failure_reason=str(reason) if reason else None,
        tags=tags,
        demand=demand,
        keep_alive_seconds=int(keep_alive) if isinstance(keep_alive, int | float) else 0,
        warm_pool_status=str(warm_status) if warm_status else None,
        creation_time=parse_time(detail.get("CreationTime")),
        training_start_time=parse_time(detail.get("TrainingStartTime")),
        training_end_time=parse_time(detail.get("TrainingEndTime")),
        last_modified_time=parse_time(detail.get("LastModifiedTime")),
        training_phase_started_at=_phase_start(detail.get("SecondaryStatusTransitions"), "Training"),
        seconds_trained=_seconds_trained(detail),
        detail=detail,
        capacity_wait=_capacity_wait(status, detail),
    )


#: How SageMaker says, in Starting, that EC2 has no instances for the job yet. It is only a StatusMessage
#: (SageMaker gives no code for it), so it is matched by its stable opening words.
EC2_CAPACITY_MESSAGE = "Insufficient capacity error from EC2"


def _capacity_wait(status: str, detail: Mapping[str, Any]) -> CapacityWait | None:
    """What an InProgress job that has not launched waits for, from its last secondary status."""
    if status != "InProgress":
        return None
    transitions = detail.get("SecondaryStatusTransitions")
    last = transitions[-1] if isinstance(transitions, list) and transitions else None
    if not isinstance(last, Mapping) or last.get("Status") != detail.get("SecondaryStatus"):
        return None
    since = parse_time(last.get("StartTime"))
    if since is None:
        return None
    if last.get("Status") == "Pending":
        return CapacityWait(CapacityWaitKind.TRAINING_PLAN, since)
    message = str(last.get("StatusMessage") or "")
    if last.get("Status") == "Starting" and message.startswith(EC2_CAPACITY_MESSAGE):
        return CapacityWait(CapacityWaitKind.EC2, since)
    return None


def _phase_start(transitions: Any, phase: str) -> datetime | None:
    if not isinstance(transitions, list):
        return None
    for transition in transitions:
        if isinstance(transition, Mapping) and transition.get("Status") == phase:
            return parse_time(transition.get("StartTime"))
    return None


def _seconds_trained(detail: Mapping[str, Any]) -> float | None:
    """Time in the Training phase, once the job has ended (until then the total is not final)."""
    if detail.get("TrainingJobStatus") not in ("Completed", "Failed", "Stopped"):
        return None
    ended_at = parse_time(detail.get("TrainingEndTime"))
    transitions = detail.get("SecondaryStatusTransitions")
    if isinstance(transitions, list) and transitions:
        total = 0.0
        for transition in transitions:
            if not isinstance(transition, Mapping) or transition.get("Status") != "Training":
                continue
            start = parse_time(transition.get("StartTime"))
            end = parse_time(transition.get("EndTime")) or ended_at  # an open phase ends with the job
            if start is not None and end is not None:
                total += max((end - start).total_seconds(), 0.0)
        return total
    started_at = parse_time(detail.get("TrainingStartTime"))
    if started_at is None or ended_at is None:
        return None
    return max((ended_at - started_at).total_seconds(), 0.0)


# --- publishing -----------------------------------------------------------------------------------------------


class Publisher(Protocol):
    def publish(self, event_type: EventType, detail: Mapping[str, Any]) -> None: ...


class PublishError(SageQueueError):
    """EventBridge refused an event."""


class EventBridgePublisher:
    """Puts sagequeue's events on its bus with one boto3 EventBridge client (created once, injected)."""

    def __init__(self, client: Any, event_bus_name: str, clock: Any = None) -> None:
        self.client = client
        self.event_bus_name = event_bus_name
        self._clock = clock

    def publish(self, event_type: EventType, detail: Mapping[str, Any]) -> None:
        entry: dict[str, Any] = {
            "Source": SAGEQUEUE_EVENT_SOURCE,
            "DetailType": event_type.value,
            "Detail": json.dumps(dict(detail), default=str),
            "EventBusName": self.event_bus_name,
        }
        if self._clock is not None:
            entry["Time"] = self._clock()
        try:
            response = self.client.put_events(Entries=[entry])
        except ClientError as exc:
            raise PublishError(f"could not publish {event_type.value}: {exc}") from exc
        if response.get("FailedEntryCount"):
            failed = response.get("Entries", [{}])[0]
            raise PublishError(
                f"EventBridge refused {event_type.value}: {failed.get('ErrorCode')} {failed.get('ErrorMessage')}"
            )


def announce(publisher: Publisher, event_type: EventType, detail: Mapping[str, Any]) -> bool:
    """Publish without failing the caller: the change is already stored and the event only tells others
    about it; a lost JobQueued or JobChanged trigger is caught up by the scheduler's one-minute timer."""
    try:
        publisher.publish(event_type, detail)
    except PublishError as exc:
        from sagequeue_core.observability import logger

        logger.warning("event not published", extra={"event": event_type.value, "error": str(exc)})
        return False
    return True


class RecordingPublisher:
    """Keeps events in memory: for the embedded stack's inspection and for unit tests."""

    def __init__(self) -> None:
        self.events: list[tuple[EventType, dict[str, Any]]] = []

    def publish(self, event_type: EventType, detail: Mapping[str, Any]) -> None:
        self.events.append((event_type, dict(detail)))

    def of_type(self, event_type: EventType) -> list[dict[str, Any]]:
        return [detail for kind, detail in self.events if kind is event_type]
