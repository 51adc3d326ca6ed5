"""Managed warm pools as SageMaker documents them: retention, the match rule, reuse, expiry, termination by
update, the 28-day chain, billing, and their weight against the instance limit."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

from sagequeue.local import SageMakerEmulator, VirtualClock
from tests.functional.emulator.conftest import TIMINGS

KEEP_ALIVE = 600
FRESH_RUN = 120 + 30 + 600 + 20  # provisioning, download, training, upload
WARM_RUN = 10 + 30 + 600 + 20  # the same from a warm pool


def describe(sagemaker: Any, name: str) -> dict[str, Any]:
    return sagemaker.describe_training_job(TrainingJobName=name)


def warm_pool(sagemaker: Any, name: str) -> dict[str, Any]:
    return describe(sagemaker, name)["WarmPoolStatus"]


def starting_seconds(sagemaker: Any, name: str) -> float:
    first = describe(sagemaker, name)["SecondaryStatusTransitions"][0]
    assert first["Status"] == "Starting"
    return (first["EndTime"] - first["StartTime"]).total_seconds()


@pytest.fixture
def warm_request(make_request: Any) -> Any:
    def build(name: str, **overrides: Any) -> dict[str, Any]:
        request = make_request(name, **overrides)
        request["ResourceConfig"].setdefault("KeepAlivePeriodInSeconds", KEEP_ALIVE)
        return request

    return build


@pytest.fixture
def pool_owner(emulator: SageMakerEmulator, sagemaker: Any, warm_request: Any) -> str:
    """A completed job whose warm pool has just become Available."""
    sagemaker.create_training_job(**warm_request("owner"))
    emulator.advance(FRESH_RUN)
    assert warm_pool(sagemaker, "owner") == {
        "Status": "Available",
        "ResourceRetainedBillableTimeInSeconds": 0,
    }
    return "owner"


def test_a_running_job_with_keep_alive_shows_its_pool_in_use(
    emulator: SageMakerEmulator, sagemaker: Any, warm_request: Any
) -> None:
    sagemaker.create_training_job(**warm_request("warm"))
    emulator.advance(300)
    assert warm_pool(sagemaker, "warm") == {"Status": "InUse"}


def test_retained_time_is_billed_while_the_pool_waits(
    emulator: SageMakerEmulator, sagemaker: Any, pool_owner: str
) -> None:
    emulator.advance(125)
    assert warm_pool(sagemaker, pool_owner) == {
        "Status": "Available",
        "ResourceRetainedBillableTimeInSeconds": 125,
    }


def test_a_matching_job_reuses_the_pool_and_starts_fast(
    emulator: SageMakerEmulator, sagemaker: Any, warm_request: Any, pool_owner: str, events: list[Any]
) -> None:
    emulator.advance(200)
    # GIVEN a job that differs only where SageMaker allows: image, hyperparameters, environment, tags
    request = warm_request(
        "reuser",
        AlgorithmSpecification={"TrainingImage": "another-image:latest"},
        HyperParameters={"epochs": "9", "lr": "0.1"},
        Environment={"SAGEQUEUE_SIM_DURATION": "600", "EXTRA": "1"},
        Tags=[{"Key": "team", "Value": "speech"}],
    )
    sagemaker.create_training_job(**request)

    assert warm_pool(sagemaker, pool_owner) == {
        "Status": "Reused",
        "ResourceRetainedBillableTimeInSeconds": 200,
        "ReusedByJob": "reuser",
    }
    assert warm_pool(sagemaker, "reuser") == {"Status": "InUse"}
    emulator.advance(9)
    assert events[-1]["detail"]["TrainingJobName"] == "reuser"
    assert events[-1]["detail"]["WarmPoolStatus"] == {"Status": "InUse"}
    emulator.advance(WARM_RUN - 9)
    assert describe(sagemaker, "reuser")["TrainingJobStatus"] == "Completed"
    assert starting_seconds(sagemaker, "reuser") == 10
    assert warm_pool(sagemaker, "reuser")["Status"] == "Available", "the pool moves on with the new job"
    # The old pool's bill stopped when it was reused.
    assert warm_pool(sagemaker, pool_owner)["ResourceRetainedBillableTimeInSeconds"] == 200


MISMATCHES: dict[str, dict[str, Any]] = {
    "RoleArn": {"RoleArn": "arn:aws:iam::123456789012:role/OtherRole"},
    "InstanceType": {"ResourceConfig": {"InstanceType": "ml.trn1n.32xlarge"}},
    "InstanceCount": {"ResourceConfig": {"InstanceCount": 2}},
    "VolumeSizeInGB": {"ResourceConfig": {"VolumeSizeInGB": 1024}},
    "VolumeKmsKeyId": {"ResourceConfig": {"VolumeKmsKeyId": "arn:aws:kms:us-east-1:123456789012:key/abc"}},
    "Subnets": {"VpcConfig": {"Subnets": ["subnet-b"], "SecurityGroupIds": ["sg-a"]}},
    "SecurityGroupIds": {"VpcConfig": {"Subnets": ["subnet-a"], "SecurityGroupIds": ["sg-b"]}},
    "EnableInterContainerTrafficEncryption": {"EnableInterContainerTrafficEncryption": True},
    "EnableNetworkIsolation": {"EnableNetworkIsolation": True},
}


@pytest.mark.parametrize("field", list(MISMATCHES))
def test_a_difference_in_any_key_field_means_no_reuse(
    emulator: SageMakerEmulator, sagemaker: Any, warm_request: Any, field: str
) -> None:
    base = {"VpcConfig": {"Subnets": ["subnet-a"], "SecurityGroupIds": ["sg-a"]}}
    sagemaker.create_training_job(**warm_request("owner", **base))
    emulator.advance(FRESH_RUN)
    assert warm_pool(sagemaker, "owner")["Status"] == "Available"

    sagemaker.create_training_job(**warm_request("other", **{**base, **MISMATCHES[field]}))

    assert warm_pool(sagemaker, "owner")["Status"] == "Available", f"{field} differs: the pool stays"
    assert "ReusedByJob" not in warm_pool(sagemaker, "owner")
    emulator.advance(200)
    assert starting_seconds(sagemaker, "other") == 120, "a cold start"


def test_the_pool_expires_after_the_keep_alive_and_is_billed_for_it(
    emulator: SageMakerEmulator, sagemaker: Any, warm_request: Any, pool_owner: str
) -> None:
    emulator.advance(KEEP_ALIVE - 1)
    assert warm_pool(sagemaker, pool_owner)["Status"] == "Available"
    emulator.advance(1)
    assert warm_pool(sagemaker, pool_owner) == {
        "Status": "Terminated",
        "ResourceRetainedBillableTimeInSeconds": KEEP_ALIVE,
    }
    emulator.advance(3600)
    assert warm_pool(sagemaker, pool_owner)["ResourceRetainedBillableTimeInSeconds"] == KEEP_ALIVE
    sagemaker.create_training_job(**warm_request("too-late"))
    emulator.advance(200)
    assert starting_seconds(sagemaker, "too-late") == 120


def test_update_with_keep_alive_zero_terminates_an_available_pool(
    emulator: SageMakerEmulator, sagemaker: Any, warm_request: Any, pool_owner: str
) -> None:
    emulator.advance(42)
    sagemaker.update_training_job(TrainingJobName=pool_owner, ResourceConfig={"KeepAlivePeriodInSeconds": 0})
    job = describe(sagemaker, pool_owner)
    assert job["WarmPoolStatus"] == {"Status": "Terminated", "ResourceRetainedBillableTimeInSeconds": 42}
    assert job["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 0
    sagemaker.create_training_job(**warm_request("after"))
    assert warm_pool(sagemaker, "after") == {"Status": "InUse"}
    emulator.advance(200)
    assert starting_seconds(sagemaker, "after") == 120
    with pytest.raises(ClientError) as caught:
        sagemaker.update_training_job(
            TrainingJobName=pool_owner, ResourceConfig={"KeepAlivePeriodInSeconds": 60}
        )
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    assert "Terminated warm pool" in caught.value.response["Error"]["Message"]


def test_update_can_extend_an_available_pool_but_not_a_running_job_or_one_without_a_pool(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any, warm_request: Any, pool_owner: str
) -> None:
    sagemaker.update_training_job(
        TrainingJobName=pool_owner, ResourceConfig={"KeepAlivePeriodInSeconds": 1800}
    )
    emulator.advance(1799)
    assert warm_pool(sagemaker, pool_owner)["Status"] == "Available"
    emulator.advance(1)
    assert warm_pool(sagemaker, pool_owner)["Status"] == "Terminated"

    sagemaker.create_training_job(**make_request("plain"))
    sagemaker.create_training_job(**warm_request("running"))
    for name, says in (("plain", "created without a warm pool"), ("running", "InProgress")):
        with pytest.raises(ClientError) as caught:
            sagemaker.update_training_job(
                TrainingJobName=name, ResourceConfig={"KeepAlivePeriodInSeconds": 300}
            )
        assert caught.value.response["Error"]["Code"] == "ValidationException"
        assert says in caught.value.response["Error"]["Message"]
    emulator.advance(FRESH_RUN)
    assert "WarmPoolStatus" not in describe(sagemaker, "plain")
    with pytest.raises(ClientError):
        sagemaker.update_training_job(
            TrainingJobName="plain", ResourceConfig={"KeepAlivePeriodInSeconds": 300}
        )


def test_warm_pool_quota_per_type_retains_no_pool_beyond_it(clock: Any, make_request: Any) -> None:
    with SageMakerEmulator(clock=clock, warm_pool_limits={"ml.trn1.32xlarge": 2}, **TIMINGS) as emulator:
        sagemaker = emulator.client()
        for name, count in (("first", 2), ("second", 1)):
            sagemaker.create_training_job(
                **make_request(name, ResourceConfig={"InstanceCount": count, "KeepAlivePeriodInSeconds": 600})
            )
        emulator.advance(FRESH_RUN)
        assert warm_pool(sagemaker, "first")["Status"] == "Available"
        assert warm_pool(sagemaker, "second")["Status"] == "Terminated", "2 instances already retained"
        assert emulator.instances_in_use() == {"ml.trn1.32xlarge": 2}
    with SageMakerEmulator(clock=clock, warm_pool_limits={"ml.trn1.32xlarge": 0}, **TIMINGS) as emulator:
        sagemaker = emulator.client()
        sagemaker.create_training_job(
            **make_request("aws-default", ResourceConfig={"KeepAlivePeriodInSeconds": 600})
        )
        emulator.advance(FRESH_RUN)
        assert warm_pool(sagemaker, "aws-default")["Status"] == "Terminated"


def test_warm_pool_status_goes_missing_for_a_moment_after_the_job_ends(clock: Any, warm_request: Any) -> None:
    timings = {**TIMINGS, "warm_pool_status_lag_seconds": 5}
    events: list[dict[str, Any]] = []
    with SageMakerEmulator(clock=clock, on_event=events.append, **timings) as emulator:
        sagemaker = emulator.client()
        sagemaker.create_training_job(**warm_request("lagging"))
        emulator.advance(FRESH_RUN)
        assert describe(sagemaker, "lagging")["TrainingJobStatus"] == "Completed"
        assert "WarmPoolStatus" not in describe(sagemaker, "lagging")
        summary = sagemaker.list_training_jobs()["TrainingJobSummaries"][0]
        assert "WarmPoolStatus" not in summary
        emulator.advance(4)
        assert "WarmPoolStatus" not in describe(sagemaker, "lagging")
        emulator.advance(1)
        assert warm_pool(sagemaker, "lagging")["Status"] == "Available"
        emulator.advance(10)
    completed = [e for e in events if e["detail"]["TrainingJobStatus"] == "Completed"]
    assert completed
    assert all(e["detail"]["WarmPoolStatus"]["Status"] == "Available" for e in completed)


def test_a_pool_may_end_early(emulator: SageMakerEmulator, sagemaker: Any, pool_owner: str) -> None:
    emulator.advance(100)
    emulator.end_warm_pool(pool_owner)
    assert warm_pool(sagemaker, pool_owner) == {
        "Status": "Terminated",
        "ResourceRetainedBillableTimeInSeconds": 100,
    }
    assert emulator.instances_in_use() == {}
    with pytest.raises(ValueError, match="no Available warm pool"):
        emulator.end_warm_pool(pool_owner)


def test_update_refuses_a_keep_alive_out_of_range(raw_sagemaker: Any, make_request: Any) -> None:
    raw_sagemaker.create_training_job(**make_request("ranged"))
    for value in (-1, 21601):
        with pytest.raises(ClientError) as caught:
            raw_sagemaker.update_training_job(
                TrainingJobName="ranged", ResourceConfig={"KeepAlivePeriodInSeconds": value}
            )
        assert caught.value.response["Error"]["Code"] == "ValidationException"
    with pytest.raises(ClientError) as caught:
        raw_sagemaker.update_training_job(
            TrainingJobName="ghost", ResourceConfig={"KeepAlivePeriodInSeconds": 1}
        )
    assert caught.value.response["Error"]["Code"] == "ValidationException"


def test_a_job_stopped_after_launch_leaves_a_pool_and_one_stopped_while_starting_does_not(
    emulator: SageMakerEmulator, sagemaker: Any, warm_request: Any
) -> None:
    sagemaker.create_training_job(**warm_request("launched"))
    sagemaker.create_training_job(**warm_request("never-launched", ResourceConfig={"InstanceCount": 2}))
    emulator.advance(60)
    sagemaker.stop_training_job(TrainingJobName="never-launched")
    emulator.advance(140)
    sagemaker.stop_training_job(TrainingJobName="launched")
    emulator.advance(30 + 20)
    assert describe(sagemaker, "launched")["TrainingJobStatus"] == "Stopped"
    assert warm_pool(sagemaker, "launched")["Status"] == "Available"
    assert warm_pool(sagemaker, "never-launched")["Status"] == "Terminated"


def test_an_algorithm_failure_leaves_a_pool_but_an_internal_error_does_not(
    emulator: SageMakerEmulator, sagemaker: Any, warm_request: Any
) -> None:
    for name, reason in (("algo", "AlgorithmError: boom"), ("internal", "InternalServerError: host lost")):
        sagemaker.create_training_job(
            **warm_request(
                name,
                Environment={"SAGEQUEUE_SIM_OUTCOME": f"Failed:{reason}", "SAGEQUEUE_SIM_DURATION": "60"},
            )
        )
    emulator.advance(300)
    assert describe(sagemaker, "algo")["TrainingJobStatus"] == "Failed"
    assert warm_pool(sagemaker, "algo")["Status"] == "Available"
    assert warm_pool(sagemaker, "internal")["Status"] == "Terminated"


def test_spot_jobs_never_take_a_warm_pool(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any, pool_owner: str
) -> None:
    sagemaker.create_training_job(**make_request("spot", EnableManagedSpotTraining=True))
    assert warm_pool(sagemaker, pool_owner)["Status"] == "Available"
    assert "WarmPoolStatus" not in describe(sagemaker, "spot")


def test_a_pool_cannot_outlive_its_28_day_chain(
    emulator: SageMakerEmulator, sagemaker: Any, clock: VirtualClock, warm_request: Any
) -> None:
    # GIVEN a chain of 9-day jobs, each reusing the previous one's pool
    nine_days = str(9 * 86400)
    long_job = {
        "Environment": {"SAGEQUEUE_SIM_DURATION": nine_days},
        "StoppingCondition": {"MaxRuntimeInSeconds": 28 * 86400},
    }
    sagemaker.create_training_job(
        **warm_request("link-1", ResourceConfig={"KeepAlivePeriodInSeconds": 21600}, **long_job)
    )
    emulator.advance(120)
    launched = clock.now()
    emulator.advance(9 * 86400 + 50)
    sagemaker.create_training_job(
        **warm_request("link-2", ResourceConfig={"KeepAlivePeriodInSeconds": 21600}, **long_job)
    )
    assert warm_pool(sagemaker, "link-1")["ReusedByJob"] == "link-2"
    emulator.advance(9 * 86400 + 60)
    # link-3 trains until three hours before the chain's 28 days are up (it starts warm: 10 + 30 s, uploads 20 s)
    chain_end = launched + timedelta(days=28)
    training = (chain_end - timedelta(hours=3) - clock.now()).total_seconds() - 60
    last = {**long_job, "Environment": {"SAGEQUEUE_SIM_DURATION": str(training)}}
    sagemaker.create_training_job(
        **warm_request("link-3", ResourceConfig={"KeepAlivePeriodInSeconds": 21600}, **last)
    )
    assert warm_pool(sagemaker, "link-2")["ReusedByJob"] == "link-3"
    # WHEN link-3 ends with a 6-hour keep-alive but only 3 hours of the chain left
    emulator.advance(training + 60)
    job = describe(sagemaker, "link-3")
    assert job["TrainingJobStatus"] == "Completed"
    left = chain_end - job["TrainingEndTime"]
    assert left == timedelta(hours=3)
    # THEN its pool is Available only until the chain limit, not for the whole keep-alive
    emulator.advance(left.total_seconds() - 1)
    assert warm_pool(sagemaker, "link-3")["Status"] == "Available"
    emulator.advance(1)
    assert warm_pool(sagemaker, "link-3") == {
        "Status": "Terminated",
        "ResourceRetainedBillableTimeInSeconds": int(left.total_seconds()),
    }


def test_available_pools_count_against_the_limit_and_reuse_needs_no_extra_capacity(
    emulator: SageMakerEmulator, sagemaker: Any, warm_request: Any, make_request: Any
) -> None:
    # GIVEN the 4-instance limit held entirely by a warm pool
    sagemaker.create_training_job(**warm_request("holder", ResourceConfig={"InstanceCount": 4}))
    emulator.advance(FRESH_RUN)
    assert warm_pool(sagemaker, "holder")["Status"] == "Available"
    # THEN a job that does not match it cannot start
    with pytest.raises(ClientError) as caught:
        sagemaker.create_training_job(**make_request("stranger"))
    assert caught.value.response["Error"]["Code"] == "ResourceLimitExceeded"
    # AND a matching job takes the pool over within the limit
    sagemaker.create_training_job(**warm_request("matching", ResourceConfig={"InstanceCount": 4}))
    assert warm_pool(sagemaker, "holder")["ReusedByJob"] == "matching"
    # AND once the pool is released, the capacity is free
    emulator.advance(WARM_RUN)
    sagemaker.update_training_job(TrainingJobName="matching", ResourceConfig={"KeepAlivePeriodInSeconds": 0})
    sagemaker.create_training_job(**make_request("stranger"))
