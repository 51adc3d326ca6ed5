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
    attempts it had then). `p90` None: not started in any run within the horizon."""

    job: str
    pool: str
    attempt: int
    made_at: datetime
    p10: datetime | None
    p50: datetime | None
    p90: datetime | None
    runs: int

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

    @property
    def coverage(self) -> float | None:
        return self.covered / self.scored if self.scored else None

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
            "enough": self.enough,
        }


def covers(forecast: StartForecast, started_at: datetime) -> bool:
    """The start fell inside the P10-P90 range (an open P90 has no upper end)."""
    if forecast.p10 is not None and started_at < forecast.p10:
        return False
    return forecast.p90 is None or started_at <= forecast.p90


def score(pool: str, past: Iterable[PastForecast], now: datetime) -> PoolScore:
    """P10-P90 coverage and the P50's median absolute error over the forecasts whose jobs started."""
    forecasts = scored = covered = overdue = 0
    errors: list[float] = []
    for entry in past:
        forecasts += 1
        made = entry.forecast
        if entry.started_at is not None:
            scored += 1
            covered += covers(made, entry.started_at)
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
    )


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
    "covers",
    "score",
    "score_answer",
]
