"""LocalStack on a template of the test's own: it serves that template's routes, fires its schedules on the
virtual clock, counts function errors as Lambda does, and refuses settings the stack does not have."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import urllib3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from sagequeue.local.stack import FunctionFailed, LocalStack, LocalStackError


@pytest.fixture
def stack(mini_template: Path) -> Iterator[LocalStack]:
    with LocalStack(settings={"required": "given"}, template=mini_template, function_logs=False) as running:
        yield running
    for name in list(sys.modules):
        if name.startswith("sagequeue_local_functions."):
            del sys.modules[name]


def recorder() -> Any:
    return sys.modules["sagequeue_local_functions.Recorder.app"]


def test_the_template_s_routes_are_served(stack: LocalStack) -> None:
    user = stack.identity("user")
    request = AWSRequest(method="GET", url=stack.endpoint + "/hello/world")
    SigV4Auth(Credentials(user.access_key_id, user.secret_access_key), "execute-api", stack.region).add_auth(
        request
    )
    prepared = request.prepare()
    answer = urllib3.PoolManager().request("GET", prepared.url, headers=dict(prepared.headers))
    assert answer.status == 200
    event = json.loads(answer.data)["event"]
    assert event["pathParameters"] == {"name": "world"}
    assert event["requestContext"]["identity"]["userArn"] == user.arn
    assert event["requestContext"]["accountId"] == stack.account_id


def test_schedules_fire_as_the_clock_advances(stack: LocalStack) -> None:
    started = stack.now()
    stack.advance(299)
    assert stack.invocations["Recorder"] == 0
    stack.advance(1)  # rate(5 minutes), counted from the stack's start
    ticks = [e for e in recorder().EVENTS if e.get("detail-type") == "Scheduled Event"]
    assert [e["time"] for e in ticks] == [(started + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")]


def test_a_failing_function_is_reported_and_counted(stack: LocalStack) -> None:
    stack._host.handler("Recorder")  # the module exists once the host has loaded the function
    recorder().FAILURES_LEFT = 10
    topic = stack.spec.topics[0].arn if stack.spec else ""
    stack.aws_client("sns").publish(TopicArn=topic, Message="boom")
    with pytest.raises(FunctionFailed, match="Recorder: RuntimeError: the recorder was told to fail"):
        stack.run_until_idle()
    statistics = stack.aws_client("cloudwatch").get_metric_statistics(
        Namespace="AWS/Lambda",
        MetricName="Errors",
        Dimensions=[
            {"Name": "FunctionName", "Value": stack.spec.functions["Recorder"].name if stack.spec else ""}
        ],
        StartTime=stack.now() - timedelta(minutes=5),
        EndTime=stack.now() + timedelta(minutes=1),
        Period=60,
        Statistics=["Sum"],
    )
    # MaximumRetryAttempts 1: two tries, two errors
    assert sum(point["Sum"] for point in statistics["Datapoints"]) == 2.0


def test_settings_the_stack_does_not_have_are_refused(mini_template: Path) -> None:
    with pytest.raises(LocalStackError, match="unknown setting"):
        LocalStack(settings={"required": "x", "no_such_setting": 1}, template=mini_template).start()


def test_one_stack_per_process(stack: LocalStack, mini_template: Path) -> None:
    with pytest.raises(LocalStackError, match="another LocalStack is running"):
        LocalStack(settings={"required": "x"}, template=mini_template).start()
