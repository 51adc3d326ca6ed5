"""Parsing SageMaker's state changes in every shape they come in (tests/events/*.json)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sagequeue_core.domain import ResourceKey
from sagequeue_core.events import (
    EventType,
    MalformedEvent,
    RecordingPublisher,
    is_training_job_event,
    parse_description,
    parse_time,
    parse_training_job_event,
)

EVENTS = Path(__file__).resolve().parents[2] / "events"


def load(name: str) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / name).read_text())
    return event


def test_a_real_event_has_tags_as_a_map_and_times_in_milliseconds() -> None:
    event = load("sagemaker-training-job-completed.json")
    assert is_training_job_event(event)

    change = parse_training_job_event(event)

    assert change.training_job_name == "llama-ft-0412-2"
    assert (change.status, change.secondary_status) == ("Completed", "Completed")
    assert change.tags["sagequeue:job"] == "llama-ft-0412"
    assert change.creation_time == datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
    assert change.training_end_time == datetime(2026, 3, 2, 9, 14, 10, tzinfo=UTC)
    assert change.demand == {"ml.trn1.32xlarge": 1}
    assert (change.keep_alive_seconds, change.warm_pool_status) == (600, "Available")
    assert change.ended
    assert ResourceKey.from_request(change.detail) == ResourceKey(
        role_arn="arn:aws:iam::123456789012:role/SageMakerTraining",
        instance_type="ml.trn1.32xlarge",
        instance_count=1,
        volume_size_gb=200,
    )


def test_the_documentation_shape_has_tags_as_a_list_and_times_as_strings() -> None:
    change = parse_training_job_event(load("sagemaker-training-job-stopped-documentation-shape.json"))
    assert change.tags == {"sagequeue:job": "overrun", "team": "research"}
    assert change.secondary_status == "MaxRuntimeExceeded"
    assert change.training_end_time == datetime(2026, 3, 2, 10, 58, 0, 123000, tzinfo=UTC)


def test_a_sparse_event_parses_with_defaults() -> None:
    change = parse_training_job_event(load("sagemaker-training-job-in-progress-sparse.json"))
    assert change.tags == {}
    assert change.failure_reason is None
    assert change.warm_pool_status is None
    assert change.demand == {"ml.trn1.32xlarge": 2}
    assert not change.ended


def test_a_failure_keeps_its_reason() -> None:
    change = parse_training_job_event(load("sagemaker-training-job-failed-capacity.json"))
    assert change.failure_reason is not None
    assert change.failure_reason.startswith("CapacityError:")


@pytest.mark.parametrize(
    "detail",
    [
        {},
        {"TrainingJobName": "x"},
        {"TrainingJobStatus": "Completed"},
        {"TrainingJobName": 3, "TrainingJobStatus": "x"},
    ],
)
def test_an_event_without_a_name_or_status_is_malformed(detail: dict[str, Any]) -> None:
    with pytest.raises(MalformedEvent):
        parse_description(detail)


def test_unreadable_tags_and_resources_do_not_stop_parsing() -> None:
    change = parse_description(
        {"TrainingJobName": "x", "TrainingJobStatus": "InProgress", "Tags": "oops", "ResourceConfig": "?"}
    )
    assert (change.tags, change.demand) == ({}, {})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1772442000000, datetime(2026, 3, 2, 9, 0, tzinfo=UTC)),
        (1772442000, datetime(2026, 3, 2, 9, 0, tzinfo=UTC)),
        ("1772442000000", datetime(2026, 3, 2, 9, 0, tzinfo=UTC)),
        ("2026-03-02T09:00:00Z", datetime(2026, 3, 2, 9, 0, tzinfo=UTC)),
        ("2026-03-02T10:00:00+01:00", datetime(2026, 3, 2, 9, 0, tzinfo=UTC)),
        ("2026-03-02T09:00:00", datetime(2026, 3, 2, 9, 0, tzinfo=UTC)),
        ("not a time", None),
        (None, None),
        (True, None),
    ],
)
def test_times_in_every_shape(value: Any, expected: datetime | None) -> None:
    assert parse_time(value) == expected


def test_only_sagemakers_training_job_events_are_recognised() -> None:
    assert not is_training_job_event(load("scheduled-reconcile.json"))
    assert not is_training_job_event(load("sagequeue-job-queued.json"))


def test_the_recording_publisher_keeps_events_by_type() -> None:
    publisher = RecordingPublisher()
    publisher.publish(EventType.JOB_QUEUED, {"name": "a"})
    publisher.publish(EventType.JOB_STARTED, {"name": "a", "attempt": 1})
    assert publisher.of_type(EventType.JOB_STARTED) == [{"name": "a", "attempt": 1}]


T0 = 1772442000000  # epoch milliseconds, as real events carry times


def _detail(status: str, transitions: list[dict[str, Any]], **times: Any) -> dict[str, Any]:
    return {
        "TrainingJobName": "j",
        "TrainingJobStatus": status,
        "SecondaryStatusTransitions": transitions,
        **times,
    }


def test_seconds_trained_is_the_time_in_the_training_phase() -> None:
    # the real event: Training from 09:03:30 to 09:13:50, between Downloading and Uploading
    change = parse_training_job_event(load("sagemaker-training-job-completed.json"))
    assert change.seconds_trained == 620.0


def test_seconds_trained_sums_every_training_phase_and_closes_an_open_one_at_the_end() -> None:
    # GIVEN a spot job that trained, was interrupted, trained again and was stopped while training
    transitions = [
        {"Status": "Starting", "StartTime": T0, "EndTime": T0 + 100_000},
        {"Status": "Training", "StartTime": T0 + 100_000, "EndTime": T0 + 400_000},
        {"Status": "Interrupted", "StartTime": T0 + 400_000, "EndTime": T0 + 500_000},
        {"Status": "Training", "StartTime": T0 + 500_000},
    ]
    stopped = parse_description(_detail("Stopped", transitions, TrainingEndTime=T0 + 560_000))
    # THEN both phases count, the open one until TrainingEndTime: 300 s + 60 s
    assert stopped.seconds_trained == 360.0
    # while it is still in progress the open phase has no end: the total is not known yet
    assert parse_description(_detail("InProgress", transitions)).seconds_trained is None


def test_seconds_trained_without_transitions_uses_training_start_and_end_and_zero_when_never_trained() -> (
    None
):
    billed = _detail("Completed", [], TrainingStartTime=T0, TrainingEndTime=T0 + 90_500)
    assert parse_description(billed).seconds_trained == 90.5
    never = _detail("Stopped", [{"Status": "Starting", "StartTime": T0, "EndTime": T0 + 5_000}])
    assert parse_description(never).seconds_trained == 0.0
    assert parse_description(_detail("Failed", [])).seconds_trained is None
