"""Calibrated ranges at their edges (sagequeue.forecast.calibrate, as the forecast function and the CLI apply
it): a range stretched by the widest scale the bounds allow still ends within the engine's horizon (or past
it, open), never at a date no clock can hold; extreme or non-finite numbers neither raise nor leave the
bounds; a log that holds only censored forecasts, only zero waits or collapsed ranges learns a bounded scale.
"""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime

import pytest
from test_forecast_calibration import OTHER, POOL, _started, _waiting

from sagequeue.forecast.calibrate import Adjustment, Calibration, CalibrationSettings, Outcome, learn
from sagequeue.forecast.engine import JobForecast
from sagequeue.forecast.live import SETTINGS, LiveQueue
from sagequeue.forecast.live import calibrated as live_calibrated
from sagequeue.forecast.model import ForecastSettings
from sagequeue.forecast.stored import calibrated as stored_calibrated

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
HORIZON = ForecastSettings().horizon_seconds
WIDEST = Calibration(pools={POOL: Adjustment(scale=CalibrationSettings().max_scale)})
#: what a store, a clock or a hostile stream might hand the module
EXTREMES = (0.0, -0.0, -1.0, -1e308, 1e-320, 1.0, 59.0, 600.0, 3600.0, 86400.0, 1e9, 1e15, 1e300, 1.7e308)
NON_FINITE = (math.inf, -math.inf, math.nan)


def _queue(calibration: Calibration) -> LiveQueue:
    return LiveQueue(NOW, {POOL: 1}, {}, [], [], [], calibration)


@pytest.mark.parametrize(
    "engine",
    [
        (0.0, 60.0, 10 * 86400.0),  # starts at the next pass in most runs, after a week-long job in some
        (0.0, 0.0, 6 * 86400.0),
        (30.0, 600.0, HORIZON),
        (0.0, 300.0, 9 * 86400.0),
    ],
)
def test_the_widest_scale_never_stretches_a_range_past_the_horizon_or_any_date(
    engine: tuple[float, float, float],
) -> None:
    # GIVEN a pool whose calibration is at its bound (a tenant can drive it there, ADR 0026) and a forecast
    # whose P50 is near and whose P90 is days away, as the engine makes them (P90 within its horizon)
    result = JobForecast("spread", NOW, (engine[0], engine[1], engine[2]))
    assert (result.p10, result.p50, result.p90) == engine
    # WHEN the forecast function calibrates it and stores it as dates
    quantiles = stored_calibrated(result, POOL, WIDEST)
    dates = [result.at(q) for q in quantiles]  # raised OverflowError: a P90 thousands of years on
    # THEN the range is as wide as the bound allows up to the horizon, and open past it
    assert quantiles[0] <= quantiles[1] <= quantiles[2]
    assert quantiles[1] == engine[1]
    assert quantiles[2] <= HORIZON or math.isinf(quantiles[2])
    assert quantiles[2] >= engine[2]
    assert all(d is None or d <= NOW.replace(year=NOW.year + 1) for d in dates)
    # and the CLI, which forecasts on the caller's machine and shows it the same way
    shown = live_calibrated(_queue(WIDEST), result, POOL)
    assert (shown.p10, shown.p50, shown.p90) == quantiles
    assert shown.to_dict()["p50"] == result.to_dict()["p50"]


def test_the_cli_and_the_function_use_the_same_horizon() -> None:
    assert SETTINGS.horizon_seconds == HORIZON


def test_no_quantiles_at_the_edges_of_floats_make_apply_raise_or_leave_their_order() -> None:
    rng = random.Random(20261127)
    for scale in (1 / 3, 0.5, 1.0, 2.0, 3.0):
        for shift in (0.0, -1.0, 1.0):
            adjustment = Adjustment(scale=scale, shift=shift)
            for _ in range(400):
                quantiles = sorted(rng.choice((*EXTREMES, math.inf)) for _ in range(3))
                low, middle, high = adjustment.apply((quantiles[0], quantiles[1], quantiles[2]))
                assert low <= middle <= high, (scale, shift, quantiles)
                assert not any(math.isnan(q) for q in (low, middle, high))


def test_a_log_with_numbers_no_clock_gives_still_learns_a_finite_bounded_calibration() -> None:
    settings = CalibrationSettings()
    rng = random.Random(33)
    values = EXTREMES + NON_FINITE
    for _ in range(300):
        past = [
            Outcome(
                pool=rng.choice((POOL, OTHER)),
                age=rng.choice(values),
                quantiles=tuple(sorted(rng.choice(EXTREMES) for _ in range(3))),  # type: ignore[arg-type]
                started=rng.choice((None, *values)),
                waited=rng.choice(values),
            )
            for _ in range(rng.randint(0, 25))
        ]
        learnt = learn(past, settings)
        for adjustment in (*learnt.pools.values(), learnt.fallback):
            assert 1 / settings.max_scale <= adjustment.scale <= settings.max_scale
            assert math.isfinite(adjustment.weight), adjustment
            assert adjustment.weight >= 0
            assert math.isfinite(adjustment.shift)
        # and what it stores reads back as itself
        assert Calibration.from_api(learnt.to_api()).to_api() == learnt.to_api()


def test_a_pool_of_censored_forecasts_only_widens_once_they_are_past_their_p90() -> None:
    short = learn([_waiting(60.0) for _ in range(50)])
    assert short.for_pool(POOL).scale == 1.0
    late = learn([_waiting(2 * 86400.0) for _ in range(200)])
    assert late.for_pool(POOL).scale == pytest.approx(CalibrationSettings().max_scale)


def test_all_waits_zero_and_collapsed_ranges_learn_a_bounded_scale_and_stay_in_order() -> None:
    zero = (0.0, 0.0, 0.0)
    learnt = learn([_started(0.0, quantiles=zero) for _ in range(100)])
    # every start on its P50: ranges narrowed as far as the bound allows, no further
    assert learnt.for_pool(POOL).scale == pytest.approx(1 / CalibrationSettings().max_scale)
    for quantiles in (zero, (3600.0, 3600.0, 3600.0), (0.0, 3600.0, 3600.0)):
        low, middle, high = learnt.apply(POOL, quantiles)
        assert low <= middle <= high
        assert middle == quantiles[1]


def test_a_collapsed_range_opens_as_far_as_its_pool_learnt() -> None:
    # GIVEN a pool whose forecasts said "now" (P10 = P50 = P90 = 0) and whose jobs started a minute later
    rng = random.Random(7)
    waits = [rng.uniform(30.0, 90.0) for _ in range(200)]
    learnt = learn([_started(wait, quantiles=(0.0, 0.0, 0.0)) for wait in waits])
    # WHEN a new collapsed forecast is calibrated with what the pool learnt
    low, middle, high = learnt.apply(POOL, (0.0, 0.0, 0.0))
    # THEN its range opens above its P50, so that it holds the share of starts the calibration aims at
    assert low == middle == 0.0
    assert high > 0.0
    covered = sum(wait <= high for wait in waits) / len(waits)
    assert covered == pytest.approx(CalibrationSettings().coverage, abs=0.05)
