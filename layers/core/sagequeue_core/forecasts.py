"""Start forecasts the stack keeps: the latest per waiting job, shown by GET /jobs/{name}, and a bounded log of
past ones, scored once their jobs start (docs/adr/0024-stored-forecasts-and-their-score.md).

The forecast itself is made by the forecast function (the SDK's engine, run on a timer); this module holds
only what the API needs to answer from the table: what a stored forecast is, when it is too old to show, and
the score of past forecasts against the starts that happened. Nothing here runs a simulation.

Who writes it: only the forecast function, from the queue the scheduler wrote. A forecast decides nothing:
the scheduler never reads it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

#: A job's forecast older than this is not shown (the forecast function runs every 5 minutes by default,
#: ForecastSchedule): a forecast two runs old still says something, one older is from another queue.
FRESH_SECONDS = 15 * 60
#: A job's forecast goes to the log at most this often, so a job waiting a day logs 48 forecasts, not 288.
LOG_EVERY_SECONDS = 1800
#: How long forecasts (latest and logged) are kept: the table's TTL removes them after.
KEEP_SECONDS = 7 * 86400
#: Logged forecasts one run of the forecast function writes at most (the rest wait for the next hour).
LOG_PER_RUN = 200
#: Logged forecasts of one pool a score reads at most (the newest).
SCORE_READ = 1000
#: Fewer settled forecasts than this in a pool and the score says so rather than give percentages.
SCORE_MINIMUM = 5
#: The score's window, in hours: default and bounds (the log is kept KEEP_SECONDS).
SCORE_HOURS_DEFAULT = 24
SCORE_HOURS_MAX = KEEP_SECONDS // 3600


@dataclass(frozen=True)
class StartForecast:
    """When a waiting job is forecast to start, made at `made_at` for its attempt `attempt` (the count of
    attempts it had then). `p90` None: not started in any run within the horizon. `engine`: the engine's
    own P10, P50 and P90 when those shown are calibrated by past forecasts (docs/adr/0026), which is what
    the calibration learns from; None: those shown are the engine's."""

    job: str
    pool: str
    attempt: int
    made_at: datetime
    p10: datetime | None
    p50: datetime | None
    p90: datetime | None
    runs: int
    engine: tuple[datetime | None, datetime | None, datetime | None] | None = None

    @property
    def engine_quantiles(self) -> tuple[datetime | None, datetime | None, datetime | None]:
        """The engine's P10, P50 and P90 (those shown where it made no other)."""
        return self.engine if self.engine is not None else (self.p10, self.p50, self.p90)

    def fresh_at(self, now: datetime) -> bool:
        return now - self.made_at <= timedelta(seconds=FRESH_SECONDS)

    def to_api(self) -> dict[str, Any]:
        return {
            "p10": _iso(self.p10),
            "p50": _iso(self.p50),
            "p90": _iso(self.p90),
            "made_at": _iso(self.made_at),
            "runs": self.runs,
        }


@dataclass(frozen=True)
class PastForecast:
    """A logged forecast and what came of it: `started_at` once its job started after it, `gone` when the job
    ended, was cancelled or was held without starting (nothing to score)."""

    forecast: StartForecast
    started_at: datetime | None = None
    gone: bool = False

    @property
    def settled(self) -> bool:
        return self.started_at is not None or self.gone


@dataclass(frozen=True)
class PoolScore:
    """Past forecasts of one pool over a window, against the starts that happened."""

    pool: str
    forecasts: int
    scored: int
    covered: int
    median_error_seconds: float | None
    #: still waiting past their P90: misses already, scored once they start
    overdue: int
    #: scored forecasts whose start fell inside the engine's own P10-P90, before calibration
    engine_covered: int = 0

    @property
    def coverage(self) -> float | None:
        return self.covered / self.scored if self.scored else None

    @property
    def engine_coverage(self) -> float | None:
        return self.engine_covered / self.scored if self.scored else None

    @property
    def enough(self) -> bool:
        return self.scored >= SCORE_MINIMUM

    def to_api(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "forecasts": self.forecasts,
            "scored": self.scored,
            "covered": self.covered,
            "coverage": self.coverage if self.enough else None,
            "median_error_seconds": self.median_error_seconds if self.enough else None,
            "overdue": self.overdue,
            "engine_covered": self.engine_covered,
            "engine_coverage": self.engine_coverage if self.enough else None,
            "enough": self.enough,
        }


def covers(forecast: StartForecast, started_at: datetime, *, engine: bool = False) -> bool:
    """The start fell inside the P10-P90 range shown (`engine`: the engine's own; an open P90 has no upper
    end)."""
    p10, _, p90 = forecast.engine_quantiles if engine else (forecast.p10, forecast.p50, forecast.p90)
    if p10 is not None and started_at < p10:
        return False
    return p90 is None or started_at <= p90


def score(pool: str, past: Iterable[PastForecast], now: datetime) -> PoolScore:
    """P10-P90 coverage and the P50's median absolute error over the forecasts whose jobs started."""
    forecasts = scored = covered = engine_covered = overdue = 0
    errors: list[float] = []
    for entry in past:
        forecasts += 1
        made = entry.forecast
        if entry.started_at is not None:
            scored += 1
            covered += covers(made, entry.started_at)
            engine_covered += covers(made, entry.started_at, engine=True)
            if made.p50 is not None:
                errors.append(abs((entry.started_at - made.p50).total_seconds()))
            else:  # a P50 past the horizon: a start within it is as far off as can be
                errors.append(math.inf)
        elif not entry.gone and made.p90 is not None and now > made.p90:
            overdue += 1
    import statistics  # only a score needs it (the API's score route)

    median = statistics.median(errors) if errors else None
    return PoolScore(
        pool=pool,
        forecasts=forecasts,
        scored=scored,
        covered=covered,
        median_error_seconds=None if median is None or math.isinf(median) else round(median, 1),
        overdue=overdue,
        engine_covered=engine_covered,
    )


def calibration_answer(stored: tuple[dict[str, Any], datetime] | None) -> dict[str, Any]:
    """GET /forecasts/calibration: the calibration the forecast function last learnt from the log and
    applies to the forecasts it stores, per pool (`sagequeue.forecast.calibrate`, docs/adr/0026), and when;
    with none learnt yet, no pools and `made_at` null (clients then apply none). Written by the forecast
    function alone; clients bound it again before applying it."""
    if stored is None:
        return {"made_at": None, "pools": {}, "all": None}
    detail, made_at = stored
    pools = detail.get("pools")
    return {
        "made_at": _iso(made_at),
        "pools": pools if isinstance(pools, dict) else {},
        "all": detail.get("all") if isinstance(detail.get("all"), dict) else None,
    }


def score_answer(scores: Iterable[PoolScore], hours: int, now: datetime) -> dict[str, Any]:
    return {
        "hours": hours,
        "as_of": _iso(now),
        "minimum": SCORE_MINIMUM,
        "pools": [s.to_api() for s in scores],
    }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


__all__ = [
    "FRESH_SECONDS",
    "KEEP_SECONDS",
    "LOG_EVERY_SECONDS",
    "LOG_PER_RUN",
    "SCORE_HOURS_DEFAULT",
    "SCORE_HOURS_MAX",
    "SCORE_MINIMUM",
    "SCORE_READ",
    "PastForecast",
    "PoolScore",
    "StartForecast",
    "calibration_answer",
    "covers",
    "score",
    "score_answer",
]
