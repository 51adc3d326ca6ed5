"""A bounded schemathesis run against the local stack: no request that is not a server fault gets a 5xx, and
no refused request changes the table (#15, point 6).

Cases come from docs/openapi.json (the document the API's own routes generate), both valid and invalid
data, drawn with a fixed seed (hypothesis' derandomize) so every run sends the same requests. Each request
is SigV4-signed as an ordinary user or the admin, like any client of the deployed API.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import requests
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.openapi import from_path

from sagequeue.local import LocalStack

DOCUMENT = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
POOL = "ml.trn1.32xlarge"
#: Requests per operation and generation mode: 18 (operation, mode) pairs x this = 270 requests.
EXAMPLES = 15


class SignedAuth(requests.auth.AuthBase):
    """SigV4 for execute-api over the exact bytes requests will send."""

    def __init__(self, access_key: str, secret: str, region: str) -> None:
        self.signer = SigV4Auth(Credentials(access_key, secret), "execute-api", region)

    def __call__(self, prepared: requests.PreparedRequest) -> requests.PreparedRequest:
        body = prepared.body or b""
        if isinstance(body, str):
            body = body.encode("utf-8", "surrogatepass")
        headers = {k: v for k, v in prepared.headers.items() if k.lower() in ("content-type", "host")}
        aws = AWSRequest(method=prepared.method, url=prepared.url, data=body, headers=headers)
        self.signer.add_auth(aws)
        for name in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token"):
            if name in aws.headers:
                prepared.headers[name] = aws.headers[name]
        return prepared


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    running = LocalStack(settings={"capacity": {POOL: 2}}, function_logs=False).start()
    running.client().pools()  # the configured pools are seeded on first use; that write is not a request's
    yield running
    running.stop()


def table_items(stack: LocalStack) -> list[dict[str, Any]]:
    dynamodb = boto3.client(
        "dynamodb",
        endpoint_url=stack.moto_endpoint,
        region_name=stack.region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    table = dynamodb.list_tables()["TableNames"]
    items: list[dict[str, Any]] = []
    for name in table:
        pages = dynamodb.get_paginator("scan").paginate(TableName=name, ConsistentRead=True)
        for page in pages:
            items.extend(page["Items"])
    return sorted(items, key=repr)


OPERATIONS = [result.ok() for result in from_path(str(DOCUMENT)).get_all_operations()]
#: Invalid data needs something to spoil: operations with parameters or a body.
CASES = [
    pytest.param(operation, mode, id=f"{operation.method.upper()} {operation.path} {mode}")
    for operation in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE
    or operation.definition.raw.get("parameters")
    or operation.definition.raw.get("requestBody")
]


@pytest.mark.slow
@pytest.mark.parametrize(("operation", "mode"), CASES)
def test_no_5xx_and_no_table_change_on_refusal(stack: LocalStack, operation: Any, mode: Any) -> None:
    sessions = {
        who: SignedAuth(
            stack.identity(who).access_key_id, stack.identity(who).secret_access_key, stack.region
        )
        for who in ("user", "admin")
    }
    seen: list[tuple[int, str]] = []

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode), who=st.sampled_from(sorted(sessions)))
    def run(case: Any, who: str) -> None:
        before = table_items(stack)
        response = case.call(base_url=stack.endpoint, auth=sessions[who], timeout=30)
        stack.run_until_idle()
        seen.append((response.status_code, who))
        assert response.status_code < 500, (
            f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:300]}"
        )
        if response.status_code >= 400:
            assert table_items(stack) == before, (
                f"refused {case.method} {case.formatted_path} changed the table"
            )

    run()
    assert seen, "no request was sent"
    assert stack.failures == []
