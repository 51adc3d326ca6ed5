"""A training job's life through boto3: statuses, secondary statuses and their transitions, times, billing,
stopping, stopping conditions, simulated outcomes and spot interruptions."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

from sagequeue.local import RealClock, SageMakerEmulator, VirtualClock

CAPACITY_REASON = (
    "CapacityError: Unable to provision requested ML compute capacity. "
    "Please retry using a different ML instance type."
)


def describe(sagemaker: Any, name: str) -> dict[str, Any]:
    return sagemaker.describe_training_job(TrainingJobName=name)


def statuses(description: dict[str, Any]) -> tuple[str, str]:
    return description["TrainingJobStatus"], description["SecondaryStatus"]


def transition_names(description: dict[str, Any]) -> list[str]:
    return [t["Status"] for t in description["SecondaryStatusTransitions"]]


def test_a_job_walks_through_every_phase_at_the_configured_times(
    emulator: SageMakerEmulator, sagemaker: Any, clock: VirtualClock, make_request: Any
) -> None:
    created = clock.now()
    arn = sagemaker.create_training_job(**make_request("bert-1"))["TrainingJobArn"]
    assert arn == "arn:aws:sagemaker:us-east-1:123456789012:training-job/bert-1"

    # GIVEN provisioning 120 s, download 30 s, training 600 s, upload 20 s
    checkpoints = [
        (119, ("InProgress", "Starting")),
        (1, ("InProgress", "Downloading")),
        (30, ("InProgress", "Training")),
        (599, ("InProgress", "Training")),
        (1, ("InProgress", "Uploading")),
        (20, ("Completed", "Completed")),
    ]
    for seconds, expected in checkpoints:
        emulator.advance(seconds)
        assert statuses(describe(sagemaker, "bert-1")) == expected, f"at +{(clock.now() - created).seconds}s"

    job = describe(sagemaker, "bert-1")
    assert transition_names(job) == ["Starting", "Downloading", "Training", "Uploading", "Completed"]
    starts = [t["StartTime"] for t in job["SecondaryStatusTransitions"]]
    assert [s - created for s in starts] == [timedelta(seconds=s) for s in (0, 120, 150, 750, 770)]
    ends = [t["EndTime"] for t in job["SecondaryStatusTransitions"]]
    assert ends[:-1] == starts[1:], "each phase ends when the next begins"
    assert ends[-1] == starts[-1]
    assert job["SecondaryStatusTransitions"][2]["StatusMessage"] == (
        "Training image download completed. Training in progress."
    )
    assert job["CreationTime"] == created
    assert job["TrainingStartTime"] == created + timedelta(seconds=120)
    assert job["TrainingEndTime"] == created + timedelta(seconds=770)
    assert job["LastModifiedTime"] == job["TrainingEndTime"]
    assert job["TrainingTimeInSeconds"] == 650
    assert job["BillableTimeInSeconds"] == 650
    assert job["ModelArtifacts"]["S3ModelArtifacts"] == "s3://bucket/output/bert-1/output/model.tar.gz"
    assert job["HyperParameters"] == {"epochs": "3"}
    assert "FailureReason" not in job
    assert "WarmPoolStatus" not in job, "no keep-alive, no warm pool"


def test_a_running_job_reports_no_training_time_or_billing_yet(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any
) -> None:
    sagemaker.create_training_job(**make_request("running"))
    emulator.advance(300)
    job = describe(sagemaker, "running")
    assert statuses(job) == ("InProgress", "Training")
    assert "TrainingTimeInSeconds" not in job
    assert "BillableTimeInSeconds" not in job
    assert "TrainingEndTime" not in job
    assert job["StoppingCondition"] == {"MaxRuntimeInSeconds": 86400}


def test_default_duration_and_stopping_condition_apply_when_the_request_leaves_them_out(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any
) -> None:
    sagemaker.create_training_job(**make_request("defaults", Environment=None, StoppingCondition=None))
    assert describe(sagemaker, "defaults")["StoppingCondition"] == {"MaxRuntimeInSeconds": 86400}
    emulator.advance(120 + 30 + 600 - 1)
    assert statuses(describe(sagemaker, "defaults")) == ("InProgress", "Training")
    emulator.advance(1)
    assert statuses(describe(sagemaker, "defaults")) == ("InProgress", "Uploading")


def test_stop_sends_the_job_to_stopping_then_stopped_after_the_grace_period(
    emulator: SageMakerEmulator, sagemaker: Any, clock: VirtualClock, make_request: Any, events: list[Any]
) -> None:
    sagemaker.create_training_job(**make_request("to-stop"))
    emulator.advance(200)
    stop_at = clock.now()
    delivered = len(events)
    sagemaker.stop_training_job(TrainingJobName="to-stop")

    # THEN the Stopping event comes after StopTrainingJob answered, as EventBridge's delivery is asynchronous
    assert len(events) == delivered
    assert statuses(describe(sagemaker, "to-stop")) == ("Stopping", "Stopping")
    emulator.advance(10)
    assert ("Stopping", "Stopping") in [
        (e["detail"]["TrainingJobStatus"], e["detail"]["SecondaryStatus"]) for e in events[delivered:]
    ]
    emulator.advance(19)
    assert statuses(describe(sagemaker, "to-stop")) == ("Stopping", "Stopping")
    emulator.advance(1)
    # after the grace the container is killed and what it saved is uploaded
    assert statuses(describe(sagemaker, "to-stop")) == ("Stopping", "Uploading")
    emulator.advance(19)
    assert statuses(describe(sagemaker, "to-stop")) == ("Stopping", "Uploading")
    emulator.advance(1)
    job = describe(sagemaker, "to-stop")
    assert statuses(job) == ("Stopped", "Stopped")
    assert transition_names(job) == [
        "Starting",
        "Downloading",
        "Training",
        "Stopping",
        "Uploading",
        "Stopped",
    ]
    assert job["TrainingEndTime"] == stop_at + timedelta(seconds=30 + 20)
    assert job["BillableTimeInSeconds"] == 200 - 120 + 30 + 20


@pytest.mark.parametrize("final", ["Completed", "Stopped"])
def test_stopping_an_ended_job_is_a_validation_error_naming_its_status(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any, final: str
) -> None:
    sagemaker.create_training_job(**make_request("ended"))
    if final == "Stopped":
        sagemaker.stop_training_job(TrainingJobName="ended")
    emulator.advance(2000)
    with pytest.raises(ClientError) as caught:
        sagemaker.stop_training_job(TrainingJobName="ended")
    error = caught.value.response["Error"]
    assert error["Code"] == "ValidationException"
    assert error["Message"] == f"The request was rejected because the training job is in status {final}."


def test_stopping_a_stopping_job_again_is_refused_and_changes_nothing(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any
) -> None:
    sagemaker.create_training_job(**make_request("twice"))
    sagemaker.stop_training_job(TrainingJobName="twice")
    with pytest.raises(ClientError) as caught:
        sagemaker.stop_training_job(TrainingJobName="twice")
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    emulator.advance(30)
    job = describe(sagemaker, "twice")
    assert statuses(job) == ("Stopped", "Stopped")
    assert "TrainingStartTime" not in job, "stopped before its instances launched"


def test_stopping_an_unknown_job_is_a_validation_exception(sagemaker: Any) -> None:
    with pytest.raises(ClientError) as caught:
        sagemaker.stop_training_job(TrainingJobName="never-created")
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    assert "Requested resource not found" in caught.value.response["Error"]["Message"]


def test_max_runtime_stops_the_job_with_secondary_status_max_runtime_exceeded(
    emulator: SageMakerEmulator, sagemaker: Any, clock: VirtualClock, make_request: Any
) -> None:
    created = clock.now()
    sagemaker.create_training_job(**make_request("too-long", StoppingCondition={"MaxRuntimeInSeconds": 300}))
    emulator.advance(120 + 300 - 1)
    assert statuses(describe(sagemaker, "too-long")) == ("InProgress", "Training")
    emulator.advance(1)
    assert statuses(describe(sagemaker, "too-long")) == ("Stopping", "Stopping")
    emulator.advance(30 + 20)
    job = describe(sagemaker, "too-long")
    assert statuses(job) == ("Stopped", "MaxRuntimeExceeded")
    assert job["TrainingEndTime"] == created + timedelta(seconds=120 + 300 + 30 + 20)
    assert transition_names(job)[-3:] == ["Stopping", "Uploading", "MaxRuntimeExceeded"]


def test_failed_outcome_fails_after_training_with_the_given_reason(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any
) -> None:
    reason = "AlgorithmError: ExecuteUserScriptError: exit code 1"
    sagemaker.create_training_job(
        **make_request(
            "doomed",
            Environment={"SAGEQUEUE_SIM_DURATION": "60", "SAGEQUEUE_SIM_OUTCOME": f"Failed:{reason}"},
        )
    )
    emulator.advance(120 + 30 + 59)
    assert statuses(describe(sagemaker, "doomed")) == ("InProgress", "Training")
    emulator.advance(1)
    job = describe(sagemaker, "doomed")
    assert statuses(job) == ("Failed", "Failed")
    assert job["FailureReason"] == reason
    assert transition_names(job) == ["Starting", "Downloading", "Training", "Failed"]


def test_capacity_error_waits_in_starting_then_fails_with_the_capacity_reason(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any
) -> None:
    sagemaker.create_training_job(
        **make_request(
            "no-capacity",
            Environment={"SAGEQUEUE_SIM_OUTCOME": "CapacityError"},
            ResourceConfig={"KeepAlivePeriodInSeconds": 600},
        )
    )
    emulator.advance(899)
    job = describe(sagemaker, "no-capacity")
    assert statuses(job) == ("InProgress", "Starting")
    assert job["SecondaryStatusTransitions"][-1]["StatusMessage"] == (
        "Insufficient capacity error from EC2 while launching instances, retrying!"
    )
    emulator.advance(1)
    job = describe(sagemaker, "no-capacity")
    assert statuses(job) == ("Failed", "Failed")
    assert job["FailureReason"] == CAPACITY_REASON
    assert transition_names(job) == ["Starting", "Failed"]
    assert job["WarmPoolStatus"]["Status"] == "Terminated", "no cluster launched, nothing to keep warm"
    assert "BillableTimeInSeconds" not in job


def test_an_idle_job_trains_and_completes_like_any_other(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any
) -> None:
    sagemaker.create_training_job(
        **make_request("idle", Environment={"SAGEQUEUE_SIM_OUTCOME": "Idle", "SAGEQUEUE_SIM_DURATION": "100"})
    )
    emulator.advance(120 + 30 + 100 + 20)
    assert statuses(describe(sagemaker, "idle")) == ("Completed", "Completed")


def test_spot_interruptions_restart_the_job_and_it_completes_after_its_full_training_time(
    emulator: SageMakerEmulator, sagemaker: Any, clock: VirtualClock, make_request: Any
) -> None:
    created = clock.now()
    sagemaker.create_training_job(
        **make_request(
            "spot",
            EnableManagedSpotTraining=True,
            Environment={"SAGEQUEUE_SIM_DURATION": "600", "SAGEQUEUE_SIM_OUTCOME": "Interrupted:2"},
        )
    )
    # Each run: Starting 120, Downloading 30, Training 200 (600 / 3), then Interrupted 60.
    emulator.advance(120 + 30 + 200)
    assert statuses(describe(sagemaker, "spot")) == ("InProgress", "Interrupted")
    emulator.advance(60)
    assert statuses(describe(sagemaker, "spot")) == ("InProgress", "Starting")
    emulator.advance(5000)
    job = describe(sagemaker, "spot")
    assert statuses(job) == ("Completed", "Completed")
    assert transition_names(job) == [
        "Starting", "Downloading", "Training", "Interrupted",
        "Starting", "Downloading", "Training", "Interrupted",
        "Starting", "Downloading", "Training", "Uploading", "Completed",
    ]  # fmt: skip
    training = [t for t in job["SecondaryStatusTransitions"] if t["Status"] == "Training"]
    assert sum((t["EndTime"] - t["StartTime"]).total_seconds() for t in training) == 600
    total = 3 * (120 + 30) + 600 + 2 * 60 + 20
    assert job["TrainingEndTime"] == created + timedelta(seconds=total)
    assert job["TrainingTimeInSeconds"] == total - 120
    # Spot bills the time on instances only: not the first Starting, not the interruptions or restarts.
    assert job["BillableTimeInSeconds"] == 3 * 30 + 600 + 20
    assert job["BillableTimeInSeconds"] < job["TrainingTimeInSeconds"]


def test_max_wait_time_stops_a_spot_job_that_cannot_finish_in_time(
    emulator: SageMakerEmulator, sagemaker: Any, clock: VirtualClock, make_request: Any
) -> None:
    created = clock.now()
    sagemaker.create_training_job(
        **make_request(
            "spot-late",
            EnableManagedSpotTraining=True,
            StoppingCondition={"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 3600},
            Environment={"SAGEQUEUE_SIM_DURATION": "3000", "SAGEQUEUE_SIM_OUTCOME": "Interrupted:3"},
        )
    )
    emulator.advance(3599)
    assert describe(sagemaker, "spot-late")["TrainingJobStatus"] == "InProgress"
    emulator.advance(1)
    assert statuses(describe(sagemaker, "spot-late")) == ("Stopping", "Stopping")
    emulator.advance(30 + 20)
    job = describe(sagemaker, "spot-late")
    assert statuses(job) == ("Stopped", "MaxWaitTimeExceeded")
    assert job["TrainingEndTime"] == created + timedelta(seconds=3650)


def test_a_real_clock_with_a_speed_up_runs_jobs_in_the_background() -> None:
    with SageMakerEmulator(clock=RealClock(speed=2000), provisioning_seconds=100) as emulator:
        sagemaker = emulator.client()
        sagemaker.create_training_job(
            TrainingJobName="fast",
            RoleArn="arn:aws:iam::123456789012:role/SageMakerTraining",
            AlgorithmSpecification={"TrainingImage": "image", "TrainingInputMode": "File"},
            OutputDataConfig={"S3OutputPath": "s3://bucket/output"},
            ResourceConfig={"InstanceType": "ml.trn1.2xlarge", "InstanceCount": 1, "VolumeSizeInGB": 50},
            Environment={"SAGEQUEUE_SIM_DURATION": "600"},
        )
        # 100 + 100 + 600 + 20 simulated seconds is 0.41 s of wall time at 2000x.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if sagemaker.describe_training_job(TrainingJobName="fast")["TrainingJobStatus"] == "Completed":
                break
            time.sleep(0.05)
        job = sagemaker.describe_training_job(TrainingJobName="fast")
        assert statuses(job) == ("Completed", "Completed")
        assert job["TrainingTimeInSeconds"] == 100 + 600 + 20  # Downloading takes 100 s by default
        with pytest.raises(TypeError, match="VirtualClock"):
            emulator.advance(10)


def test_next_due_and_instances_in_use_tell_a_driver_what_comes_next(
    emulator: SageMakerEmulator, sagemaker: Any, clock: VirtualClock, make_request: Any
) -> None:
    assert emulator.next_due() is None
    assert emulator.instances_in_use() == {}
    created = clock.now()
    sagemaker.create_training_job(
        **make_request("watched", ResourceConfig={"InstanceCount": 3, "KeepAlivePeriodInSeconds": 60})
    )
    # The Starting event waits for its delivery, a few seconds after the change.
    first = emulator.next_due()
    assert first is not None
    assert created < first <= created + timedelta(seconds=8)
    emulator.advance(10)
    assert emulator.next_due() == created + timedelta(seconds=120)
    assert emulator.instances_in_use() == {"ml.trn1.32xlarge": 3}
    emulator.advance(760)
    # Completed with a warm pool: the next step is its expiry, and its instances are still held.
    emulator.advance(10)  # the Completed event's delivery
    assert emulator.next_due() == created + timedelta(seconds=770 + 60)
    assert emulator.instances_in_use() == {"ml.trn1.32xlarge": 3}
    emulator.advance(50)
    assert emulator.next_due() is None
    assert emulator.instances_in_use() == {}
