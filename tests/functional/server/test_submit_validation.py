"""Submission validation through the real api handler: every bad request is a 400 naming the field, and
nothing is stored (no job, no queued count, no training job)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import QueueWorld, make_world, training_request


@pytest.fixture(scope="module")
def world(moto_endpoint: str) -> Iterator[QueueWorld]:
    """One world for the module: a refused request leaves nothing behind, which is what is tested."""
    yield from make_world(moto_endpoint)


def _without(field: str) -> Callable[[dict[str, Any]], None]:
    return lambda body: body.pop(field)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def apply(body: dict[str, Any]) -> None:
        *parents, leaf = path.split(".")
        target = body
        for part in parents:
            target = target[part]
        target[leaf] = value

    return apply


BAD_REQUESTS = [
    pytest.param(_without("RoleArn"), "RoleArn", id="missing-role"),
    pytest.param(_without("ResourceConfig"), "ResourceConfig", id="missing-resource-config"),
    pytest.param(_without("StoppingCondition"), "StoppingCondition", id="missing-stopping-condition"),
    pytest.param(_set("TrainingJobName", "bad_name!"), "TrainingJobName", id="name-pattern"),
    pytest.param(_set("TrainingJobName", "x" * 64), "TrainingJobName", id="name-length"),
    pytest.param(_set("RoleArn", "arn:aws:iam::123456789012:role/Other"), "RoleArn", id="role-not-allowed"),
    pytest.param(_set("ResourceConfig.InstanceType", "ml.p5.48xlarge"), "InstanceType", id="unknown-pool"),
    pytest.param(_set("ResourceConfig.InstanceCount", 3), "InstanceCount", id="more-than-the-pool"),
    pytest.param(_set("ResourceConfig.InstanceCount", 0), "InstanceCount", id="zero-instances"),
    pytest.param(_set("priority", 5000), "priority", id="priority-out-of-range"),
    pytest.param(_set("priority", "urgent"), "priority", id="priority-not-a-number"),
    pytest.param(_set("Tags", [{"Key": "priority", "Value": "high"}]), "priority", id="priority-tag"),
    pytest.param(
        _set("Tags", [{"Key": "sagequeue:submitted-by", "Value": "arn:aws:iam::1:user/x"}]),
        "sagequeue:submitted-by",
        id="forged-owner-tag",
    ),
    # what botocore's validator and SageMaker's service model refuse at create time (#15, point 1)
    pytest.param(_set("HyperParameters", {"epochs": 3}), "HyperParameters.epochs", id="hyperparameter-int"),
    pytest.param(_set("NotAMember", 1), "NotAMember", id="unknown-member"),
    pytest.param(
        _set("StoppingCondition.MaxRuntimeInSeconds", 3600.5),
        "StoppingCondition.MaxRuntimeInSeconds",
        id="float-runtime",
    ),
    pytest.param(
        _set(
            "ResourceConfig",
            {
                "InstanceGroups": [
                    {
                        "InstanceType": "ml.trn1.32xlarge",
                        "InstanceCount": 1,
                        "InstanceGroupName": "g",
                        "RoleArn": "arn:aws:iam::123456789012:role/x",
                    }
                ],
                "VolumeSizeInGB": 64,
            },
        ),
        "InstanceGroups[0]",
        id="role-in-instance-group",
    ),
    pytest.param(_set("Tags", [{"Key": ["team"], "Value": "nlp"}]), "Tags[0].Key", id="list-as-tag-key"),
    pytest.param(_set("TrainingJobName", "trailing\n"), "TrainingJobName", id="name-trailing-newline"),
    pytest.param(_set("TrainingJobName", "exp--2"), "reserved", id="reserved-attempt-name"),
    pytest.param(
        _set("ResourceConfig.InstanceType", "ml.trn9.huge"),
        "ml.trn1.2xlarge",
        id="instance-type-not-in-model",
    ),
    pytest.param(
        _set("StoppingCondition.MaxRuntimeInSeconds", 10**40), "MaxRuntimeInSeconds", id="runtime-overflow"
    ),
    pytest.param(_set("priority", "5"), "priority", id="priority-as-string"),
    pytest.param(_set("priority", False), "priority", id="priority-as-bool"),
    pytest.param(_set("priority", 5.0), "priority", id="priority-as-float"),
]


@pytest.mark.parametrize(("spoil", "named"), BAD_REQUESTS)
def test_a_bad_request_is_refused_naming_the_field_and_nothing_is_stored(
    world: QueueWorld, spoil: Callable[[dict[str, Any]], None], named: str
) -> None:
    body = training_request("bad-job")
    spoil(body)
    name = body.get("TrainingJobName", "bad-job")

    status, answer = world.api("POST", "/jobs", body)

    assert status == 400, answer
    assert answer["code"] == "ValidationError"
    assert named in answer["message"]
    # not stored: 404, or 400 when the name itself is not one a job could have
    assert world.api("GET", f"/jobs/{name}")[0] in (400, 404)
    assert world.api("GET", "/pools")[1]["pools"][0]["queued"] == 0
    assert world.sagemaker().list_training_jobs()["TrainingJobSummaries"] == []


def test_a_body_that_is_not_json_or_too_large_is_refused(world: QueueWorld) -> None:
    status, answer = world.api("POST", "/jobs", raw_body="{not json")
    assert (status, answer["code"]) == (400, "ValidationError")

    body = training_request("huge")
    body["HyperParameters"] = {f"p{i}": "x" * 200 for i in range(1000)}
    status, answer = world.api("POST", "/jobs", body)
    assert status == 400
    assert "bytes" in answer["message"]
    assert world.api("GET", "/jobs/huge")[0] == 404


def test_a_teams_job_leaves_room_in_its_environment_for_the_metric_namespace_sagequeue_sets(
    moto_endpoint: str,
) -> None:
    from conftest import SUBMITTER

    for world in make_world(moto_endpoint, settings={"team_roles": {SUBMITTER: "research"}}):
        # WHEN a team's job fills SageMaker's 100 Environment variables
        body = training_request("full-env")
        body["Environment"] = {f"V{i}": "x" for i in range(100)}
        status, answer = world.api("POST", "/jobs", body)
        # THEN it is refused, naming the variable sagequeue adds, and nothing is stored
        assert status == 400, answer
        assert "at most 99 (sagequeue sets SAGEQUEUE_METRIC_NAMESPACE" in answer["message"]
        assert world.api("GET", "/jobs/full-env")[0] == 404
        # AND with one fewer it is queued
        body["Environment"].pop("V0")
        assert world.api("POST", "/jobs", body)[0] == 201
