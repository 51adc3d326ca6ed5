"""Alarm evaluation: CloudWatch's M-out-of-N and missing-data rules, on metric data in moto, with the alarm's
state set in moto and an SNS-shaped alarm message delivered to the topic's subscribers."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sagequeue.local.alarms import ALARM, INSUFFICIENT_DATA, OK, AlarmEvaluator, evaluate, evaluation_range

BASE = {"Threshold": 10.0, "ComparisonOperator": "LessThanThreshold", "EvaluationPeriods": 3}
NOW = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
X, G, M = 1.0, 50.0, None  # breaching, good (not breaching), missing: below 10 breaches


@pytest.mark.parametrize(
    ("values", "treat", "datapoints", "expected"),
    [
        ([X, X, X], "missing", 3, ALARM),
        ([G, X, X], "missing", 3, OK),
        ([G, X, X], "missing", 2, ALARM),  # 2 out of 3
        ([M, M, M], "missing", 3, INSUFFICIENT_DATA),
        ([M, M, X], "missing", 3, ALARM),  # fewer points than M: all present breach
        ([M, G, X], "missing", 3, OK),
        ([M, M, M], "notBreaching", 3, OK),
        ([M, X, X], "notBreaching", 3, OK),
        ([M, X, X], "notBreaching", 2, ALARM),
        ([M, M, M], "breaching", 3, ALARM),
        ([M, G, X], "breaching", 2, ALARM),
        ([G, G, G], "breaching", 1, OK),
        ([X, X, X, G], "missing", 3, OK),  # only the last N periods count
    ],
)
def test_cloudwatch_rules(values: list[float | None], treat: str, datapoints: int, expected: str) -> None:
    alarm = {**BASE, "TreatMissingData": treat, "DatapointsToAlarm": datapoints}
    assert evaluate(alarm, values).state == expected


def test_ignore_keeps_the_state_without_data() -> None:
    alarm = {**BASE, "TreatMissingData": "ignore", "StateValue": ALARM}
    assert evaluate(alarm, [M, M, M]).state == ALARM
    assert evaluate(alarm, [G, G, G]).state == OK


def test_comparisons_include_the_threshold_or_not() -> None:
    at = {**BASE, "EvaluationPeriods": 1, "Threshold": 5.0}
    assert evaluate({**at, "ComparisonOperator": "GreaterThanOrEqualToThreshold"}, [5.0]).state == ALARM
    assert evaluate({**at, "ComparisonOperator": "GreaterThanThreshold"}, [5.0]).state == OK
    assert evaluate({**at, "ComparisonOperator": "LessThanOrEqualToThreshold"}, [5.0]).state == ALARM
    with pytest.raises(ValueError, match="LessThanLowerThreshold"):
        evaluate({**at, "ComparisonOperator": "LessThanLowerThreshold"}, [5.0])


def test_the_evaluation_range_is_whole_periods_before_now() -> None:
    periods = evaluation_range({"Period": 300, "EvaluationPeriods": 2}, NOW)
    assert periods == [
        (datetime(2026, 6, 1, 11, 50, tzinfo=UTC), datetime(2026, 6, 1, 11, 55, tzinfo=UTC)),
        (datetime(2026, 6, 1, 11, 55, tzinfo=UTC), datetime(2026, 6, 1, 12, 0, tzinfo=UTC)),
    ]


def _idle_alarm(aws: Callable[[str], Any], host: str, topic: str, queue_url: str) -> str:
    name = f"idle-{uuid.uuid4().hex[:8]}"
    aws("cloudwatch").put_metric_alarm(
        AlarmName=name,
        AlarmDescription="host idle",
        Namespace="LocalTest",
        MetricName="Utilization",
        Dimensions=[{"Name": "Host", "Value": host}],
        Statistic="Average",
        Period=60,
        EvaluationPeriods=3,
        DatapointsToAlarm=3,
        Threshold=5.0,
        ComparisonOperator="LessThanThreshold",
        TreatMissingData="missing",
        AlarmActions=[topic],
        OKActions=[topic],
    )
    return name


def test_an_idle_host_alarms_and_notifies_its_topic(
    aws: Callable[[str], Any], account_moto: tuple[str, str]
) -> None:
    _, account_id = account_moto
    topic = aws("sns").create_topic(Name=f"alarms-{uuid.uuid4().hex[:6]}")["TopicArn"]
    queue_url = aws("sqs").create_queue(QueueName=f"alarm-inbox-{uuid.uuid4().hex[:6]}")["QueueUrl"]
    queue_arn = aws("sqs").get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])[
        "Attributes"
    ]["QueueArn"]
    aws("sns").subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)
    host = f"job-{uuid.uuid4().hex[:6]}/algo-1"
    name = _idle_alarm(aws, host, topic, queue_url)
    evaluator = AlarmEvaluator(aws("cloudwatch"), aws("sns"), region="us-east-1", account_id=account_id)

    def utilization(minute: int, value: float) -> None:
        aws("cloudwatch").put_metric_data(
            Namespace="LocalTest",
            MetricData=[
                {
                    "MetricName": "Utilization",
                    "Dimensions": [{"Name": "Host", "Value": host}],
                    "Timestamp": NOW.replace(second=0) - timedelta(minutes=minute) + timedelta(seconds=10),
                    "Value": value,
                }
            ],
        )

    def state() -> str:
        return str(aws("cloudwatch").describe_alarms(AlarmNames=[name])["MetricAlarms"][0]["StateValue"])

    # GIVEN a busy minute among idle ones: not three idle periods in a row
    for minute, value in ((3, 0.0), (2, 80.0), (1, 0.0)):
        utilization(minute, value)
    alarm = aws("cloudwatch").describe_alarms(AlarmNames=[name])["MetricAlarms"][0]
    assert evaluator.values(alarm, NOW) == [0.0, 80.0, 0.0]
    evaluator.run(NOW)
    assert state() == OK  # moto creates alarms in OK (CloudWatch: INSUFFICIENT_DATA); either way, not ALARM

    # WHEN the next minutes are idle too
    utilization(0, 0.0)
    later = NOW + timedelta(minutes=2)
    utilization(-1, 1.0)
    changes = evaluator.run(later)

    # THEN the alarm fires, moto holds the state, and the topic carries CloudWatch's alarm message
    assert [(c.alarm_name, c.old_state, c.new_state) for c in changes if c.alarm_name == name] == [
        (name, OK, ALARM)
    ]
    assert state() == ALARM
    assert all(c.alarm_name != name for c in evaluator.run(later))  # no new transition, no new message
    messages = aws("sqs").receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10)["Messages"]
    notifications = [json.loads(m["Body"]) for m in messages]
    assert len(notifications) == 1  # one transition, one message
    alarm_message = json.loads(notifications[-1]["Message"])
    assert notifications[-1]["Subject"] == f'ALARM: "{name}" in US East (N. Virginia)'
    assert alarm_message["NewStateValue"] == ALARM
    assert alarm_message["OldStateValue"] == OK
    assert alarm_message["AlarmName"] == name
    assert alarm_message["AWSAccountId"] == account_id
    assert alarm_message["Trigger"]["Dimensions"] == [{"value": host, "name": "Host"}]
    assert alarm_message["Trigger"]["Period"] == 60
    assert "3 out of the last 3 datapoints" in alarm_message["NewStateReason"]


def test_alarms_sharing_a_range_are_read_in_one_call_and_kept_apart(
    aws: Callable[[str], Any], account_moto: tuple[str, str]
) -> None:
    _, account_id = account_moto
    cloudwatch = aws("cloudwatch")
    hosts = {f"batch-{uuid.uuid4().hex[:6]}/algo-{n}": float(n * 10) for n in range(1, 4)}
    names = {}
    for host, value in hosts.items():
        name = f"batch-{uuid.uuid4().hex[:8]}"
        names[name] = host
        cloudwatch.put_metric_alarm(
            AlarmName=name,
            Namespace="LocalBatch",
            MetricName="Utilization",
            Dimensions=[{"Name": "Host", "Value": host}],
            Statistic="Average",
            Period=60,
            EvaluationPeriods=1,
            Threshold=15.0,
            ComparisonOperator="LessThanThreshold",
        )
        cloudwatch.put_metric_data(
            Namespace="LocalBatch",
            MetricData=[
                {
                    "MetricName": "Utilization",
                    "Dimensions": [{"Name": "Host", "Value": host}],
                    "Timestamp": NOW.replace(second=5) - timedelta(minutes=1),
                    "Value": value,
                }
            ],
        )
    calls: list[str] = []
    cloudwatch.meta.events.register("before-call.monitoring.GetMetricData", lambda **_: calls.append("x"))
    alarms = cloudwatch.describe_alarms(AlarmNames=list(names))["MetricAlarms"]
    evaluator = AlarmEvaluator(cloudwatch, aws("sns"), region="us-east-1", account_id=account_id)
    values = evaluator.batch_values(alarms, NOW)
    assert len(calls) == 1
    assert {alarm["AlarmName"]: v for alarm, v in zip(alarms, values, strict=True)} == {
        name: [hosts[host]] for name, host in names.items()
    }
    changes = {c.alarm_name: c.new_state for c in evaluator.run(NOW) if c.alarm_name in names}
    # only the host at 10% is below the 15% threshold
    assert changes == {name: ALARM for name, host in names.items() if hosts[host] < 15}
