"""What the SageMaker SDK end-to-end tests (v2 and v3, each in its own environment) share: the pool, the
image, moving the stack's virtual clock, and a job that keeps the pool busy."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from sagequeue.client import QueueClient

POOL = "ml.trn1.32xlarge"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/neuron-train:2.21"


def advance_until(stack: Any, done: Callable[[], bool], *, step: float = 30, limit: float = 7200) -> None:
    """Move the stack's virtual clock in `step`s until `done()`; fail after `limit` simulated seconds."""
    stack.run_until_idle()
    waited = 0.0
    while not done():
        if waited >= limit:
            raise AssertionError(f"condition not reached after {limit:g} simulated seconds")
        stack.advance(step)
        waited += step


def hold_the_pool(stack: Any, queue: QueueClient, seconds: int = 240) -> str:
    """Start a job that keeps the pool's one instance busy for `seconds`."""
    name = f"blocker-{uuid.uuid4().hex[:6]}"
    queue.submit(
        {
            "TrainingJobName": name,
            "RoleArn": stack.training_role_arn,
            "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
            "OutputDataConfig": {"S3OutputPath": "s3://sagequeue-e2e/output"},
            "ResourceConfig": {"InstanceType": POOL, "InstanceCount": 1, "VolumeSizeInGB": 64},
            "StoppingCondition": {"MaxRuntimeInSeconds": 7200},
            "Environment": {"SAGEQUEUE_SIM_DURATION": str(seconds)},
        },
        priority=900,
    )
    advance_until(stack, lambda: queue.job(name).state == "running")
    return name
