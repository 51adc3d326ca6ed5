"""Alarms and notices reach someone. On the local stack (moto's server over HTTP, the template's alarms
evaluated on the stack's clock):

- a health alarm going to ALARM notifies the operations topic, and its subscriber receives the alarm;
- a job owner who ran `sagequeue notify <queue ARN>` receives its own jobs' notices (start, end) and none of
  another user's, who subscribed the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sagequeue.config import save_local_connection
from sagequeue.local import LocalStack

POOL = "ml.trn1.32xlarge"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/neuron-train:2.21"
COMMAND = str(Path(sys.executable).with_name("sagequeue"))
AWS_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


@pytest.fixture(scope="module")
def stack() -> Iterator[Any]:
    with LocalStack(settings={"capacity": {POOL: 2}}) as running:
        yield running


def a_queue(stack: Any, name: str) -> tuple[str, str]:
    """An SQS queue on the stack's moto that SNS may deliver to: (URL, ARN)."""
    sqs = stack.aws_client("sqs")
    url = sqs.create_queue(QueueName=f"{name}-{uuid.uuid4().hex[:6]}")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    return url, arn


def received(stack: Any, url: str) -> list[dict[str, Any]]:
    """Every SNS envelope waiting in the queue (consumed)."""
    sqs = stack.aws_client("sqs")
    out = []
    while True:
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
        if not messages:
            return out
        for message in messages:
            out.append(json.loads(message["Body"]))
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


def test_a_health_alarm_reaches_the_operations_topics_subscriber(stack: Any) -> None:
    # GIVEN an operator's queue subscribed to the operations topic
    url, arn = a_queue(stack, "operator")
    topic = stack.spec.outputs["OperationsTopicArn"]
    stack.aws_client("sns").subscribe(TopicArn=topic, Protocol="sqs", Endpoint=arn)
    api = stack.spec.functions["ApiFunction"]
    # WHEN the API function fails (the Errors datapoint Lambda records for a failed invocation)
    stack.aws_client("cloudwatch").put_metric_data(
        Namespace="AWS/Lambda",
        MetricData=[
            {
                "MetricName": "Errors",
                "Dimensions": [{"Name": "FunctionName", "Value": api.name}],
                "Timestamp": stack.now(),
                "Value": 1.0,
                "Unit": "Count",
            }
        ],
    )
    stack.advance(600)
    # THEN the API's alarm went to ALARM and told the operator so
    alarms = [json.loads(envelope["Message"]) for envelope in received(stack, url)]
    fired = [a for a in alarms if a.get("NewStateValue") == "ALARM"]
    (api_alarm,) = [a.name for a in stack.spec.alarms if a.logical_id == "ApiErrorsAlarm"]
    assert [a["AlarmName"] for a in fired] == [api_alarm]
    assert "API function" in fired[0]["AlarmDescription"]
    # AND every health alarm of the template notifies the operations topic, going to ALARM and back to OK
    cloudwatch = stack.aws_client("cloudwatch")
    health = [
        a
        for a in cloudwatch.describe_alarms(AlarmTypes=["MetricAlarm"])["MetricAlarms"]
        if not a["AlarmName"].startswith("sagequeue-idle-")
    ]
    assert len(health) == 4
    for alarm in health:
        assert alarm["AlarmActions"] == [topic], alarm["AlarmName"]
        assert alarm["OKActions"] == [topic], alarm["AlarmName"]


def request(stack: Any, name: str) -> dict[str, Any]:
    return {
        "TrainingJobName": name,
        "RoleArn": stack.training_role_arn,
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": "s3://sagequeue-e2e/output"},
        "ResourceConfig": {"InstanceType": POOL, "InstanceCount": 1, "VolumeSizeInGB": 64},
        "StoppingCondition": {"MaxRuntimeInSeconds": 7200},
        "Environment": {"SAGEQUEUE_SIM_DURATION": "300"},
    }


def notify(stack: Any, who: str, home: Path, endpoint: str) -> subprocess.CompletedProcess[str]:
    save_local_connection(stack.connection(who), home / "local.json")
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith("SAGEQUEUE_") and k not in AWS_KEYS
    }
    environment["SAGEQUEUE_HOME"] = str(home)
    return subprocess.run(
        [COMMAND, "notify", endpoint, "--json"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
        check=False,
    )


def test_an_owner_receives_its_own_jobs_notices_and_not_another_users(stack: Any, tmp_path: Path) -> None:
    # GIVEN two users, each subscribed to their jobs' notices with one command
    queues = {}
    for who in ("user", "other"):
        url, arn = a_queue(stack, who)
        home = tmp_path / who
        home.mkdir()
        done = notify(stack, who, home, arn)
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert answer["owner"] == stack.identity(who).arn
        assert answer["protocol"] == "sqs"
        queues[who] = url
    # WHEN each submits a job and both run to their end
    mine, theirs = f"mine-{uuid.uuid4().hex[:4]}", f"theirs-{uuid.uuid4().hex[:4]}"
    stack.client("user").submit(request(stack, mine))
    stack.client("other").submit(request(stack, theirs))
    stack.run_until_idle()
    stack.advance(900)
    assert stack.client("user").job(mine).state == "completed"
    assert stack.client("other").job(theirs).state == "completed"
    # THEN each received the notices of its own job, in order, and none of the other's
    for who, job in (("user", mine), ("other", theirs)):
        notices = received(stack, queues[who])
        attributes = [{k: v["Value"] for k, v in n["MessageAttributes"].items()} for n in notices]
        assert {a["job"] for a in attributes} == {job}, (who, attributes)
        assert {a["owner"] for a in attributes} == {stack.identity(who).arn}
        assert [a["event"] for a in attributes] == ["started", "finished"]
        assert notices[-1]["Subject"] == f"sagequeue: job {job} finished"
        assert "it is now completed" in notices[-1]["Message"]


def test_a_forged_end_on_the_bus_sends_no_notice(stack: Any, tmp_path: Path) -> None:
    # GIVEN an owner subscribed to its notices, and its job running
    url, arn = a_queue(stack, "owner")
    home = tmp_path / "owner"
    home.mkdir()
    assert notify(stack, "user", home, arn).returncode == 0
    name = f"long-{uuid.uuid4().hex[:4]}"
    stack.client("user").submit({**request(stack, name), "Environment": {"SAGEQUEUE_SIM_DURATION": "36000"}})
    stack.run_until_idle()
    for _ in range(20):  # provisioning, as long as SageMaker takes (events may come late)
        if stack.client("user").job(name).state == "running":
            break
        stack.advance(60)
        stack.run_until_idle()
    assert stack.client("user").job(name).state == "running"
    # WHEN someone allowed to put events on sagequeue's bus says the job failed
    bus = stack.spec.outputs["EventBusName"]
    before = stack.invocations.get("NoticesFunction", 0)
    stack.aws_client("events").put_events(
        Entries=[
            {
                "Source": "sagequeue",
                "DetailType": "JobFinished",
                "Detail": json.dumps({"name": name, "state": "failed", "reason": "forged"}),
                "EventBusName": bus,
            }
        ]
    )
    stack.run_until_idle()
    assert stack.invocations["NoticesFunction"] == before + 1  # the forged event reached the function
    # THEN the owner heard of the start only: the table says the job runs
    events = [n["MessageAttributes"]["event"]["Value"] for n in received(stack, url)]
    assert events == ["started"]
    assert stack.client("user").job(name).state == "running"
