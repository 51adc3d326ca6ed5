"""Job notices are judged from the job as the table holds it: an event on the bus, which others may be
allowed to put events on, names a job and nothing more."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from sagequeue_core.domain import Job, JobState
from sagequeue_core.events import EventType
from sagequeue_core.service.notices import NOTICE_KINDS, notice_for

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
OWNER = "arn:aws:iam::123456789012:role/ml-alice"


def job(state: JobState, attempt: int = 1, preemptions: int = 0) -> Job:
    return dataclasses.replace(
        Job(
            name="train",
            request={"TrainingJobName": "train"},
            priority=1,
            owner=OWNER,
            submitted_at=EPOCH,
            team="vision",
        ),
        state=state,
        attempt=attempt,
        preemptions=preemptions,
        reason="a reason",
    )


@pytest.mark.parametrize(
    ("event", "state", "kind"),
    [
        (EventType.JOB_STARTED, JobState.STARTING, "started"),
        (EventType.JOB_RESUMED, JobState.RUNNING, "started"),
        (EventType.JOB_REQUEUED, JobState.QUEUED, "requeued"),
        (EventType.JOB_FINISHED, JobState.COMPLETED, "finished"),
        (EventType.JOB_FINISHED, JobState.FAILED, "failed"),
        (EventType.JOB_FINISHED, JobState.IDLE_STOPPED, "idle_stopped"),
        (EventType.JOB_FINISHED, JobState.CANCELLED, "cancelled"),
    ],
)
def test_a_notice_carries_the_tables_owner_and_state(event: EventType, state: JobState, kind: str) -> None:
    notice = notice_for(job(state), event)

    assert notice is not None
    assert notice.kind == kind
    assert kind in NOTICE_KINDS
    assert notice.attributes == {
        "owner": OWNER,
        "event": kind,
        "job": "train",
        "state": state.value,
        "team": "vision",
    }


def test_a_preemption_notice_needs_a_preemption_the_table_counted() -> None:
    assert notice_for(job(JobState.PREEMPTING, preemptions=1), EventType.JOB_PREEMPTED) is not None
    assert notice_for(job(JobState.RUNNING, preemptions=0), EventType.JOB_PREEMPTED) is None


def test_a_forged_end_of_a_job_still_running_sends_nothing() -> None:
    assert notice_for(job(JobState.RUNNING), EventType.JOB_FINISHED) is None
    assert notice_for(job(JobState.QUEUED, attempt=0), EventType.JOB_STARTED) is None
    # events that are not about a job's course send nothing either
    assert notice_for(job(JobState.RUNNING), EventType.WARM_POOL_REUSED) is None
