"""The forecast engine: the real policy run forward from a queue state, with drawn run times."""

from __future__ import annotations

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
