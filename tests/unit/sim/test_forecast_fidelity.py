"""The forward run follows the scheduler and SageMaker as the simulator models them: run with every training
time and later submission known (the full oracle), it forecasts the starts that happen; and the reference
forecasts that know the workload's distribution draw as the generator draws."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from sagequeue.forecast import ForecastSettings, History, QueueState, Submission, Traits, Work, forecast
from sagequeue.forecast.model import Arrival
from sagequeue.sim import SimSettings, WorkloadSpec, generate
from sagequeue.sim.engine import Simulation
from sagequeue.sim.forecast import TrueArrivals, TrueRunTimes, scored_runs
from sagequeue.sim.sagemaker import Timings
from sagequeue.sim.schedulers import SagequeuePolicy
from sagequeue_core.policy import PolicySettings, QueuedJob, RunningAttempt

NOW = datetime(2026, 3, 4, 12, tzinfo=UTC)  # on the whole minute, as the scheduler's timer runs
POOL = "ml.trn1.32xlarge"
TIMINGS = Timings()
CAPACITY = {"ml.trn1.32xlarge": 4, "ml.trn2.48xlarge": 2}
#: no waits for checkpoints: the stops below happen in the pass that decides them
NO_WAIT = ForecastSettings(
    samples=3,
    arrivals=False,
    policy=PolicySettings(
        min_runtime_before_preemption_seconds=600, reserve_after_seconds=1800, checkpoint_wait_seconds=0
    ),
)


def queued(name: str, priority: int, minutes_ago: float = 5, instances: int = 1) -> QueuedJob:
    return QueuedJob(
        name=name,
        priority=priority,
        submitted_at=NOW - timedelta(minutes=minutes_ago),
        demand={POOL: instances},
    )


def running(name: str, priority: int, trained: float, **extra: object) -> RunningAttempt:
    training = NOW - timedelta(seconds=trained)
    return RunningAttempt(
        training_job_name=f"{name}-1",
        demand={POOL: 1},
        priority=priority,
        started_at=training - timedelta(seconds=TIMINGS.provisioning_seconds),
        job_name=name,
        training_started_at=training,
        **extra,  # type: ignore[arg-type]
    )


def known(seconds: float, **extra: object) -> Work:
    return Work(known_total_seconds=seconds, **extra)  # type: ignore[arg-type]


def test_a_threshold_the_clock_crosses_is_acted_on_at_the_timers_next_pass() -> None:
    # GIVEN a low-priority attempt whose minimum runtime is over 475 s from now, between two timer passes
    state = QueueState(
        now=NOW,
        capacity={POOL: 1},
        queued=[queued("urgent", 9)],
        running=[running("low", 1, trained=125)],
        work={"urgent": known(3600), "low": known(36000)},
    )
    result = forecast(state, History(), NO_WAIT).jobs["urgent"]
    # THEN the timer's pass at 480 s preempts it, and the urgent job starts when the stop lands
    assert result.p10 == result.p90 == 480 + TIMINGS.stop_grace_seconds


def test_an_attempt_that_ends_is_followed_by_a_pass_at_once_not_by_the_next_happening() -> None:
    # GIVEN two attempts ending 30 s apart and a job waiting for an instance
    state = QueueState(
        now=NOW,
        capacity={POOL: 2},
        queued=[queued("waits", 1)],
        running=[running("first", 5, trained=0), running("second", 5, trained=0)],
        work={"waits": known(3600), "first": known(1000), "second": known(1030)},
    )
    result = forecast(state, History(), NO_WAIT).jobs["waits"]
    # THEN it starts when the first ends, as the service's pass on the end event starts it
    assert result.p10 == result.p90 == 1000 + TIMINGS.upload_seconds


def test_a_stopped_attempt_keeps_the_checkpoints_written_before_the_stop_was_asked_for() -> None:
    # GIVEN a victim checkpointing every 100 s, with 1,000 s trained and a checkpoint written just now; an
    # urgent job that preempts it at once; and a last job behind both
    victim = running("victim", 5, trained=1000, last_checkpoint_at=NOW, checkpoint_interval_seconds=100.0)
    state = QueueState(
        now=NOW,
        capacity={POOL: 1},
        queued=[queued("urgent", 9), queued("last", 1)],
        running=[victim],
        work={
            "urgent": known(1000),
            "last": known(100),
            "victim": known(2000, checkpoint_interval_seconds=100.0),
        },
    )
    result = forecast(state, History(), NO_WAIT).jobs["last"]
    # THEN the victim trains no further once asked to stop (its grace writes no checkpoint): it keeps 1,000 s
    # and trains 1,000 s more after the urgent job; the last job starts when it ends
    grace, cold, upload = TIMINGS.stop_grace_seconds, TIMINGS.provisioning_seconds, TIMINGS.upload_seconds
    urgent_ends = grace + cold + 1000 + upload
    victim_ends = urgent_ends + cold + 1000 + upload
    assert result.p10 == result.p90 == victim_ends


def test_a_preempted_running_job_waits_again_in_its_submission_order() -> None:
    # GIVEN a running job submitted 2 hours ago (its attempt started 35 minutes ago), a job of the same
    # priority submitted an hour ago, and an urgent job that preempts the running one
    state = QueueState(
        now=NOW,
        capacity={POOL: 1},
        queued=[queued("urgent", 9), queued("later", 3, minutes_ago=60)],
        running=[running("earlier", 3, trained=1800, checkpointed=False)],
        work={
            "urgent": known(1000),
            "later": known(1000),
            "earlier": known(5000, submitted_at=NOW - timedelta(hours=2)),
        },
    )
    result = forecast(state, History(), NO_WAIT).jobs["later"]
    # THEN the preempted job goes first again when the urgent one ends: the later job waits for all of it
    urgent_ends = TIMINGS.stop_grace_seconds + TIMINGS.provisioning_seconds + 1000 + TIMINGS.upload_seconds
    assert (
        result.p10 == result.p90 == urgent_ends + TIMINGS.provisioning_seconds + 5000 + TIMINGS.upload_seconds
    )


class _OneArrival:
    def __init__(self, arrival: Arrival) -> None:
        self.arrival = arrival

    def draw(self, rng: random.Random) -> Sequence[Arrival]:
        return [self.arrival]


def test_a_less_important_arrival_backfills_ahead_of_a_wide_job_and_delays_it() -> None:
    # GIVEN a two-instance job waiting for one of two instances, and a one-instance job of lower priority
    # submitted 10 s from now
    state = QueueState(
        now=NOW,
        capacity={POOL: 2},
        queued=[queued("wide", 5, instances=2)],
        running=[running("runs", 5, trained=0)],
        work={"wide": known(3600), "runs": known(1000)},
    )
    low = Submission(at=NOW, priority=1, demand={POOL: 1}, traits=Traits())
    source = _OneArrival(Arrival(at=10.0, submission=low, known_total_seconds=50_000))
    with_it = forecast(state, History(), dataclasses.replace(NO_WAIT, arrivals=True), arrival_source=source)
    alone = forecast(state, History(), NO_WAIT)
    # THEN it takes the idle instance, and the wide job waits for it to be preempted once the running one ends
    runs_ends = 1000 + TIMINGS.upload_seconds
    assert alone.jobs["wide"].p50 == runs_ends
    assert with_it.jobs["wide"].p50 >= runs_ends + TIMINGS.stop_grace_seconds


def test_the_full_oracle_forecasts_the_starts_that_happen() -> None:
    # GIVEN the first five days of the documented trace, forecast every 3 hours by a forward run that knows
    # every training time and later submission (there a loan is taken back by the timer's pass after the one
    # that lent it, with nothing else happening: a forward run without that pass forecast 71 % of them)
    spec = WorkloadSpec(capacity=CAPACITY)
    trace = generate(spec, seed=1)
    trace = dataclasses.replace(trace, jobs=tuple(j for j in trace.jobs if j.submit_seconds < 5 * 86400))
    scored = scored_runs(
        trace,
        SimSettings(capacity=CAPACITY),
        every_seconds=3 * 3600,
        horizon_seconds=trace.last_submit_seconds + 3 * 86400,
        variants={"full": {"samples": 1, "truth": "full"}},
        spec=spec,
    )
    _, made = scored["full"]
    errors = [abs(m.p50 - m.actual) for m in made if m.actual is not None]
    assert len(errors) >= 200
    # THEN nearly every forecast is within a few minutes of the start (what is left: checkpoint intervals
    # that drift, which the forward run does not know)
    within = sum(e <= 300 for e in errors) / len(errors)
    assert within >= 0.9, (within, sorted(errors)[-10:])


def test_true_run_times_are_the_generators_given_what_a_job_trained() -> None:
    spec = WorkloadSpec()
    model = TrueRunTimes(spec)
    rng = random.Random(3)
    draws = [model.draw(rng, Traits()) for _ in range(4000)]
    assert abs(statistics.median(draws) / spec.median_duration_seconds - 1) < 0.08
    assert min(draws) >= spec.min_duration_seconds
    assert max(draws) <= spec.max_duration_seconds
    # conditioned on 5 hours trained: never less, and the median of the rest of the log-normal
    later = [model.draw(rng, Traits(), at_least=5 * 3600) for _ in range(4000)]
    assert min(later) >= 5 * 3600
    normal = statistics.NormalDist(math.log(spec.median_duration_seconds), spec.duration_sigma)
    expected = math.exp(normal.inv_cdf((1 + normal.cdf(math.log(5 * 3600))) / 2))
    assert abs(statistics.median(later) / expected - 1) < 0.08


def test_true_arrivals_draw_the_jobs_still_to_come_within_the_trace() -> None:
    spec = WorkloadSpec(days=3, jobs=120, capacity=CAPACITY)
    trace = generate(spec, seed=2)
    stopped_at = 86400.0
    sim = Simulation(trace, SagequeuePolicy(), SimSettings(capacity=CAPACITY), horizon_seconds=stopped_at)
    sim.run()
    source = TrueArrivals(spec, trace, sim)
    left = len(trace.jobs) - len(sim.runs)
    assert left > 0
    for seed in range(5):
        drawn = source.draw(random.Random(seed))
        assert len(drawn) == left
        assert all(0 < a.at <= spec.days * 86400 - sim.now for a in drawn)
        assert all(a.submission.priority in spec.priorities for a in drawn)
        assert all(a.known_total_seconds is not None for a in drawn)
        # the checkpoints of each, as the generator drew them: a stop in the run keeps what they saved
        intervals = {a.checkpoint_interval_seconds for a in drawn}
        assert intervals <= {None} | {60 * m for m in spec.checkpoint_minutes}
        assert intervals - {None}
