"""Event routing on moto: rules match (moto decides), schedules fire on the clock, SNS and SQS sources deliver,
failures retry then land in the on-failure destination, and reserved concurrency serializes a function."""

from __future__ import annotations

import json
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sagequeue.local.provision import Provisioned, provision
from sagequeue.local.router import EventRouter, FunctionHost, RunawayEvents, Schedule, ScheduleError
from sagequeue.local.template import StackContext, StackSpec, Template, build_spec

T0 = datetime(2026, 3, 3, 2, 20, 7, tzinfo=UTC)


@dataclass
class Wired:
    spec: StackSpec
    provisioned: Provisioned
    host: FunctionHost
    router: EventRouter
    stack_name: str

    def module(self, function: str) -> Any:
        self.host.handler(function)
        return sys.modules[f"sagequeue_local_functions.{function}.app"]

    def events(self, function: str) -> list[Any]:
        return list(self.module(function).EVENTS)


@pytest.fixture
def wired(mini_template: Path, account_moto: tuple[str, str], aws: Callable[[str], Any]) -> Iterator[Wired]:
    endpoint, account_id = account_moto
    stack_name = f"t{uuid.uuid4().hex[:8]}"
    context = StackContext(stack_name, "us-east-1", account_id, queue_url_base=endpoint)
    spec = build_spec(Template.from_file(mini_template, context, {"Required": "x"}))
    provisioned = provision(spec, stack_name, aws)
    host = FunctionHost(spec.functions)
    router = EventRouter(
        host,
        aws("sqs"),
        inboxes=provisioned.inbox_urls,
        sources=provisioned.source_urls,
        queue_arns={url: arn for arn, url in provisioned.queue_urls.items()},
        region="us-east-1",
        account_id=account_id,
        max_rounds=8,
    )
    for rule_name, function, input_ in provisioned.schedules:
        rule = next(r for r in spec.rules if r.name == rule_name)
        router.add_schedule(
            rule_name,
            f"arn:aws:events:us-east-1:{account_id}:rule/{rule_name}",
            function,
            str(rule.schedule),
            input_,
            T0,
        )
    yield Wired(spec, provisioned, host, router, stack_name)
    for name in list(sys.modules):
        if name.startswith("sagequeue_local_functions."):
            del sys.modules[name]


def test_resources_exist_in_moto(wired: Wired, aws: Callable[[str], Any]) -> None:
    table = aws("dynamodb").describe_table(TableName=f"{wired.stack_name}-items")["Table"]
    assert [i["IndexName"] for i in table["GlobalSecondaryIndexes"]] == ["by_team"]
    buses = [b["Name"] for b in aws("events").list_event_buses()["EventBuses"]]
    assert f"{wired.stack_name}-bus" in buses
    alarm = aws("cloudwatch").describe_alarms(AlarmNames=[wired.spec.alarms[0].name])["MetricAlarms"][0]
    assert alarm["DatapointsToAlarm"] == 2
    assert alarm["AlarmActions"] == [wired.spec.topics[0].arn]


def test_a_matching_event_reaches_its_function_and_others_do_not(
    wired: Wired, aws: Callable[[str], Any]
) -> None:
    bus = f"{wired.stack_name}-bus"
    aws("events").put_events(
        Entries=[
            {"Source": "test", "DetailType": "Ping", "Detail": json.dumps({"n": 1}), "EventBusName": bus},
            {"Source": "test", "DetailType": "Pang", "Detail": json.dumps({"n": 2}), "EventBusName": bus},
            {"Source": "other", "DetailType": "Ping", "Detail": json.dumps({"n": 3}), "EventBusName": bus},
        ]
    )
    assert wired.router.drain() == 1
    (event,) = wired.events("Recorder")
    assert event["detail"] == {"n": 1}
    assert event["detail-type"] == "Ping"
    assert event["account"] == wired.router.account_id
    assert wired.events("Serial") == []


def test_targets_input_and_input_path_shape_what_is_delivered(
    wired: Wired, aws: Callable[[str], Any]
) -> None:
    bus = f"{wired.stack_name}-bus"
    aws("events").put_events(
        Entries=[
            {"Source": "test", "DetailType": "Pong", "Detail": json.dumps({"n": 7}), "EventBusName": bus}
        ]
    )
    wired.router.drain()
    assert wired.events("Parallel") == [{"n": 7}]  # InputPath: $.detail
    assert wired.events("Serial") == [{"constant": True}]  # a constant Input replaces the event


def test_content_filters_in_patterns_are_moto_s(wired: Wired, aws: Callable[[str], Any]) -> None:
    def job_event(status: str) -> dict[str, Any]:
        return {
            "Source": "aws.sagemaker",
            "DetailType": "SageMaker Training Job State Change",
            "Detail": json.dumps({"TrainingJobName": f"job-{status}", "TrainingJobStatus": status}),
        }

    aws("events").put_events(Entries=[job_event("InProgress"), job_event("Completed")])
    wired.router.drain()
    assert [e["detail"]["TrainingJobName"] for e in wired.events("Serial")] == ["job-Completed"]


def test_schedules_fire_on_the_clock(wired: Wired) -> None:
    router = wired.router
    assert router.fire_due_schedules(T0 + timedelta(minutes=4, seconds=59)) == 0
    # rate(5 minutes) counts from creation (02:25:07); cron(30 2 * * ? *) fires at 02:30 UTC
    assert router.fire_due_schedules(datetime(2026, 3, 3, 2, 30, tzinfo=UTC)) == 2
    assert router.fire_due_schedules(T0 + timedelta(minutes=15)) == 2  # 02:30:07 and 02:35:07
    router.drain()
    ticks = wired.events("Recorder")
    assert [e["detail-type"] for e in ticks] == ["Scheduled Event"] * 3
    assert [e["time"] for e in ticks] == [
        "2026-03-03T02:25:07Z",
        "2026-03-03T02:30:07Z",
        "2026-03-03T02:35:07Z",
    ]
    tick_rule = next(r for r in wired.spec.rules if r.logical_id == "RecorderTick")
    assert ticks[0]["resources"] == [f"arn:aws:events:us-east-1:{router.account_id}:rule/{tick_rule.name}"]
    # a constant Input replaces the event
    assert wired.events("Parallel") == [{"kind": "nightly"}]


def test_sns_subscribers_get_sns_shaped_events(wired: Wired, aws: Callable[[str], Any]) -> None:
    aws("sns").publish(TopicArn=wired.spec.topics[0].arn, Subject="hello", Message='{"x": 1}')
    wired.router.drain()
    (event,) = wired.events("Recorder")
    (record,) = event["Records"]
    assert record["EventSource"] == "aws:sns"
    assert record["Sns"]["TopicArn"] == wired.spec.topics[0].arn
    assert record["Sns"]["Subject"] == "hello"
    assert json.loads(record["Sns"]["Message"]) == {"x": 1}


def test_sqs_sources_deliver_batches(wired: Wired, aws: Callable[[str], Any]) -> None:
    work_url = next(url for arn, url in wired.provisioned.queue_urls.items() if "-Work-" in arn)
    for n in range(7):
        aws("sqs").send_message(QueueUrl=work_url, MessageBody=f"item {n}")
    wired.router.drain()
    batches = wired.events("Recorder")
    assert [len(b["Records"]) for b in batches] == [5, 2]  # BatchSize 5
    bodies = [r["body"] for b in batches for r in b["Records"]]
    assert sorted(bodies) == [f"item {n}" for n in range(7)]
    assert batches[0]["Records"][0]["eventSource"] == "aws:sqs"
    assert (
        aws("sqs").get_queue_attributes(QueueUrl=work_url, AttributeNames=["ApproximateNumberOfMessages"])[
            "Attributes"
        ]["ApproximateNumberOfMessages"]
        == "0"
    )


def test_a_failing_event_is_retried_then_sent_to_the_failure_destination(
    wired: Wired, aws: Callable[[str], Any]
) -> None:
    module = wired.module("Recorder")
    module.FAILURES_LEFT = 1  # fails once, then the retry succeeds
    aws("sns").publish(TopicArn=wired.spec.topics[0].arn, Message="first")
    wired.router.drain()
    assert len(wired.events("Recorder")) == 1
    assert wired.router.failures == []

    module.FAILURES_LEFT = 2  # MaximumRetryAttempts 1: two tries in all, both fail
    aws("sns").publish(TopicArn=wired.spec.topics[0].arn, Message="second")
    wired.router.drain()
    assert len(wired.events("Recorder")) == 1
    (failure,) = wired.router.failures
    assert failure.function == "Recorder"
    assert "told to fail" in failure.error
    dlq = next(url for arn, url in wired.provisioned.queue_urls.items() if "-DeadLetters-" in arn)
    (message,) = aws("sqs").receive_message(QueueUrl=dlq, MaxNumberOfMessages=10)["Messages"]
    record = json.loads(message["Body"])
    assert record["requestContext"]["condition"] == "RetriesExhausted"
    assert record["requestContext"]["approximateInvokeCount"] == 2
    assert record["requestPayload"]["Records"][0]["Sns"]["Message"] == "second"
    assert record["responsePayload"]["errorType"] == "RuntimeError"


def _overlap(wired: Wired, function: str) -> int:
    """Invoke `function` from two threads while the first holds; the most invocations seen at once."""
    module = wired.module(function)
    module.STARTED.clear()
    module.RELEASE.clear()
    first = threading.Thread(target=wired.host.invoke, args=(function, {"hold": True}))
    first.start()
    assert module.STARTED.wait(5)
    second = threading.Thread(target=wired.host.invoke, args=(function, {"n": 2}))
    second.start()
    second.join(0.5)  # with room for a second invocation it finishes here; reserved, it waits
    module.RELEASE.set()
    first.join(5)
    second.join(5)
    return int(module.MAX_ACTIVE)


def test_reserved_concurrency_one_never_runs_twice_at_once(wired: Wired) -> None:
    assert _overlap(wired, "Serial") == 1
    assert _overlap(wired, "Parallel") == 2


def test_endless_event_loops_are_stopped(wired: Wired, aws: Callable[[str], Any]) -> None:
    work_url = next(url for arn, url in wired.provisioned.queue_urls.items() if "-Work-" in arn)
    original = wired.host.invoke

    def echo_forever(function: str, event: Any) -> Any:
        aws("sqs").send_message(QueueUrl=work_url, MessageBody="again")
        return original(function, event)

    wired.host.invoke = echo_forever  # type: ignore[method-assign, assignment]
    aws("sqs").send_message(QueueUrl=work_url, MessageBody="start")
    with pytest.raises(RunawayEvents, match="8 rounds"):
        wired.router.drain()


def test_schedule_expressions() -> None:
    assert Schedule("rate(1 minute)", T0).next_due == T0 + timedelta(minutes=1)
    assert Schedule("rate(2 hours)", T0).next_due == T0 + timedelta(hours=2)
    weekly = Schedule("cron(0 9 ? * MON *)", datetime(2026, 3, 4, tzinfo=UTC))  # a Wednesday
    assert weekly.next_due == datetime(2026, 3, 9, 9, 0, tzinfo=UTC)
    weekly.advance()
    assert weekly.next_due == datetime(2026, 3, 16, 9, 0, tzinfo=UTC)
    with pytest.raises(ScheduleError, match="neither rate"):
        Schedule("every minute", T0)


def test_a_schedule_only_rule_gets_no_events(wired: Wired, aws: Callable[[str], Any]) -> None:
    """As EventBridge: a rule with a schedule and no pattern fires on the clock and matches no event, so a
    function with a schedule on the default bus sees each SageMaker event only through its own rules."""
    aws("events").put_events(
        Entries=[
            {
                "Source": "aws.sagemaker",
                "DetailType": "SageMaker Training Job State Change",
                "Detail": json.dumps({"TrainingJobName": "job-1", "TrainingJobStatus": "Completed"}),
            },
            {"Source": "anything", "DetailType": "Whatever", "Detail": "{}"},
        ]
    )
    assert wired.router.drain() == 1
    # Recorder (rate schedule) and Parallel (cron schedule with a constant Input) match nothing
    assert wired.events("Recorder") == []
    assert wired.events("Parallel") == []
    assert [e["detail"]["TrainingJobName"] for e in wired.events("Serial")] == ["job-1"]
    # the schedules still fire on the clock
    assert wired.router.fire_due_schedules(datetime(2026, 3, 3, 2, 30, tzinfo=UTC)) == 2
    wired.router.drain()
    assert [e["detail-type"] for e in wired.events("Recorder")] == ["Scheduled Event"]
    assert wired.events("Parallel") == [{"kind": "nightly"}]
