"""The AWS profile: SageMaker as AWS documents it, and the named departures from it a test must declare."""

from __future__ import annotations

from typing import Any

import pytest

from sagequeue.local import SageMakerEmulator, VirtualClock
from sagequeue.local.emulator import DEPARTURES, Kinder, aws_options
from tests.functional.emulator.conftest import TIMINGS

TRN1 = "ml.trn1.32xlarge"
PLAN = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/research"
RUN = 120 + 30 + 600 + 20  # provisioning, download, training, upload


def warm_status(sagemaker: Any, name: str) -> str:
    return str(sagemaker.describe_training_job(TrainingJobName=name)["WarmPoolStatus"]["Status"])


def test_the_aws_profile_departs_from_aws_in_nothing(clock: VirtualClock, make_request: Any) -> None:
    timings = {k: v for k, v in TIMINGS.items() if k != "stop_grace_seconds"}
    with SageMakerEmulator(**aws_options(region_capacity={TRN1: 2}, clock=clock, **timings)) as emulator:
        emulator.add_training_plan(PLAN, 1)
        sagemaker = emulator.client()
        sagemaker.create_training_job(**make_request("plain"))
        sagemaker.create_training_job(**make_request("planned", ResourceConfig={"TrainingPlanArn": PLAN}))
        assert emulator.departures_from_aws() == set()
        assert emulator.timings.stop_grace_seconds == 120


def test_each_kinder_setting_is_named(clock: VirtualClock, make_request: Any) -> None:
    with SageMakerEmulator(clock=clock, **TIMINGS) as emulator:
        sagemaker = emulator.client()
        sagemaker.create_training_job(
            **make_request("plain", ResourceConfig={"KeepAlivePeriodInSeconds": 60})
        )
        sagemaker.create_training_job(**make_request("planned", ResourceConfig={"TrainingPlanArn": PLAN}))
        emulator.advance(RUN)
        assert emulator.departures_from_aws() == set(DEPARTURES) - {"throttling", "event_delivery"}
    with SageMakerEmulator(clock=clock, exactly_once_in_order=True, rates=None) as emulator:
        assert {"event_delivery", "event_loss", "throttling", "faults"} <= emulator.departures_from_aws()


def test_the_warm_pool_quota_is_zero_unless_the_account_raised_it(
    clock: VirtualClock, make_request: Any
) -> None:
    timings = {k: v for k, v in TIMINGS.items() if k != "stop_grace_seconds"}
    options = aws_options(region_capacity={TRN1: 4, "ml.trn2.48xlarge": 4}, warm_pool_quota={TRN1: 1})
    with SageMakerEmulator(clock=clock, **{**options, **timings}) as emulator:
        sagemaker = emulator.client()
        keep = {"KeepAlivePeriodInSeconds": 600}
        sagemaker.create_training_job(**make_request("kept", ResourceConfig=keep))
        sagemaker.create_training_job(**make_request("beyond-quota", ResourceConfig=keep))
        sagemaker.create_training_job(
            **make_request("trn2", ResourceConfig={**keep, "InstanceType": "ml.trn2.48xlarge"})
        )
        emulator.advance(RUN)
        assert warm_status(sagemaker, "kept") == "Available"
        assert warm_status(sagemaker, "beyond-quota") == "Terminated", "the raised quota is 1 instance"
        assert warm_status(sagemaker, "trn2") == "Terminated", "AWS's default warm-pool quota is 0"


def test_a_kinder_setting_needs_a_reason_and_names() -> None:
    with pytest.raises(ValueError, match="reason"):
        Kinder(" ", "stop_grace")
    with pytest.raises(ValueError, match="departures"):
        Kinder("fast", "stop_grace", "gentle")
    assert Kinder("fast stops", "stop_grace").departures == frozenset({"stop_grace"})
