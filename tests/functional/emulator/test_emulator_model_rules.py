"""Requests SageMaker refuses by its service model are refused here too, whatever member breaks a rule."""

from __future__ import annotations

import functools
from typing import Any

import botocore.session
import pytest
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sagequeue.local.emulator import model_rules
from sagequeue.local.emulator.errors import ValidationError


def refusal(raw_sagemaker: Any, request: dict[str, Any]) -> str:
    with pytest.raises(ClientError) as caught:
        raw_sagemaker.create_training_job(**request)
    assert caught.value.response["Error"]["Code"] == "ValidationException"
    return str(caught.value.response["Error"]["Message"])


@pytest.mark.parametrize(
    ("overrides", "where"),
    [
        ({"HyperParameters": {f"h{i}": "1" for i in range(101)}}, "hyperParameters"),
        ({"ResourceConfig": {"InstanceType": "ml.t3.nano"}}, "resourceConfig.instanceType"),
        ({"Tags": [{"Key": "a#b", "Value": "x"}]}, "tags.1.member.key"),
        (
            {"StoppingCondition": {"MaxPendingTimeInSeconds": 600}},
            "stoppingCondition.maxPendingTimeInSeconds",
        ),
        (
            {"AlgorithmSpecification": {"TrainingInputMode": "Streaming"}},
            "algorithmSpecification.trainingInputMode",
        ),
        ({"ResourceConfig": {"VolumeSizeInGB": 0}}, "resourceConfig.volumeSizeInGB"),
        ({"OutputDataConfig": {"CompressionType": "ZIP"}}, "outputDataConfig.compressionType"),
        ({"HyperParameters": {"k": "v" * 2501}}, "hyperParameters.k.member"),
    ],
)
def test_documented_refusals_name_the_member(
    raw_sagemaker: Any, make_request: Any, overrides: dict[str, Any], where: str
) -> None:
    message = refusal(raw_sagemaker, make_request("refused", **overrides))
    assert f"at '{where}' failed to satisfy constraint" in message


def test_twenty_one_channels_are_too_many(raw_sagemaker: Any, make_request: Any) -> None:
    channel = {"DataSource": {"S3DataSource": {"S3DataType": "S3Prefix", "S3Uri": "s3://bucket/data"}}}
    channels = [{"ChannelName": f"c{i}", **channel} for i in range(21)]
    assert "at 'inputDataConfig'" in refusal(
        raw_sagemaker, make_request("channels", InputDataConfig=channels)
    )
    raw_sagemaker.create_training_job(**make_request("twenty", InputDataConfig=channels[:20]))


def test_every_broken_rule_is_listed(raw_sagemaker: Any, make_request: Any) -> None:
    request = make_request(
        "many", ResourceConfig={"InstanceType": "ml.t3.nano"}, Tags=[{"Key": "a#b", "Value": "x"}]
    )
    assert refusal(raw_sagemaker, request).startswith("2 validation errors detected:")


def test_instance_preferences_exclude_instance_type(raw_sagemaker: Any, make_request: Any) -> None:
    request = make_request("both")
    request["ResourceConfig"]["InstancePreferences"] = [
        {"InstanceType": "ml.trn1.32xlarge", "InstanceCount": 1}
    ]
    message = refusal(raw_sagemaker, request)
    assert "InstancePreferences" in message


@functools.cache
def _tag_key_shape() -> Any:
    model = botocore.session.get_session().get_service_model("sagemaker")
    return model.shape_for("TagKey")


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(st.text(min_size=0, max_size=140))
def test_tag_keys_are_judged_by_the_models_length_and_pattern(key: str) -> None:
    shape = _tag_key_shape()
    allowed_chars = set("_.:/=+-@ ")
    looks_fine = 1 <= len(key) <= shape.metadata["max"] and all(
        c.isascii() and (c.isalnum() or c in allowed_chars) for c in key
    )
    request = {
        "ResourceArn": "arn:aws:sagemaker:us-east-1:123456789012:training-job/x",
        "Tags": [{"Key": key, "Value": "v"}],
    }
    try:
        model_rules.check("AddTags", request)
        accepted = True
    except ValidationError:
        accepted = False
    if looks_fine:
        assert accepted, key
    if not key or len(key) > shape.metadata["max"] or "#" in key or "\n" in key:
        assert not accepted, key
