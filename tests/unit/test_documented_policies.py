"""The IAM policies the docs give operators, evaluated with the checker the functions' roles are held to
(tests/support/iam_check.py) on the requests a user's SageMaker calls make."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support import iam_check
from support.iam_check import Statement

ROOT = Path(__file__).resolve().parents[2]
EXEMPT_POLICY = ROOT / "docs" / "policies" / "only-queue-admins-exempt.json"
ACCOUNT = "123456789012"
ADMIN = f"arn:aws:iam::{ACCOUNT}:role/QueueAdmin"
USER = f"arn:aws:iam::{ACCOUNT}:role/ResearchTeam"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/SageMakerTraining"
WHERE = iam_check.Where("us-east-1", ACCOUNT)
#: what a user's role otherwise allows: everything, so that only the documented Deny decides
ALLOW_ALL = Statement(
    "user", "theirs", 0, {"Sid": "Everything", "Effect": "Allow", "Action": "*", "Resource": "*"}
)


def _exempt_policy() -> list[Statement]:
    text = EXEMPT_POLICY.read_text().replace("<account>", ACCOUNT).replace("<QueueAdminRole>", "QueueAdmin")
    document = json.loads(text)
    return [Statement("user", EXEMPT_POLICY.name, i, s) for i, s in enumerate(document["Statement"])]


def _allowed(principal: str, operation: str, params: dict[str, object]) -> bool:
    statements = [ALLOW_ALL, *_exempt_policy()]
    requests = iam_check.authorizations("sagemaker", operation, params, WHERE)
    as_principal = [replace(r, context=(*r.context, ("aws:PrincipalArn", (principal,)))) for r in requests]
    return all(iam_check.evaluate(statements, r).allowed for r in as_principal)


def test_the_guardrails_page_shows_the_policy_file() -> None:
    page = (ROOT / "docs" / "guardrails.md").read_text()
    block = re.search(r'```json\n(\{\n  "Sid": "OnlyQueueAdminsExempt".*?\n\})\n```', page, re.S)
    assert block is not None
    assert json.loads(block.group(1)) == json.loads(EXEMPT_POLICY.read_text())["Statement"][0]
    assert "policies/only-queue-admins-exempt.json" in page


@pytest.mark.parametrize(
    ("principal", "tags", "allowed"),
    [
        (USER, [{"Key": "team", "Value": "research"}], True),
        (USER, [{"Key": "sagequeue:exempt", "Value": "true"}], False),
        # hidden among others, or with another value: the key alone is refused
        (USER, [{"Key": "team", "Value": "research"}, {"Key": "sagequeue:exempt", "Value": "false"}], False),
        (ADMIN, [{"Key": "sagequeue:exempt", "Value": "true"}], True),
        (USER, [], True),
    ],
)
def test_only_queue_admins_create_jobs_tagged_exempt(
    principal: str, tags: list[dict[str, str]], allowed: bool
) -> None:
    params = {"TrainingJobName": "j1", "RoleArn": ROLE, "Tags": tags}
    assert _allowed(principal, "CreateTrainingJob", params) is allowed


def test_a_user_cannot_tag_a_running_job_exempt_afterwards() -> None:
    job = f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:training-job/j1"
    exempt = {"ResourceArn": job, "Tags": [{"Key": "sagequeue:exempt", "Value": "true"}]}
    assert not _allowed(USER, "AddTags", exempt)
    assert _allowed(ADMIN, "AddTags", exempt)
    assert _allowed(USER, "AddTags", {"ResourceArn": job, "Tags": [{"Key": "note", "Value": "x"}]})
