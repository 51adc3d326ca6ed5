"""`sagequeue preflight` reads the account's prerequisites and says what to fix: API Gateway's account
settings on moto's server; Lambda's account settings and Service Quotas, which moto does not implement,
answered by botocore's Stubber with the shapes of their models."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from click.testing import CliRunner

from sagequeue import preflight
from sagequeue.preflight import FIX, OK, UNKNOWN, run_checks

POOL = "ml.trn1.32xlarge"


def lambda_with(total: int, unreserved: int) -> Any:
    client = boto3.client("lambda", region_name="us-east-1")
    stub = Stubber(client)
    stub.add_response(
        "get_account_settings",
        {
            "AccountLimit": {
                "TotalCodeSize": 80530636800,
                "CodeSizeUnzipped": 262144000,
                "CodeSizeZipped": 52428800,
                "ConcurrentExecutions": total,
                "UnreservedConcurrentExecutions": unreserved,
            },
            "AccountUsage": {"TotalCodeSize": 0, "FunctionCount": 0},
        },
    )
    stub.activate()
    return client


def quotas_with(defaults: dict[str, float], applied: dict[str, float]) -> Any:
    client = boto3.client("service-quotas", region_name="us-east-1")
    stub = Stubber(client)
    for operation, values in (
        ("list_aws_default_service_quotas", defaults),
        ("list_service_quotas", applied),
    ):
        stub.add_response(
            operation,
            {
                "Quotas": [
                    {"ServiceCode": "sagemaker", "QuotaName": name, "QuotaCode": f"L-{i:08d}", "Value": value}
                    for i, (name, value) in enumerate(values.items())
                ]
            },
            {"ServiceCode": "sagemaker"},
        )
    stub.activate()
    return client


@pytest.fixture
def apigateway(moto_endpoint: str) -> Iterator[Any]:
    client = boto3.client("apigateway", region_name="us-east-1", endpoint_url=moto_endpoint)
    yield client
    client.update_account(patchOperations=[{"op": "replace", "path": "/cloudwatchRoleArn", "value": ""}])


def test_a_new_account_is_told_each_thing_to_fix(apigateway: Any) -> None:
    # GIVEN a new account: a concurrency quota of 10, no logging role, no trn1 instances for training
    clients = {
        "lambda": lambda_with(10, 10),
        "apigateway": apigateway,
        "service-quotas": quotas_with(
            {f"{POOL} for training job usage": 0, f"{POOL} for training warm pool usage": 0}, {}
        ),
    }
    # WHEN the checks run for a pool of 4
    findings = run_checks(clients.__getitem__, {POOL: 4})
    # THEN each prerequisite says what to do
    by_check = {f.check: f for f in findings}
    assert [f.status for f in findings] == [FIX, FIX, FIX, FIX]
    assert "at least 101" in by_check["Lambda concurrency"].detail
    assert "CloudWatch log role ARN" in by_check["API Gateway logging role"].detail
    assert "0 is below the pool's 4" in by_check[f"quota '{POOL} for training job usage'"].detail


def test_an_account_ready_for_the_stack_passes(apigateway: Any) -> None:
    apigateway.update_account(
        patchOperations=[
            {
                "op": "replace",
                "path": "/cloudwatchRoleArn",
                "value": "arn:aws:iam::123456789012:role/apigw-logs",
            }
        ]
    )
    clients = {
        "lambda": lambda_with(1000, 1000),
        "apigateway": apigateway,
        # the applied value, raised from a default of 0, is the one that counts
        "service-quotas": quotas_with(
            {f"{POOL} for training job usage": 0, f"{POOL} for training warm pool usage": 0},
            {f"{POOL} for training job usage": 4, f"{POOL} for training warm pool usage": 8},
        ),
    }

    findings = run_checks(clients.__getitem__, {POOL: 4})

    assert [f.status for f in findings] == [OK, OK, OK, OK], findings
    assert findings[1].detail == "arn:aws:iam::123456789012:role/apigw-logs"


def test_reservations_already_made_count_against_the_unreserved_floor() -> None:
    # 1000 in all, but 900 reserved by other functions: 100 unreserved, none left for the scheduler
    finding = preflight.lambda_concurrency(lambda_with(1000, 100))
    assert finding.status == FIX


def test_what_cannot_be_read_is_unknown_not_ok() -> None:
    client = boto3.client("lambda", region_name="us-east-1")
    stub = Stubber(client)
    stub.add_client_error("get_account_settings", "AccessDeniedException", "not allowed")
    stub.activate()

    finding = preflight.lambda_concurrency(client)

    assert finding.status == UNKNOWN
    assert "AccessDeniedException: not allowed" in finding.detail


def test_the_command_prints_a_line_per_check_and_exits_1_when_something_is_to_fix(
    apigateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    clients = {
        "lambda": lambda_with(10, 10),
        "apigateway": apigateway,
        "service-quotas": quotas_with({f"{POOL} for training job usage": 2}, {}),
    }
    monkeypatch.setattr(
        preflight,
        "run_checks",
        lambda _client_for, capacity, warm: run_checks(clients.__getitem__, capacity, warm),
    )

    result = CliRunner().invoke(preflight.preflight, ["--capacity", f"{POOL}=4", "--no-warm-pools"])

    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("fix      Lambda concurrency")
    assert lines[2].startswith(f"fix      quota '{POOL} for training job usage'")
    bad = CliRunner().invoke(preflight.preflight, ["--capacity", "trn1"])
    assert bad.exit_code == 2
    assert "is not TYPE=N" in bad.output
