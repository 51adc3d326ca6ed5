"""The simulator against the real thing.

GIVEN a small trace (a two-instance pool, a sweep whose second job reuses the first one's warm pool, a late
high-priority job that preempts, no checkpoints),
WHEN it runs through the simulator and, submission by submission, through the local stack on its virtual
clock (the very handlers, moto and the SageMaker emulator with the same timings),
THEN both start the jobs in the same order, preempt the same jobs, and every job ends within
TOLERANCE_SECONDS of the other's end.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from sagequeue.local import LocalStack
from sagequeue.local.emulator import EventDelivery
from sagequeue.sim import Result, SimSettings, Timings, Trace, TraceJob, Variant, simulate

POOL = "ml.trn1.32xlarge"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/neuron-train:2.21"
EMULATOR = {
    "provisioning_seconds": 60,
    "warm_start_seconds": 20,
    "download_seconds": 10,
    "upload_seconds": 10,
    "stop_grace_seconds": 30,
    # the simulator models neither lost events nor 5xx answers nor a warm-pool quota: the stack's SageMaker
    # is given the same world, so that the two models are compared, not their assumptions
    "delivery": EventDelivery(),
    "transient_error_share": 0.0,
    "warm_pool_limits": {POOL: 2},
}
TIMINGS = Timings(
    cold_start_seconds=60,
    warm_start_seconds=20,
    download_seconds=10,
    upload_seconds=10,
    stop_grace_seconds=30,
)
#: The stack applies an end when its event is delivered and the simulation at the same instant, but a start
#: waits for the next pass in both; what can differ is the order of passes within one timer period.
TOLERANCE_SECONDS = 60

TRACE = Trace(
    (
        TraceJob("a-long", 0, 5, POOL, 1, 4000),
        TraceJob("b-small", 5, 5, POOL, 1, 900),
        TraceJob("c-sweep-1", 20, 4, POOL, 1, 600, keep_alive_seconds=300, family="sweep"),
        TraceJob("d-sweep-2", 40, 4, POOL, 1, 600, keep_alive_seconds=300, family="sweep"),
        TraceJob("e-urgent", 1300, 8, POOL, 1, 400),
        TraceJob("f-late", 1400, 1, POOL, 1, 300),
    )
)
SETTINGS = SimSettings(
    capacity={POOL: 2}, min_runtime_before_preemption_seconds=300, default_keep_alive_seconds=0
)


def _request(stack: LocalStack, job: TraceJob, volume: int) -> dict[str, Any]:
    resources: dict[str, Any] = {"InstanceType": job.instance_type, "InstanceCount": job.instance_count}
    resources["VolumeSizeInGB"] = volume
    if job.keep_alive_seconds:
        resources["KeepAlivePeriodInSeconds"] = job.keep_alive_seconds
    return {
        "TrainingJobName": job.name,
        "RoleArn": stack.training_role_arn,
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": "s3://sagequeue-sim/output"},
        "ResourceConfig": resources,
        "StoppingCondition": {"MaxRuntimeInSeconds": 7200},
        "Environment": {"SAGEQUEUE_SIM_DURATION": str(int(job.duration_seconds))},
    }


def _through_the_stack() -> tuple[list[str], dict[str, float], dict[str, int]]:
    stack = LocalStack(
        settings={
            "capacity": SETTINGS.capacity,
            "min_runtime_before_preemption_seconds": SETTINGS.min_runtime_before_preemption_seconds,
            "default_keep_alive_seconds": SETTINGS.default_keep_alive_seconds,
        },
        emulator=EMULATOR,
        function_logs=False,
    ).start()
    try:
        queue = stack.client()
        origin = stack.now()
        # jobs of one family share a warm-pool key; every other job gets one of its own (its volume size)
        volumes = {}
        for index, job in enumerate(TRACE.jobs):
            volumes[job.name] = 64 if job.family else 100 + index
        for job in TRACE.jobs:
            stack.advance(job.submit_seconds - _since(stack.now(), origin))
            queue.submit(_request(stack, job, volumes[job.name]), priority=job.priority)
            stack.run_until_idle()
        for _ in range(200):
            if all(j.state == "completed" for j in queue.jobs()):
                break
            stack.advance(60)
        jobs = {job.name: queue.job(job.name) for job in TRACE.jobs}
        assert all(j.state == "completed" for j in jobs.values()), {n: j.state for n, j in jobs.items()}
        starts = []
        for name, job in jobs.items():
            first = next(h.at for h in job.history if h.state == "starting" and h.attempt == 1)
            assert first is not None
            starts.append((_since(first, origin), name))
        ends = {name: _since(job.ended_at, origin) for name, job in jobs.items() if job.ended_at}
        preemptions = {name: job.preemptions for name, job in jobs.items()}
        return [name for _, name in sorted(starts)], ends, preemptions
    finally:
        stack.stop()


def _since(moment: datetime, origin: datetime) -> float:
    return (moment - origin).total_seconds()


_LAST_RUN: list[Result] = []


def _through_the_simulator() -> tuple[list[str], dict[str, float], dict[str, int]]:
    (result,) = simulate(TRACE, [Variant("sagequeue", "sagequeue", SETTINGS)], TIMINGS)
    _LAST_RUN[:] = [result]
    records = result.recorder.jobs
    order = sorted(records, key=lambda n: (records[n].first_start, n))
    ends = {name: r.ended for name, r in records.items() if r.ended is not None}
    return order, ends, {name: r.preemptions for name, r in records.items()}


@pytest.mark.slow
def test_the_simulator_and_the_local_stack_agree() -> None:
    sim_order, sim_ends, sim_preemptions = _through_the_simulator()
    sim_warm_starts = {name: r.warm_starts for name, r in _LAST_RUN[0].recorder.jobs.items()}
    stack_order, stack_ends, stack_preemptions = _through_the_stack()

    assert sim_order == stack_order
    assert sim_preemptions == stack_preemptions
    assert sum(sim_preemptions.values()) >= 1, "the trace is meant to exercise a preemption"
    assert sim_warm_starts["d-sweep-2"] == 1, "the trace is meant to exercise a warm-pool reuse"
    assert set(sim_ends) == set(stack_ends) == {job.name for job in TRACE.jobs}
    gaps = {name: abs(sim_ends[name] - stack_ends[name]) for name in sim_ends}
    assert max(gaps.values()) <= TOLERANCE_SECONDS, gaps
