"""Plain boto3 with `sagequeue.install`, against the local stack over HTTP: the API, the scheduler and the
SageMaker emulator all real, the clock virtual.

GIVEN a pool of one ml.trn1.32xlarge and a boto3 SageMaker client with the hook installed,
WHEN the caller uses create/describe/stop_training_job and botocore's waiter as usual,
THEN jobs are queued with their priority, tags and keep-alive, started by the scheduler, preempted and
resumed, and every describe answers under the caller's name.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import sagequeue
from sagequeue.client import QueueClient
from sagequeue.local import LocalStack

POOL = "ml.trn1.32xlarge"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/neuron-train:2.21"


@pytest.fixture(scope="module")
def stack() -> Iterator[Any]:
    # a training plan is a pool of its own (plan:<name>)
    settings = {"capacity": {POOL: 1, "plan:trn1-reserved": 1}, "min_runtime_before_preemption_seconds": 0}
    with LocalStack(settings=settings) as running:
        yield running


@pytest.fixture
def queue(stack: Any) -> QueueClient:
    return stack.client()


@pytest.fixture
def sagemaker(stack: Any, queue: QueueClient) -> Any:
    """The user's client: a boto3 SageMaker client on the emulator, routed through the queue."""
    client = stack.emulator.client()
    sagequeue.install(client, client=queue)
    return client


@pytest.fixture(autouse=True)
def drained(stack: Any, queue: QueueClient) -> Iterator[None]:
    """Each test starts and ends with nothing running, so the one instance is free."""
    yield
    for job in queue.jobs():
        if not job.terminal:
            queue.cancel(job.name)
    advance_until(stack, lambda: all(j.terminal for j in queue.jobs()), limit=3600)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def training_request(
    stack: Any, name: str, priority: int | None = None, seconds: int = 300
) -> dict[str, Any]:
    tags = [{"Key": "team", "Value": "nlp"}, {"Key": "cost-center", "Value": "cc-42"}]
    if priority is not None:
        tags.append({"Key": "priority", "Value": str(priority)})
    return {
        "TrainingJobName": name,
        "RoleArn": stack.training_role_arn,
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": "s3://sagequeue-e2e/output"},
        "ResourceConfig": {
            "InstanceType": POOL,
            "InstanceCount": 1,
            "VolumeSizeInGB": 64,
            "KeepAlivePeriodInSeconds": 900,
        },
        "CheckpointConfig": {"S3Uri": "s3://sagequeue-e2e/checkpoints/" + name},
        "StoppingCondition": {"MaxRuntimeInSeconds": 7200},
        "Environment": {"SAGEQUEUE_SIM_DURATION": str(seconds)},
        "Tags": tags,
    }


def advance_until(stack: Any, done: Callable[[], bool], *, step: float = 30, limit: float = 7200) -> None:
    stack.run_until_idle()
    waited = 0.0
    while not done():
        if waited >= limit:
            raise AssertionError(f"condition not reached after {limit:g} simulated seconds")
        stack.advance(step)
        waited += step


def test_create_queues_with_tag_priority_and_the_scheduler_starts_it_unchanged(
    stack: Any, queue: QueueClient, sagemaker: Any
) -> None:
    name = unique("bert")
    plan = f"arn:aws:sagemaker:{stack.region}:{stack.account_id}:training-plan/trn1-reserved"
    create = training_request(stack, name, priority=100)
    create["ResourceConfig"]["TrainingPlanArn"] = plan

    answer = sagemaker.create_training_job(**create)

    assert (
        answer["TrainingJobArn"] == f"arn:aws:sagemaker:{stack.region}:{stack.account_id}:training-job/{name}"
    )
    job = queue.job(name)
    assert (job.state, job.priority, job.pool, job.position) == ("queued", 100, "plan:trn1-reserved", 1)
    assert job.owner == stack.identity().arn
    # nothing reached SageMaker yet: the job waits for the scheduler
    pending = sagemaker.describe_training_job(TrainingJobName=name)
    assert (pending["TrainingJobStatus"], pending["SecondaryStatus"]) == ("InProgress", "Pending")
    assert "position 1" in pending["SecondaryStatusTransitions"][0]["StatusMessage"]

    stack.run_until_idle()

    started = queue.job(name)
    assert started.state in ("starting", "running")
    assert started.training_job_name == name
    real = stack.sagemaker.describe_training_job(TrainingJobName=name)
    assert real["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 900
    assert real["ResourceConfig"]["TrainingPlanArn"] == plan
    assert real["CheckpointConfig"]["S3Uri"] == f"s3://sagequeue-e2e/checkpoints/{name}"
    tags = {
        t["Key"]: t["Value"] for t in stack.sagemaker.list_tags(ResourceArn=real["TrainingJobArn"])["Tags"]
    }
    assert tags["team"] == "nlp"
    assert tags["cost-center"] == "cc-42"
    assert tags["priority"] == "100"

    advance_until(stack, lambda: queue.job(name).terminal)
    sagemaker.get_waiter("training_job_completed_or_stopped").wait(
        TrainingJobName=name, WaiterConfig={"Delay": 1, "MaxAttempts": 3}
    )
    done = sagemaker.describe_training_job(TrainingJobName=name)
    assert done["TrainingJobStatus"] == "Completed"
    assert queue.job(name).state == "completed"


def test_installed_priority_overrides_the_tag(stack: Any, queue: QueueClient) -> None:
    client = stack.emulator.client()
    sagequeue.install(client, client=queue, priority=640)
    name = unique("tagged")
    client.create_training_job(**training_request(stack, name, priority=5))
    assert queue.job(name).priority == 640


@pytest.mark.slow
def test_a_preempted_job_waits_again_then_describes_as_its_next_attempt(
    stack: Any, queue: QueueClient, sagemaker: Any
) -> None:
    low, high = unique("low"), unique("high")
    sagemaker.create_training_job(**training_request(stack, low, priority=10, seconds=400))
    advance_until(stack, lambda: queue.job(low).state == "running")

    sagemaker.create_training_job(**training_request(stack, high, priority=900, seconds=120))
    advance_until(stack, lambda: queue.job(low).waiting)

    requeued = queue.job(low)
    assert requeued.preemptions == 1
    waiting = sagemaker.describe_training_job(TrainingJobName=low)
    assert waiting["SecondaryStatus"] == "Pending"
    assert "preempted" in waiting["SecondaryStatusTransitions"][0]["StatusMessage"]

    advance_until(stack, lambda: queue.job(low).attempt == 2 and queue.job(low).live)
    second = sagemaker.describe_training_job(TrainingJobName=low)
    assert second["TrainingJobName"] == low
    assert second["TrainingJobArn"].endswith(f"training-job/{low}--2")
    assert queue.job(high).state == "completed"

    advance_until(stack, lambda: queue.job(low).terminal)
    assert sagemaker.describe_training_job(TrainingJobName=low)["TrainingJobStatus"] == "Completed"
    assert queue.job(low).attempts == (low, f"{low}--2")


def test_stop_of_a_queued_job_cancels_it_and_it_describes_as_stopped(
    stack: Any, queue: QueueClient, sagemaker: Any
) -> None:
    running, waiting = unique("busy"), unique("idle")
    sagemaker.create_training_job(**training_request(stack, running, priority=500))
    stack.run_until_idle()
    sagemaker.create_training_job(**training_request(stack, waiting, priority=1))

    sagemaker.stop_training_job(TrainingJobName=waiting)

    assert queue.job(waiting).state == "cancelled"
    described = sagemaker.describe_training_job(TrainingJobName=waiting)
    assert described["TrainingJobStatus"] == "Stopped"


def test_a_request_the_queue_refuses_is_a_client_error_with_its_reason(stack: Any, sagemaker: Any) -> None:
    from botocore.exceptions import ClientError

    request = training_request(stack, unique("rogue"))
    request["RoleArn"] = f"arn:aws:iam::{stack.account_id}:role/not-allowed"

    with pytest.raises(ClientError) as raised:
        sagemaker.create_training_job(**request)

    error = raised.value.response["Error"]
    assert error["Code"] == "ValidationException"
    assert "not-allowed" in error["Message"]


def test_jobs_the_queue_never_saw_are_sagemakers_business(stack: Any, sagemaker: Any) -> None:
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as raised:
        sagemaker.describe_training_job(TrainingJobName=unique("never-submitted"))
    assert "not found" in raised.value.response["Error"]["Message"].lower()


def test_a_name_already_queued_is_resource_in_use_as_on_sagemaker(stack: Any, sagemaker: Any) -> None:
    from botocore.exceptions import ClientError

    name = unique("twice")
    sagemaker.create_training_job(**training_request(stack, name))

    with pytest.raises(ClientError) as raised:
        sagemaker.create_training_job(**training_request(stack, name))

    assert raised.value.response["Error"]["Code"] == "ResourceInUse"
    assert name in raised.value.response["Error"]["Message"]


def test_stopping_someone_elses_queued_job_is_access_denied(
    stack: Any, queue: QueueClient, sagemaker: Any
) -> None:
    from botocore.exceptions import ClientError

    busy, theirs = unique("busy"), unique("theirs")
    sagemaker.create_training_job(**training_request(stack, busy, priority=500))
    stack.run_until_idle()
    sagemaker.create_training_job(**training_request(stack, theirs, priority=1))
    other = stack.emulator.client()
    sagequeue.install(other, client=stack.client("other"))

    with pytest.raises(ClientError) as raised:
        other.stop_training_job(TrainingJobName=theirs)

    assert raised.value.response["Error"]["Code"] == "AccessDeniedException"
    assert raised.value.response["Error"]["Message"].startswith("sagequeue: ")
    assert queue.job(theirs).state == "queued"
