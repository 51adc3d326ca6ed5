"""`sagequeue preflight`: read the account prerequisites of a first deploy and say what to fix before
`sam deploy`.

Each check reads one thing the account owner can see with read-only calls: Lambda's concurrency (the
scheduler reserves 1, and Lambda keeps 100 unreserved), API Gateway's account-level CloudWatch Logs role
(the API's access logs need it), and SageMaker's service quotas for the pools' instance types (training
job usage, and warm pool usage when jobs keep instances warm). A check that cannot read what it needs
says so and what permission it lacks; it does not pass.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import click

#: What the scheduler reserves (template.yaml: ReservedConcurrentExecutions) and what Lambda keeps free.
SCHEDULER_RESERVED_CONCURRENCY = 1
LAMBDA_MIN_UNRESERVED = 100

OK, FIX, UNKNOWN = "ok", "fix", "unknown"


@dataclass(frozen=True)
class Finding:
    check: str
    status: str  # ok | fix | unknown
    detail: str


def _error(exc: Exception) -> str:
    from botocore.exceptions import ClientError

    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return f"{error.get('Code', 'Error')}: {error.get('Message', '')}".strip()
    return f"{type(exc).__name__}: {exc}"


def lambda_concurrency(client: Any) -> Finding:
    check = "Lambda concurrency"
    try:
        settings = client.get_account_settings()
    except Exception as exc:  # noqa: BLE001 - any failure to read is reported, not raised
        return Finding(check, UNKNOWN, f"cannot read (lambda:GetAccountSettings): {_error(exc)}")
    limit = settings.get("AccountLimit", {})
    total = int(limit.get("ConcurrentExecutions", 0))
    unreserved = int(limit.get("UnreservedConcurrentExecutions", total))
    left = unreserved - SCHEDULER_RESERVED_CONCURRENCY
    if left < LAMBDA_MIN_UNRESERVED:
        return Finding(
            check,
            FIX,
            f"the account may run {total} concurrent executions, {unreserved} unreserved; the scheduler "
            f"reserves {SCHEDULER_RESERVED_CONCURRENCY} and Lambda keeps {LAMBDA_MIN_UNRESERVED} unreserved: "
            f"ask for a higher 'Concurrent executions' quota (Service Quotas, AWS Lambda, L-B99A9384) of at "
            f"least {total + LAMBDA_MIN_UNRESERVED - left}",
        )
    return Finding(
        check, OK, f"{unreserved} of {total} unreserved; {left} left once the scheduler reserves 1"
    )


def api_gateway_logging_role(client: Any) -> Finding:
    check = "API Gateway logging role"
    try:
        account = client.get_account()
    except Exception as exc:  # noqa: BLE001
        return Finding(check, UNKNOWN, f"cannot read (apigateway:GET /account): {_error(exc)}")
    role = account.get("cloudwatchRoleArn")
    if not role:
        return Finding(
            check,
            FIX,
            "the account has no CloudWatch Logs role for API Gateway, which the API's access logs need: "
            "create a role API Gateway can assume with the AmazonAPIGatewayPushToCloudWatchLogs policy and "
            "set it in API Gateway's Settings ('CloudWatch log role ARN'), once per account and region",
        )
    return Finding(check, OK, role)


def _quotas(client: Any) -> dict[str, float]:
    """SageMaker's applied quotas by name (the defaults where none was applied)."""
    found: dict[str, float] = {}
    for operation in ("list_aws_default_service_quotas", "list_service_quotas"):
        paginator = client.get_paginator(operation)
        for page in paginator.paginate(ServiceCode="sagemaker"):
            for quota in page.get("Quotas", []):
                found[str(quota.get("QuotaName"))] = float(quota.get("Value", 0))
    return found


def sagemaker_quotas(client: Any, capacity: Mapping[str, int], warm_pools: bool) -> list[Finding]:
    if not capacity:
        return [
            Finding("SageMaker quotas", UNKNOWN, "no pool named: pass --capacity TYPE=N to check its quotas")
        ]
    try:
        quotas = _quotas(client)
    except Exception as exc:  # noqa: BLE001
        return [
            Finding(
                "SageMaker quotas", UNKNOWN, f"cannot read (servicequotas:ListServiceQuotas): {_error(exc)}"
            )
        ]
    findings = []
    usages = ["training job usage", *(["training warm pool usage"] if warm_pools else [])]
    for pool, wanted in sorted(capacity.items()):
        for usage in usages:
            instance_type = pool.removeprefix("plan:")
            name = f"{instance_type} for {usage}"
            check = f"quota '{name}'"
            value = quotas.get(name)
            if value is None:
                findings.append(Finding(check, UNKNOWN, "SageMaker lists no such quota in this region"))
            elif value < wanted:
                findings.append(
                    Finding(
                        check,
                        FIX,
                        f"{value:g} is below the pool's {wanted}: ask for {wanted} in Service Quotas "
                        f"(Amazon SageMaker, '{name}'), or give the pool {value:g}",
                    )
                )
            else:
                findings.append(Finding(check, OK, f"{value:g} >= {wanted}"))
    return findings


def run_checks(
    client_for: Callable[[str], Any], capacity: Mapping[str, int], warm_pools: bool = True
) -> list[Finding]:
    return [
        lambda_concurrency(client_for("lambda")),
        api_gateway_logging_role(client_for("apigateway")),
        *sagemaker_quotas(client_for("service-quotas"), capacity, warm_pools),
    ]


def _capacity(values: Sequence[str]) -> dict[str, int]:
    out = {}
    for value in values:
        pool, sep, count = value.partition("=")
        if not sep or not count.strip().isdigit() or not pool.strip():
            raise click.BadParameter(
                f"{value!r} is not TYPE=N (e.g. ml.trn1.32xlarge=4)", param_hint="--capacity"
            )
        out[pool.strip()] = int(count)
    return out


@click.command("preflight")
@click.option(
    "--capacity",
    "capacity",
    multiple=True,
    metavar="TYPE=N",
    help="A pool you will deploy, to check its SageMaker quotas (repeatable), e.g. ml.trn1.32xlarge=4.",
)
@click.option(
    "--warm-pools/--no-warm-pools",
    default=True,
    show_default=True,
    help="Check the warm-pool quotas too (jobs keep instances warm when DefaultKeepAliveSeconds > 0).",
)
@click.option("--region", help="The region to deploy to (default: the AWS configuration's).")
@click.option("--profile", help="The AWS profile to read with.")
def preflight(capacity: tuple[str, ...], warm_pools: bool, region: str | None, profile: str | None) -> None:
    """Check the account's prerequisites of a first deploy (Lambda concurrency, API Gateway's logging role,
    SageMaker's instance and warm-pool quotas) and say what to fix before `sam deploy`.

    Exit codes: 0 nothing to fix, 1 something to fix, 3 something could not be read.
    """
    import boto3
    from botocore.exceptions import BotoCoreError

    pools = _capacity(capacity)
    try:
        session = boto3.Session(profile_name=profile, region_name=region)
    except BotoCoreError as exc:
        raise click.ClickException(str(exc)) from exc
    findings = run_checks(lambda service: session.client(service, region_name=region), pools, warm_pools)
    width = max(len(f.check) for f in findings)
    for finding in findings:
        click.echo(f"{finding.status:7}  {finding.check.ljust(width)}  {finding.detail}")
    to_fix = [f for f in findings if f.status == FIX]
    unread = [f for f in findings if f.status == UNKNOWN]
    if to_fix:
        click.echo(f"\n{len(to_fix)} thing(s) to fix before `sam deploy`.", err=True)
        sys.exit(1)
    if unread:
        click.echo(f"\n{len(unread)} check(s) could not read what they need.", err=True)
        sys.exit(3)
    click.echo("\nready for `sam build && sam deploy --guided`.")
