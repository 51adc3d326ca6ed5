"""Forecasts scored during a simulation: several forecasts side by side in one run of a trace."""

from __future__ import annotations

from sagequeue.forecast.calibrate import CalibrationSettings
from sagequeue.sim import SimSettings, WorkloadSpec, generate
from sagequeue.sim.forecast import scored_run, scored_runs

CAPACITY = {"ml.trn1.32xlarge": 2, "ml.trn2.48xlarge": 1}


def test_forecasts_side_by_side_are_scored_on_the_same_jobs_at_the_same_moments() -> None:
    trace = generate(WorkloadSpec(jobs=24, days=1, capacity=CAPACITY), seed=3)
    settings = SimSettings(capacity=CAPACITY)
    scored = scored_runs(
        trace,
        settings,
        every_seconds=3600.0,
        variants={
            "before": {"samples": 4, "arrival_rate_spread": 0.0, "resample_history": False},
            "now": {"samples": 4},
            "oracle": {"samples": 4, "oracle": True},
        },
    )
    (before, made_before), (now, made_now), (oracle, _) = scored["before"], scored["now"], scored["oracle"]
    assert before.pairs == now.pairs == oracle.pairs > 0
    assert [(m.job, m.made, m.actual) for m in made_before] == [(m.job, m.made, m.actual) for m in made_now]
    assert len(before.seconds) == len(now.seconds) > 0
    # the calibrated forecast is a different forecast, not a copy
    assert [m.p50 for m in made_before] != [m.p50 for m in made_now]
    # one forecast alone scores as it does beside the others
    alone, _ = scored_run(trace, settings, every_seconds=3600.0, samples=4)
    assert (alone.pairs, alone.covered, alone.errors) == (now.pairs, now.covered, now.errors)


def test_calibrated_forecasts_are_the_same_forecasts_moved_by_what_the_run_had_seen_so_far() -> None:
    trace = generate(WorkloadSpec(jobs=40, days=1, capacity=CAPACITY), seed=5)
    settings = SimSettings(capacity=CAPACITY)
    # a calibration that moves on little evidence, so that a few hours of outcomes change it
    eager = CalibrationSettings(prior=1.0)
    variants = {"now": {"samples": 4}, "calibrated": {"calibrate": "now", "calibration": eager}}
    whole = scored_runs(trace, settings, every_seconds=3600.0, variants=variants)
    (now, made_now), (calibrated, made_calibrated) = whole["now"], whole["calibrated"]
    # the same jobs at the same moments, with the engine's P50 (the calibration leaves it) and moved ranges
    assert [(m.job, m.made, m.actual, m.p50) for m in made_now] == [
        (m.job, m.made, m.actual, m.p50) for m in made_calibrated
    ]
    assert calibrated.pairs == now.pairs > 0
    assert [(m.p10, m.p90) for m in made_now] != [(m.p10, m.p90) for m in made_calibrated]
    # nothing after a forecast's moment is read: a run stopped early calibrates its forecasts the same
    cut = sorted({m.made for m in made_now})[len({m.made for m in made_now}) // 2]
    early = scored_runs(trace, settings, every_seconds=3600.0, horizon_seconds=cut + 1.0, variants=variants)
    before_cut = [(m.job, m.made, m.p10, m.p90) for m in made_calibrated if m.made <= cut]
    assert [(m.job, m.made, m.p10, m.p90) for m in early["calibrated"][1]] == before_cut
