"""Regional capacity from demand: a create the region cannot launch retries in Starting, then fails."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from sagequeue.local import SageMakerEmulator, VirtualClock
from tests.functional.emulator.conftest import TIMINGS, TRN1, sagemaker_client

RETRYING = "Insufficient capacity error from EC2 while launching instances, retrying!"
PROVISION = TIMINGS["provisioning_seconds"]
GIVE_UP = TIMINGS["capacity_error_after_seconds"]


def describe(sagemaker: Any, name: str) -> dict[str, Any]:
    return sagemaker.describe_training_job(TrainingJobName=name)


def phase(sagemaker: Any, name: str) -> tuple[str, str, str]:
    job = describe(sagemaker, name)
    return (
        job["TrainingJobStatus"],
        job["SecondaryStatus"],
        job["SecondaryStatusTransitions"][-1]["StatusMessage"],
    )


@pytest.fixture
def region(clock: VirtualClock) -> Any:
    with SageMakerEmulator(clock=clock, capacity={TRN1: 2}, **TIMINGS) as emulator:
        yield emulator, sagemaker_client(emulator.endpoint_url)


def test_a_create_beyond_capacity_retries_in_starting_and_launches_when_instances_free_up(
    region: Any, clock: VirtualClock, make_request: Any
) -> None:
    emulator, sagemaker = region
    sagemaker.create_training_job(**make_request("first", ResourceConfig={"InstanceCount": 2}))
    sagemaker.create_training_job(**make_request("second"))
    assert phase(sagemaker, "first") == ("InProgress", "Starting", "Launching requested ML instances")
    assert phase(sagemaker, "second") == ("InProgress", "Starting", RETRYING)
    # first runs 120 + 30 + 600 + 20 = 770 s; second waits that long, well inside the 900 s bound
    emulator.advance(769)
    assert phase(sagemaker, "second") == ("InProgress", "Starting", RETRYING)
    freed = clock.now() + timedelta(seconds=1)
    emulator.advance(1)
    assert describe(sagemaker, "first")["TrainingJobStatus"] == "Completed"
    assert phase(sagemaker, "second") == ("InProgress", "Starting", "Launching requested ML instances")
    emulator.advance(PROVISION)
    job = describe(sagemaker, "second")
    assert job["SecondaryStatus"] == "Downloading"
    assert job["TrainingStartTime"] == freed + timedelta(seconds=PROVISION)
    assert emulator.instances_in_use() == {TRN1: 1}


def test_capacity_that_never_comes_fails_the_job_with_capacity_error_after_the_bound(
    region: Any, make_request: Any
) -> None:
    emulator, sagemaker = region
    sagemaker.create_training_job(
        **make_request(
            "hog", ResourceConfig={"InstanceCount": 2}, Environment={"SAGEQUEUE_SIM_DURATION": "5000"}
        )
    )
    sagemaker.create_training_job(**make_request("starved"))
    emulator.advance(GIVE_UP - 1)
    assert phase(sagemaker, "starved") == ("InProgress", "Starting", RETRYING)
    emulator.advance(1)
    job = describe(sagemaker, "starved")
    assert job["TrainingJobStatus"] == "Failed"
    assert job["FailureReason"].startswith("CapacityError: Unable to provision requested ML compute capacity")
    assert "TrainingStartTime" not in job
    assert "BillableTimeInSeconds" not in job
    assert describe(sagemaker, "hog")["SecondaryStatus"] == "Training", "the running job is untouched"


def test_raising_capacity_launches_the_waiting_jobs_oldest_first(region: Any, make_request: Any) -> None:
    emulator, sagemaker = region
    sagemaker.create_training_job(**make_request("big", ResourceConfig={"InstanceCount": 2}))
    for name in ("w1", "w2", "w3"):
        sagemaker.create_training_job(**make_request(name))
    emulator.advance(10)
    emulator.set_capacity({TRN1: 4})
    launched = [n for n in ("w1", "w2", "w3") if phase(sagemaker, n)[2] != RETRYING]
    assert launched == ["w1", "w2"]
    emulator.set_capacity({TRN1: None})
    assert phase(sagemaker, "w3")[2] == "Launching requested ML instances"


def test_a_new_job_does_not_jump_the_queue_of_jobs_retrying_for_the_same_type(
    region: Any, make_request: Any
) -> None:
    emulator, sagemaker = region
    sagemaker.create_training_job(
        **make_request(
            "pair", ResourceConfig={"InstanceCount": 2}, Environment={"SAGEQUEUE_SIM_DURATION": "60"}
        )
    )
    sagemaker.create_training_job(**make_request("waits-for-two", ResourceConfig={"InstanceCount": 2}))
    emulator.advance(PROVISION + 30 + 60 + 20)
    # the pair ended and waits-for-two took its instances; nothing is left for a newcomer
    assert phase(sagemaker, "waits-for-two")[2] == "Launching requested ML instances"
    sagemaker.create_training_job(**make_request("newcomer"))
    assert phase(sagemaker, "newcomer") == ("InProgress", "Starting", RETRYING)


def test_stopping_a_job_that_retries_for_capacity_stops_it_without_launching(
    region: Any, make_request: Any
) -> None:
    emulator, sagemaker = region
    sagemaker.create_training_job(**make_request("full", ResourceConfig={"InstanceCount": 2}))
    sagemaker.create_training_job(**make_request("given-up"))
    emulator.advance(30)
    sagemaker.stop_training_job(TrainingJobName="given-up")
    emulator.advance(TIMINGS["stop_grace_seconds"])
    job = describe(sagemaker, "given-up")
    assert (job["TrainingJobStatus"], job["SecondaryStatus"]) == ("Stopped", "Stopped")
    assert "TrainingStartTime" not in job
    assert [t["Status"] for t in job["SecondaryStatusTransitions"]] == ["Starting", "Stopping", "Stopped"]


def test_capacity_must_be_a_count(region: Any) -> None:
    emulator, _ = region
    with pytest.raises(ValueError, match=r"capacity of ml\.trn1\.32xlarge"):
        emulator.set_capacity({TRN1: -1})
