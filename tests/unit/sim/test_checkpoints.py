"""The simulator's checkpoints (docs/adr/0023): each attempt writes them at its job's interval (drifting for
some jobs), reports them to the policy, and a stop loses exactly the training since the last one."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sagequeue.sim import SimSettings, Timings, Trace, TraceJob, Variant, generate, simulate
from sagequeue.sim.sagemaker import Attempt
from sagequeue.sim.trace import TraceError, parse_jsonl
from sagequeue.sim.workload import WorkloadSpec

POOL = "ml.trn1.32xlarge"
T = Timings(
    cold_start_seconds=100,
    warm_start_seconds=10,
    download_seconds=20,
    upload_seconds=5,
    stop_grace_seconds=40,
)


def attempt(checkpoint: float | None, drift: float = 0.0, name: str = "job-1") -> Attempt:
    return Attempt(
        name=name,
        job_name="job",
        pool=POOL,
        instances=1,
        key=None,
        keep_alive_seconds=0,
        created=0.0,
        remaining_work=10**6,
        checkpoint_seconds=checkpoint,
        checkpoint_drift=drift,
    )


@settings(max_examples=50, deadline=None)
@given(
    base=st.sampled_from([60.0, 600.0, 1800.0]),
    drift=st.sampled_from([0.0, 0.1, 0.5]),
    trained=st.floats(0, 20_000),
    name=st.text("abc-", min_size=1, max_size=6),
)
def test_a_stop_loses_exactly_the_training_since_the_last_checkpoint(
    base: float, drift: float, trained: float, name: str
) -> None:
    a = attempt(base, drift, name)
    a.first_training_at = a.training_since = 500.0
    now = 500.0 + trained
    last, interval = a.checkpoints(now)
    saved = a.last_mark(trained)
    if saved is None:
        assert last is None
        assert trained < base
    else:
        assert last == 500.0 + saved
        assert 0 <= trained - saved < 2 * base  # no interval drifts beyond twice the job's
    gaps = [b - c for b, c in zip(a.marks[1:], a.marks, strict=False)]
    assert all(base / 2 - 1e-9 <= gap <= 2 * base + 1e-9 for gap in gaps)
    if drift == 0:
        assert all(abs(gap - base) < 1e-9 for gap in gaps)
    if interval is not None:
        assert interval in gaps
    # the same attempt draws the same marks however often it is asked
    again = attempt(base, drift, name)
    again.first_training_at = again.training_since = 500.0
    assert again.checkpoints(now) == (last, interval)
    # ended by a stop now: its training was counted, the loss is what lies past the last mark
    a.trained, a.training_since = trained, None
    assert trained - a.saved_work() == (trained - saved if saved is not None else trained)


def test_without_checkpoints_nothing_is_reported_and_all_is_lost() -> None:
    a = attempt(None)
    a.first_training_at = a.training_since = 0.0
    assert a.checkpoints(5000.0) == (None, None)
    a.trained, a.training_since = 5000.0, None
    assert a.saved_work() == 0.0


def run(trace: Trace, **changes: object) -> dict[str, object]:
    base = SimSettings(
        capacity={POOL: 2}, min_runtime_before_preemption_seconds=0, default_keep_alive_seconds=0
    )
    (result,) = simulate(trace, [Variant("sagequeue", "sagequeue", base.with_changes(**changes))], T)
    return {"summary": result.summary, "jobs": result.recorder.jobs}


#: "low" trains from 120 s and checkpoints every 600 s of training (at 720 s, 1320 s, 1920 s, ...); "high"
#: arrives at 1800 s, when its next checkpoint is due in 120 s and 480 s of training would be lost
WAIT_TRACE = Trace(
    (
        TraceJob("low", 0, 1, POOL, 2, 3000, checkpoint_minutes=10),
        TraceJob("high", 1800, 9, POOL, 2, 100),
    )
)


def test_the_simulated_preemption_waits_for_the_due_checkpoint_and_loses_nothing() -> None:
    out = run(WAIT_TRACE)
    low, high = out["jobs"]["low"], out["jobs"]["high"]  # type: ignore[index]
    assert low.preemptions == 1
    assert low.lost_per_stop == [0.0]  # stopped by the timer pass at its checkpoint
    assert high.first_start == 1920 + 40  # waited 120 s for it, then the stop grace


def test_without_waiting_the_same_preemption_loses_the_training_since_the_checkpoint() -> None:
    out = run(WAIT_TRACE, checkpoint_wait_seconds=0)
    low, high = out["jobs"]["low"], out["jobs"]["high"]  # type: ignore[index]
    assert low.lost_per_stop == [480.0]
    assert high.first_start == 1800 + 40
    summary = out["summary"]
    assert summary["work_lost_per_stop_instance_hours"]["mean"] == 2 * 480 / 3600  # type: ignore[index]
    assert summary["work_lost_share"] == 2 * 480 / (2 * 3000 + 2 * 100)  # type: ignore[index]


def test_a_checkpoint_due_beyond_the_bound_is_not_waited_for() -> None:
    # due in 120 s, beyond a bound of 60 s: the preemptor does not wait at all
    out = run(WAIT_TRACE, checkpoint_wait_seconds=60)
    low, high = out["jobs"]["low"], out["jobs"]["high"]  # type: ignore[index]
    assert high.first_start == 1800 + 40
    assert low.lost_per_stop == [480.0]


def test_the_generated_traces_keep_their_jobs_and_give_some_a_drifting_interval() -> None:
    spec = WorkloadSpec(capacity={POOL: 4, "ml.trn2.48xlarge": 2})
    trace = generate(spec, seed=1)
    without = generate(WorkloadSpec(capacity=spec.capacity, checkpoint_drift_share=0), seed=1)
    assert [j.checkpoint_drift for j in without.jobs] == [None] * len(without.jobs)
    # drift comes from the job's name, not the seed's stream: every other field is as it was
    strip = [{**j.to_dict(), "checkpoint_drift": None} for j in trace.jobs]
    assert strip == [{**j.to_dict(), "checkpoint_drift": None} for j in without.jobs]
    drifting = [j for j in trace.jobs if j.checkpoint_drift]
    checkpointing = [j for j in trace.jobs if j.checkpoint_minutes]
    assert all(j.checkpoint_minutes for j in drifting)
    assert 0.15 < len(drifting) / len(checkpointing) < 0.45
    assert any(not j.checkpoint_minutes for j in trace.jobs)


def test_a_trace_names_a_drift_and_a_bad_one_is_refused() -> None:
    line = '{"submit": 0, "priority": 1, "instance_type": "ml.trn1.32xlarge", "instance_count": 1, '
    line += '"duration_seconds": 60, "checkpoint_minutes": 10, "checkpoint_drift": 0.2}'
    (job,) = parse_jsonl(line).jobs
    assert job.checkpoint_drift == 0.2
    assert parse_jsonl(json.dumps(job.to_dict())).jobs[0] == job
    with pytest.raises(TraceError, match=r"checkpoint_drift must be at least 0 and below 1, got 1\.5"):
        parse_jsonl(line.replace("0.2}", "1.5}"))
