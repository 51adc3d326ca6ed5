"""`LocalStack(aws="in-process")`, what `sagequeue demo` runs on: moto's handlers and the emulator answer the
stack's own clients without HTTP, and the queue behaves exactly as over HTTP."""

from __future__ import annotations

import socket
from typing import Any

import botocore.session
import pytest
from botocore.exceptions import ClientError

from sagequeue.local.emulator import SageMakerEmulator
from sagequeue.local.inprocess import IN_PROCESS_ENDPOINT
from sagequeue.local.stack import LocalStack

POOL = "ml.trn1.32xlarge"
ACCOUNT = "222233334444"
SETTINGS = {"capacity": {POOL: 2}, "min_runtime_before_preemption_seconds": 0}


def request(name: str, role: str, seconds: int = 600) -> dict[str, Any]:
    return {
        "TrainingJobName": name,
        "RoleArn": role,
        "AlgorithmSpecification": {"TrainingImage": "img:1", "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/output"},
        "ResourceConfig": {"InstanceType": POOL, "InstanceCount": 1, "VolumeSizeInGB": 64},
        "StoppingCondition": {"MaxRuntimeInSeconds": 7200},
        "Environment": {"SAGEQUEUE_SIM_DURATION": str(seconds)},
    }


def scenario(aws: str) -> tuple[bytes, dict[str, list[tuple[str, int]]]]:
    """Three jobs on two instances, the last one preempting: the emulator's event log and each job's
    history (state, attempt), on one transport. Same account, seed and clock on both."""
    with LocalStack(
        settings=SETTINGS, aws=aws, account_id=ACCOUNT, emulator={"seed": 7}, function_logs=False
    ) as stack:
        queue = stack.client()
        for index, priority in enumerate((1, 1, 5)):
            queue.submit(request(f"job-{index}", stack.training_role_arn), priority=priority)
            stack.advance(120)
        stack.advance(2400)
        histories = {
            name: [(entry.state, entry.attempt) for entry in queue.job(name).history]
            for name in ("job-0", "job-1", "job-2")
        }
        return stack.emulator.event_log_bytes(), histories


@pytest.mark.slow
def test_in_process_and_http_stacks_tell_the_same_story() -> None:
    # GIVEN the same seeded scenario, WHEN it runs over moto's server and then in process
    over_http = scenario("http")
    in_process = scenario("in-process")
    # THEN SageMaker saw the same events in the same order, and every job has the same history
    events, histories = in_process
    assert events == over_http[0]
    assert histories == over_http[1]
    assert b'"TrainingJobStatus":"Completed"' in events
    # and the story has a preemption in it, not only starts: job-2 (priority 5) took an instance
    assert any(state == "preempting" for state, _ in histories["job-0"] + histories["job-1"])
    assert all(history[-1][0] == "completed" for history in histories.values())


def test_an_in_process_stack_reaches_moto_without_a_server() -> None:
    with LocalStack(settings=SETTINGS, aws="in-process", function_logs=False) as stack:
        # GIVEN a stack whose AWS endpoint cannot be reached over the network
        assert stack.moto_endpoint == IN_PROCESS_ENDPOINT
        with pytest.raises(socket.gaierror):
            socket.getaddrinfo("moto.sagequeue.invalid", 80)
        # WHEN a job is submitted and its training starts
        queue = stack.client()
        queue.submit(request("served", stack.training_role_arn))
        stack.advance(300)
        # THEN the functions did their work through moto in this process
        assert queue.job("served").state == "running"
        tables = stack.aws_client("dynamodb").list_tables()["TableNames"]
        assert len(tables) == 1
        described = stack.sagemaker.describe_training_job(TrainingJobName="served")
        assert described["TrainingJobStatus"] == "InProgress"


def test_a_stopped_in_process_stack_leaves_nothing_to_the_next() -> None:
    # GIVEN a stack in an account that held a job, then stopped
    with LocalStack(settings=SETTINGS, aws="in-process", account_id=ACCOUNT, function_logs=False) as stack:
        stack.client().submit(request("forgotten", stack.training_role_arn))
        stack.run_until_idle()
    # WHEN another stack starts in the same account, THEN its queue is empty
    with LocalStack(settings=SETTINGS, aws="in-process", account_id=ACCOUNT, function_logs=False) as stack:
        assert stack.client().jobs() == []


def test_an_unknown_transport_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"aws must be 'http' \(moto's server\) or 'in-process', got 'grpc'"):
        LocalStack(aws="grpc")


def test_an_attached_client_gets_the_answers_the_http_server_gives() -> None:
    with SageMakerEmulator() as emulator:
        session = botocore.session.get_session()

        def client() -> Any:
            return session.create_client(
                "sagemaker",
                endpoint_url=emulator.endpoint_url,
                region_name="us-east-1",
                aws_access_key_id="k",
                aws_secret_access_key="s",
            )

        over_http, attached = client(), emulator.attach(client())
        # GIVEN a job created through the attached client
        attached.create_training_job(**request("attached", "arn:aws:iam::123456789012:role/r"))
        # THEN both clients see it, and refusals carry the same code and message either way
        assert over_http.describe_training_job(TrainingJobName="attached")["TrainingJobName"] == "attached"
        errors = []
        for each in (over_http, attached):
            with pytest.raises(ClientError) as refused:
                each.describe_training_job(TrainingJobName="no-such-job")
            errors.append(refused.value.response["Error"])
        assert errors[0] == errors[1]
        assert errors[0]["Code"] == "ValidationException"
        with pytest.raises(ClientError) as invalid:
            attached.create_training_job(**request("attached", "arn:aws:iam::123456789012:role/r"))
        assert invalid.value.response["Error"]["Code"] == "ResourceInUse"
