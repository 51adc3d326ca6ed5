"""Invariants of the emulated account under random sequences of requests and clock moves.

Drives the backend directly (no HTTP), so hypothesis can try hundreds of histories in seconds.
"""

from __future__ import annotations

import contextlib
import itertools
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sagequeue.local.clock import VirtualClock
from sagequeue.local.emulator.backend import Outputs, SageMakerBackend
from sagequeue.local.emulator.errors import SageMakerError
from sagequeue.local.emulator.simulation import Timings

TRN1 = "ml.trn1.32xlarge"
LIMIT = 4
TERMINAL = {"Completed", "Failed", "Stopped"}

create = st.tuples(
    st.just("create"),
    st.integers(0, 7),  # name
    st.integers(1, 3),  # instance count
    st.sampled_from([0, 0, 60, 600]),  # keep-alive
    st.sampled_from(["Completed", "Failed:AlgorithmError: x", "CapacityError", "Idle", "Interrupted:2"]),
    st.integers(1, 900),  # duration
    st.booleans(),  # spot
    st.sampled_from([None, 300, 2000]),  # MaxRuntimeInSeconds
)
stop = st.tuples(st.just("stop"), st.integers(0, 7))
update = st.tuples(st.just("update"), st.integers(0, 7), st.sampled_from([0, 30, 900]))
advance = st.tuples(st.just("advance"), st.integers(0, 1200))
actions = st.lists(st.one_of(create, create, stop, update, advance, advance), max_size=30)


def request(
    name: str, count: int, keep_alive: int, outcome: str, duration: int, spot: bool, runtime: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::123456789012:role/Training",
        "AlgorithmSpecification": {"TrainingImage": "image", "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/out"},
        "ResourceConfig": {"InstanceType": TRN1, "InstanceCount": count, "VolumeSizeInGB": 100},
        "Environment": {"SAGEQUEUE_SIM_DURATION": str(duration), "SAGEQUEUE_SIM_OUTCOME": outcome},
    }
    if keep_alive and not spot:
        body["ResourceConfig"]["KeepAlivePeriodInSeconds"] = keep_alive
    if spot:
        body["EnableManagedSpotTraining"] = True
    if runtime:
        body["StoppingCondition"] = {"MaxRuntimeInSeconds": runtime}
    return body


def check(backend: SageMakerBackend, events: list[dict[str, Any]]) -> None:
    assert backend.instances_in_use().get(TRN1, 0) <= LIMIT
    for name in backend.job_names():
        job = backend.describe(name)
        transitions = job["SecondaryStatusTransitions"]
        starts = [t["StartTime"] for t in transitions]
        assert starts == sorted(starts)
        for before, after in itertools.pairwise(transitions):
            assert before["EndTime"] == after["StartTime"]
        assert transitions[-1]["Status"] == job["SecondaryStatus"]
        assert [e["detail"]["SecondaryStatus"] for e in events if e["detail"]["TrainingJobName"] == name] == [
            t["Status"] for t in transitions
        ], "one event per secondary-status change, in order"
        if job["TrainingJobStatus"] in TERMINAL:
            assert "TrainingEndTime" in job
            if "TrainingStartTime" in job:
                assert job["TrainingEndTime"] >= job["TrainingStartTime"]
                assert 1 <= job["BillableTimeInSeconds"] <= job["TrainingTimeInSeconds"]
        pool = job.get("WarmPoolStatus")
        if pool is not None:
            assert not job.get("EnableManagedSpotTraining")
            if pool["Status"] == "Available":
                assert job["TrainingJobStatus"] in TERMINAL
            if pool["Status"] == "Reused":
                assert backend.describe(pool["ReusedByJob"])["WarmPoolStatus"]["Status"] in {
                    "InUse",
                    "Available",
                    "Reused",
                    "Terminated",
                }


@settings(max_examples=120, deadline=None)
@given(history=actions)
def test_any_history_keeps_the_account_consistent_and_everything_ends(history: list[tuple[Any, ...]]) -> None:
    clock = VirtualClock(datetime(2026, 1, 1, tzinfo=UTC))
    timings = Timings(provisioning_seconds=120, warm_start_seconds=10, capacity_error_after_seconds=600)
    backend = SageMakerBackend(clock, timings, {TRN1: LIMIT}, "us-east-1", "123456789012")
    events: list[dict[str, Any]] = []

    def call(operation: str, body: dict[str, Any]) -> None:
        outputs = Outputs()
        with contextlib.suppress(SageMakerError):  # refusals are part of any history
            backend.call(operation, body, outputs)
        events.extend(outputs.events)

    for action in history:
        kind = action[0]
        if kind == "create":
            _, index, count, keep_alive, outcome, duration, spot, runtime = action
            call(
                "CreateTrainingJob",
                request(f"job-{index}", count, keep_alive, outcome, duration, spot, runtime),
            )
        elif kind == "stop":
            call("StopTrainingJob", {"TrainingJobName": f"job-{action[1]}"})
        elif kind == "update":
            call(
                "UpdateTrainingJob",
                {
                    "TrainingJobName": f"job-{action[1]}",
                    "ResourceConfig": {"KeepAlivePeriodInSeconds": action[2]},
                },
            )
        else:
            clock.advance(action[1])
            events.extend(backend.process_due(clock.now()).events)
        check(backend, events)

    clock.advance(30 * 86400)
    events.extend(backend.process_due(clock.now()).events)
    check(backend, events)
    assert backend.instances_in_use() == {}
    assert backend.next_due() is None
    for name in backend.job_names():
        job = backend.describe(name)
        assert job["TrainingJobStatus"] in TERMINAL
        assert job.get("WarmPoolStatus", {"Status": "Terminated"})["Status"] in {"Terminated", "Reused"}
