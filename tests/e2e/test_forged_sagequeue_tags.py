"""sagequeue's own tags on a training job prove nothing: anyone allowed sagemaker:CreateTrainingJob or
sagemaker:AddTags sets them. On the local stack end to end.

GIVEN sagequeue's whole stack with two teams (`user` is vision, `other` is speech),
WHEN someone with direct SageMaker rights creates a training job under a job's attempt name tagged as the
queue tags its attempts, or retags another job's running attempt with the name of their own job,
THEN the queue adopts nothing it did not start and stops nothing it did not start: the victim's job runs
its own image under a fallback name, and its retagged attempt keeps running. Only an attempt carrying its
seal (`sagequeue:seal`, an HMAC of its name under a secret only the table holds) is the queue's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sagequeue.client import QueueClient
from sagequeue.local import LocalStack
from sagequeue_core.defaults import ATTEMPT_TAG, JOB_TAG, SEAL_TAG

POOL = "ml.trn1.32xlarge"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/neuron-train:2.21"
FOREIGN_IMAGE = "999999999999.dkr.ecr.us-east-1.amazonaws.com/other:1"
FAST = {"provisioning_seconds": 60, "download_seconds": 10, "upload_seconds": 10, "stop_grace_seconds": 30}


def unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:6]}"


def request(stack: LocalStack, name: str, seconds: int, *, outcome: str | None = None) -> dict[str, Any]:
    environment = {"SAGEQUEUE_SIM_DURATION": str(seconds)}
    if outcome:
        environment["SAGEQUEUE_SIM_OUTCOME"] = outcome
    return {
        "TrainingJobName": name,
        "RoleArn": stack.training_role_arn,
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": "s3://sagequeue-e2e/output"},
        "ResourceConfig": {"InstanceType": POOL, "InstanceCount": 1, "VolumeSizeInGB": 64},
        "StoppingCondition": {"MaxRuntimeInSeconds": 7200},
        "Environment": environment,
    }


@pytest.fixture
def stack() -> Iterator[LocalStack]:
    running = LocalStack(
        settings={"capacity": {POOL: 2}, "min_runtime_before_preemption_seconds": 0},
        emulator=FAST,
        function_logs=False,
        teams={"user": "vision", "other": "speech"},
    ).start()
    yield running
    running.stop()


def until(stack: LocalStack, done: Any, limit: int, step: int = 30) -> None:
    waited = 0
    while not done():
        assert waited < limit, f"not done after {limit} s"
        stack.advance(step)
        waited += step


def cancel_all(stack: LocalStack, *queues: QueueClient) -> None:
    for queue in queues:
        for job in queue.jobs():
            if not job.terminal:
                queue.cancel(job.name)
    until(stack, lambda: all(job.terminal for queue in queues for job in queue.jobs()), limit=900)


def tags_of(stack: LocalStack, training_job_name: str) -> dict[str, str]:
    arn = stack.sagemaker.describe_training_job(TrainingJobName=training_job_name)["TrainingJobArn"]
    return {tag["Key"]: tag["Value"] for tag in stack.sagemaker.list_tags(ResourceArn=arn)["Tags"]}


def test_a_training_job_created_ahead_with_the_jobs_tags_is_not_adopted_as_its_attempt(
    stack: LocalStack,
) -> None:
    vision = stack.client("user")
    victim = unique("victim")
    # GIVEN someone with sagemaker:CreateTrainingJob creates the victim's first attempt name ahead, tagged
    # as the queue tags its attempts, running another image, and failing at once
    foreign = request(stack, victim, 30, outcome="Failed:AlgorithmError: not the victim's")
    foreign["AlgorithmSpecification"]["TrainingImage"] = FOREIGN_IMAGE
    foreign["Tags"] = [{"Key": JOB_TAG, "Value": victim}, {"Key": ATTEMPT_TAG, "Value": "1"}]
    stack.sagemaker.create_training_job(**foreign)
    stack.advance(300)
    # WHEN the victim submits its job under that name
    vision.submit(request(stack, victim, 600), priority=1)
    until(stack, lambda: vision.job(victim).terminal or vision.job(victim).state == "running", limit=900)
    # THEN its first attempt runs its own image under a fallback name, sealed, and the job does not fail
    job = vision.job(victim)
    assert job.state == "running", (job.state, job.reason)
    assert job.training_job_name != victim
    assert job.training_job_name is not None
    assert job.training_job_name.startswith(f"{victim}--1x")
    ran = stack.sagemaker.describe_training_job(TrainingJobName=job.training_job_name)
    assert ran["AlgorithmSpecification"]["TrainingImage"] == IMAGE
    assert SEAL_TAG in tags_of(stack, job.training_job_name)
    # AND the API never returns what makes a seal
    assert "attempt_secret" not in job.to_dict()
    cancel_all(stack, vision)


def test_another_jobs_tag_added_to_a_running_attempt_does_not_get_it_stopped(stack: LocalStack) -> None:
    vision, speech = stack.client("user"), stack.client("other")
    victim, decoy = unique("victim"), unique("decoy")
    # GIVEN a speech user's job and a vision user's job, both started
    speech.submit(request(stack, decoy, 3000), priority=1)
    vision.submit(request(stack, victim, 3000), priority=1)
    until(stack, lambda: vision.job(victim).training_job_name is not None, limit=300, step=5)
    # WHEN, while the victim's attempt provisions, someone with sagemaker:AddTags retags it as an attempt of
    # the speech job (which is not its current attempt: the queue would stop such an attempt of its own)
    attempt = vision.job(victim).training_job_name
    assert attempt is not None
    arn = stack.sagemaker.describe_training_job(TrainingJobName=attempt)["TrainingJobArn"]
    stack.sagemaker.add_tags(ResourceArn=arn, Tags=[{"Key": JOB_TAG, "Value": decoy}])
    stack.advance(600)
    # THEN the victim's attempt still runs, and so does the speech job
    assert stack.sagemaker.describe_training_job(TrainingJobName=attempt)["TrainingJobStatus"] == "InProgress"
    assert vision.job(victim).state == "running"
    assert speech.job(decoy).state == "running"
    cancel_all(stack, vision, speech)
