"""The api handler's answers to requests it refuses, or passes on to a use case, before the use case runs.

The table was recorded from the previous handler (Powertools' resolver with pydantic request validation) and
pins the same statuses and messages on the handler's own router and request checks; two rows that answered
500 there (a body-less PUT with another media type, an upper-case JSON media type) now get what the request
deserves. A request that passes every check reaches the use case, which these tests stand in for.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from sagequeue_core import runtime
from sagequeue_core.domain import DomainError

ROOT = Path(__file__).resolve().parents[3]
#: The status of a request that passed every check (the stand-in use case answers it).
USE_CASE = -1

VALID = {
    "TrainingJobName": "j1",
    "RoleArn": "arn:aws:iam::123456789012:role/r",
    "AlgorithmSpecification": {"TrainingImage": "i", "TrainingInputMode": "File"},
    "OutputDataConfig": {"S3OutputPath": "s3://b/o"},
    "ResourceConfig": {"InstanceType": "ml.trn1.32xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
    "StoppingCondition": {"MaxRuntimeInSeconds": 60},
}


def submission(**changes: Any) -> str:
    """A valid submission's JSON with members changed, added, or removed (`...`)."""
    body = {**VALID, **changes}
    return json.dumps({k: v for k, v in body.items() if v is not ...})


# (method, path, query, body, headers or None for JSON, status, message)
CASES: list[tuple[str, str, dict[str, str] | None, str | None, dict[str, str] | None, int, str | None]] = [
    ("GET", "/nope", None, None, None, 404, "no route for GET '/nope'"),
    ("GET", "/", None, None, None, 404, "no route for GET '/'"),
    ("PUT", "/jobs", None, "{}", None, 405, "PUT is not allowed here; allowed: GET, POST"),
    ("POST", "/jobs/abc", None, "{}", None, 405, "POST is not allowed here; allowed: DELETE, GET, PATCH"),
    ("DELETE", "/pools", None, None, None, 405, "DELETE is not allowed here; allowed: GET"),
    ("GET", "/jobs/a/b", None, None, None, 404, "no route for GET '/jobs/a/b'"),
    ("POST", "/pools/ml.trn1.2xlarge", None, "{}", None, 405, "POST is not allowed here; allowed: PUT"),
    ("GET", "/jobs/", None, None, None, USE_CASE, None),
    ("GET", "/whoami/", None, None, None, USE_CASE, None),
    ("get", "/jobs", None, None, None, USE_CASE, None),
    (
        "GET",
        "/jobs/bad_name",
        None,
        None,
        None,
        400,
        "name: String should match pattern '^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$'",
    ),
    (
        "GET",
        "/jobs/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        None,
        None,
        None,
        400,
        "name: String should have at most 63 characters",
    ),
    (
        "GET",
        "/jobs/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        None,
        None,
        None,
        USE_CASE,
        None,
    ),
    (
        "GET",
        "/jobs/a-",
        None,
        None,
        None,
        400,
        "name: String should match pattern '^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$'",
    ),
    ("GET", "/jobs/abc\n", None, None, None, USE_CASE, None),
    (
        "GET",
        "/jobs/-a",
        None,
        None,
        None,
        400,
        "name: String should match pattern '^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$'",
    ),
    ("DELETE", "/jobs/a--b", None, None, None, USE_CASE, None),
    ("GET", "/jobs", {"limit": "0"}, None, None, 400, "limit: Input should be greater than or equal to 1"),
    ("GET", "/jobs", {"limit": "101"}, None, None, 400, "limit: Input should be less than or equal to 100"),
    (
        "GET",
        "/jobs",
        {"limit": "abc"},
        None,
        None,
        400,
        "limit: Input should be a valid integer, unable to parse string as an integer",
    ),
    (
        "GET",
        "/jobs",
        {"limit": "1.5"},
        None,
        None,
        400,
        "limit: Input should be a valid integer, unable to parse string as an integer",
    ),
    (
        "GET",
        "/jobs",
        {"limit": ""},
        None,
        None,
        400,
        "limit: Input should be a valid integer, unable to parse string as an integer",
    ),
    ("GET", "/jobs", {"limit": " 5"}, None, None, USE_CASE, None),
    ("GET", "/jobs", {"limit": "5"}, None, None, USE_CASE, None),
    ("GET", "/jobs", {"limit": "100"}, None, None, USE_CASE, None),
    (
        "GET",
        "/jobs",
        {"limit": "1e2"},
        None,
        None,
        400,
        "limit: Input should be a valid integer, unable to parse string as an integer",
    ),
    ("GET", "/jobs", {"limit": "+5"}, None, None, USE_CASE, None),
    (
        "GET",
        "/jobs",
        {"limit": "0x10"},
        None,
        None,
        400,
        "limit: Input should be a valid integer, unable to parse string as an integer",
    ),
    ("GET", "/jobs", {"limit": "1_0"}, None, None, USE_CASE, None),
    ("GET", "/jobs", {"state": "", "other": "x"}, None, None, USE_CASE, None),
    (
        "GET",
        "/jobs",
        {"limit": "0", "state": "queued"},
        None,
        None,
        400,
        "limit: Input should be greater than or equal to 1",
    ),
    (
        "PUT",
        "/pools/ml.trn1.32xlarge",
        None,
        '{"capacity": -1}',
        None,
        400,
        "capacity: Input should be greater than or equal to 0",
    ),
    (
        "PUT",
        "/pools/ml.trn1.32xlarge",
        None,
        '{"capacity": "3"}',
        None,
        400,
        "capacity: Input should be a valid integer",
    ),
    (
        "PUT",
        "/pools/ml.trn1.32xlarge",
        None,
        '{"capacity": true}',
        None,
        400,
        "capacity: Input should be a valid integer",
    ),
    (
        "PUT",
        "/pools/ml.trn1.32xlarge",
        None,
        '{"capacity": 3.0}',
        None,
        400,
        "capacity: Input should be a valid integer",
    ),
    ("PUT", "/pools/ml.trn1.32xlarge", None, "{}", None, 400, "capacity: Field required"),
    (
        "PUT",
        "/pools/ml.trn1.32xlarge",
        None,
        '{"capacity": 3, "x": 1}',
        None,
        400,
        "x: Extra inputs are not permitted",
    ),
    (
        "PUT",
        "/pools/ml.trn1.32xlarge",
        None,
        "[]",
        None,
        400,
        "request: Input should be a valid dictionary or object to extract fields from",
    ),
    (
        "PUT",
        "/pools/ml.trn1.32xlarge",
        None,
        '"3"',
        None,
        400,
        "request: Input should be a valid dictionary or object to extract fields from",
    ),
    ("PUT", "/pools/ml.trn1.32xlarge", None, "null", None, 400, "request: Field required"),
    ("PUT", "/pools/ml.trn1.32xlarge", None, None, None, 400, "request: Field required"),
    (
        "PUT",
        "/pools/ml.trn1.32xlarge",
        None,
        '{"capacity": 100001}',
        None,
        400,
        "capacity: Input should be less than or equal to 100000",
    ),
    ("PUT", "/pools/ml.trn1.32xlarge", None, '{"capacity": 100000}', None, USE_CASE, None),
    (
        "PUT",
        "/pools/trn1",
        None,
        '{"capacity": 1}',
        None,
        400,
        "instanceType: String should match pattern '^(ml\\.[a-z0-9]+\\.[a-z0-9]+|plan:[A-Za-z0-9-]{1,64})$'",
    ),
    (
        "PUT",
        "/pools/plan:",
        None,
        '{"capacity": 1}',
        None,
        400,
        "instanceType: String should match pattern '^(ml\\.[a-z0-9]+\\.[a-z0-9]+|plan:[A-Za-z0-9-]{1,64})$'",
    ),
    ("PUT", "/pools/plan:abc", None, '{"capacity": 1}', None, USE_CASE, None),
    (
        "PUT",
        "/pools/trn1",
        None,
        '{"capacity": -1}',
        None,
        400,
        "instanceType: String should match pattern '^(ml\\.[a-z0-9]+\\.[a-z0-9]+|plan:[A-Za-z0-9-]{1,64})$'; capacity: Input should be greater than or equal to 0",
    ),
    (
        "PUT",
        "/pools/plan:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        None,
        '{"capacity": 1}',
        None,
        400,
        "instanceType: String should have at most 69 characters",
    ),
    (
        "PUT",
        "/pools/ml.trn1.32xlarge",
        None,
        '{"capacity": null}',
        None,
        400,
        "capacity: Input should be a valid integer",
    ),
    (
        "PUT",
        "/pools/ml.trn1.32xlarge",
        None,
        '{"capacity": 1, "capacity2": 2, "z": 3}',
        None,
        400,
        "capacity2: Extra inputs are not permitted; z: Extra inputs are not permitted",
    ),
    ("PUT", "/pools/ml.trn1.32xlarge", None, "{", None, 400, "1: JSON decode error"),
    (
        "PUT",
        "/pools/ml.trn1.32xlarge",
        None,
        '{"capacity": 1e3}',
        None,
        400,
        "capacity: Input should be a valid integer",
    ),
    (
        "PATCH",
        "/jobs/x",
        None,
        '{"priority": 1001}',
        None,
        400,
        "priority: Input should be less than or equal to 1000",
    ),
    (
        "PATCH",
        "/jobs/x",
        None,
        '{"priority": -1}',
        None,
        400,
        "priority: Input should be greater than or equal to 0",
    ),
    ("PATCH", "/jobs/x", None, '{"priority": "5"}', None, 400, "priority: Input should be a valid integer"),
    ("PATCH", "/jobs/x", None, '{"held": "yes"}', None, 400, "held: Input should be a valid boolean"),
    ("PATCH", "/jobs/x", None, '{"held": 1}', None, 400, "held: Input should be a valid boolean"),
    ("PATCH", "/jobs/x", None, '{"foo": 1}', None, 400, "foo: Extra inputs are not permitted"),
    ("PATCH", "/jobs/x", None, "{}", None, 400, "nothing to change: give priority and/or held"),
    (
        "PATCH",
        "/jobs/x",
        None,
        '{"priority": null}',
        None,
        400,
        "nothing to change: give priority and/or held",
    ),
    (
        "PATCH",
        "/jobs/x",
        None,
        "[]",
        None,
        400,
        "request: Input should be a valid dictionary or object to extract fields from",
    ),
    ("PATCH", "/jobs/x", None, None, None, 400, "request: Field required"),
    ("PATCH", "/jobs/x", None, '{"priority": 5, "held": true}', None, USE_CASE, None),
    (
        "PATCH",
        "/jobs/bad_name",
        None,
        '{"priority": "x"}',
        None,
        400,
        "name: String should match pattern '^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$'; priority: Input should be a valid integer",
    ),
    ("PATCH", "/jobs/x", None, '{"priority": 1.0}', None, 400, "priority: Input should be a valid integer"),
    (
        "PATCH",
        "/jobs/x",
        None,
        '{"priority": true, "held": 0, "a": 1}',
        None,
        400,
        "priority: Input should be a valid integer; held: Input should be a valid boolean; a: Extra inputs are not permitted",
    ),
    (
        "PATCH",
        "/jobs/x",
        None,
        '{"priority": 99999999999999999999999}',
        None,
        400,
        "priority: Input should be less than or equal to 1000",
    ),
    (
        "POST",
        "/jobs",
        None,
        "{}",
        None,
        400,
        "TrainingJobName: Field required; RoleArn: Field required; AlgorithmSpecification: Field required; OutputDataConfig: Field required; ResourceConfig: Field required; StoppingCondition: Field required",
    ),
    (
        "POST",
        "/jobs",
        None,
        submission(TrainingJobName=5),
        None,
        400,
        "TrainingJobName: Input should be a valid string",
    ),
    ("POST", "/jobs", None, submission(Tags="x"), None, 400, "Tags: Input should be a valid list"),
    ("POST", "/jobs", None, submission(Tags=[1]), None, 400, "Tags.0: Input should be a valid dictionary"),
    (
        "POST",
        "/jobs",
        None,
        submission(Tags=[{"Key": "a"}, "b", 3]),
        None,
        400,
        "Tags.1: Input should be a valid dictionary; Tags.2: Input should be a valid dictionary",
    ),
    ("POST", "/jobs", None, submission(Tags=None), None, USE_CASE, None),
    ("POST", "/jobs", None, submission(priority=1.5), None, 400, "priority: Input should be a valid integer"),
    (
        "POST",
        "/jobs",
        None,
        submission(priority=True),
        None,
        400,
        "priority: Input should be a valid integer",
    ),
    ("POST", "/jobs", None, submission(priority=None), None, USE_CASE, None),
    (
        "POST",
        "/jobs",
        None,
        submission(priority=2000),
        None,
        400,
        "priority: Input should be less than or equal to 1000",
    ),
    (
        "POST",
        "/jobs",
        None,
        submission(priority=-5),
        None,
        400,
        "priority: Input should be greater than or equal to 0",
    ),
    ("POST", "/jobs", None, submission(priority="3"), None, 400, "priority: Input should be a valid integer"),
    (
        "POST",
        "/jobs",
        None,
        "[]",
        None,
        400,
        "request: Input should be a valid dictionary or object to extract fields from",
    ),
    ("POST", "/jobs", None, "null", None, 400, "request: Field required"),
    (
        "POST",
        "/jobs",
        None,
        "5",
        None,
        400,
        "request: Input should be a valid dictionary or object to extract fields from",
    ),
    ("POST", "/jobs", None, None, None, 400, "request: Field required"),
    ("POST", "/jobs", None, "{", None, 400, "1: JSON decode error"),
    ("POST", "/jobs", None, "", None, 400, "request: Field required"),
    ("POST", "/jobs", None, submission(), None, USE_CASE, None),
    ("POST", "/add-job", None, submission(), None, USE_CASE, None),
    (
        "POST",
        "/add-job",
        None,
        "{}",
        None,
        400,
        "TrainingJobName: Field required; RoleArn: Field required; AlgorithmSpecification: Field required; OutputDataConfig: Field required; ResourceConfig: Field required; StoppingCondition: Field required",
    ),
    (
        "POST",
        "/jobs",
        None,
        '{"TrainingJobName": "j1", "RoleArn": null, "AlgorithmSpecification": null, "OutputDataConfig": 1, "ResourceConfig": [], "StoppingCondition": "x"}',
        None,
        400,
        "RoleArn: Input should be a valid string; AlgorithmSpecification: Input should be a valid dictionary; OutputDataConfig: Input should be a valid dictionary; ResourceConfig: Input should be a valid dictionary; StoppingCondition: Input should be a valid dictionary",
    ),
    (
        "POST",
        "/jobs",
        None,
        submission(TrainingJobName=..., RoleArn=...),
        None,
        400,
        "TrainingJobName: Field required; RoleArn: Field required",
    ),
    ("POST", "/jobs", None, submission(Extra={"x": 1}), None, USE_CASE, None),
    (
        "POST",
        "/jobs",
        None,
        '{"TrainingJobName": "a", "TrainingJobName": 3}',
        None,
        400,
        "TrainingJobName: Input should be a valid string; RoleArn: Field required; AlgorithmSpecification: Field required; OutputDataConfig: Field required; ResourceConfig: Field required; StoppingCondition: Field required",
    ),
    ("POST", "/jobs", None, submission(priority=0), None, USE_CASE, None),
    ("POST", "/jobs", None, submission(priority=1000), None, USE_CASE, None),
    (
        "POST",
        "/jobs",
        None,
        submission(priority=1001),
        None,
        400,
        "priority: Input should be less than or equal to 1000",
    ),
    (
        "PUT",
        "/exemptions/bad_name",
        None,
        None,
        None,
        400,
        "trainingJobName: String should match pattern '^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$'",
    ),
    ("PUT", "/exemptions/ok-name", None, None, None, USE_CASE, None),
    ("PUT", "/exemptions/ok-name", None, "{}", None, USE_CASE, None),
    ("GET", "/whoami", None, None, None, USE_CASE, None),
    ("GET", "/pools", None, None, None, USE_CASE, None),
    ("GET", "/jobs/ok", None, None, None, USE_CASE, None),
    ("DELETE", "/jobs/ok", None, None, None, USE_CASE, None),
    ("GET", "/jobs", None, None, None, USE_CASE, None),
    (
        "GET",
        "/jobs/a%20b",
        None,
        None,
        None,
        400,
        "name: String should match pattern '^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$'",
    ),
    (
        "GET",
        "/jobs/é",
        None,
        None,
        None,
        400,
        "name: String should match pattern '^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$'",
    ),
    (
        "POST",
        "/jobs",
        None,
        '{"priority": NaN}',
        None,
        400,
        "TrainingJobName: Field required; RoleArn: Field required; AlgorithmSpecification: Field required; OutputDataConfig: Field required; ResourceConfig: Field required; StoppingCondition: Field required; priority: Input should be a valid integer",
    ),
    (
        "PUT",
        "/pools/ml.trn1.32xlarge",
        None,
        None,
        {"content-type": "text/plain"},
        400,
        "request: Field required",
    ),  # was a 500
    (
        "PUT",
        "/pools/ml.trn1.32xlarge",
        None,
        '{"capacity": 1}',
        {"content-type": "application/json; charset=utf-8"},
        USE_CASE,
        None,
    ),
    (
        "PUT",
        "/pools/ml.trn1.32xlarge",
        None,
        '{"capacity": 1}',
        {"Content-Type": "APPLICATION/JSON"},
        USE_CASE,
        None,
    ),  # was a 500
    (
        "PUT",
        "/pools/ml.trn1.32xlarge",
        None,
        '{"capacity": -1}',
        {},
        400,
        "capacity: Input should be greater than or equal to 0",
    ),
    (
        "PUT",
        "/pools/ml.trn1.32xlarge",
        None,
        '{"capacity": -1}',
        {"content-type": " application/json"},
        400,
        "capacity: Input should be greater than or equal to 0",
    ),
    ("GET", "/jobs/x", None, "{", {}, USE_CASE, None),
    ("PATCH", "/jobs/bad_name", None, "{", {}, 400, "1: JSON decode error"),
    ("PATCH", "/jobs/x", None, "", None, 400, "request: Field required"),
    ("GET", "/jobs", {"limit": "5.0"}, None, None, USE_CASE, None),
    ("GET", "/jobs", {"limit": "\t7\n"}, None, None, USE_CASE, None),
    ("GET", "/jobs", {"limit": "-5"}, None, None, 400, "limit: Input should be greater than or equal to 1"),
    (
        "PATCH",
        "/jobs/x",
        None,
        '{"priority": 5}',
        {"content-type": "text/plain"},
        415,
        "Content-Type must be application/json, got 'text/plain'",
    ),
    ("PATCH", "/jobs/x", None, "  ", None, 400, "2: JSON decode error"),
    ("POST", "/jobs", None, " null ", None, 400, "request: Field required"),
]


class ReachedUseCase(DomainError):
    """Raised by the stand-in dependencies: the request passed every check."""


class StandIn:
    def __getattr__(self, name: str) -> Any:
        raise ReachedUseCase(f"use case reached ({name})")


class Context:
    function_name = "api"
    memory_limit_in_mb = 1024
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:api"
    aws_request_id = "request-1"


@pytest.fixture(scope="module")
def api() -> Iterator[ModuleType]:
    spec = importlib.util.spec_from_file_location("sagequeue_api_requests", ROOT / "functions/api/app.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    runtime.install(StandIn())  # type: ignore[arg-type]
    yield module
    runtime.reset()


def proxy_event(
    method: str, path: str, query: dict[str, str] | None, body: str | None, headers: dict[str, str] | None
) -> dict[str, Any]:
    return {
        "resource": path,
        "path": path,
        "httpMethod": method,
        "headers": headers if headers is not None else {"content-type": "application/json"},
        "queryStringParameters": query,
        "multiValueQueryStringParameters": {k: [v] for k, v in query.items()} if query else None,
        "pathParameters": None,
        "requestContext": {
            "path": "/v1" + path,
            "stage": "v1",
            "requestId": "r1",
            "identity": {"userArn": "arn:aws:iam::123456789012:role/u"},
        },
        "body": body,
        "isBase64Encoded": False,
    }


@pytest.mark.parametrize(("method", "path", "query", "body", "headers", "status", "message"), CASES)
def test_a_request_gets_the_recorded_answer(
    api: ModuleType,
    method: str,
    path: str,
    query: dict[str, str] | None,
    body: str | None,
    headers: dict[str, str] | None,
    status: int,
    message: str | None,
) -> None:
    answer = api.handler(proxy_event(method, path, query, body, headers), Context())
    payload = json.loads(answer["body"])
    assert answer["multiValueHeaders"] == {"Content-Type": ["application/json"]}
    if status == USE_CASE:
        assert (answer["statusCode"], payload["message"].split(" (")[0]) == (400, "use case reached"), payload
    else:
        assert (answer["statusCode"], payload) == (status, {"message": message, "code": _code(status)})


def _code(status: int) -> str:
    return {400: "ValidationError", 404: "NotFound", 405: "MethodNotAllowed", 415: "UnsupportedMediaType"}[
        status
    ]


def test_query_strings_take_the_first_of_repeated_values(api: ModuleType) -> None:
    event = proxy_event("GET", "/jobs", {"limit": "0"}, None, None)
    event["multiValueQueryStringParameters"] = {"limit": ["0", "5"]}
    answer = api.handler(event, Context())
    assert json.loads(answer["body"])["message"] == "limit: Input should be greater than or equal to 1"
