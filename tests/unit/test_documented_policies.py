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

from sagequeue_core.defaults import team_metric_namespace

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


# --- the job image's execution role (docs/neff-cache.md, docs/guardrails.md) and the notices policy ---------

BUCKET, PREFIX = "neff-cache", "team/cache"
CACHE = f"arn:aws:s3:::{BUCKET}/{PREFIX}"


def _json_blocks(page: str) -> list[object]:
    return [json.loads(b) for b in re.findall(r"```json\n(.*?)\n```", (ROOT / page).read_text(), re.S)]


@pytest.mark.parametrize(
    ("page", "policy", "shown"),
    [
        ("docs/neff-cache.md", "job-role-neff-cache.json", "document"),
        ("docs/guardrails.md", "job-role-utilization-metric.json", "statement"),
        ("image/README.md", "job-role-hub-token.json", "document"),
        ("docs/guardrails.md", "only-queue-admins-exempt.json", "statement"),
        ("docs/deploy.md", "only-operators-subscribe-to-notices.json", "document"),
    ],
)
def test_each_page_shows_and_links_the_policy_file_the_tests_check(
    page: str, policy: str, shown: str
) -> None:
    document = json.loads((iam_check.POLICIES / policy).read_text())
    expected = document if shown == "document" else document["Statement"][0]
    assert expected in _json_blocks(page), f"{page} does not show docs/policies/{policy} as it is"
    assert f"policies/{policy}" in (ROOT / page).read_text()


def _job_allows(team: str, operation: str, params: dict[str, object], service: str = "s3") -> bool:
    statements = iam_check.job_role_statements(BUCKET, PREFIX, team)
    requests = iam_check.authorizations(service, operation, params, WHERE)
    assert requests
    return all(iam_check.evaluate(statements, r).allowed for r in requests)


ENTRY = "neuronxcc-2.14.213.0+013d129b/MODULE_1+aaaa"


@pytest.mark.parametrize(
    ("operation", "params"),
    [
        ("PutObject", {"Bucket": BUCKET, "Key": f"{PREFIX}/writers/team-a/{ENTRY}/u1/model.neff"}),
        (
            "CreateMultipartUpload",
            {"Bucket": BUCKET, "Key": f"{PREFIX}/writers/team-a/{ENTRY}/u1/model.neff"},
        ),
        ("PutObject", {"Bucket": BUCKET, "Key": f"{PREFIX}/manifests/neuronxcc-2.14/MODULE_1+aaaa.json"}),
        ("PutObject", {"Bucket": BUCKET, "Key": f"{PREFIX}/registry/llama.json"}),
        ("PutObject", {"Bucket": BUCKET, "Key": f"{PREFIX}/{ENTRY}/model.neff"}),
        ("GetObject", {"Bucket": BUCKET, "Key": f"{PREFIX}/writers/team-b/{ENTRY}/u2/model.neff"}),
        ("HeadObject", {"Bucket": BUCKET, "Key": f"{PREFIX}/manifests/neuronxcc-2.14/MODULE_1+aaaa.json"}),
        ("ListObjectsV2", {"Bucket": BUCKET, "Prefix": f"{PREFIX}/manifests/"}),
        ("DeleteObjects", {"Bucket": BUCKET, "Delete": {"Objects": [{"Key": f"{PREFIX}/writers/team-a/x"}]}}),
        (
            "CopyObject",
            {
                "Bucket": BUCKET,
                "Key": f"{PREFIX}/{ENTRY}/model.neff",
                "CopySource": {"Bucket": BUCKET, "Key": f"{PREFIX}/writers/team-b/{ENTRY}/u2/model.neff"},
            },
        ),
    ],
)
def test_a_teams_job_reads_the_cache_and_writes_its_folder_and_the_shared_keys(
    operation: str, params: dict[str, object]
) -> None:
    assert _job_allows("team-a", operation, params)


@pytest.mark.parametrize(
    ("operation", "params"),
    [
        # another team's writer folder: bytes planted there would be trusted as that team's
        ("PutObject", {"Bucket": BUCKET, "Key": f"{PREFIX}/writers/team-b/{ENTRY}/u1/model.neff"}),
        ("UploadPart", {"Bucket": BUCKET, "Key": f"{PREFIX}/writers/team-b/{ENTRY}/u1/model.neff"}),
        ("DeleteObject", {"Bucket": BUCKET, "Key": f"{PREFIX}/writers/team-b/{ENTRY}/u2/model.neff"}),
        ("DeleteObjects", {"Bucket": BUCKET, "Delete": {"Objects": [{"Key": f"{PREFIX}/writers/team-b/x"}]}}),
        (
            "CopyObject",
            {
                "Bucket": BUCKET,
                "Key": f"{PREFIX}/writers/team-b/{ENTRY}/u1/model.neff",
                "CopySource": {"Bucket": BUCKET, "Key": f"{PREFIX}/writers/team-a/{ENTRY}/u1/model.neff"},
            },
        ),
        # a name that only starts like the team's: the folder ends at its slash
        ("PutObject", {"Bucket": BUCKET, "Key": f"{PREFIX}/writers/team-a-evil/{ENTRY}/u1/model.neff"}),
        # outside the cache's prefix, or another bucket
        ("PutObject", {"Bucket": BUCKET, "Key": "elsewhere/writers/team-a/x"}),
        ("GetObject", {"Bucket": BUCKET, "Key": "other-team-data/secret"}),
        ("GetObject", {"Bucket": "another-bucket", "Key": f"{PREFIX}/manifests/x.json"}),
        ("ListObjectsV2", {"Bucket": BUCKET, "Prefix": "other-team-data/"}),
        ("ListObjectsV2", {"Bucket": BUCKET}),
        ("CreateBucket", {"Bucket": BUCKET}),
    ],
)
def test_a_teams_job_is_refused_another_teams_folder_and_everything_outside_the_cache(
    operation: str, params: dict[str, object]
) -> None:
    assert not _job_allows("team-a", operation, params)


def test_a_teams_denial_names_the_statement_that_grants_writers_folders() -> None:
    statements = iam_check.job_role_statements(BUCKET, PREFIX, "team-a")
    (request,) = iam_check.authorizations(
        "s3", "PutObject", {"Bucket": BUCKET, "Key": f"{PREFIX}/writers/team-b/x"}, WHERE
    )
    decision = iam_check.evaluate(statements, request)
    assert not decision.allowed
    assert "WriteOwnFolderOnly" in decision.why
    assert f"{CACHE}/writers/team-a/*" in decision.why


@pytest.mark.parametrize(
    ("namespace", "allowed"),
    [
        ("SageQueue/TrainingJobs/team-a", True),
        # another team's namespace: datapoints there would keep that team's idle hosts running
        ("SageQueue/TrainingJobs/team-b", False),
        ("SageQueue/TrainingJobs/team-a-evil", False),
        # the namespace of jobs without a team, SageMaker's, and any other
        ("SageQueue/TrainingJobs", False),
        ("/aws/sagemaker/TrainingJobs", False),
        ("SageQueue/Other", False),
    ],
)
def test_a_teams_job_role_publishes_only_to_its_teams_namespace(namespace: str, allowed: bool) -> None:
    statements = iam_check.job_role_statements(
        BUCKET, PREFIX, "team-a", metric_namespace=team_metric_namespace("team-a")
    )
    params = {"Namespace": namespace, "MetricData": [{"MetricName": "NeuronCoreUtilization", "Value": 1.0}]}
    requests = iam_check.authorizations("cloudwatch", "PutMetricData", params, WHERE)
    assert requests
    assert all(iam_check.evaluate(statements, r).allowed for r in requests) is allowed


@pytest.mark.parametrize(
    ("namespace", "allowed"),
    [
        ("SageQueue/TrainingJobs", True),
        ("SageQueue/TrainingJobs/team-a", False),
        ("/aws/sagemaker/TrainingJobs", False),
    ],
)
def test_the_role_of_jobs_without_a_team_publishes_only_to_the_default_namespace(
    namespace: str, allowed: bool
) -> None:
    params = {"Namespace": namespace, "MetricData": [{"MetricName": "NeuronCoreUtilization", "Value": 1.0}]}
    assert _job_allows("team-a", "PutMetricData", params, service="cloudwatch") is allowed


OPERATOR = f"arn:aws:iam::{ACCOUNT}:role/QueueOperator"
NOTICES = f"arn:aws:sns:us-east-1:{ACCOUNT}:sagequeue-JobNoticesTopic-ABC"


def _subscribe_allowed(principal: str, topic: str) -> bool:
    values = {
        "Region": "us-east-1",
        "Account": ACCOUNT,
        "JobNoticesTopic": NOTICES.rsplit(":", 1)[-1],
        "OperatorRole": "QueueOperator",
    }
    statements = [
        ALLOW_ALL,
        *iam_check.documented_statements("only-operators-subscribe-to-notices.json", values),
    ]
    params = {"TopicArn": topic, "Protocol": "email", "Endpoint": "someone@example.com"}
    requests = iam_check.authorizations("sns", "Subscribe", params, WHERE)
    as_principal = [replace(r, context=(*r.context, ("aws:PrincipalArn", (principal,)))) for r in requests]
    return all(iam_check.evaluate(statements, r).allowed for r in as_principal)


def test_only_operators_subscribe_to_job_notices() -> None:
    # a subscriber picks its own filter policy: a user's subscription could read every owner's notices
    assert not _subscribe_allowed(USER, NOTICES)
    assert _subscribe_allowed(OPERATOR, NOTICES)
    # other topics are not this policy's business
    assert _subscribe_allowed(USER, f"arn:aws:sns:us-east-1:{ACCOUNT}:sagequeue-OperationsTopic-ABC")


def test_a_placeholder_without_a_value_is_refused() -> None:
    with pytest.raises(iam_check.CheckerError, match="Team"):
        iam_check.documented_statements("job-role-neff-cache.json", {"Bucket": BUCKET, "Prefix": PREFIX})


def test_the_job_role_reads_its_own_hub_token_secret_and_no_other() -> None:
    mine, theirs = "sagequeue/hub-token-team-a", "sagequeue/hub-token-team-b"
    statements = iam_check.job_role_statements(BUCKET, PREFIX, "team-a", hub_token_secret=mine)

    def reads(secret: str) -> bool:
        requests = iam_check.authorizations("secretsmanager", "GetSecretValue", {"SecretId": secret}, WHERE)
        return all(iam_check.evaluate(statements, r).allowed for r in requests)

    assert reads(mine)
    assert reads(f"arn:aws:secretsmanager:us-east-1:{ACCOUNT}:secret:{mine}-x1Y2z3")
    assert not reads(theirs)
    # a name that only starts like the team's secret: the six characters after the dash are all there is
    assert not reads(f"{mine}-and-more")
