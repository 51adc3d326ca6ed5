"""Submissions checked against SageMaker's service model (sagequeue_core.validation)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sagequeue_core.domain import DomainError
from sagequeue_core.validation import (
    RequestShapeInvalid,
    check_training_instance_type,
    training_instance_types,
    validate_create_training_job,
)

VALID: dict[str, Any] = {
    "TrainingJobName": "llama-ft",
    "RoleArn": "arn:aws:iam::123456789012:role/SageMakerTraining",
    "AlgorithmSpecification": {"TrainingImage": "img:1", "TrainingInputMode": "File"},
    "OutputDataConfig": {"S3OutputPath": "s3://bucket/out"},
    "ResourceConfig": {"InstanceType": "ml.trn1.32xlarge", "InstanceCount": 1, "VolumeSizeInGB": 64},
    "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    "HyperParameters": {"epochs": "3"},
    "Tags": [{"Key": "team", "Value": "équipe nlp"}],
}


def spoiled(path: str, value: Any) -> dict[str, Any]:
    request = copy.deepcopy(VALID)
    *parents, leaf = path.split(".")
    target = request
    for part in parents:
        target = target[part]
    target[leaf] = value
    return request


def test_a_valid_request_passes_including_unicode_tag_values() -> None:
    validate_create_training_job(VALID)


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("HyperParameters", {"epochs": 3}, "HyperParameters.epochs"),
        ("Unknown", 1, "Unknown"),
        ("StoppingCondition.MaxRuntimeInSeconds", 1.5, "StoppingCondition.MaxRuntimeInSeconds"),
        ("StoppingCondition.MaxRuntimeInSeconds", 2**40, "MaxRuntimeInSeconds"),
        ("TrainingJobName", "name\n", "TrainingJobName"),
        ("TrainingJobName", "x" * 64, "TrainingJobName"),
        ("AlgorithmSpecification.TrainingInputMode", "Sideways", "TrainingInputMode"),
        ("ResourceConfig.InstanceType", "ml.trn9.huge", "ResourceConfig.InstanceType"),
        ("Tags", [{"Key": ["a"], "Value": "b"}], "Tags[0].Key"),
        ("Tags", [{"Key": f"k{i}", "Value": "v"} for i in range(51)], "Tags"),
        ("RoleArn", "not-an-arn", "RoleArn"),
    ],
)
def test_a_request_the_model_refuses_names_the_member(path: str, value: Any, named: str) -> None:
    with pytest.raises(RequestShapeInvalid) as refused:
        validate_create_training_job(spoiled(path, value))
    assert named in str(refused.value)


@given(
    st.dictionaries(st.text(min_size=1, max_size=20), st.integers() | st.booleans() | st.none(), max_size=5)
)
def test_hyperparameters_that_are_not_strings_are_always_refused(values: dict[str, Any]) -> None:
    request = spoiled("HyperParameters", values)
    if not values:
        validate_create_training_job(request)
        return
    with pytest.raises(RequestShapeInvalid, match="HyperParameters"):
        validate_create_training_job(request)


def test_instance_types_come_from_the_model_trainium_first() -> None:
    known = training_instance_types()
    assert known[:4] == ("ml.trn1.2xlarge", "ml.trn1.32xlarge", "ml.trn1n.32xlarge", "ml.trn2.48xlarge")
    assert "ml.p5.48xlarge" in known
    assert check_training_instance_type("ml.trn2.48xlarge") == "ml.trn2.48xlarge"
    with pytest.raises(DomainError, match=r"valid: ml\.trn1\.2xlarge, ml\.trn1\.32xlarge"):
        check_training_instance_type("ml.trn3.huge", "pool")
