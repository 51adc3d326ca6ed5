"""SageMaker Python SDK v3: a real `ModelTrainer.train()` with `QueueSession`, against the local stack.

Needs the SDK v3 (`pip install -e '.[dev]' 'sagemaker>=3'`, in its own environment: v2 and v3 are one
package name). SDK v3 creates its SageMaker client from the boto3 Session, so the test points botocore at
the emulator and the stack's CloudWatch Logs with the standard AWS_ENDPOINT_URL_<SERVICE> variables, and
turns off the SDK's IAM role check (SAGEMAKER_VALIDATE_ROLE), which needs IAM.

GIVEN a pool of one ml.trn1.32xlarge that another job holds,
WHEN `ModelTrainer(sagemaker_session=QueueSession()).train()` runs,
THEN the job is queued with its priority tag, keep-alive, checkpoints and other tags, `TrainingJob`
describes it as InProgress/Pending while it waits, and `train()` returns once the scheduler has run it to
completion.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

pytest.importorskip("sagemaker.train", reason="SDK v3 tests run in an environment with 'sagemaker>=3'")

from sagemaker.core.resources import TrainingJob
from sagemaker.core.shapes import Tag
from sagemaker.train import ModelTrainer
from sagemaker.train.configs import (
    CheckpointConfig,
    Compute,
    OutputDataConfig,
    StoppingCondition,
)
from sdk_world import IMAGE, POOL, advance_until, hold_the_pool

from sagequeue.client import QueueClient
from sagequeue.local import LocalStack
from sagequeue.session import SDK_MAJOR, QueueSession


@pytest.fixture(scope="module")
def stack() -> Iterator[Any]:
    assert SDK_MAJOR == 3
    with LocalStack(settings={"capacity": {POOL: 1}}) as running, pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ENDPOINT_URL_SAGEMAKER", running.emulator.endpoint_url)
        env.setenv("AWS_ENDPOINT_URL_CLOUDWATCH_LOGS", running.moto_endpoint)
        env.setenv("SAGEMAKER_VALIDATE_ROLE", "false")
        yield running


@pytest.fixture(autouse=True)
def no_telemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK calls home after train(); not from tests."""
    from sagemaker.core.telemetry import telemetry_logging

    monkeypatch.setattr(telemetry_logging, "_requests_helper", lambda url, timeout: None)


@pytest.fixture
def queue(stack: Any) -> QueueClient:
    return stack.client()


@pytest.fixture(autouse=True)
def drained(stack: Any, queue: QueueClient) -> Iterator[None]:
    yield
    for job in queue.jobs():
        if not job.terminal:
            queue.cancel(job.name)
    advance_until(stack, lambda: all(j.terminal for j in queue.jobs()))


def trainer(stack: Any, session: QueueSession, *, priority: str = "100", seconds: int = 120) -> ModelTrainer:
    return ModelTrainer(
        training_image=IMAGE,
        role=stack.training_role_arn,
        base_job_name=f"llama-{uuid.uuid4().hex[:4]}",
        compute=Compute(
            instance_type=POOL, instance_count=1, volume_size_in_gb=64, keep_alive_period_in_seconds=900
        ),
        output_data_config=OutputDataConfig(s3_output_path="s3://sagequeue-e2e/output"),
        checkpoint_config=CheckpointConfig(s3_uri="s3://sagequeue-e2e/checkpoints"),
        stopping_condition=StoppingCondition(max_runtime_in_seconds=7200),
        environment={"SAGEQUEUE_SIM_DURATION": str(seconds)},
        tags=[Tag(key="priority", value=priority), Tag(key="team", value="nlp")],
        sagemaker_session=session,
    )


def test_train_waits_in_the_queue_and_returns_when_the_job_completes(
    stack: Any, queue: QueueClient, capsys: pytest.CaptureFixture[str]
) -> None:
    hold_the_pool(stack, queue)
    session = QueueSession(boto_session=boto3.Session(region_name=stack.region), queue_client=queue)
    model_trainer = trainer(stack, session)
    known = {j.name for j in queue.jobs()}
    outcome: dict[str, Any] = {}

    def train() -> None:
        try:
            model_trainer.train(wait=True, logs=True)
            outcome["returned"] = True
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=train, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not ({j.name for j in queue.jobs()} - known):
        assert thread.is_alive(), f"train() ended before queueing: {outcome}"
        assert time.monotonic() < deadline, "train() never submitted"
        time.sleep(0.05)
    (name,) = {j.name for j in queue.jobs()} - known

    # WHILE it waits: queued with the tag's priority, described as Pending by the SDK's own resource
    waiting = queue.job(name)
    assert (waiting.state, waiting.priority, waiting.position) == ("queued", 100, 1)
    described = TrainingJob.get(training_job_name=name, session=session.boto_session, region=stack.region)
    assert (described.training_job_status, described.secondary_status) == ("InProgress", "Pending")
    assert thread.is_alive()

    while thread.is_alive():
        assert time.monotonic() < deadline, "train() did not return"
        stack.advance(60)
        time.sleep(0.05)

    assert outcome == {"returned": True}
    assert f"sagequeue: {name}: Waiting in the sagequeue queue: position 1" in capsys.readouterr().out
    assert queue.job(name).state == "completed"
    assert model_trainer._latest_training_job.training_job_status == "Completed"
    real = stack.sagemaker.describe_training_job(TrainingJobName=name)
    assert real["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 900
    assert real["CheckpointConfig"]["S3Uri"] == "s3://sagequeue-e2e/checkpoints"
    tags = {
        t["Key"]: t["Value"] for t in stack.sagemaker.list_tags(ResourceArn=real["TrainingJobArn"])["Tags"]
    }
    assert tags["team"] == "nlp"
    assert tags["priority"] == "100"


def test_session_priority_and_stop_of_a_queued_job(stack: Any, queue: QueueClient) -> None:
    hold_the_pool(stack, queue)
    session = QueueSession(
        boto_session=boto3.Session(region_name=stack.region), queue_client=queue, priority=700
    )
    model_trainer = trainer(stack, session, priority="5")

    model_trainer.train(wait=False, logs=False)

    job = model_trainer._latest_training_job
    assert queue.job(job.training_job_name).priority == 700
    job.refresh()
    assert job.training_job_status == "InProgress"
    job.stop()
    assert queue.job(job.training_job_name).state == "cancelled"
    job.refresh()
    assert job.training_job_status == "Stopped"


def test_training_job_get_reads_the_emulators_description(monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a job created straight on the emulator with only what the request needs, run to completion
    from sagequeue.local import SageMakerEmulator

    with SageMakerEmulator() as emulator:
        monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER", emulator.endpoint_url)
        client = emulator.client()
        name = f"described-{uuid.uuid4().hex[:6]}"
        client.create_training_job(
            TrainingJobName=name,
            RoleArn="arn:aws:iam::123456789012:role/SageMakerTraining",
            AlgorithmSpecification={"TrainingImage": IMAGE, "TrainingInputMode": "File"},
            OutputDataConfig={"S3OutputPath": "s3://sagequeue-e2e/output"},
            ResourceConfig={"InstanceType": POOL, "InstanceCount": 1, "VolumeSizeInGB": 64},
            StoppingCondition={"MaxRuntimeInSeconds": 7200},
            Environment={"SAGEQUEUE_SIM_DURATION": "120"},
        )
        emulator.advance(3600)
        session = boto3.Session(region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")

        # WHEN the SDK's own resource describes it
        described = TrainingJob.get(training_job_name=name, session=session, region="us-east-1")

        # THEN every member parsed into the SDK's shapes, with the defaults SageMaker fills
        assert (described.training_job_status, described.secondary_status) == ("Completed", "Completed")
        assert described.output_data_config.kms_key_id == ""
        assert described.output_data_config.compression_type == "GZIP"
        assert described.enable_network_isolation is False
        assert described.training_time_in_seconds == 100 + 120 + 20
        assert [t.status for t in described.secondary_status_transitions] == [
            "Starting",
            "Downloading",
            "Training",
            "Uploading",
            "Completed",
        ]
