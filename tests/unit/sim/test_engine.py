"""The simulation engine and its modelled SageMaker, on traces whose outcome can be worked out by hand, and
seeded random traces checked for conservation (capacity, work, jobs) under every scheduler."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from sagequeue.sim import SimSettings, Timings, Trace, TraceJob, Variant, generate, simulate
from sagequeue.sim.engine import Simulation
from sagequeue.sim.metrics import Recorder, percentile
from sagequeue.sim.sagemaker import Phase
from sagequeue.sim.schedulers import SCHEDULERS, SagequeuePolicy
from sagequeue.sim.workload import WorkloadSpec
from sagequeue_core.policy import Preempt

POOL = "ml.trn1.32xlarge"
T = Timings(
    cold_start_seconds=100,
    warm_start_seconds=10,
    download_seconds=20,
    upload_seconds=5,
    stop_grace_seconds=40,
)


def run(trace: Trace, scheduler: str = "sagequeue", **changes: object) -> dict[str, object]:
    base = SimSettings(
        capacity={POOL: 2}, min_runtime_before_preemption_seconds=0, default_keep_alive_seconds=0
    )
    (result,) = simulate(trace, [Variant(scheduler, scheduler, base.with_changes(**changes))], T)
    return {"summary": result.summary, "jobs": result.recorder.jobs}


def test_a_cold_job_ends_after_start_download_training_and_upload() -> None:
    out = run(Trace((TraceJob("a", 10, 1, POOL, 1, 1000),)))
    record = out["jobs"]["a"]  # type: ignore[index]
    # submitted at 10, created at once: 100 s Starting, 20 s Downloading, 1000 s Training, 5 s Uploading
    assert record.first_start == 10
    assert record.ended == 10 + 100 + 20 + 1000 + 5


def test_a_sweep_reuses_the_warm_pool_of_its_family_and_starts_warm() -> None:
    trace = Trace(
        (
            TraceJob("s1", 0, 1, POOL, 2, 100, keep_alive_seconds=300, family="f"),
            TraceJob("s2", 1, 1, POOL, 2, 100, keep_alive_seconds=300, family="f"),
            TraceJob("other", 2, 1, POOL, 2, 100),
        )
    )
    out = run(trace)
    jobs = out["jobs"]
    s1_end = 100 + 20 + 100 + 5
    assert jobs["s1"].ended == s1_end  # type: ignore[index]
    assert jobs["s2"].warm_starts == 1  # type: ignore[index]
    assert jobs["s2"].ended == s1_end + 10 + 20 + 100 + 5  # type: ignore[index]


def test_preemption_loses_the_work_since_the_last_checkpoint() -> None:
    trace = Trace(
        (
            TraceJob("low", 0, 1, POOL, 2, 3000, checkpoint_minutes=10),
            TraceJob("high", 1000, 9, POOL, 2, 100),
        )
    )
    out = run(trace)
    jobs = out["jobs"]
    low, high = jobs["low"], jobs["high"]  # type: ignore[index]
    # low trains from 120 s; preempted at 1000 s (880 s trained, checkpoint at 600 s): 280 s lost, on 2 instances
    assert low.preemptions == 1
    assert low.work_lost == 880 - 600
    assert out["summary"]["work_lost_instance_hours"] == 2 * 280 / 3600  # type: ignore[index]
    assert high.first_start == 1000 + 40  # after the victim's stop grace
    # low resumes after high: 2400 s of its 3000 s left
    high_end = 1040 + 100 + 20 + 100 + 5
    assert low.ended == high_end + 100 + 20 + 2400 + 5


def test_without_checkpoints_a_preempted_job_starts_over() -> None:
    trace = Trace((TraceJob("low", 0, 1, POOL, 2, 3000), TraceJob("high", 1000, 9, POOL, 2, 100)))
    low = run(trace)["jobs"]["low"]  # type: ignore[index]
    assert low.work_lost == 880
    assert low.ended == 1040 + 225 + 100 + 20 + 3000 + 5


def test_a_quota_below_capacity_refuses_creates_and_nothing_starts_beyond_it() -> None:
    trace = Trace(tuple(TraceJob(f"j{i}", 0, 1, POOL, 1, 600) for i in range(3)))
    out = run(trace, "fifo", quota={POOL: 1})
    summary = out["summary"]
    assert summary["refused_creates"] > 0  # type: ignore[index]
    starts = sorted(r.first_start for r in out["jobs"].values())  # type: ignore[union-attr]
    # one at a time: each starts when the one before ends
    assert starts == [0, 725, 1450]


def test_capacity_errors_are_retried_with_backoff_then_fail() -> None:
    trace = Trace((TraceJob("a", 0, 1, POOL, 1, 60),))
    base = SimSettings(capacity={POOL: 1}, max_attempts=2, retry_backoff_seconds=60)
    (result,) = simulate(
        trace,
        [Variant("sq", "sagequeue", base)],
        Timings(capacity_error_rate=1.0, capacity_error_after_seconds=100),
    )
    record = result.recorder.jobs["a"]
    assert record.attempts == 2
    assert record.outcome == "failed"
    assert result.summary["failed"] == 1
    assert result.summary["unfinished"] == 0


def test_fifo_is_submission_order_and_priority_is_priority_order() -> None:
    trace = Trace(
        (
            TraceJob("first", 0, 1, POOL, 2, 100),
            TraceJob("low", 1, 1, POOL, 1, 100),
            TraceJob("high", 2, 9, POOL, 1, 100),
            TraceJob("wide", 3, 5, POOL, 2, 100),
        )
    )

    def starts(scheduler: str) -> dict[str, float]:
        return {n: r.first_start for n, r in run(trace, scheduler)["jobs"].items()}  # type: ignore[union-attr]

    first_end = 100 + 20 + 100 + 5
    # FIFO: low and high (in submission order) take the two freed instances; wide waits for both
    fifo = starts("fifo")
    assert fifo["low"] == fifo["high"] == first_end < fifo["wide"]
    # priority: high, then wide blocks the pool for low (no backfill, no preemption)
    by_priority = starts("priority")
    assert by_priority["high"] == first_end < by_priority["wide"] <= by_priority["low"]


def test_the_naive_scheduler_preempts_one_job_per_pass_and_ignores_warm_pools() -> None:
    trace = Trace(
        (
            TraceJob("a", 0, 1, POOL, 1, 5000, keep_alive_seconds=600, family="a"),
            TraceJob("b", 0, 1, POOL, 1, 5000),
            TraceJob("c", 1000, 9, POOL, 1, 100),
            TraceJob("d", 1000, 9, POOL, 1, 100),
        )
    )
    sim = Simulation(trace, SCHEDULERS["naive"](), SimSettings(capacity={POOL: 2}), T)
    per_pass: list[int] = []
    original = sim.carry_out

    def spy(actions):  # type: ignore[no-untyped-def]
        per_pass.append(sum(isinstance(a, Preempt) for a in actions))
        original(actions)

    sim.carry_out = spy  # type: ignore[method-assign]
    recorder = sim.run()
    assert max(per_pass) == 1
    assert sum(per_pass) == 2
    # a's stop left a warm pool the naive scheduler does not count: its creates were refused meanwhile
    assert recorder.refused_creates > 0


def test_skipping_quiet_timer_passes_changes_nothing() -> None:
    trace = generate(WorkloadSpec(jobs=40, days=2, capacity={POOL: 4, "ml.trn2.48xlarge": 2}), seed=7)
    base = SimSettings(capacity={POOL: 4, "ml.trn2.48xlarge": 2}, min_runtime_before_preemption_seconds=300)
    variants = [Variant(n, n, base) for n in SCHEDULERS]
    fast = simulate(trace, variants, exact=False)
    exact = simulate(trace, variants, exact=True)
    for a, b in zip(fast, exact, strict=True):
        assert {k: v for k, v in a.summary.items() if k != "passes"} == {
            k: v for k, v in b.summary.items() if k != "passes"
        }
        assert a.summary["passes"] <= b.summary["passes"]


job_strategy = st.builds(
    lambda i, submit, priority, count, duration, keep, family, ckpt: TraceJob(
        f"j{i}", submit, priority, POOL, count, duration, keep, family, ckpt
    ),
    st.integers(),
    st.integers(0, 4000),
    st.integers(0, 9),
    st.sampled_from([1, 1, 2, 3]),
    st.integers(30, 3000),
    st.sampled_from([0, 0, 300]),
    st.sampled_from([None, "f", "g"]),
    st.sampled_from([None, 5.0]),
)


@settings(max_examples=25, deadline=None)
@given(
    jobs=st.lists(job_strategy, min_size=1, max_size=12),
    scheduler=st.sampled_from(sorted(SCHEDULERS)),
    min_runtime=st.sampled_from([0, 300]),
)
def test_every_job_finishes_capacity_holds_and_work_adds_up(
    jobs: list[TraceJob], scheduler: str, min_runtime: int
) -> None:
    jobs = [dataclasses.replace(j, name=f"j{n}") for n, j in enumerate(jobs)]
    trace = Trace(tuple(sorted(jobs, key=lambda j: j.submit_seconds)))
    base = SimSettings(capacity={POOL: 3}, min_runtime_before_preemption_seconds=min_runtime)
    sim = Simulation(trace, SCHEDULERS[scheduler](), base, T, horizon_seconds=10**7)
    peak = [0]
    original = sim._occupancy_changed

    def watch(pool: str, at: float) -> None:
        peak[0] = max(peak[0], sim.sagemaker.held[pool])
        original(pool, at)

    sim.sagemaker._on_change = watch
    recorder = sim.run()
    assert peak[0] <= 3, "SageMaker never holds more than the account limit"
    assert not sim.live
    assert not sim.sagemaker.live
    for job in trace.jobs:
        record = recorder.jobs[job.name]
        run = sim.runs[job.name]
        assert record.outcome == "completed"
        assert run.saved_work == job.duration_seconds
        assert record.preemptions == run.job.preemptions
        assert record.loans_taken_back == run.job.loans_taken_back
        assert record.work_lost >= 0
        assert (record.work_lost > 0) <= (record.preemptions + record.loans_taken_back > 0)
    if scheduler in ("fifo", "priority"):
        assert sum(r.preemptions + r.loans_taken_back for r in recorder.jobs.values()) == 0


def test_percentile_interpolates() -> None:
    assert percentile([], 95) is None
    assert percentile([5.0], 95) == 5.0
    assert percentile([0.0, 10.0], 50) == 5.0
    assert percentile(list(map(float, range(101))), 95) == 95.0


def test_sagequeue_scheduler_uses_the_lookahead_window() -> None:
    trace = Trace(tuple(TraceJob(f"j{i}", 0, 1, POOL, 1, 100) for i in range(5)))
    sim = Simulation(trace, SagequeuePolicy(), SimSettings(capacity={POOL: 1}, queue_lookahead=2), T)
    for spec in trace.jobs:
        sim._submit(spec)
    # j0 started on submission; the window is the next two in queue order
    assert [j.name for j in sim.window(POOL)] == ["j1", "j2"]


def _drain_with_a_small_job(checkpoint_minutes: float | None, **changes: object) -> dict[str, object]:
    # a runs alone on one of two instances; wide (same priority, both instances) drains behind it from
    # its submission on, holding the free instance; small fits that instance and waits behind wide
    trace = Trace(
        (
            TraceJob("a", 0, 5, POOL, 1, 5000, checkpoint_minutes=10),
            TraceJob("wide", 10, 5, POOL, 2, 100),
            TraceJob("small", 20, 1, POOL, 1, 100, checkpoint_minutes=checkpoint_minutes),
        )
    )
    return run(trace, reserve_after_seconds=5, **changes)["summary"]  # type: ignore[return-value]


def test_idle_beside_a_fitting_job_is_split_by_what_kept_that_job_waiting() -> None:
    without_checkpoint = _drain_with_a_small_job(None)
    lending_off = _drain_with_a_small_job(10, lend_reserved_capacity=False)
    lending_on = _drain_with_a_small_job(10)
    kinds = ("resumable", "loans spent", "no checkpoint")

    def split(summary: dict[str, object]) -> tuple[float, ...]:
        by_kind = summary["idle_while_a_waiting_job_fits_by_kind"]
        return tuple(by_kind[kind] for kind in kinds)  # type: ignore[index]

    # small may not borrow without a checkpoint: the free instance idles beside it, and says why
    idle = without_checkpoint["idle_while_a_waiting_job_fits"]
    assert idle > 0.3  # type: ignore[operator]
    assert split(without_checkpoint) == (0, 0, idle)
    # with one, only lending kept it waiting: the idle share is the same, as "resumable"
    assert split(lending_off) == (lending_off["idle_while_a_waiting_job_fits"], 0, 0)
    assert split(lending_off)[0] == idle
    # and with lending on it borrows the instance: nothing fitting idles
    assert lending_on["idle_while_a_waiting_job_fits"] == 0


def _wide_behind(priority: int, **changes: object) -> dict[str, float]:
    # "a" holds one of two instances for 2000 s of training; "wide" (priority 5, both instances) waits from
    # t=10; nothing else is queued, so the free instance idles with no waiting job that fits it
    trace = Trace(
        (
            TraceJob("a", 0, priority, POOL, 1, 2000, checkpoint_minutes=10),
            TraceJob("wide", 10, 5, POOL, 2, 100),
        )
    )
    summary = run(trace, **changes)["summary"]
    assert summary["idle_while_a_waiting_job_fits"] == 0  # type: ignore[index]
    return summary["idle_while_no_waiting_job_fits_by_kind"]  # type: ignore[index,return-value]


def test_idle_no_start_could_fill_behind_equal_or_higher_priority_is_told_apart() -> None:
    for priority in (5, 9):
        forced = _wide_behind(priority)
        # "a" is at least as important as "wide": it runs to its end while the other instance idles,
        # for about half the capacity while "wide" waits (2,125 s of the 2,125 + 125 s of backlog)
        assert forced["behind equal or higher priority"] > 0.4
        assert forced["behind lower priority or a warm pool"] == 0


def test_idle_behind_less_important_work_not_yet_preemptible_is_its_own_share() -> None:
    # "a" is less important but protected by its minimum runtime, then stopped within its grace
    protected = _wide_behind(1, min_runtime_before_preemption_seconds=1000)
    assert protected["behind lower priority or a warm pool"] > 0.4
    assert protected["behind equal or higher priority"] == 0
    # with no minimum runtime it is preempted at once: only its stop grace idles (40 s of a short backlog)
    at_once = _wide_behind(1)
    assert (
        0
        < at_once["behind lower priority or a warm pool"]
        < protected["behind lower priority or a warm pool"]
    )
    assert at_once["behind equal or higher priority"] == 0


NOW = datetime(2026, 1, 1, tzinfo=UTC)
FORCED, OTHER = "behind equal or higher priority", "behind lower priority or a warm pool"


def _blocked(
    capacity: int,
    waiting: dict[str, tuple[int, int]],  # name -> (priority, instances)
    holder_priority: int = 5,
    warm_instances: int = 0,
    backing_off: frozenset[str] = frozenset(),
    team_quotas: tuple[object, ...] = (),
) -> str | None:
    """The recorder alone on a state built by hand (the simulated SageMaker releases warm pools at once,
    so some states never last in a run): "a" trains on one instance of the pool, with `holder_priority`."""
    attempt = SimpleNamespace(pool=POOL, phase=Phase.TRAINING, instances=1, job_name="a")
    warm = {"w": SimpleNamespace(pool=POOL, instances=warm_instances)} if warm_instances else {}
    later = datetime(2026, 1, 2, tzinfo=UTC)
    queued = {
        name: SimpleNamespace(
            demand={POOL: instances},
            not_before=later if name in backing_off else None,
            priority=priority,
            checkpointed=True,
        )
        for name, (priority, instances) in waiting.items()
    }
    sim = SimpleNamespace(
        sagemaker=SimpleNamespace(live={"a": attempt}, warm=warm),
        queued={POOL: queued},
        runs={"a": SimpleNamespace(spec=SimpleNamespace(priority=holder_priority, team=None))},
        now_dt=NOW,
        settings=SimpleNamespace(capacity={POOL: capacity}, team_quotas=team_quotas),
    )
    recorder = Recorder({POOL: capacity}, timeline=False)
    recorder.occupancy(sim, POOL, 0.0)  # type: ignore[arg-type]
    return recorder.pools[POOL].blocked


def test_idle_a_warm_pool_release_would_fill_is_not_counted_as_forced() -> None:
    # on a pool of 3, "a" (priority 9) trains on one instance, a warm pool keeps another, one is free, and
    # "wide" (priority 5, two instances) waits: releasing the warm pool would make room for it
    assert _blocked(3, {"wide": (5, 2)}, holder_priority=9, warm_instances=1) == OTHER
    # the same pool without the warm pool (one instance fewer): nothing but more important work holds it
    assert _blocked(2, {"wide": (5, 2)}, holder_priority=9) == FORCED


def test_forced_idle_is_judged_against_the_most_important_job_that_may_start() -> None:
    # "a" (priority 5) is more important than "low" but not than "high": "high" could preempt it
    assert _blocked(2, {"low": (3, 2), "high": (9, 2)}) == OTHER
    assert _blocked(2, {"low": (3, 2)}) == FORCED
    # a job backing off may not start now: it does not make the idle preventable...
    assert _blocked(2, {"low": (3, 2), "high": (9, 2)}, backing_off=frozenset({"high"})) == FORCED
    # ...nor does a job that can never fit the pool (wider than its capacity)
    assert _blocked(2, {"low": (3, 2), "huge": (9, 3)}) == FORCED
    # and with only such jobs waiting, the idle is in neither share
    assert _blocked(2, {"huge": (9, 3)}) is None
    assert _blocked(2, {"high": (9, 2)}, backing_off=frozenset({"high"})) is None


def test_with_team_quotas_no_idle_is_counted_as_forced() -> None:
    # a team under its quota reclaims other teams' work whatever its priority
    assert _blocked(2, {"low": (3, 2)}, team_quotas=(object(),)) == OTHER


def test_the_worst_gang_class_names_its_priority_and_its_small_jobs_mean_wait() -> None:
    # a pool of 4 taken by one whole-pool job; then, in submission order, a small and a whole-pool job at
    # priority 5 and the same at priority 3. Priority 5's gangs include the one that started at once, so its
    # ratio is lower: the worst class is the second one looked at, not the first.
    trace = Trace(
        (
            TraceJob("f5", 0, 5, POOL, 4, 1000),
            TraceJob("s5", 1, 5, POOL, 1, 100),
            TraceJob("g5", 2, 5, POOL, 4, 100),
            TraceJob("s3", 3, 3, POOL, 1, 100),
            TraceJob("g3", 4, 3, POOL, 4, 100),
        )
    )
    out = run(trace, "fifo", capacity={POOL: 4})
    jobs = out["jobs"]
    wait = {name: job.first_start - job.submitted for name, job in jobs.items()}  # type: ignore[attr-defined]
    ratio_5 = (wait["f5"] + wait["g5"]) / 2 / wait["s5"]
    ratio_3 = wait["g3"] / wait["s3"]
    assert wait["s3"] > 0
    assert ratio_3 > ratio_5
    summary = out["summary"]
    assert summary["gang_over_small_worst_class"] == {"priority": 3, "small_mean_wait": wait["s3"]}  # type: ignore[index]
    assert summary["gang_over_small_wait_same_priority"] == ratio_3  # type: ignore[index]
