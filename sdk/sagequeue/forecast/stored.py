"""The forecast function's use case: forecast every waiting job from the table, store the forecasts for GET
/jobs/{name}, log some for the score, and settle logged ones whose jobs have started
(docs/adr/0024-stored-forecasts-and-their-score.md).

It runs on a timer in a function of its own (functions/forecast), never in the API's or the scheduler's: a
forecast is seconds of CPU, bounded here by `BUDGET_SECONDS`, and the API only reads what it stored.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sagequeue.client import Job
from sagequeue.forecast.calibrate import Calibration, Outcome, learn
from sagequeue.forecast.engine import Forecast, JobForecast, forecast
from sagequeue.forecast.live import SETTINGS, LiveQueue, history_of, state_of
from sagequeue.forecast.model import ForecastSettings
from sagequeue_core.domain import JobState
from sagequeue_core.forecasts import (
    KEEP_SECONDS,
    LOG_EVERY_SECONDS,
    LOG_PER_RUN,
    SCORE_READ,
    PastForecast,
    StartForecast,
)
from sagequeue_core.snapshot import policy_settings

if TYPE_CHECKING:
    from sagequeue_core.domain import Job as StoredJob
    from sagequeue_core.runtime import Dependencies

#: Seconds of runs forward one invocation draws at most (of the function's 60 s timeout): past it, no more
#: runs beyond the first three (ForecastSettings.min_samples), as the CLI does with its 5 s.
BUDGET_SECONDS = 20.0
#: Runs forward per forecast when the budget allows.
SAMPLES = 40
#: A queue whose every waiting job has a forecast this recent, made for its current attempt, is not
#: forecast again at this run: a job that joins the queue (or waits again) is forecast at the next run, the
#: rest at least this often, so a shown forecast is at most this plus one timer period old (FRESH_SECONDS).
REFRESH_SECONDS = 600
#: States after which a job that did not start after a forecast never will: nothing to score.
_STARTED = frozenset({JobState.STARTING.value, JobState.RUNNING.value})
_ENDED = frozenset({JobState.CANCELLED, JobState.FAILED, JobState.COMPLETED, JobState.IDLE_STOPPED})


@dataclasses.dataclass(frozen=True)
class Published:
    """What one run did: jobs forecast, forecasts logged, logged forecasts settled, runs forward drawn, and
    the calibration the forecasts were stored with."""

    forecast: int = 0
    logged: int = 0
    settled: int = 0
    runs: int = 0
    calibration: Calibration = dataclasses.field(default_factory=Calibration)


def settings_for(deps: Dependencies, budget_seconds: float = BUDGET_SECONDS) -> ForecastSettings:
    """The stack's own scheduling settings, so the runs forward plan as its passes do."""
    return ForecastSettings(
        policy=policy_settings(deps.settings),
        queue_lookahead=deps.settings.queue_lookahead,
        pass_lookahead=deps.settings.queue_lookahead,
        samples=SAMPLES,
        budget_seconds=budget_seconds,
    )


def publish(deps: Dependencies, *, budget_seconds: float = BUDGET_SECONDS) -> Published:
    """Settle past forecasts, learn from them how to calibrate (docs/adr/0026), forecast the queue as the
    table has it, and store the forecasts calibrated, with the calibration clients apply to their own."""
    queue = LiveQueue.from_store(deps)
    earlier = deps.store.job_forecasts(job.name for job in queue.queued) if queue.queued else {}
    settled, past = settle(deps, queue.now, {job.name: job for job in queue.queued})
    made: Forecast | None = None
    calibration = Calibration()
    logged = 0
    if _due(queue, earlier):
        calibration = learn(outcomes(past, queue.now))
        settings = settings_for(deps, budget_seconds)
        made = forecast(state_of(queue), history_of(queue), settings)
        logged = _store(deps, queue, made, earlier, calibration, settings.horizon_seconds)
    return Published(
        forecast=len(made.jobs) if made else 0,
        logged=logged,
        settled=settled,
        runs=made.samples if made else 0,
        calibration=calibration,
    )


def outcomes(past: Iterable[PastForecast], now: datetime) -> list[Outcome]:
    """What came of logged forecasts by `now`, as the calibration reads them: the engine's quantiles, and
    the start that followed or, still unsettled, the wait so far (a job that left without starting says
    nothing). Written by the forecast function alone, from starts the scheduler recorded."""
    out = []
    for entry in past:
        if entry.gone:
            continue
        made = entry.forecast
        quantiles = tuple(
            math.inf if at is None else max((at - made.made_at).total_seconds(), 0.0)
            for at in made.engine_quantiles
        )
        started = entry.started_at
        out.append(
            Outcome(
                pool=made.pool,
                age=(now - made.made_at).total_seconds(),
                quantiles=(quantiles[0], quantiles[1], quantiles[2]),
                started=None if started is None else max((started - made.made_at).total_seconds(), 0.0),
                waited=max((now - made.made_at).total_seconds(), 0.0),
            )
        )
    return out


def calibrated(
    result: JobForecast, pool: str, calibration: Calibration, horizon: float = SETTINGS.horizon_seconds
) -> tuple[float, float, float]:
    """A job's P10, P50 and P90 (seconds from the forecast) with its pool's calibration applied, none past
    the engine's `horizon` (inf there, as the engine's own)."""
    return calibration.apply(pool, (result.p10, result.p50, result.p90), horizon)


def _due(queue: LiveQueue, earlier: Mapping[str, tuple[StartForecast, datetime | None]]) -> bool:
    """Some waiting job has no forecast made for its current attempt in the last REFRESH_SECONDS."""
    refresh = timedelta(seconds=REFRESH_SECONDS)
    for job in queue.queued:
        stored = earlier.get(job.name)
        if stored is None or stored[0].attempt != job.attempt or queue.now - stored[0].made_at >= refresh:
            return True
    return False


def _store(
    deps: Dependencies,
    queue: LiveQueue,
    made: Forecast,
    earlier: Mapping[str, tuple[StartForecast, datetime | None]],
    calibration: Calibration,
    horizon: float,
) -> int:
    now = queue.now
    latest: list[tuple[StartForecast, datetime | None]] = []
    logged: list[StartForecast] = []
    for job in queue.queued:
        result = made.get(job.name)
        if result is None or not result.starts:
            continue
        p10, p50, p90 = calibrated(result, job.pool, calibration, horizon)
        start = StartForecast(
            job=job.name,
            pool=job.pool,
            attempt=job.attempt,
            made_at=now,
            p10=result.at(p10),
            p50=result.at(p50),
            p90=result.at(p90),
            runs=made.samples,
            engine=(result.at(result.p10), result.at(result.p50), result.at(result.p90)),
        )
        latest.append((start, earlier[job.name][1] if job.name in earlier else None))
    # the log takes at most LOG_PER_RUN a run, the longest unlogged first (never logged before any), not
    # the queue's first: a tenant queueing many jobs cannot keep the rest of a pool out of what it learns
    due = [
        index
        for index, (_, logged_at) in enumerate(latest)
        if logged_at is None or now - logged_at >= timedelta(seconds=LOG_EVERY_SECONDS)
    ]
    due.sort(key=lambda index: (latest[index][1] is not None, latest[index][1] or now))
    for index in sorted(due[:LOG_PER_RUN]):
        logged.append(latest[index][0])
        latest[index] = (latest[index][0], now)
    deps.store.save_forecasts(latest, logged, (calibration.to_api(), now))
    return len(logged)


def settle(deps: Dependencies, now: datetime, waiting: Mapping[str, Job]) -> tuple[int, list[PastForecast]]:
    """Logged forecasts whose jobs have started since (or ended without starting): record the start, so the
    score reads it without reading the jobs. A job still waiting on the same attempt stays open. Answers
    how many were settled, and every logged forecast read (of the last KEEP_SECONDS, each pool's newest
    SCORE_READ), as settled now."""
    since = now - timedelta(seconds=KEEP_SECONDS)
    jobs: dict[str, StoredJob | None] = {}
    settled: list[PastForecast] = []
    read: list[PastForecast] = []
    for status in deps.store.pools():
        for entry in deps.store.past_forecasts(status.pool.instance_type, since, SCORE_READ):
            if entry.settled:
                read.append(entry)
                continue
            made = entry.forecast
            still = waiting.get(made.job)
            if still is not None and still.attempt == made.attempt:
                read.append(entry)
                continue
            if made.job not in jobs:
                jobs[made.job] = deps.store.find_job(made.job)
            outcome = _outcome(entry, jobs[made.job])
            if outcome is not None:
                settled.append(outcome)
            read.append(outcome or entry)
    if settled:
        deps.store.settle_forecasts(settled)
    return len(settled), read


def _outcome(entry: PastForecast, job: StoredJob | None) -> PastForecast | None:
    made = entry.forecast
    if job is None or _held_since(job, made):
        return dataclasses.replace(entry, gone=True)
    if job.attempt > made.attempt:
        started = _next_start(job, made)
        if started is not None and started >= made.made_at:
            return dataclasses.replace(entry, started_at=started)
        if started is not None:
            # made after the start it forecast (the queue read as the job left it): nothing to score, and
            # left open it would count as a job waiting ever longer past its P90
            return dataclasses.replace(entry, gone=True)
    if job.state in _ENDED and job.attempt <= made.attempt:
        return dataclasses.replace(entry, gone=True)
    return None  # queued again before its start is visible: wait


def _held_since(job: StoredJob, made: StartForecast) -> bool:
    """Its owner held the job after the forecast, before the attempt after it: how long it waits is then the
    owner's choice, not the queue's, and says nothing of the forecast (dropped, as a cancelled job's)."""
    if job.state is JobState.HELD and job.attempt == made.attempt:
        return True
    return any(
        entry.get("state") == JobState.HELD.value
        and entry.get("attempt") == made.attempt
        and (at := _at(entry)) is not None
        and at >= made.made_at
        for entry in job.history
    )


def _at(entry: Mapping[str, object]) -> datetime | None:
    """When a history entry happened; None for one without a readable time."""
    try:
        at = datetime.fromisoformat(str(entry.get("at")))
    except ValueError:
        return None
    return at if at.tzinfo is not None else None


def _next_start(job: StoredJob, made: StartForecast) -> datetime | None:
    """When the attempt after the forecast's first started: its history's first entry of that attempt (the
    history keeps the first and the latest entries; the current attempt's start stands in when trimmed).
    None: not visible yet."""
    for entry in job.history:
        if entry.get("state") in _STARTED and entry.get("attempt") == made.attempt + 1:
            at = _at(entry)
            if at is not None:
                return at
    if job.attempt == made.attempt + 1 and job.started_at is not None:
        return job.started_at
    return None


__all__ = [
    "BUDGET_SECONDS",
    "REFRESH_SECONDS",
    "Published",
    "calibrated",
    "outcomes",
    "publish",
    "settings_for",
    "settle",
]
