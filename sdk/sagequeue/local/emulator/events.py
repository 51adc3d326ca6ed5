"""SageMaker's "Training Job State Change" events: their shape, and delivery to an EventBridge bus.

The detail mirrors DescribeTrainingJob at the moment of the change, with Tags as a `{key: value}` map and
every time as epoch milliseconds, which is how SageMaker's real events arrive (docs/contracts.md).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sagequeue_core.defaults import SAGEMAKER_EVENT_SOURCE, TRAINING_JOB_STATE_CHANGE

#: PutEvents takes at most this many entries per call.
PUT_EVENTS_BATCH = 10


class EventDeliveryError(RuntimeError):
    """EventBridge refused some of the emulator's events."""


def epoch_millis(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def _millis_everywhere(value: Any) -> Any:
    if isinstance(value, datetime):
        return epoch_millis(value)
    if isinstance(value, Mapping):
        return {k: _millis_everywhere(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_millis_everywhere(v) for v in value]
    return value


#: Members SageMaker's events carry as JSON null while they have no value (AWS's own sample events do),
#: where DescribeTrainingJob leaves them out.
NULL_WHEN_ABSENT = (
    "FailureReason",
    "TrainingStartTime",
    "TrainingEndTime",
    "VpcConfig",
    "CheckpointConfig",
    "WarmPoolStatus",
    "DebugHookConfig",
    "TensorBoardOutputConfig",
)


def state_change_event(
    description: Mapping[str, Any],
    tags: Mapping[str, str],
    at: datetime,
    *,
    region: str,
    account_id: str,
    event_id: str | None = None,
) -> dict[str, Any]:
    """The EventBridge event for a training job that looks like `description` at `at`."""
    detail = _millis_everywhere(description)
    for member in NULL_WHEN_ABSENT:
        detail.setdefault(member, None)
    detail["Tags"] = dict(tags)
    return {
        "version": "0",
        "id": event_id or str(uuid.uuid4()),
        "detail-type": TRAINING_JOB_STATE_CHANGE,
        "source": SAGEMAKER_EVENT_SOURCE,
        "account": account_id,
        "time": at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [description["TrainingJobArn"]],
        "detail": detail,
    }


class EventBridgeForwarder:
    """Puts state-change events on a bus (moto's, in the embedded stack) with PutEvents."""

    def __init__(self, client: Any, event_bus_name: str = "default") -> None:
        self._client = client
        self._bus = event_bus_name

    def put(self, events: Sequence[Mapping[str, Any]]) -> None:
        for start in range(0, len(events), PUT_EVENTS_BATCH):
            batch = events[start : start + PUT_EVENTS_BATCH]
            entries = [
                {
                    "Time": datetime.strptime(event["time"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC),
                    "Source": event["source"],
                    "Resources": list(event["resources"]),
                    "DetailType": event["detail-type"],
                    "Detail": json.dumps(event["detail"]),
                    "EventBusName": self._bus,
                }
                for event in batch
            ]
            answer = self._client.put_events(Entries=entries)
            if answer.get("FailedEntryCount"):
                failures = [e for e in answer.get("Entries", []) if e.get("ErrorCode")]
                raise EventDeliveryError(
                    f"EventBridge bus {self._bus!r} refused {answer['FailedEntryCount']} event(s): "
                    + "; ".join(f"{f.get('ErrorCode')}: {f.get('ErrorMessage')}" for f in failures)
                )
