"""Stored start forecasts: when GET /jobs/{name} shows one, how the score counts a logged forecast against
the start that followed, and what the forecast function settles a logged forecast as."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime, timedelta

import pytest

from sagequeue.forecast.calibrate import Calibration
from sagequeue.forecast.stored import _outcome, outcomes
from sagequeue_core.domain import Job, JobState
from sagequeue_core.forecasts import (
    FRESH_SECONDS,
    SCORE_MINIMUM,
    PastForecast,
    StartForecast,
    calibration_answer,
    covers,
    score,
)

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
POOL = "ml.trn1.32xlarge"


def made(
    p10: float | None, p50: float | None, p90: float | None, *, job: str = "j", attempt: int = 0
) -> StartForecast:
    def at(hours: float | None) -> datetime | None:
        return None if hours is None else T0 + timedelta(hours=hours)

    return StartForecast(job, POOL, attempt, T0, at(p10), at(p50), at(p90), 10)


def started(forecast: StartForecast, hours: float) -> PastForecast:
    return PastForecast(forecast, started_at=T0 + timedelta(hours=hours))


def test_a_forecast_is_fresh_for_fifteen_minutes() -> None:
    forecast = made(1, 2, 3)
    assert forecast.fresh_at(T0 + timedelta(seconds=FRESH_SECONDS))
    assert not forecast.fresh_at(T0 + timedelta(seconds=FRESH_SECONDS + 1))


@pytest.mark.parametrize(
    ("hours", "inside"),
    [(0.5, False), (1, True), (2, True), (3, True), (3.01, False)],
)
def test_the_range_covers_a_start_from_p10_to_p90(hours: float, inside: bool) -> None:
    assert covers(made(1, 2, 3), T0 + timedelta(hours=hours)) is inside


def test_an_open_p90_covers_any_start_after_p10() -> None:
    assert covers(made(1, 5, None), T0 + timedelta(days=30))
    assert not covers(made(1, 5, None), T0)


def test_the_score_counts_misses_as_uncovered_and_takes_the_median_error_of_p50() -> None:
    past = [
        started(made(1, 2, 3), 2.5),  # covered, 0.5 h off
        started(made(1, 2, 3), 4),  # missed late, 2 h off
        started(made(1, 2, 3), 0.5),  # missed early, 1.5 h off
        started(made(0, 1, 2), 1),  # covered, exact
        started(made(0, 1, 2), 1.25),  # covered, 0.25 h off
        PastForecast(made(0, 1, 2), gone=True),  # cancelled before it started: not scored
        PastForecast(made(0, 1, 2)),  # still waiting past its P90: overdue, not scored yet
        PastForecast(made(0, 1, 100)),  # still waiting within its range
    ]
    result = score(POOL, past, T0 + timedelta(hours=5))
    assert (result.forecasts, result.scored, result.covered, result.overdue) == (8, 5, 3, 1)
    assert result.median_error_seconds == 0.5 * 3600
    answer = result.to_api()
    assert answer["coverage"] == pytest.approx(0.6)
    assert answer["enough"] is True


def test_below_the_minimum_the_score_gives_counts_but_no_figures() -> None:
    past = [started(made(1, 2, 3), 2)] * (SCORE_MINIMUM - 1)
    answer = score(POOL, past, T0).to_api()
    assert answer["scored"] == SCORE_MINIMUM - 1
    assert answer["coverage"] is None
    assert answer["median_error_seconds"] is None
    assert answer["enough"] is False


def _job(state: JobState, attempt: int, history: list[dict[str, object]]) -> Job:
    job = Job(
        name="j",
        request={"ResourceConfig": {"InstanceType": POOL, "InstanceCount": 1}},
        priority=1,
        owner="arn:aws:iam::123456789012:role/u",
        submitted_at=T0 - timedelta(hours=1),
    )
    job.state = state
    job.attempt = attempt
    job.history = history
    return job


def _entry(state: str, attempt: int, hours: float) -> dict[str, object]:
    return {
        "at": (T0 + timedelta(hours=hours)).isoformat(),
        "state": state,
        "attempt": attempt,
        "reason": None,
    }


def test_a_logged_forecast_settles_on_the_first_start_of_the_next_attempt() -> None:
    entry = PastForecast(made(1, 2, 3, attempt=1))
    job = _job(
        JobState.QUEUED,
        3,
        [
            _entry("starting", 1, -0.5),  # before the forecast: the attempt it was made after
            _entry("starting", 2, 2.5),  # the start that followed it
            _entry("queued", 2, 3),  # preempted
            _entry("starting", 3, 6),
        ],
    )
    settled = _outcome(entry, job)
    assert settled is not None
    assert settled.started_at == T0 + timedelta(hours=2.5)


def test_a_job_gone_ended_or_held_without_a_start_settles_as_gone_and_a_queued_one_waits() -> None:
    entry = PastForecast(made(1, 2, 3))
    gone = PastForecast(entry.forecast, gone=True)
    assert _outcome(entry, None) == gone
    cancelled = _job(JobState.CANCELLED, 0, [_entry("cancelled", 0, 1)])
    assert _outcome(entry, cancelled) == gone
    # held by its owner after the forecast: how long it waits is the owner's choice (held now, or held
    # and released before a run saw it held, or started since), as a cancelled job's, nothing to score
    held = _job(JobState.HELD, 0, [_entry("held", 0, 1)])
    assert _outcome(entry, held) == gone
    released = _job(JobState.QUEUED, 0, [_entry("held", 0, 1), _entry("queued", 0, 1.5)])
    assert _outcome(entry, released) == gone
    started_since = _job(JobState.RUNNING, 1, [_entry("held", 0, 1), _entry("starting", 1, 4)])
    assert _outcome(entry, started_since) == gone
    # held and released before the forecast: it waits in the queue as forecast
    before = _job(JobState.QUEUED, 0, [_entry("held", 0, -1), _entry("queued", 0, -0.5)])
    assert _outcome(entry, before) is None


def test_a_forecast_made_after_the_start_it_was_for_settles_as_gone() -> None:
    entry = PastForecast(made(1, 2, 3))
    job = _job(JobState.RUNNING, 1, [_entry("starting", 1, -0.01), _entry("running", 1, 0.2)])
    assert _outcome(entry, job) == PastForecast(entry.forecast, gone=True)


def _calibrated(engine: StartForecast, p10: float, p90: float) -> StartForecast:
    """`engine` shown with a calibrated range (the P50 kept), the engine's quantiles beside it."""
    return dataclasses.replace(
        engine,
        p10=T0 + timedelta(hours=p10),
        p90=T0 + timedelta(hours=p90),
        engine=(engine.p10, engine.p50, engine.p90),
    )


def test_the_score_counts_the_range_shown_and_the_engines_own_beside_it() -> None:
    past = [
        started(_calibrated(made(1, 2, 3), 0.5, 5), 4),  # inside the calibrated range, not the engine's
        started(_calibrated(made(1, 2, 3), 0.5, 5), 2),  # inside both
        started(made(1, 2, 3), 2),  # an uncalibrated forecast: its range is the engine's
        started(made(1, 2, 3), 6),  # outside
        started(_calibrated(made(1, 2, 3), 1.5, 2.5), 1.2),  # a narrowed range: inside the engine's only
    ]
    result = score(POOL, past, T0 + timedelta(hours=7))
    assert (result.scored, result.covered, result.engine_covered) == (5, 3, 3)
    answer = result.to_api()
    assert answer["coverage"] == pytest.approx(0.6)
    assert answer["engine_coverage"] == pytest.approx(0.6)
    assert covers(past[0].forecast, T0 + timedelta(hours=4))
    assert not covers(past[0].forecast, T0 + timedelta(hours=4), engine=True)


def test_the_calibration_learns_from_the_engines_quantiles_with_jobs_still_waiting_and_not_the_gone() -> None:
    now = T0 + timedelta(hours=10)
    past = [
        started(_calibrated(made(1, 2, 3), 0.5, 5), 4),
        PastForecast(made(1, 2, None)),  # still waiting, its P90 past the horizon
        PastForecast(made(1, 2, 3), gone=True),  # cancelled: says nothing
    ]
    learnt = outcomes(past, now)
    assert [o.quantiles for o in learnt] == [(3600.0, 7200.0, 10800.0), (3600.0, 7200.0, math.inf)]
    assert [o.started for o in learnt] == [4 * 3600.0, None]
    assert [o.waited for o in learnt] == [10 * 3600.0, 10 * 3600.0]
    assert [o.age for o in learnt] == [10 * 3600.0, 10 * 3600.0]
    assert {o.pool for o in learnt} == {POOL}


def test_with_no_calibration_learnt_the_api_answers_none_and_clients_apply_none() -> None:
    answer = calibration_answer(None)
    assert answer == {"made_at": None, "pools": {}, "all": None}
    assert Calibration.from_api(answer).apply(POOL, (60.0, 600.0, 6000.0)) == (60.0, 600.0, 6000.0)
    stored = ({"pools": {POOL: {"scale": 2.0, "shift": 0.0, "weight": 40.0}}, "all": "not one"}, T0)
    answer = calibration_answer(stored)
    assert answer["made_at"] == T0.isoformat()
    assert answer["all"] is None
    assert Calibration.from_api(answer).for_pool(POOL).scale == 2.0
