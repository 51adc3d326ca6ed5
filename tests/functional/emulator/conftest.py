"""An emulator on a virtual clock per test, a boto3 client for it, and a CreateTrainingJob request factory."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from botocore.config import Config

from sagequeue.local import SageMakerEmulator, VirtualClock

START = datetime(2026, 3, 2, 9, 0, 0, tzinfo=UTC)
ROLE = "arn:aws:iam::123456789012:role/SageMakerTraining"
TRN1 = "ml.trn1.32xlarge"

#: Phase lengths the tests count on (simulated seconds).
TIMINGS: dict[str, Any] = {
    "provisioning_seconds": 120,
    "warm_start_seconds": 10,
    "download_seconds": 30,
    "upload_seconds": 20,
    "stop_grace_seconds": 30,
    "default_duration_seconds": 600,
    "capacity_error_after_seconds": 900,
    "spot_interruption_seconds": 60,
    # WarmPoolStatus shows at once: these tests read pools at exact moments; the lag has its own test
    "warm_pool_status_lag_seconds": 0,
}

RequestFactory = Callable[..., dict[str, Any]]


def sagemaker_client(endpoint_url: str, *, validate: bool = True, retries: int = 1) -> Any:
    return boto3.client(
        "sagemaker",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        config=Config(
            parameter_validation=validate,
            retries={"total_max_attempts": retries, "mode": "standard"},
        ),
    )


@pytest.fixture
def events() -> list[dict[str, Any]]:
    return []


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock(START)


@pytest.fixture
def emulator(clock: VirtualClock, events: list[dict[str, Any]]) -> Iterator[SageMakerEmulator]:
    with SageMakerEmulator(
        clock=clock, instance_limits={TRN1: 4}, on_event=events.append, **TIMINGS
    ) as running:
        yield running


@pytest.fixture
def sagemaker(emulator: SageMakerEmulator) -> Any:
    return sagemaker_client(emulator.endpoint_url)


@pytest.fixture
def raw_sagemaker(emulator: SageMakerEmulator) -> Any:
    """A client that sends what it is given, so the emulator's own validation answers."""
    return sagemaker_client(emulator.endpoint_url, validate=False)


def _request(name: str, **overrides: Any) -> dict[str, Any]:
    request: dict[str, Any] = {
        "TrainingJobName": name,
        "RoleArn": ROLE,
        "AlgorithmSpecification": {
            "TrainingImage": "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training-neuronx:2.1",
            "TrainingInputMode": "File",
        },
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/output"},
        "ResourceConfig": {"InstanceType": TRN1, "InstanceCount": 1, "VolumeSizeInGB": 512},
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
        "HyperParameters": {"epochs": "3"},
        "Environment": {"SAGEQUEUE_SIM_DURATION": "600"},
        "Tags": [{"Key": "team", "Value": "nlp"}],
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(request.get(key), dict):
            request[key] = {**request[key], **value}
        elif value is None:
            request.pop(key, None)
        else:
            request[key] = value
    return copy.deepcopy(request)


@pytest.fixture
def make_request() -> RequestFactory:
    """`make_request(name, ResourceConfig={...})` merges dict members; a None value removes a member."""
    return _request
