"""The local API gateway: SigV4-authorized requests become API Gateway REST proxy events (format 1.0) with the
caller's identity, routed as the template declares; refusals look like API Gateway's."""

from __future__ import annotations

import hashlib
import json
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import urllib3
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from sagequeue.local.apigw import LocalApiGateway
from sagequeue.local.identities import Identity, IdentityTable, default_identities
from sagequeue.local.router import FunctionHost
from sagequeue.local.template import StackContext, Template, build_spec

ACCOUNT = "444455556666"
NOW = datetime(2026, 5, 4, 3, 2, 1, tzinfo=UTC)
HTTP = urllib3.PoolManager()


@pytest.fixture
def gateway(mini_template: Path) -> Iterator[LocalApiGateway]:
    context = StackContext(f"api{uuid.uuid4().hex[:6]}", "us-east-1", ACCOUNT)
    spec = build_spec(Template.from_file(mini_template, context, {"Required": "x"}))
    host = FunctionHost(spec.functions)
    gateway = LocalApiGateway(
        routes=spec.routes,
        identities=IdentityTable(default_identities(ACCOUNT).values()),
        invoke=host.invoke,
        region="us-east-1",
        account_id=ACCOUNT,
        now=lambda: NOW,
        api_id="abc123",
        stage="v1",
    )
    gateway.start()
    yield gateway
    gateway.stop()
    for name in list(sys.modules):
        if name.startswith("sagequeue_local_functions."):
            del sys.modules[name]


def call(
    gateway: LocalApiGateway,
    method: str,
    path: str,
    *,
    identity: Identity | None = None,
    secret: str | None = None,
    body: Any = None,
    region: str = "us-east-1",
) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode() if body is not None else b""
    request = AWSRequest(
        method=method, url=gateway.endpoint + path, data=data, headers={"Content-Type": "application/json"}
    )
    if identity is not None:
        credentials = Credentials(identity.access_key_id, secret or identity.secret_access_key)
        SigV4Auth(credentials, "execute-api", region).add_auth(request)
    prepared = request.prepare()
    answer = HTTP.request(method, prepared.url, body=data or None, headers=dict(prepared.headers))
    return answer.status, json.loads(answer.data or b"{}")


def echoed(answer: dict[str, Any]) -> dict[str, Any]:
    event: dict[str, Any] = answer["event"]
    return event


def test_a_signed_request_becomes_the_proxy_event(gateway: LocalApiGateway) -> None:
    user = gateway.identities["user"]
    status, answer = call(gateway, "GET", "/hello/model%20card?verbose=1&tag=a&tag=b", identity=user)
    assert status == 200
    event = echoed(answer)
    assert event["resource"] == "/hello/{name}"
    assert event["path"] == "/hello/model card"
    assert event["httpMethod"] == "GET"
    assert event["pathParameters"] == {"name": "model card"}
    assert event["queryStringParameters"] == {"verbose": "1", "tag": "b"}
    assert event["multiValueQueryStringParameters"] == {"verbose": ["1"], "tag": ["a", "b"]}
    assert event["body"] is None
    assert event["isBase64Encoded"] is False
    assert "Authorization" in event["headers"]
    context = event["requestContext"]
    assert context["resourcePath"] == "/hello/{name}"
    assert context["stage"] == "v1"
    assert context["path"] == "/v1/hello/model card"
    assert context["apiId"] == "abc123"
    assert context["accountId"] == ACCOUNT
    assert context["requestTimeEpoch"] == int(NOW.timestamp() * 1000)
    assert context["identity"]["userArn"] == f"arn:aws:iam::{ACCOUNT}:user/sagequeue-local-user"
    assert context["identity"]["caller"] == user.caller
    assert context["identity"]["accessKey"] == user.access_key_id
    assert context["identity"]["accountId"] == ACCOUNT


def test_the_identity_follows_the_access_key(gateway: LocalApiGateway) -> None:
    admin = gateway.identities["admin"]
    status, answer = call(gateway, "POST", "/things", identity=admin, body={"a": 1})
    assert status == 200
    event = echoed(answer)
    assert json.loads(event["body"]) == {"a": 1}
    identity = event["requestContext"]["identity"]
    assert identity["userArn"] == f"arn:aws:sts::{ACCOUNT}:assumed-role/sagequeue-local-admin/admin"
    assert identity["caller"].endswith(":admin")
    assert identity["caller"].startswith("AROA")


def test_literal_routes_win_over_parameters_and_the_stage_prefix_is_accepted(
    gateway: LocalApiGateway,
) -> None:
    user = gateway.identities["user"]
    status, answer = call(gateway, "GET", "/v1/hello/mine", identity=user)
    assert status == 200
    assert echoed(answer)["resource"] == "/hello/mine"
    assert echoed(answer)["pathParameters"] is None


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("unsigned", "Missing Authentication Token"),
        ("unknown key", "is not a local identity"),
        ("wrong secret", "signature we calculated does not match"),
        ("wrong region", "Credential should be scoped to a valid region"),
    ],
)
def test_unauthorized_requests_are_refused(gateway: LocalApiGateway, case: str, message: str) -> None:
    user = gateway.identities["user"]
    if case == "unsigned":
        status, answer = call(gateway, "GET", "/hello/x")
    elif case == "unknown key":
        stranger = Identity("x", "AKIAUNKNOWNUNKNOWN00", "s" * 40, "arn:aws:iam::1:user/x", "AIDAX", "1")
        status, answer = call(gateway, "GET", "/hello/x", identity=stranger)
    elif case == "wrong secret":
        status, answer = call(gateway, "GET", "/hello/x", identity=user, secret="not-the-secret")
    else:
        status, answer = call(gateway, "GET", "/hello/x", identity=user, region="eu-west-1")
    assert status == 403
    assert answer["code"] == "Forbidden"
    assert message in answer["message"]


def test_a_body_changed_after_signing_is_refused(gateway: LocalApiGateway) -> None:
    user = gateway.identities["user"]
    request = AWSRequest(method="POST", url=gateway.endpoint + "/things", data=b'{"n": 1}')
    SigV4Auth(Credentials(user.access_key_id, user.secret_access_key), "execute-api", "us-east-1").add_auth(
        request
    )
    prepared = request.prepare()
    answer = HTTP.request("POST", prepared.url, body=b'{"n": 2}', headers=dict(prepared.headers))
    assert answer.status == 403


def test_a_body_swapped_under_a_signed_content_hash_is_refused(gateway: LocalApiGateway) -> None:
    # GIVEN a request signed with X-Amz-Content-Sha256 (SigV4 then signs the header, not the body)
    user = gateway.identities["user"]
    signed_body = b'{"n": 1}'
    request = AWSRequest(
        method="POST",
        url=gateway.endpoint + "/things",
        data=signed_body,
        headers={"X-Amz-Content-Sha256": hashlib.sha256(signed_body).hexdigest()},
    )
    SigV4Auth(Credentials(user.access_key_id, user.secret_access_key), "execute-api", "us-east-1").add_auth(
        request
    )
    prepared = request.prepare()
    # WHEN the body is swapped on the way, THEN the gateway refuses it; the signed body itself passes
    swapped = HTTP.request("POST", prepared.url, body=b'{"n": 2}', headers=dict(prepared.headers))
    assert swapped.status == 403
    assert "X-Amz-Content-Sha256" in json.loads(swapped.data)["message"]
    honest = HTTP.request("POST", prepared.url, body=signed_body, headers=dict(prepared.headers))
    assert honest.status == 200


@pytest.mark.parametrize("age", [timedelta(days=400), timedelta(minutes=16), -timedelta(minutes=16)])
def test_a_signature_older_or_newer_than_15_minutes_is_refused(
    gateway: LocalApiGateway, age: timedelta
) -> None:
    user = gateway.identities["user"]
    request = AWSRequest(method="GET", url=gateway.endpoint + "/hello/x", data=b"")
    signed_at = datetime.now(UTC) - age
    signer = SigV4Auth(Credentials(user.access_key_id, user.secret_access_key), "execute-api", "us-east-1")
    with mock.patch("botocore.auth.get_current_datetime", return_value=signed_at.replace(tzinfo=None)):
        signer.add_auth(request)  # a correct signature, made `age` ago
    prepared = request.prepare()
    answer = HTTP.request("GET", prepared.url, headers=dict(prepared.headers))
    assert answer.status == 403
    assert "Signature expired" in json.loads(answer.data)["message"]


def test_unknown_routes_and_methods_name_the_problem(gateway: LocalApiGateway) -> None:
    user = gateway.identities["user"]
    status, answer = call(gateway, "GET", "/nowhere", identity=user)
    assert status == 404
    assert "no route for GET /nowhere" in answer["message"]
    assert "GET /hello/{name}" in answer["message"]
    status, answer = call(gateway, "DELETE", "/hello/x", identity=user)
    assert status == 405
    assert "allowed: GET" in answer["message"]


def test_function_failures_become_gateway_errors(gateway: LocalApiGateway) -> None:
    user = gateway.identities["user"]
    call(gateway, "GET", "/hello/warm-up", identity=user)  # loads the function
    recorder: Any = sys.modules["sagequeue_local_functions.Recorder.app"]
    recorder.FAILURES_LEFT = 1
    status, answer = call(gateway, "GET", "/hello/x", identity=user)
    assert status == 502
    assert answer["code"] == "InternalError"
    status, answer = call(gateway, "POST", "/things", identity=user, body={"malformed": True})
    assert status == 502
    assert answer["message"] == "Malformed Lambda proxy response"


def test_the_date_header_is_the_stacks_clock(gateway: LocalApiGateway) -> None:
    # GIVEN a gateway whose clock stands at NOW, far from the wall clock
    user = default_identities(ACCOUNT)["user"]
    request = AWSRequest(method="GET", url=gateway.endpoint + "/hello/x", data=b"")
    SigV4Auth(Credentials(user.access_key_id, user.secret_access_key), "execute-api", "us-east-1").add_auth(
        request
    )
    prepared = request.prepare()
    # WHEN a client calls it
    answer = HTTP.request("GET", prepared.url, headers=dict(prepared.headers))
    # THEN the answer's Date is the stack's time, as clients measure waits against it
    assert answer.status == 200
    assert parsedate_to_datetime(answer.headers["Date"]) == NOW
