"""The alarm adapter turns CloudWatch error codes into named errors (stubbed client: one module alone)."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest
from botocore.stub import Stubber

from sagequeue_core.alarms import (
    AlarmError,
    AlarmLimitExceeded,
    AlarmNotPermitted,
    CloudWatchAlarms,
    InvalidAlarm,
)
from sagequeue_core.governance import IdleRules, idle_alarm_specs

SPEC = idle_alarm_specs(
    {"TrainingJobName": "j", "ResourceConfig": {"InstanceType": "ml.trn1.2xlarge", "InstanceCount": 1}},
    IdleRules(),
)[0]


@pytest.fixture
def stubbed() -> Iterator[tuple[CloudWatchAlarms, Stubber]]:
    client = boto3.client("cloudwatch", region_name="us-east-1")
    with Stubber(client) as stub:
        yield CloudWatchAlarms(client), stub
        stub.assert_no_pending_responses()


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("LimitExceeded", AlarmLimitExceeded),
        ("AccessDenied", AlarmNotPermitted),
        ("InvalidParameterValue", InvalidAlarm),
        ("Throttling", AlarmError),
    ],
)
def test_put_errors_are_named_by_code(
    stubbed: tuple[CloudWatchAlarms, Stubber], code: str, error: type[AlarmError]
) -> None:
    alarms, stub = stubbed
    stub.add_client_error("put_metric_alarm", service_error_code=code, service_message="nope")
    with pytest.raises(error, match=f"cannot put alarm sagequeue-idle-j/algo-1: {code}: nope") as raised:
        alarms.put(SPEC, ["arn:aws:sns:us-east-1:123456789012:t"])
    assert type(raised.value) is error


def test_a_delete_of_alarms_already_gone_is_not_an_error(stubbed: tuple[CloudWatchAlarms, Stubber]) -> None:
    alarms, stub = stubbed
    stub.add_client_error("delete_alarms", service_error_code="ResourceNotFound", service_message="gone")
    stub.add_response("describe_alarms", {"MetricAlarms": []})
    assert alarms.delete(["sagequeue-idle-j/algo-1"]) == 1


def test_one_alarm_gone_does_not_keep_the_rest_of_its_batch(
    stubbed: tuple[CloudWatchAlarms, Stubber],
) -> None:
    # CloudWatch deletes nothing when one name of the batch does not exist
    alarms, stub = stubbed
    batch = ["sagequeue-idle-j/algo-1", "sagequeue-idle-j/algo-2", "sagequeue-idle-j/algo-3"]
    stub.add_client_error(
        "delete_alarms", service_error_code="ResourceNotFound", expected_params={"AlarmNames": batch}
    )
    stub.add_response(
        "describe_alarms",
        {"MetricAlarms": [{"AlarmName": batch[0]}, {"AlarmName": batch[2]}]},
        {"AlarmNames": batch, "AlarmTypes": ["MetricAlarm"], "MaxRecords": 100},
    )
    stub.add_response("delete_alarms", {}, {"AlarmNames": [batch[0], batch[2]]})
    assert alarms.delete(reversed(batch)) == 3


def test_a_denied_delete_is_not_swallowed(stubbed: tuple[CloudWatchAlarms, Stubber]) -> None:
    alarms, stub = stubbed
    stub.add_client_error("delete_alarms", service_error_code="AccessDenied", service_message="no")
    with pytest.raises(AlarmNotPermitted, match="cannot delete alarms other-alarm"):
        alarms.delete(["other-alarm"])
