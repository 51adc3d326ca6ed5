"""The functions' roles in template.yaml against the calls the functions really make.

`calls.json` beside this file is a representative log of the functions' requests, recorded while the
functional and end-to-end suites ran (tests/conftest.py checks every request live as well):

    SAGEQUEUE_IAM_CALL_LOG=tests/functional/iam/calls.json .venv/bin/python -m pytest -q -p no:randomly \
        tests/functional/server tests/functional/governance tests/functional/local tests/e2e \
        --ignore tests/e2e/test_sdk_v2.py --ignore tests/e2e/test_sdk_v3.py

Each permission a recorded call uses is removed from the rendered role in turn: the recorded calls must
then be refused, with a message naming the action. What no recorded call uses is either gone from the
template or justified there (the function's `Metadata.UnexercisedPermissions`).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support import iam_check
from support.iam_check import Authorization, Grant, Statement

CALLS = Path(__file__).with_name("calls.json")


@pytest.fixture(scope="module")
def calls() -> list[iam_check.Call]:
    return iam_check.load(CALLS)


@pytest.fixture(scope="module")
def policies() -> iam_check.Policies:
    return iam_check.Policies()


def test_the_log_covers_every_function_of_the_template(calls: list[iam_check.Call]) -> None:
    assert {c.function for c in calls} == set(iam_check.functions())


def test_every_recorded_call_is_allowed(calls: list[iam_check.Call], policies: iam_check.Policies) -> None:
    assert iam_check.denials(calls, policies) == []


def test_every_grant_is_used_or_justified(calls: list[iam_check.Call], policies: iam_check.Policies) -> None:
    unused = iam_check.unused_report(calls, policies)
    assert unused == [], "granted, used by no recorded call, not justified:\n" + iam_check.summary(unused)


def _without(statements: list[Statement], grant: Grant, binding: iam_check.Binding) -> list[Statement]:
    """The role without one action or resource entry (a statement left with none is gone)."""
    out = []
    for statement in statements:
        if statement.sid != grant.sid:
            out.append(statement)
            continue
        entries = [e for e in statement.entries(grant.kind) if iam_check.generic(e, binding) != grant.entry]
        if entries:
            out.append(replace(statement, body={**statement.body, grant.kind: entries}))
    return out


def _mutants(calls: list[iam_check.Call], policies: iam_check.Policies) -> list[Grant]:
    return sorted(iam_check.used_grants(calls, policies), key=lambda g: (g.function, g.sid, g.kind, g.entry))


def test_removing_any_used_permission_refuses_a_recorded_call_naming_it(
    calls: list[iam_check.Call], policies: iam_check.Policies
) -> None:
    grants = _mutants(calls, policies)
    assert len(grants) >= 20  # every function, several statements each
    survivors = []
    for grant in grants:
        refused = []
        for call in (c for c in calls if c.function == grant.function):
            mutated = _without(policies.of(call.function, call.binding), grant, call.binding)
            for request in call.authorizations:
                decision = iam_check.evaluate(mutated, request)
                if not decision.allowed:
                    refused.append((request, decision.why))
        if not refused:
            survivors.append(grant)
            continue
        # the message names the action that is missing, and the statement or the new one to add
        request, why = refused[0]
        assert request.action in why or grant.kind == "Resource", why
        if grant.kind == "Action":
            assert any(
                request.action.lower().endswith(grant.entry.split(":")[-1].lower().strip("*"))
                for request, _ in refused
            )
    assert survivors == [], f"removing these changes no recorded decision: {survivors}"


# --- IAM semantics the check relies on, each on a statement of its own ----------------------------------------


def _statement(body: dict[str, object], sid: str = "S") -> Statement:
    return Statement("Fn", "P", 0, {"Sid": sid, **body})


ROLE = "arn:aws:iam::123456789012:role/SageMakerTraining"
JOB = "arn:aws:sagemaker:us-east-1:123456789012:training-job/j1"


def test_create_training_job_with_tags_and_a_role_needs_add_tags_and_pass_role() -> None:
    where = iam_check.Where("us-east-1", "123456789012")
    found = iam_check.authorizations(
        "sagemaker",
        "CreateTrainingJob",
        {
            "TrainingJobName": "j1",
            "RoleArn": ROLE,
            "Tags": [{"Key": "team", "Value": "a"}],
            "ResourceConfig": {"InstanceType": "ml.trn1.32xlarge"},
        },
        where,
    )
    actions = {(a.action, a.resource) for a in found}
    assert actions == {
        ("sagemaker:CreateTrainingJob", JOB),
        ("sagemaker:AddTags", JOB),
        ("iam:PassRole", ROLE),
    }
    create = next(a for a in found if a.action == "sagemaker:CreateTrainingJob")
    assert create.context_dict()["aws:RequestTag/team"] == ["a"]
    assert create.context_dict()["sagemaker:InstanceTypes"] == ["ml.trn1.32xlarge"]
    untagged = iam_check.authorizations(
        "sagemaker", "CreateTrainingJob", {"TrainingJobName": "j1", "RoleArn": ROLE}, where
    )
    assert "sagemaker:AddTags" not in {a.action for a in untagged}


def test_a_training_plan_is_a_resource_of_the_create() -> None:
    plan = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/p1"
    found = iam_check.authorizations(
        "sagemaker",
        "CreateTrainingJob",
        {"TrainingJobName": "j1", "RoleArn": ROLE, "ResourceConfig": {"TrainingPlanArn": plan}},
        iam_check.Where("us-east-1", "123456789012"),
    )
    assert ("sagemaker:CreateTrainingJob", plan) in {(a.action, a.resource) for a in found}


def test_dynamodb_index_and_transactions() -> None:
    where = iam_check.Where("us-east-1", "123456789012")
    table = "arn:aws:dynamodb:us-east-1:123456789012:table/jobs"
    query = iam_check.authorizations("dynamodb", "Query", {"TableName": "jobs", "IndexName": "queued"}, where)
    assert [(a.action, a.resource) for a in query] == [("dynamodb:Query", f"{table}/index/queued")]
    transact = iam_check.authorizations(
        "dynamodb",
        "TransactWriteItems",
        {"TransactItems": [{"Put": {"TableName": "jobs"}}, {"ConditionCheck": {"TableName": "jobs"}}]},
        where,
    )
    assert [(a.action, a.resource) for a in transact] == [
        ("dynamodb:PutItem", table),
        ("dynamodb:ConditionCheckItem", table),
    ]


def test_an_unknown_operation_is_refused_not_guessed() -> None:
    with pytest.raises(iam_check.CheckerError, match="NoSuchOperation"):
        iam_check.authorizations(
            "sagemaker", "NoSuchOperation", {}, iam_check.Where("us-east-1", "123456789012")
        )


def test_pass_role_only_to_sagemaker_and_only_the_listed_roles() -> None:
    allow = _statement(
        {
            "Effect": "Allow",
            "Action": "iam:PassRole",
            "Resource": [ROLE],
            "Condition": {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}},
        }
    )
    to_sagemaker = Authorization(
        "iam:PassRole", ROLE, (("iam:PassedToService", ("sagemaker.amazonaws.com",)),)
    )
    assert iam_check.evaluate([allow], to_sagemaker).allowed
    to_ec2 = Authorization("iam:PassRole", ROLE, (("iam:PassedToService", ("ec2.amazonaws.com",)),))
    assert "condition fails" in iam_check.evaluate([allow], to_ec2).why
    other = Authorization("iam:PassRole", "arn:aws:iam::123456789012:role/Admin", to_sagemaker.context)
    assert "but not on" in iam_check.evaluate([allow], other).why
    no_context = Authorization("iam:PassRole", ROLE)
    assert not iam_check.evaluate([allow], no_context).allowed


def test_explicit_deny_wins_and_actions_match_case_insensitively() -> None:
    allow = _statement({"Effect": "Allow", "Action": "SageMaker:*", "Resource": "*"}, "A")
    deny = _statement(
        {
            "Effect": "Deny",
            "Action": ["sagemaker:AddTags", "sagemaker:CreateTrainingJob"],
            "Resource": "*",
            "Condition": {"ForAnyValue:StringEquals": {"aws:TagKeys": ["sagequeue:exempt"]}},
        },
        "D",
    )
    exempt = Authorization("sagemaker:AddTags", JOB, (("aws:TagKeys", ("sagequeue:exempt", "team")),))
    decision = iam_check.evaluate([allow, deny], exempt)
    assert not decision.allowed
    assert decision.denied_by is not None
    assert decision.denied_by.sid == "D"
    plain = Authorization("sagemaker:AddTags", JOB, (("aws:TagKeys", ("team",)),))
    assert iam_check.evaluate([allow, deny], plain).allowed
    assert iam_check.evaluate([allow, deny], Authorization("sagemaker:AddTags", JOB)).allowed


def test_resources_match_case_sensitively_with_wildcards() -> None:
    allow = _statement(
        {
            "Effect": "Allow",
            "Action": "cloudwatch:DeleteAlarms",
            "Resource": "arn:aws:cloudwatch:us-east-1:123456789012:alarm:sagequeue-idle-*",
        }
    )
    assert iam_check.evaluate(
        [allow],
        Authorization(
            "cloudwatch:DeleteAlarms", "arn:aws:cloudwatch:us-east-1:123456789012:alarm:sagequeue-idle-j1"
        ),
    ).allowed
    assert not iam_check.evaluate(
        [allow],
        Authorization(
            "cloudwatch:DeleteAlarms", "arn:aws:cloudwatch:us-east-1:123456789012:alarm:SageQueue-idle-j1"
        ),
    ).allowed
    assert not iam_check.evaluate(
        [allow], Authorization("cloudwatch:DeleteAlarms", "arn:aws:cloudwatch:us-east-1:123456789012:alarm:*")
    ).allowed


def test_missing_keys_and_if_exists() -> None:
    tagged = _statement(
        {
            "Effect": "Allow",
            "Action": "sagemaker:StopTrainingJob",
            "Resource": "*",
            "Condition": {"StringEquals": {"sagemaker:ResourceTag/team": "a"}},
        }
    )
    lenient = _statement(
        {
            "Effect": "Allow",
            "Action": "sagemaker:StopTrainingJob",
            "Resource": "*",
            "Condition": {"StringEqualsIfExists": {"sagemaker:ResourceTag/team": "a"}},
        }
    )
    untagged = Authorization("sagemaker:StopTrainingJob", JOB)
    assert not iam_check.evaluate([tagged], untagged).allowed
    assert iam_check.evaluate([lenient], untagged).allowed
    other_team = Authorization("sagemaker:StopTrainingJob", JOB, (("sagemaker:ResourceTag/team", ("b",)),))
    assert not iam_check.evaluate([lenient], other_team).allowed


def test_policy_variables_and_unknown_operators_are_refused() -> None:
    variable = _statement(
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/${aws:username}/*"}
    )
    with pytest.raises(iam_check.CheckerError, match="policy variables"):
        iam_check.evaluate([variable], Authorization("s3:GetObject", "arn:aws:s3:::b/x/y"))
    odd = _statement(
        {
            "Effect": "Allow",
            "Action": "s3:GetObject",
            "Resource": "*",
            "Condition": {"DateGreaterThan": {"aws:CurrentTime": "2020-01-01T00:00:00Z"}},
        }
    )
    with pytest.raises(iam_check.CheckerError, match="DateGreaterThan"):
        iam_check.evaluate([odd], Authorization("s3:GetObject", "arn:aws:s3:::b/x"))
