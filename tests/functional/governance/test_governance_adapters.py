"""The alarm adapter and the notifier against moto's server over HTTP."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import boto3
import pytest

from sagequeue_core.alarms import CloudWatchAlarms
from sagequeue_core.governance import AlarmKind, IdleRules, alarm_prefix, idle_alarm_specs
from sagequeue_core.notify import NullNotifier, SnsNotifier, notifier_for

TOPIC = "arn:aws:sns:us-east-1:123456789012:idle"


def job(name: str, hosts: int) -> dict[str, object]:
    return {
        "TrainingJobName": name,
        "ResourceConfig": {"InstanceType": "ml.trn1.32xlarge", "InstanceCount": hosts},
        "TrainingStartTime": datetime(2026, 1, 1, tzinfo=UTC),
    }


@pytest.fixture
def cloudwatch(moto_endpoint: str) -> object:
    return boto3.client("cloudwatch", endpoint_url=moto_endpoint, region_name="us-east-1")


@pytest.fixture
def alarms(cloudwatch: object) -> CloudWatchAlarms:
    return CloudWatchAlarms(cloudwatch)


def unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def test_put_alarms_are_found_by_the_jobs_prefix_and_carry_the_spec(
    alarms: CloudWatchAlarms, cloudwatch: object
) -> None:
    name = unique("llama")
    other = name + "-2"  # a job whose name extends the first one's
    for spec in idle_alarm_specs(job(name, 3), IdleRules()) + idle_alarm_specs(job(other, 1), IdleRules()):
        alarms.put(spec, [TOPIC])
    found = alarms.names(alarm_prefix(name))
    assert found == [f"sagequeue-idle-{name}/algo-{n}" for n in (1, 2, 3)]
    described = cloudwatch.describe_alarms(AlarmNames=[found[0]])["MetricAlarms"][0]  # type: ignore[attr-defined]
    # a Neuron host's idle alarm is metric math: utilization, and 100 while the host compiles
    utilization, compiling, busy = described["Metrics"]
    assert utilization["MetricStat"]["Metric"]["MetricName"] == "NeuronCoreUtilization"
    assert compiling["MetricStat"]["Metric"]["MetricName"] == "NeuronCompiling"
    for query in (utilization, compiling):
        assert query["MetricStat"]["Metric"]["Namespace"] == "SageQueue/TrainingJobs"
        assert query["MetricStat"]["Metric"]["Dimensions"] == [{"Name": "Host", "Value": f"{name}/algo-1"}]
    assert busy["Expression"] == "IF(FILL(compiling, 0) > 0, 100, utilization)"
    assert described["AlarmActions"] == [TOPIC]
    assert described["TreatMissingData"] == "notBreaching"
    assert alarms.state(found[0]) in {"OK", "INSUFFICIENT_DATA"}


def test_putting_the_same_alarm_twice_leaves_one(alarms: CloudWatchAlarms) -> None:
    name = unique("dup")
    (spec,) = idle_alarm_specs(job(name, 1), IdleRules())
    alarms.put(spec, [TOPIC])
    alarms.put(spec, [TOPIC])
    assert alarms.names(alarm_prefix(name)) == [spec.name]


def test_listing_follows_every_page(alarms: CloudWatchAlarms) -> None:
    name = unique("wide")
    now = datetime(2026, 1, 2, tzinfo=UTC)  # a day of training: silence alarms are due too
    specs = idle_alarm_specs(job(name, 64), IdleRules(), now=now)
    assert len(specs) == 128
    for spec in specs:
        alarms.put(spec, [TOPIC])
    assert sorted(alarms.names(alarm_prefix(name))) == sorted(s.name for s in specs)
    assert sum(1 for s in specs if s.kind is AlarmKind.SILENCE) == 64


def test_delete_removes_only_the_named_alarms_in_batches_and_tolerates_repeats(
    alarms: CloudWatchAlarms,
) -> None:
    name = unique("gone")
    specs = idle_alarm_specs(job(name, 120), IdleRules())
    for spec in specs:
        alarms.put(spec, [TOPIC])
    keep = specs[-1].name
    assert alarms.delete(s.name for s in specs[:-1]) == 119
    assert alarms.names(alarm_prefix(name)) == [keep]
    alarms.delete([specs[0].name])  # a second delivery of the same end event
    assert alarms.names(alarm_prefix(name)) == [keep]
    assert alarms.state(specs[0].name) is None


def test_the_notifier_publishes_subject_text_and_attributes(moto_endpoint: str) -> None:
    sns = boto3.client("sns", endpoint_url=moto_endpoint, region_name="us-east-1")
    sqs = boto3.client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1")
    topic = sns.create_topic(Name=unique("notes"))["TopicArn"]
    queue = sqs.create_queue(QueueName=unique("inbox"))["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)

    notifier = notifier_for(sns, topic)
    assert isinstance(notifier, SnsNotifier)
    message_id = notifier.notify(
        "sagequeue stopped llama-sft:\nidle " + "x" * 200,
        "llama-sft was idle for 30 minutes.",
        {"kind": "IdleStopped", "empty": ""},
    )

    (received,) = sqs.receive_message(QueueUrl=queue, WaitTimeSeconds=1)["Messages"]
    envelope = json.loads(received["Body"])
    assert envelope["MessageId"] == message_id
    assert envelope["Message"] == "llama-sft was idle for 30 minutes."
    assert "\n" not in envelope["Subject"]
    assert len(envelope["Subject"]) == 100
    assert envelope["Subject"].endswith("...")
    assert envelope["MessageAttributes"] == {"kind": {"Type": "String", "Value": "IdleStopped"}}


def test_no_topic_means_notifications_are_dropped_on_purpose(moto_endpoint: str) -> None:
    sns = boto3.client("sns", endpoint_url=moto_endpoint, region_name="us-east-1")
    notifier = notifier_for(sns, "")
    assert isinstance(notifier, NullNotifier)
    assert notifier.notify("s", "m") is None


def test_publishing_to_a_missing_topic_raises_a_named_error(moto_endpoint: str) -> None:
    from sagequeue_core.notify import NotificationError

    sns = boto3.client("sns", endpoint_url=moto_endpoint, region_name="us-east-1")
    missing = f"arn:aws:sns:us-east-1:123456789012:{unique('nowhere')}"
    with pytest.raises(NotificationError, match=f"cannot publish to {missing}: NotFound"):
        SnsNotifier(sns, missing).notify("s", "m")
