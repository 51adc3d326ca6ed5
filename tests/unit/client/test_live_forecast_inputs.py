"""What GET /jobs lists reaches the forecast: a job's MaxRuntimeInSeconds bounds its run time, is the
policy's for a queued job, and is SageMaker's default of one day for a running job that gave none."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

from sagequeue.client import Job
from sagequeue.forecast.live import LiveQueue, state_of
from sagequeue_core.checkpoints import CheckpointRecord
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


class _Stack:
    """What a client reads of the stack's calibration: an answer, or the error the API gave."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def forecast_calibration(self) -> Any:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_the_cli_applies_the_stacks_calibration_bounded_and_none_from_a_stack_without_one() -> None:
    from sagequeue.exceptions import NotFound
    from sagequeue.forecast.calibrate import CalibrationSettings
    from sagequeue.forecast.live import _calibration

    engine = (600.0, 1800.0, 3600.0)
    # a stack that predates calibrated ranges answers 404: the forecast is the engine's
    older = _calibration(_Stack(NotFound("no route", status=404)))  # type: ignore[arg-type]
    assert older.apply(POOL, engine) == engine
    # an answer past the bounds is bounded again: the range at most max_scale times as wide
    hostile = _calibration(_Stack({"pools": {POOL: {"scale": 1e9, "shift": 1e9, "weight": 1}}, "all": None}))  # type: ignore[arg-type]
    settings = CalibrationSettings()
    assert hostile.for_pool(POOL).scale == settings.max_scale
    assert hostile.for_pool(POOL).shift == settings.max_shift
    assert hostile.for_pool("ml.trn2.48xlarge").identity


def test_a_running_attempts_reported_checkpoint_reaches_the_forecast_as_the_scheduler_reads_it() -> None:
    # GIVEN a running attempt that reported checkpoints every 20 minutes, the last 5 minutes ago (ADR 0025),
    # and one whose listing carries a checkpoint of nonsense
    def running(name: str, record: CheckpointRecord | None) -> Job:
        stored = StoredJob(
            name=name,
            request={"ResourceConfig": {"InstanceType": POOL, "InstanceCount": 1}},
            priority=1,
            owner="arn:aws:iam::123456789012:role/u",
            submitted_at=NOW - timedelta(hours=2),
        )
        stored.state = JobState.RUNNING
        stored.attempt = 1
        stored.training_job_name = f"{name}-1"
        stored.started_at = NOW - timedelta(hours=1)
        stored.checkpoint = record
        return Job.from_api(stored.to_api())

    at = NOW - timedelta(minutes=5)
    reported = running(
        "reported", CheckpointRecord("reported-1", at=at, step=300, count=3, interval_seconds=1200.0)
    )
    odd = running("odd", None)
    odd = dataclasses.replace(
        odd, raw={**odd.raw, "checkpoint": {"at": "soon", "interval_seconds": float("nan")}}
    )
    queue = LiveQueue(now=NOW, capacity={POOL: 2}, warm={}, queued=[], live=[reported, odd], completed=[])
    # WHEN the forecast reads the queue
    attempts = {attempt.job_name: attempt for attempt in state_of(queue).running}
    # THEN the attempt carries its last checkpoint and interval, which the policy uses to time a preemption
    assert attempts["reported"].last_checkpoint_at == at
    assert attempts["reported"].checkpoint_interval_seconds == 1200.0
    # and nonsense in a listing is no checkpoint at all
    assert attempts["odd"].last_checkpoint_at is None
    assert attempts["odd"].checkpoint_interval_seconds is None
