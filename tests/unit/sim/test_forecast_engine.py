"""The forecast engine: the real policy run forward from a queue state, with drawn run times."""

from __future__ import annotations

import dataclasses
import math
import time
from datetime import UTC, datetime, timedelta

from sagequeue.forecast import (
    ForecastSettings,
    History,
    QueueState,
    Submission,
    Traits,
    Work,
    forecast,
)
from sagequeue.forecast.model import RunTimes
from sagequeue.sim.sagemaker import Timings
from sagequeue_core.domain import Reservation, ReservationKind
from sagequeue_core.policy import PolicySettings, QueuedJob, RunningAttempt

NOW = datetime(2026, 3, 4, 12, tzinfo=UTC)
POOL = "ml.trn1.32xlarge"
TIMINGS = Timings()
PROVISIONING = TIMINGS.provisioning_seconds
HOUR = 3600.0


def queued(
    name: str, priority: int = 1, instances: int = 1, minutes_ago: float = 5, **extra: object
) -> QueuedJob:
    return QueuedJob(
        name=name,
        priority=priority,
        submitted_at=NOW - timedelta(minutes=minutes_ago),
        demand={POOL: instances},
        **extra,  # type: ignore[arg-type]
    )


def running(name: str, trained_seconds: float, priority: int = 1, instances: int = 1) -> RunningAttempt:
    training = NOW - timedelta(seconds=trained_seconds)
    return RunningAttempt(
        training_job_name=f"{name}-1",
        demand={POOL: instances},
        priority=priority,
        started_at=training - timedelta(seconds=PROVISIONING),
        job_name=name,
        training_started_at=training,
    )


def history(seconds: float, count: int = 20) -> History:
    return History(completed=[(Traits(instances=1), seconds) for _ in range(count)])


SETTINGS = ForecastSettings(samples=20, arrivals=False)


def test_a_job_that_fits_starts_now() -> None:
    state = QueueState(now=NOW, capacity={POOL: 2}, queued=[queued("a")])
    result = forecast(state, history(HOUR), SETTINGS)
    assert result.jobs["a"].p10 == result.jobs["a"].p90 == 0.0


def test_a_waiting_job_starts_when_the_running_one_is_drawn_to_end() -> None:
    # GIVEN every completed job trained one hour, and the running one has trained 20 minutes
    state = QueueState(
        now=NOW, capacity={POOL: 1}, queued=[queued("waits")], running=[running("runs", 20 * 60)]
    )
    result = forecast(state, history(HOUR), SETTINGS).jobs["waits"]
    # THEN it starts when the running one has trained its remaining 40 minutes and uploaded (jitter aside)
    expected = 40 * 60 + TIMINGS.upload_seconds
    assert result.p10 <= result.p50 <= result.p90
    assert abs(result.p50 - expected) < 0.25 * HOUR
    assert result.p90 - result.p10 > 60  # a range, not one number


def test_max_runtime_bounds_the_run_time_drawn() -> None:
    state = QueueState(
        now=NOW,
        capacity={POOL: 1},
        queued=[queued("waits")],
        running=[running("runs", 60)],
        work={"runs": Work(max_runtime_seconds=600)},
    )
    result = forecast(state, history(10 * HOUR), SETTINGS).jobs["waits"]
    assert result.p90 <= 600 + TIMINGS.upload_seconds + SETTINGS.pass_every_seconds


def test_higher_priority_goes_first_in_every_run() -> None:
    state = QueueState(
        now=NOW,
        capacity={POOL: 1},
        queued=[queued("low", priority=1, minutes_ago=60), queued("high", priority=5)],
        running=[running("runs", 10 * 60, priority=9)],
    )
    result = forecast(state, history(HOUR), SETTINGS)
    assert result.jobs["high"].starts == tuple(sorted(result.jobs["high"].starts))
    for high, low in zip(result.jobs["high"].starts, result.jobs["low"].starts, strict=True):
        assert high < low


def test_a_more_important_job_preempts_after_the_minimum_runtime() -> None:
    # GIVEN a low-priority attempt that has trained 2 minutes of a long run, and an urgent job
    state = QueueState(
        now=NOW,
        capacity={POOL: 1},
        queued=[queued("urgent", priority=9)],
        running=[running("long", 120, priority=1)],
    )
    settings = ForecastSettings(
        samples=10,
        arrivals=False,
        policy=PolicySettings(min_runtime_before_preemption_seconds=600, reserve_after_seconds=1800),
    )
    result = forecast(state, history(20 * HOUR), settings).jobs["urgent"]
    # THEN it starts once the victim trained its 10 minutes and stopped (grace), never after its 20 hours
    expected = 600 - 120 + TIMINGS.stop_grace_seconds
    assert abs(result.p50 - expected) <= 2 * SETTINGS.pass_every_seconds
    assert result.p90 < HOUR


def test_a_reservation_holder_is_not_overtaken_by_later_small_jobs() -> None:
    # GIVEN a wide job holding a drain reservation on a pool where one instance is free now
    reservation = Reservation(instances={POOL: 1}, since=NOW - timedelta(hours=1), kind=ReservationKind.DRAIN)
    state = QueueState(
        now=NOW,
        capacity={POOL: 2},
        queued=[
            queued("wide", priority=3, instances=2, minutes_ago=90, reservation=reservation),
            queued("small", priority=3, minutes_ago=1, checkpointed=False),  # it cannot borrow
        ],
        running=[running("runs", 30 * 60, priority=3)],
    )
    result = forecast(state, history(HOUR), SETTINGS)
    assert result.jobs["small"].p10 >= result.jobs["wide"].p10 > 0  # nobody takes the held instance


def test_a_small_checkpointed_job_borrows_a_waiting_reservation() -> None:
    reservation = Reservation(instances={POOL: 1}, since=NOW - timedelta(hours=1), kind=ReservationKind.DRAIN)
    state = QueueState(
        now=NOW,
        capacity={POOL: 2},
        queued=[
            queued("wide", priority=3, instances=2, minutes_ago=90, reservation=reservation),
            queued("small", priority=3, minutes_ago=1),
        ],
        running=[running("runs", 30 * 60, priority=3)],
    )
    result = forecast(state, history(HOUR), SETTINGS)
    assert result.jobs["small"].p90 == 0.0  # on loan, now
    assert result.jobs["wide"].p10 > 0


def test_later_arrivals_of_higher_priority_push_a_low_job_back() -> None:
    state = QueueState(
        now=NOW, capacity={POOL: 1}, queued=[queued("low", priority=1)], running=[running("runs", 0)]
    )
    seen = History(
        completed=[(Traits(instances=1), HOUR)] * 20,
        submissions=[
            Submission(at=NOW - timedelta(minutes=10 * i), priority=9, demand={POOL: 1}, traits=Traits())
            for i in range(1, 200)
        ],
    )
    alone = forecast(state, seen, ForecastSettings(samples=5, arrivals=False)).jobs["low"]
    ahead = ForecastSettings(samples=5, arrivals=True, arrivals_ahead_seconds=2 * HOUR)
    crowded = forecast(state, seen, ahead).jobs["low"]
    assert crowded.p50 > alone.p50 + HOUR


def test_run_times_are_drawn_by_the_most_specific_trait_with_history() -> None:
    import random

    times = RunTimes(
        [(Traits(user="alice", instances=1), 100.0)] * 10 + [(Traits(user="bob", instances=1), 10_000.0)] * 10
    )
    rng = random.Random(1)
    assert max(times.draw(rng, Traits(user="alice")) for _ in range(50)) < 200
    assert min(times.draw(rng, Traits(user="bob")) for _ in range(50)) > 5_000
    # a job that trained past everything seen runs on rather than being drawn to have ended
    assert times.draw(rng, Traits(user="alice"), at_least=500.0) >= 500.0


def test_the_same_state_gives_the_same_forecast() -> None:
    state = QueueState(
        now=NOW, capacity={POOL: 1}, queued=[queued("a"), queued("b")], running=[running("r", 60)]
    )
    first = forecast(state, history(HOUR), SETTINGS)
    again = forecast(state, history(HOUR), SETTINGS)
    assert first.jobs == again.jobs


def test_a_job_that_never_fits_is_reported_past_the_horizon() -> None:
    state = QueueState(now=NOW, capacity={POOL: 2}, queued=[queued("huge", instances=4)])
    result = forecast(state, history(HOUR), SETTINGS).jobs["huge"]
    assert math.isinf(result.p50)
    assert result.to_dict()["p50"] is None


def test_two_hundred_queued_jobs_forecast_quickly() -> None:
    jobs = [queued(f"j{i}", priority=i % 5, minutes_ago=i) for i in range(200)]
    state = QueueState(
        now=NOW,
        capacity={POOL: 8},
        queued=jobs,
        running=[running(f"r{i}", 600 * i) for i in range(8)],
    )
    began = time.perf_counter()
    result = forecast(state, history(HOUR), ForecastSettings(samples=4, arrivals=False))
    assert time.perf_counter() - began < 30
    assert all(not math.isinf(result.jobs[j.name].p50) for j in jobs)


def test_the_p10_p90_range_of_few_runs_holds_a_new_draw_eight_times_in_ten() -> None:
    import random

    from sagequeue.forecast import JobForecast

    rng = random.Random(3)
    trials, held = 4000, 0
    for _ in range(trials):
        runs = JobForecast("j", NOW, tuple(sorted(rng.expovariate(1.0) for _ in range(10))))
        held += runs.p10 <= rng.expovariate(1.0) <= runs.p90
    assert 0.77 <= held / trials <= 0.83


def test_a_time_budget_stops_drawing_runs_after_the_minimum() -> None:
    jobs = [queued(f"j{i}", priority=i % 5, minutes_ago=i) for i in range(60)]
    state = QueueState(
        now=NOW, capacity={POOL: 4}, queued=jobs, running=[running(f"r{i}", 600) for i in range(4)]
    )
    budgeted = ForecastSettings(samples=40, arrivals=False, budget_seconds=0.0, min_samples=3)
    result = forecast(state, history(HOUR), budgeted)
    assert result.samples == 3
    assert all(len(result.jobs[j.name].starts) == 3 for j in jobs)


# --- narrow passes: the same plans as passes reading the whole window --------------------------------------


def _busy_state(seed: int) -> tuple[QueueState, History]:
    """A random busy queue on two pools: priorities, widths, reservations, loans, warm pools with resource
    keys, stopping attempts and backoffs, more queued than a narrow pass reads."""
    import random

    from sagequeue.forecast import RetainedPool
    from sagequeue_core.domain import ResourceKey
    from sagequeue_core.policy import WarmPool

    rng = random.Random(seed)
    pools = {POOL: 4, "ml.trn2.48xlarge": 2}
    keys = [ResourceKey("role", pool, n, 100) for pool in pools for n in (1, 2)]
    jobs = []
    for i in range(rng.randint(12, 40)):
        pool = rng.choice(list(pools))
        width = rng.choice((1, 1, 1, 2, pools[pool]))
        key = rng.choice([k for k in keys if k.pool == pool and k.instance_count == width] + [None])
        reservation = None
        if rng.random() < 0.1:
            reservation = Reservation(
                instances={pool: rng.randint(0, width)},
                since=NOW - timedelta(minutes=rng.uniform(0, 90)),
                kind=ReservationKind.DRAIN,
            )
        jobs.append(
            QueuedJob(
                name=f"q{i:02d}",
                priority=rng.choice((1, 3, 5, 6, 9)),
                submitted_at=NOW - timedelta(minutes=rng.uniform(0, 300)),
                demand={pool: width},
                resource_key=key,
                reservation=reservation,
                checkpointed=rng.random() < 0.7,
                not_before=NOW + timedelta(minutes=20) if rng.random() < 0.05 else None,
            )
        )
    attempts = []
    for pool, capacity in pools.items():
        used = 0
        while used < capacity and rng.random() < 0.85:
            width = min(rng.choice((1, 1, 2)), capacity - used)
            used += width
            trained = rng.uniform(0, 3 * HOUR)
            lender = rng.choice(jobs).name if rng.random() < 0.1 else None
            attempts.append(
                RunningAttempt(
                    training_job_name=f"r-{pool}-{used}",
                    demand={pool: width},
                    priority=rng.choice((1, 3, 5, 9)),
                    started_at=NOW - timedelta(seconds=trained + PROVISIONING),
                    job_name=f"r-{pool}-{used}",
                    training_started_at=NOW - timedelta(seconds=trained),
                    stopping=rng.random() < 0.05,
                    on_loan_for=lender,
                )
            )
    warm = []
    if rng.random() < 0.3:
        key = rng.choice(keys)
        warm.append(RetainedPool(WarmPool("w-0", key), NOW + timedelta(minutes=rng.uniform(1, 20))))
    seen = History(
        completed=[(Traits(instances=1), rng.lognormvariate(math.log(1.5 * HOUR), 1.0)) for _ in range(40)],
        submissions=[
            Submission(
                at=NOW - timedelta(hours=rng.uniform(0, 100)),
                priority=rng.choice((1, 3, 5, 9)),
                demand={(pool := rng.choice(list(pools))): 1},
                traits=Traits(),
                resource_key=rng.choice(
                    [k for k in keys if k.pool == pool and k.instance_count == 1] + [None]
                ),
                keep_alive_seconds=rng.choice((0, 600)),
            )
            for _ in range(60)
        ],
    )
    state = QueueState(
        now=NOW,
        capacity=pools,
        queued=jobs,
        running=attempts,
        warm_pools=warm,
        work={j.name: Work(keep_alive_seconds=rng.choice((0, 900))) for j in jobs},
    )
    return state, seen


def test_narrow_passes_of_the_pools_that_changed_plan_what_whole_passes_plan(monkeypatch) -> None:
    from sagequeue.forecast import engine

    # every pass is planned again reading every pool's whole window, and a difference fails the run
    monkeypatch.setattr(engine._Run, "check_narrow", True)
    counts = {"narrow": 0, "wide": 0}
    run = engine._Run.run

    def counted(self):
        started = run(self)
        counts["narrow"] += self.narrow_passes
        counts["wide"] += self.wide_passes
        return started

    monkeypatch.setattr(engine._Run, "run", counted)
    for seed in range(10):
        state, seen = _busy_state(seed)
        for k in (2, 4):
            narrow = ForecastSettings(samples=2, narrow_lookahead=k, horizon_seconds=2 * 86400.0)
            wide = dataclasses.replace(narrow, narrow_lookahead=0)
            assert forecast(state, seen, narrow).jobs == forecast(state, seen, wide).jobs, (seed, k)
    # both kinds happened: the check is not vacuous
    assert counts["narrow"] > 100
    assert counts["wide"] > 100


def test_a_narrow_pass_reads_the_whole_window_where_a_job_behind_fits_in_idle_capacity() -> None:
    # GIVEN four wide jobs at the head that cannot start, and one free instance a small job behind them fits
    state = QueueState(
        now=NOW,
        capacity={POOL: 4},
        queued=[queued(f"wide{i}", priority=5, instances=4, minutes_ago=60 - i) for i in range(4)]
        + [queued("small", priority=1, minutes_ago=1)],
        running=[running(f"r{i}", 30 * 60, priority=9) for i in range(3)],
    )
    settings = ForecastSettings(samples=3, arrivals=False, narrow_lookahead=2)
    # THEN the small job backfills the idle instance now, as a pass of the whole window decides
    assert forecast(state, history(HOUR), settings).jobs["small"].p90 == 0.0


# --- calibration --------------------------------------------------------------------------------------------


def test_each_run_draws_its_own_arrival_rate_around_last_weeks() -> None:
    import random
    import statistics

    from sagequeue.forecast.engine import Arrivals

    submissions = [
        Submission(at=NOW - timedelta(hours=2 * i), priority=5, demand={POOL: 1}, traits=Traits())
        for i in range(1, 80)
    ]
    arrivals = Arrivals(submissions, NOW)
    rng = random.Random(5)
    assert arrivals.scale(rng, 0.0) == 1.0
    scales = [arrivals.scale(rng, 0.5) for _ in range(4000)]
    assert abs(statistics.mean(scales) - 1.0) < 0.03
    expected = math.sqrt(1 / arrivals.count + 0.25)
    assert abs(statistics.stdev(scales) - expected) < 0.05
    # no submissions seen: no rate to be unsure of
    assert Arrivals([], NOW).scale(rng, 0.5) == 1.0


def test_an_uncertain_arrival_rate_widens_the_range_of_a_job_far_behind() -> None:
    state = QueueState(
        now=NOW,
        capacity={POOL: 1},
        queued=[queued("low", priority=1)],
        running=[running("runs", 0, priority=9)],
    )
    seen = History(
        completed=[(Traits(instances=1), HOUR)] * 40,
        submissions=[
            Submission(at=NOW - timedelta(hours=3 * i), priority=9, demand={POOL: 1}, traits=Traits())
            for i in range(1, 56)
        ],
    )
    fixed = ForecastSettings(samples=60, arrival_rate_spread=0.0, arrivals_ahead_seconds=86400.0)
    spread = dataclasses.replace(fixed, arrival_rate_spread=1.0)
    narrow = forecast(state, seen, fixed).jobs["low"]
    wide = forecast(state, seen, spread).jobs["low"]
    assert wide.p90 - wide.p10 > 1.3 * (narrow.p90 - narrow.p10)


def test_each_run_draws_run_times_from_a_resample_of_a_short_history() -> None:
    # GIVEN two completed jobs (one 1 h, one 4 h) and a wide job waiting for two just-started attempts
    state = QueueState(
        now=NOW,
        capacity={POOL: 2},
        queued=[queued("wide", instances=2)],
        running=[running("a", 0), running("b", 0)],
    )
    seen = History(completed=[(Traits(instances=1), HOUR), (Traits(instances=1), 4 * HOUR)])
    settings = ForecastSettings(samples=400, arrivals=False)
    # THEN both end within 2 h in a quarter of the runs drawing from the history itself, and in 3 of 8
    # when each run draws from a resample (half the resamples hold both, a quarter only the short one)
    for resample, share in ((False, 0.25), (True, 0.375)):
        jf = forecast(state, seen, dataclasses.replace(settings, resample_history=resample)).jobs["wide"]
        early = sum(start < 2 * HOUR for start in jf.starts) / len(jf.starts)
        assert abs(early - share) < 0.07, (resample, early)
