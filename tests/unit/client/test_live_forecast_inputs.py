"""What GET /jobs lists reaches the forecast: a job's MaxRuntimeInSeconds bounds its run time, is the
policy's for a queued job, and is SageMaker's default of one day for a running job that gave none."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sagequeue.client import Job
from sagequeue.forecast.live import LiveQueue, state_of
from sagequeue_core.defaults import SAGEMAKER_DEFAULT_MAX_RUNTIME_SECONDS
from sagequeue_core.domain import Job as StoredJob
from sagequeue_core.domain import JobState

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
POOL = "ml.trn1.32xlarge"


def listed(name: str, state: JobState, stopping: dict[str, Any] | None) -> Job:
    """A job as the API lists it (the server's own Job.to_api, read back by the client)."""
    request: dict[str, Any] = {"ResourceConfig": {"InstanceType": POOL, "InstanceCount": 1}}
    if stopping is not None:
        request["StoppingCondition"] = stopping
    stored = StoredJob(
        name=name,
        request=request,
        priority=1,
        owner="arn:aws:iam::123456789012:role/u",
        submitted_at=NOW - timedelta(hours=1),
    )
    stored.state = state
    if state is JobState.RUNNING:
        stored.attempt = 1
        stored.started_at = NOW - timedelta(minutes=30)
    return Job.from_api(stored.to_api())


def test_max_runtime_goes_from_the_request_through_the_api_into_the_forecast_state() -> None:
    queue = LiveQueue(
        now=NOW,
        capacity={POOL: 1},
        warm={},
        queued=[
            listed("bounded", JobState.QUEUED, {"MaxRuntimeInSeconds": 5400}),
            listed("unbounded", JobState.QUEUED, None),
            listed("nonsense", JobState.QUEUED, {"MaxRuntimeInSeconds": "soon"}),
        ],
        live=[
            listed("running", JobState.RUNNING, None),
            listed("capped", JobState.RUNNING, {"MaxRuntimeInSeconds": 900}),
        ],
        completed=[],
    )
    assert [job.raw["max_runtime_seconds"] for job in queue.queued] == [5400, None, None]
    state = state_of(queue)
    assert {job.name: job.max_runtime_seconds for job in state.queued} == {
        "bounded": 5400,
        "unbounded": None,
        "nonsense": None,
    }
    assert state.work["bounded"].max_runtime_seconds == 5400.0
    assert state.work["unbounded"].max_runtime_seconds is None
    assert {a.job_name: a.max_runtime_seconds for a in state.running} == {
        "running": SAGEMAKER_DEFAULT_MAX_RUNTIME_SECONDS,
        "capped": 900,
    }
    assert state.work["capped"].max_runtime_seconds == 900.0
