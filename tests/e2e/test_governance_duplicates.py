"""Governance on a local stack whose SageMaker sends every state change twice, as SageMaker may: each job
still gets one set of alarms, one clone per transient failure, and one policy stop announcement."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sagequeue.local import LocalStack

TRN1 = "ml.trn1.32xlarge"


@pytest.fixture(scope="module")
def stack() -> Iterator[Any]:
    settings = {
        "capacity": {TRN1: 8},
        "required_tags": "team",
        "idle_period_seconds": 60,
        "idle_periods": 5,
        "max_resumes": 1,
        "resume_after_failure_min_runtime_seconds": 300,
    }
    with LocalStack(settings=settings, emulator={"duplicate_events": True}) as running:
        yield running


def request(
    stack: Any, name: str, env: dict[str, str], tags: dict[str, str], hosts: int = 1
) -> dict[str, Any]:
    return {
        "TrainingJobName": name,
        "RoleArn": stack.training_role_arn,
        "AlgorithmSpecification": {
            "TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/job:1",
            "TrainingInputMode": "File",
        },
        "OutputDataConfig": {"S3OutputPath": "s3://sagequeue-e2e/output"},
        "ResourceConfig": {"InstanceType": TRN1, "InstanceCount": hosts, "VolumeSizeInGB": 64},
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
        "Environment": env,
        "Tags": [{"Key": k, "Value": v} for k, v in tags.items()],
    }


def names(stack: Any, prefix: str) -> list[str]:
    pages = stack.sagemaker.get_paginator("list_training_jobs").paginate(NameContains=prefix)
    return sorted(s["TrainingJobName"] for page in pages for s in page["TrainingJobSummaries"])


def test_duplicated_events_create_no_duplicate_alarms_clones_or_announcements(stack: Any) -> None:
    run = uuid.uuid4().hex[:6]
    sns, sqs = stack.aws_client("sns"), stack.aws_client("sqs")
    inbox = sqs.create_queue(QueueName=f"notes-{run}")["QueueUrl"]
    inbox_arn = sqs.get_queue_attributes(QueueUrl=inbox, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    sns.subscribe(TopicArn=stack.spec.outputs["NotificationTopicArn"], Protocol="sqs", Endpoint=inbox_arn)
    busy, flaky, rogue = f"busy-{run}", f"flaky-{run}", f"rogue-{run}"
    fail = {"SAGEQUEUE_SIM_DURATION": "400", "SAGEQUEUE_SIM_OUTCOME": "Failed:InternalServerError: internal"}
    stack.sagemaker.create_training_job(
        **request(stack, busy, {"SAGEQUEUE_SIM_DURATION": "3000"}, {"team": "a"}, hosts=2)
    )
    stack.sagemaker.create_training_job(**request(stack, flaky, fail, {"team": "a"}))
    stack.sagemaker.create_training_job(**request(stack, rogue, {"SAGEQUEUE_SIM_DURATION": "3000"}, {}))

    stack.advance(40 * 60)

    cloudwatch = stack.aws_client("cloudwatch")
    busy_alarms = cloudwatch.describe_alarms(AlarmNamePrefix=f"sagequeue-idle-{busy}/")["MetricAlarms"]
    assert sorted(a["AlarmName"] for a in busy_alarms) == [
        f"sagequeue-idle-{busy}/algo-1",
        f"sagequeue-idle-{busy}/algo-1/no-data",
        f"sagequeue-idle-{busy}/algo-2",
        f"sagequeue-idle-{busy}/algo-2/no-data",
    ]
    # one resume (max_resumes=1) although every Failed event came twice, and none after the clone failed
    assert names(stack, flaky) == [flaky, f"{flaky}--2"]
    assert (
        stack.sagemaker.describe_training_job(TrainingJobName=f"{flaky}--2")["TrainingJobStatus"] == "Failed"
    )
    assert stack.sagemaker.describe_training_job(TrainingJobName=rogue)["TrainingJobStatus"] == "Stopped"
    subjects = []
    while messages := sqs.receive_message(QueueUrl=inbox, MaxNumberOfMessages=10).get("Messages", []):
        for message in messages:
            subjects.append(json.loads(message["Body"])["Subject"])
            sqs.delete_message(QueueUrl=inbox, ReceiptHandle=message["ReceiptHandle"])
    assert sorted(subjects) == sorted(
        [f"sagequeue stopped {rogue}: policy violation", f"sagequeue restarted {flaky} as {flaky}--2"]
    )
    stack.sagemaker.stop_training_job(TrainingJobName=busy)
    stack.advance(120)
    assert cloudwatch.describe_alarms(AlarmNamePrefix=f"sagequeue-idle-{busy}/")["MetricAlarms"] == []
