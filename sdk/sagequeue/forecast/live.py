"""The forecast of the live queue, made on the caller's machine from what the API lists.

The API answers reads already (jobs by state, pools); the forecast runs here, not in a Lambda function
(docs/adr/0022-forecasts-from-the-real-policy.md). What it reads and who writes it:

- queued and live jobs: priority, pool and instances, reservation, team, training start, loan: written by
  the queue (the submitter chose only the request and a priority under its ceiling);
- warm pools: each pool's Available warm instances, as GET /pools counts them (their keys and expiry are not
  listed: they are modelled as pools nobody queued reuses, released or expiring after the keep-alive);
- history: completed jobs' training seconds, by owner and instance count, and recent submissions;
- the calibration of the ranges (GET /forecasts/calibration): learnt by the stack's forecast function from
  its own past forecasts, applied here as there (docs/adr/0026), bounded again on reading.

A forecast is kept for `CACHE_SECONDS` for the same queue (the same jobs in the same states), so `ls
--watch` does not run it again between passes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sagequeue.client import Job, QueueClient
from sagequeue.exceptions import ApiError
from sagequeue.forecast.calibrate import Calibration
from sagequeue.forecast.engine import Forecast, JobForecast, forecast
from sagequeue.forecast.model import (
    ForecastSettings,
    History,
    QueueState,
    RetainedPool,
    Submission,
    Traits,
    Work,
)
from sagequeue_core.defaults import SAGEMAKER_DEFAULT_MAX_RUNTIME_SECONDS
from sagequeue_core.domain import JobState, Reservation, ResourceKey
from sagequeue_core.policy import QueuedJob, RunningAttempt, WarmPool

if TYPE_CHECKING:  # the server's side: only the forecast function reads the table (pynamodb, powertools)
    from sagequeue_core.runtime import Dependencies

LIVE_STATES = ("starting", "running", "preempting", "stopping")
STOPPING_STATES = frozenset({"preempting", "stopping"})
#: completed jobs read for run times: the newest (by submission), whose run times say most about those to come
HISTORY_LIMIT = 100
#: how long a forecast of an unchanged queue is reused
CACHE_SECONDS = 60.0
#: how long an Available warm pool of unknown expiry is counted (the stack's default keep-alive)
WARM_POOL_SECONDS = 600
#: what a command waits for a forecast: past it, fewer runs (at least three) and a rougher range
SETTINGS = ForecastSettings(budget_seconds=5.0)

_cache: dict[tuple[object, ...], tuple[float, Forecast]] = {}


@dataclasses.dataclass(frozen=True)
class LiveQueue:
    """What the API listed, read once."""

    now: datetime
    capacity: dict[str, int]
    warm: dict[str, int]
    queued: list[Job]
    live: list[Job]
    completed: list[Job]
    #: how the stack calibrates ranges (the identity where it has none, or the stack predates it)
    calibration: Calibration = dataclasses.field(default_factory=Calibration)

    @classmethod
    def read(cls, client: QueueClient) -> LiveQueue:
        pools = client.pools()
        queued = client.jobs(state="queued")
        live = [job for state in LIVE_STATES for job in client.jobs(state=state)]
        # the latest completed jobs say most about run times now
        completed = client.jobs(state="completed", limit=HISTORY_LIMIT, order="newest")
        now = client.server_time or datetime.now().astimezone()
        return cls(
            now=now,
            capacity={p.instance_type: p.capacity for p in pools},
            warm={p.instance_type: p.warm for p in pools if p.warm},
            queued=queued,
            live=live,
            completed=completed,
            calibration=_calibration(client) if queued else Calibration(),
        )

    @classmethod
    def from_store(cls, deps: Dependencies) -> LiveQueue:
        """The same reads from the table, as the API would answer them (the forecast function's view)."""
        from sagequeue_core.service.jobs import MAX_PAGE, pools

        views = pools(deps)
        queued: list[Job] = []
        token: str | None = None
        while True:
            page = deps.store.list_jobs(state=JobState.QUEUED, limit=MAX_PAGE, next_token=token)
            queued.extend(Job.from_api(job.to_api()) for job in page.jobs)
            token = page.next_token
            if not token:
                break
        completed = deps.store.list_jobs(
            state=JobState.COMPLETED, limit=HISTORY_LIMIT, newest_first=True
        ).jobs
        return cls(
            now=deps.now(),
            capacity={v.instance_type: v.capacity for v in views},
            warm={v.instance_type: v.warm for v in views if v.warm},
            queued=queued,
            live=[Job.from_api(job.to_api()) for job in deps.store.live_jobs()],
            completed=[Job.from_api(job.to_api()) for job in completed],
        )

    def fingerprint(self) -> tuple[object, ...]:
        return (
            tuple(sorted(self.capacity.items())),
            tuple(sorted(self.warm.items())),
            tuple(
                sorted(
                    (j.name, j.state, j.attempt, j.priority, str(j.raw.get("reservation")))
                    for j in self.queued
                )
            ),
            tuple(sorted((j.name, j.state, j.attempt) for j in self.live)),
            len(self.completed),
        )


def _calibration(client: QueueClient) -> Calibration:
    """The stack's calibration; none from a stack without one (a 404 from one that predates it)."""
    try:
        return Calibration.from_api(client.forecast_calibration())
    except ApiError:
        return Calibration()


@dataclasses.dataclass(frozen=True)
class CalibratedStart:
    """A waiting job's forecast start as shown: the engine's (`engine`) with the stack's calibration of its
    pool applied; quantiles in seconds from `now` (inf: not by the horizon), as JobForecast's."""

    name: str
    now: datetime
    p10: float
    p50: float
    p90: float
    engine: JobForecast

    def at(self, seconds: float) -> datetime | None:
        return self.engine.at(seconds)

    def to_dict(self) -> dict[str, object]:
        shown = JobForecast(self.name, self.now, (self.p10, self.p50, self.p90)).to_dict()
        engine = self.engine.to_dict()
        return {**shown, "engine": {key: engine[key] for key in ("p10", "p50", "p90")}}


def calibrated(queue: LiveQueue, result: JobForecast, pool: str) -> CalibratedStart:
    """`result` (a job's forecast in `pool`) with the stack's calibration applied, as the stack applies it to
    the forecasts it stores (none past the engine's horizon)."""
    p10, p50, p90 = queue.calibration.apply(
        pool, (result.p10, result.p50, result.p90), SETTINGS.horizon_seconds
    )
    return CalibratedStart(result.name, result.now, p10, p50, p90, result)


def _traits(job: Job) -> Traits:
    return Traits(user=job.owner or None, instances=max(job.instances, 1))


def _max_runtime(job: Job) -> int | None:
    """StoppingCondition.MaxRuntimeInSeconds as the submitter gave it (GET /jobs lists it); None: not given."""
    value = job.raw.get("max_runtime_seconds")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _queued(job: Job, now: datetime) -> QueuedJob:
    reservation = job.raw.get("reservation")
    return QueuedJob(
        name=job.name,
        priority=job.priority,
        submitted_at=job.submitted_at or now,
        demand={job.pool: max(job.instances, 1)},
        reservation=Reservation.from_dict(reservation) if reservation else None,
        preemptions=job.preemptions,
        checkpointed=not job.raw.get("warnings"),
        team=job.raw.get("team"),
        loans_taken_back=job.loans_taken_back,
        max_runtime_seconds=_max_runtime(job),
    )


def _running(job: Job, now: datetime) -> RunningAttempt:
    training = job.raw.get("training_started_at")
    return RunningAttempt(
        training_job_name=job.training_job_name or job.name,
        demand={job.pool: max(job.instances, 1)},
        priority=job.priority,
        started_at=job.started_at or now,
        job_name=job.name,
        stopping=job.state in STOPPING_STATES,
        training_started_at=datetime.fromisoformat(training) if training else None,
        preemptions=job.preemptions,
        checkpointed=not job.raw.get("warnings"),
        on_loan_for=job.raw.get("on_loan_for"),
        team=job.raw.get("team"),
        loans_taken_back=job.loans_taken_back,
        # as the scheduler's snapshot counts it: SageMaker's default when the request left it out
        max_runtime_seconds=_max_runtime(job) or SAGEMAKER_DEFAULT_MAX_RUNTIME_SECONDS,
        # the checkpoint the attempt reported (ADR 0025), as the scheduler reads it: when a preemption loses
        # least, and what a stop keeps
        last_checkpoint_at=job.last_checkpoint_at,
        checkpoint_interval_seconds=job.checkpoint_interval_seconds,
    )


def _work(job: Job) -> Work:
    max_runtime = _max_runtime(job)
    return Work(
        traits=_traits(job),
        trained_seconds=float(job.seconds_trained or 0),
        max_runtime_seconds=float(max_runtime) if max_runtime else None,
        submitted_at=job.submitted_at,
    )


def state_of(queue: LiveQueue, extra: Sequence[tuple[QueuedJob, Work]] = ()) -> QueueState:
    now = queue.now
    warm = [
        RetainedPool(
            WarmPool(
                f"warm-{pool}",
                ResourceKey(role_arn="", instance_type=pool, instance_count=count, volume_size_gb=0),
            ),
            now + timedelta(seconds=WARM_POOL_SECONDS),
        )
        for pool, count in queue.warm.items()
    ]
    work = {job.name: _work(job) for job in (*queue.queued, *queue.live)}
    queued = [_queued(job, now) for job in queue.queued]
    for job, job_work in extra:
        queued.append(job)
        work[job.name] = job_work
    return QueueState(
        now=now,
        capacity=queue.capacity,
        queued=queued,
        running=[_running(job, now) for job in queue.live],
        warm_pools=warm,
        work=work,
    )


def history_of(queue: LiveQueue) -> History:
    completed = []
    for job in queue.completed:
        seconds = float(job.seconds_trained or 0)
        if not seconds and job.started_at and job.ended_at:
            seconds = (job.ended_at - job.started_at).total_seconds()
        if seconds > 0:
            completed.append((_traits(job), seconds))
    submissions = [
        Submission(
            at=job.submitted_at,
            priority=job.priority,
            demand={job.pool: max(job.instances, 1)},
            traits=_traits(job),
            checkpointed=not job.raw.get("warnings"),
            team=job.raw.get("team"),
        )
        for job in _all(queue)
        if job.submitted_at is not None
    ]
    submissions.sort(key=lambda s: s.at)
    return History(completed=completed, submissions=submissions)


def _all(queue: LiveQueue) -> Iterable[Job]:
    return (*queue.queued, *queue.live, *queue.completed)


def live_forecast(
    queue: LiveQueue,
    settings: ForecastSettings | None = None,
    *,
    only: Iterable[str] | None = None,
    cached: bool = True,
) -> Forecast:
    """The forecast of every queued job (those in `only`, if given), reused while the queue is unchanged."""
    settings = settings or SETTINGS
    wanted = None if only is None else frozenset(only)
    key = (queue.fingerprint(), settings, wanted)
    hit = _cache.get(key)
    if cached and hit is not None and time.monotonic() - hit[0] < CACHE_SECONDS:
        return hit[1]
    result = forecast(state_of(queue), history_of(queue), settings, only=wanted)
    _cache.clear()
    _cache[key] = (time.monotonic(), result)
    return result


__all__ = ["CalibratedStart", "LiveQueue", "calibrated", "history_of", "live_forecast", "state_of"]
