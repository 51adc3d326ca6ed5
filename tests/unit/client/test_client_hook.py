"""The botocore hook on a real boto3 SageMaker client. An in-memory queue stands in for the API, and a
`before-send` handler stands in for SageMaker's HTTP endpoint for the calls the hook lets through, so
nothing leaves the process, botocore serializes and parses as usual, and every call the hook forwards is
checked against what SageMaker should receive."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.exceptions import ClientError

import sagequeue
from sagequeue.client import Job
from sagequeue.exceptions import NotFound, ValidationError
from sagequeue.hook import passthrough

OWNER = "arn:aws:iam::123456789012:user/data-scientist"


def request(name: str = "bert-1", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::123456789012:role/train",
        "AlgorithmSpecification": {"TrainingImage": "123.dkr.ecr/img:1", "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/out"},
        "ResourceConfig": {
            "InstanceType": "ml.trn1.32xlarge",
            "InstanceCount": 2,
            "VolumeSizeInGB": 100,
            "KeepAlivePeriodInSeconds": 900,
        },
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "CheckpointConfig": {"S3Uri": "s3://bucket/ckpt"},
        "Tags": [{"Key": "team", "Value": "nlp"}, {"Key": "priority", "Value": "5"}],
    }
    body.update(extra)
    return body


class MemoryQueue:
    """The QueueClient methods the hook uses, over a dict of jobs."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.submitted: list[tuple[dict[str, Any], int | None]] = []
        self.lookups: list[str] = []
        self.cancelled: list[str] = []
        self.refuse: Exception | None = None

    def put(self, name: str, **fields: Any) -> None:
        base = {
            "name": name,
            "state": "queued",
            "priority": 5,
            "pool": "ml.trn1.32xlarge",
            "attempt": 0,
            "training_job_name": None,
            "owner": OWNER,
            "submitted_at": "2026-11-22T04:00:00+00:00",
            "instances": 2,
            "position": 3,
        }
        base.update(fields)
        self.jobs[name] = base

    def submit(self, req: dict[str, Any], priority: int | None = None) -> Job:
        if self.refuse is not None:
            raise self.refuse
        self.submitted.append((req, priority))
        self.put(req["TrainingJobName"], priority=priority if priority is not None else 5)
        return Job.from_api(self.jobs[req["TrainingJobName"]])

    def job(self, name: str) -> Job:
        self.lookups.append(name)
        if name not in self.jobs:
            raise NotFound(f"no job named {name}")
        return Job.from_api(self.jobs[name])

    def cancel(self, name: str) -> Job:
        self.cancelled.append(name)
        self.jobs[name]["state"] = "cancelled"
        return Job.from_api(self.jobs[name])


@pytest.fixture
def queue() -> MemoryQueue:
    return MemoryQueue()


@pytest.fixture
def sagemaker() -> Any:
    return boto3.client("sagemaker", region_name="eu-west-1")


class _Body:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.data


class SageMakerDouble:
    """SageMaker's endpoint for one client: records each request that reaches the wire and answers it
    with the next scripted response; a call nobody scripted fails the test."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.responses: list[tuple[str, dict[str, Any]]] = []

    def add_response(
        self, operation: str, body: dict[str, Any], expected_params: dict[str, Any] | None = None
    ) -> None:
        self.responses.append((operation, {"body": body, "expected": expected_params}))

    def send(self, request: Any, **_: Any) -> AWSResponse:
        operation = request.headers["X-Amz-Target"].decode().split(".")[-1]
        params = json.loads(request.body or b"{}")
        self.calls.append((operation, params))
        assert self.responses, f"unexpected call to SageMaker: {operation} {params}"
        expected_operation, scripted = self.responses.pop(0)
        assert operation == expected_operation
        if scripted["expected"] is not None:
            assert params == scripted["expected"]
        data = json.dumps(scripted["body"], default=lambda d: d.timestamp()).encode()
        return AWSResponse(request.url, 200, {"Content-Type": "application/x-amz-json-1.1"}, _Body(data))


@pytest.fixture
def stub(sagemaker: Any) -> Iterator[SageMakerDouble]:
    double = SageMakerDouble()
    sagemaker.meta.events.register("before-send.sagemaker.*", double.send)
    yield double
    assert double.responses == [], "scripted SageMaker responses were not used"


def test_create_goes_to_the_queue_whole_and_answers_like_sagemaker(
    sagemaker: Any, queue: MemoryQueue, stub: SageMakerDouble
) -> None:
    sagequeue.install(sagemaker, client=queue, priority=100)  # type: ignore[arg-type]

    answer = sagemaker.create_training_job(**request("Bert-1"))

    assert answer["TrainingJobArn"] == "arn:aws:sagemaker:eu-west-1:123456789012:training-job/bert-1"
    assert answer["ResponseMetadata"]["HTTPStatusCode"] == 200
    sent, priority = queue.submitted[0]
    assert sent == request("Bert-1")  # tags, keep-alive, checkpoints untouched
    assert priority == 100


def test_without_an_installed_priority_the_server_decides(
    sagemaker: Any, queue: MemoryQueue, stub: SageMakerDouble
) -> None:
    sagequeue.install(sagemaker, client=queue)  # type: ignore[arg-type]
    sagemaker.create_training_job(**request())
    assert queue.submitted[0][1] is None


def test_botocore_still_validates_the_request_first(
    sagemaker: Any, queue: MemoryQueue, stub: SageMakerDouble
) -> None:
    from botocore.exceptions import ParamValidationError

    sagequeue.install(sagemaker, client=queue)  # type: ignore[arg-type]
    with pytest.raises(ParamValidationError):
        sagemaker.create_training_job(TrainingJobName="x")
    assert queue.submitted == []


def test_a_refusal_is_a_client_error_with_the_queues_message(
    sagemaker: Any, queue: MemoryQueue, stub: SageMakerDouble
) -> None:
    sagequeue.install(sagemaker, client=queue)  # type: ignore[arg-type]
    queue.refuse = ValidationError("RoleArn arn:aws:iam::123456789012:role/train is not allowed")

    with pytest.raises(ClientError) as raised:
        sagemaker.create_training_job(**request())

    error = raised.value.response["Error"]
    assert error["Code"] == "ValidationException"
    assert "role/train is not allowed" in error["Message"]


def test_describe_of_a_queued_job_is_pending_with_its_position(
    sagemaker: Any, queue: MemoryQueue, stub: SageMakerDouble
) -> None:
    sagequeue.install(sagemaker, client=queue)  # type: ignore[arg-type]
    sagemaker.create_training_job(**request())
    queue.put("bert-1", position=3, priority=5)

    description = sagemaker.describe_training_job(TrainingJobName="bert-1")

    assert description["TrainingJobStatus"] == "InProgress"
    assert description["SecondaryStatus"] == "Pending"
    message = description["SecondaryStatusTransitions"][0]["StatusMessage"]
    assert "position 3" in message
    assert "ml.trn1.32xlarge" in message
    assert description["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 900
    assert description["CreationTime"] == datetime(2026, 11, 22, 4, tzinfo=UTC)


def test_describe_of_a_started_job_describes_its_current_attempt_under_the_asked_name(
    sagemaker: Any, queue: MemoryQueue, stub: SageMakerDouble
) -> None:
    sagequeue.install(sagemaker, client=queue)  # type: ignore[arg-type]
    queue.put("bert-1", state="running", attempt=2, training_job_name="bert-1-2", position=None)
    stub.add_response(
        "DescribeTrainingJob",
        attempt_description("bert-1-2", "InProgress", "Training"),
        expected_params={"TrainingJobName": "bert-1-2"},
    )

    description = sagemaker.describe_training_job(TrainingJobName="bert-1")

    assert description["TrainingJobName"] == "bert-1"
    assert description["SecondaryStatus"] == "Training"
    assert description["TrainingJobArn"].endswith("training-job/bert-1-2")


def test_the_waiter_keeps_working_across_queue_and_attempt(
    sagemaker: Any, queue: MemoryQueue, stub: SageMakerDouble
) -> None:
    sagequeue.install(sagemaker, client=queue)  # type: ignore[arg-type]
    sagemaker.create_training_job(**request())
    queue.put("bert-1", state="completed", attempt=1, training_job_name="bert-1")
    stub.add_response(
        "DescribeTrainingJob",
        attempt_description("bert-1", "Completed", "Completed"),
        expected_params={"TrainingJobName": "bert-1"},
    )
    sagemaker.get_waiter("training_job_completed_or_stopped").wait(
        TrainingJobName="bert-1", WaiterConfig={"Delay": 0, "MaxAttempts": 2}
    )


def test_jobs_the_queue_does_not_know_go_to_sagemaker_and_are_not_asked_again(
    sagemaker: Any, queue: MemoryQueue, stub: SageMakerDouble
) -> None:
    sagequeue.install(sagemaker, client=queue)  # type: ignore[arg-type]
    for _ in range(2):
        stub.add_response(
            "DescribeTrainingJob",
            attempt_description("other", "Completed", "Completed"),
            expected_params={"TrainingJobName": "other"},
        )
        assert sagemaker.describe_training_job(TrainingJobName="other")["TrainingJobName"] == "other"
    assert queue.lookups == ["other"]


def test_a_job_cancelled_before_it_started_describes_as_stopped(
    sagemaker: Any, queue: MemoryQueue, stub: SageMakerDouble
) -> None:
    sagequeue.install(sagemaker, client=queue)  # type: ignore[arg-type]
    queue.put(
        "bert-1", state="cancelled", ended_at="2026-11-22T05:00:00+00:00", reason="cancelled by its owner"
    )
    description = sagemaker.describe_training_job(TrainingJobName="bert-1")
    assert (description["TrainingJobStatus"], description["SecondaryStatus"]) == ("Stopped", "Stopped")


def test_a_job_refused_before_it_started_describes_as_failed_with_the_reason(
    sagemaker: Any, queue: MemoryQueue, stub: SageMakerDouble
) -> None:
    sagequeue.install(sagemaker, client=queue)  # type: ignore[arg-type]
    queue.put("bert-1", state="failed", reason="ValidationException: bad image")
    description = sagemaker.describe_training_job(TrainingJobName="bert-1")
    assert description["TrainingJobStatus"] == "Failed"
    assert description["FailureReason"] == "ValidationException: bad image"


def test_stop_of_a_queued_job_cancels_it_in_the_queue(
    sagemaker: Any, queue: MemoryQueue, stub: SageMakerDouble
) -> None:
    sagequeue.install(sagemaker, client=queue)  # type: ignore[arg-type]
    queue.put("bert-1")
    sagemaker.stop_training_job(TrainingJobName="bert-1")
    assert queue.cancelled == ["bert-1"]


def test_passthrough_lets_a_call_reach_sagemaker_as_made(
    sagemaker: Any, queue: MemoryQueue, stub: SageMakerDouble
) -> None:
    sagequeue.install(sagemaker, client=queue)  # type: ignore[arg-type]
    queue.put("bert-1", state="queued", attempt=1, training_job_name="bert-1", preemptions=1)
    stub.add_response(
        "DescribeTrainingJob",
        attempt_description("bert-1", "Stopped", "Stopped"),
        expected_params={"TrainingJobName": "bert-1"},
    )
    with passthrough():
        assert sagemaker.describe_training_job(TrainingJobName="bert-1")["TrainingJobStatus"] == "Stopped"
    # outside the block, the same name is the queued job again, waiting after its preemption
    queued = sagemaker.describe_training_job(TrainingJobName="bert-1")
    assert queued["SecondaryStatus"] == "Pending"
    assert "preempted" in queued["SecondaryStatusTransitions"][0]["StatusMessage"]


def test_uninstall_sends_create_to_sagemaker_again(
    sagemaker: Any, queue: MemoryQueue, stub: SageMakerDouble
) -> None:
    sagequeue.install(sagemaker, client=queue)  # type: ignore[arg-type]
    sagequeue.uninstall(sagemaker)
    stub.add_response(
        "CreateTrainingJob", {"TrainingJobArn": "arn:aws:sagemaker:eu-west-1:1:training-job/bert-1"}
    )
    sagemaker.create_training_job(**request())
    assert queue.submitted == []


def test_installing_twice_replaces_the_first_hook(sagemaker: Any, stub: SageMakerDouble) -> None:
    first, second = MemoryQueue(), MemoryQueue()
    sagequeue.install(sagemaker, client=first)  # type: ignore[arg-type]
    sagequeue.install(sagemaker, client=second, priority=9)  # type: ignore[arg-type]
    sagemaker.create_training_job(**request())
    assert first.submitted == []
    assert second.submitted[0][1] == 9


def test_a_boto3_session_routes_the_clients_it_creates_afterwards(queue: MemoryQueue) -> None:
    session = boto3.Session(region_name="eu-west-1")
    sagequeue.install(session, client=queue)  # type: ignore[arg-type]
    client = session.client("sagemaker")
    double = SageMakerDouble()
    client.meta.events.register("before-send.sagemaker.*", double.send)
    client.create_training_job(**request())
    assert double.calls == []
    assert queue.submitted[0][0]["TrainingJobName"] == "bert-1"


def test_install_refuses_a_client_of_another_service(queue: MemoryQueue) -> None:
    with pytest.raises(TypeError, match="needs a SageMaker client"):
        sagequeue.install(boto3.client("s3", region_name="eu-west-1"), client=queue)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes a boto3 Session"):
        sagequeue.install(object(), client=queue)  # type: ignore[arg-type]


def attempt_description(name: str, status: str, secondary: str) -> dict[str, Any]:
    now = datetime(2026, 11, 22, 4, 30, tzinfo=UTC)
    return {
        "TrainingJobName": name,
        "TrainingJobArn": f"arn:aws:sagemaker:eu-west-1:123456789012:training-job/{name}",
        "ModelArtifacts": {"S3ModelArtifacts": f"s3://bucket/out/{name}/output/model.tar.gz"},
        "TrainingJobStatus": status,
        "SecondaryStatus": secondary,
        "AlgorithmSpecification": {"TrainingInputMode": "File"},
        "ResourceConfig": {"InstanceType": "ml.trn1.32xlarge", "InstanceCount": 2, "VolumeSizeInGB": 100},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "CreationTime": now,
    }


def test_each_change_of_a_waiting_jobs_place_is_reported_once(sagemaker: Any, queue: MemoryQueue) -> None:
    lines: list[str] = []
    sagequeue.install(sagemaker, client=queue, report=lines.append)  # type: ignore[arg-type]
    queue.put("bert-1", position=2)

    sagemaker.describe_training_job(TrainingJobName="bert-1")
    sagemaker.describe_training_job(TrainingJobName="bert-1")
    queue.put("bert-1", position=1)
    sagemaker.describe_training_job(TrainingJobName="bert-1")

    assert len(lines) == 2
    assert "position 2" in lines[0]
    assert "position 1" in lines[1]


def test_arns_follow_the_submitters_partition_and_account() -> None:
    from sagequeue.hook import training_job_arn

    assert (
        training_job_arn("Bert-1", "arn:aws-cn:iam::210987654321:user/li", "cn-north-1")
        == "arn:aws-cn:sagemaker:cn-north-1:210987654321:training-job/bert-1"
    )
    assert (
        training_job_arn("x", "not-an-arn", None) == "arn:aws:sagemaker:us-east-1:000000000000:training-job/x"
    )


def test_a_held_job_says_how_to_release_it(sagemaker: Any, queue: MemoryQueue) -> None:
    sagequeue.install(sagemaker, client=queue)  # type: ignore[arg-type]
    queue.put("bert-1", state="held", position=None)
    description = sagemaker.describe_training_job(TrainingJobName="bert-1")
    assert description["SecondaryStatus"] == "Pending"
    assert "sagequeue release bert-1" in description["SecondaryStatusTransitions"][0]["StatusMessage"]
