"""docs/openapi.json describes the API the handler serves: its routes, their path parameters, the list's
query bounds and the request bodies are the ones the handler's router and request checks enforce, and a
body the document's schema accepts is one the checks accept (and the reverse)."""

from __future__ import annotations

import importlib.util
import json
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from sagequeue_core.domain import Job
from sagequeue_core.service.http import (
    CAPACITY,
    CHANGE,
    QUOTA,
    SUBMIT,
    Body,
    RequestInvalid,
    quota_answer,
)

ROOT = Path(__file__).resolve().parents[3]
DOCUMENT = json.loads((ROOT / "docs" / "openapi.json").read_text())
SCHEMAS = DOCUMENT["components"]["schemas"]
BODIES = {
    "SubmitRequest": SUBMIT,
    "ChangeRequest": CHANGE,
    "CapacityRequest": CAPACITY,
    "QuotaRequest": QUOTA,
}


def _api() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sagequeue_api_for_openapi", ROOT / "functions/api/app.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


API = _api()


def _documented() -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method.upper(), path): operation
        for path, operations in DOCUMENT["paths"].items()
        for method, operation in operations.items()
    }


def _served() -> dict[tuple[str, str], Any]:
    return {(route.method, route.path.replace("<", "{").replace(">", "}")): route for route in API.app.routes}


def test_the_document_lists_exactly_the_routes_served() -> None:
    assert sorted(_documented()) == sorted(_served())


@pytest.mark.parametrize("key", sorted(_served()), ids=lambda key: f"{key[0]} {key[1]}")
def test_a_route_is_documented_as_served(key: tuple[str, str]) -> None:
    operation, route = _documented()[key], _served()[key]
    assert operation["summary"] == route.summary
    assert [status for status in operation["responses"] if status.startswith("2")] == [str(route.status)]
    body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    documented_body = body["$ref"].rsplit("/", 1)[-1] if body else None
    assert (BODIES[documented_body] if documented_body else None) is route.body
    parameters = {p["name"]: p["schema"] for p in operation.get("parameters", ()) if p["in"] == "path"}
    assert set(parameters) == set(route.parameters)
    for name, check in route.parameters.items():
        assert (parameters[name]["pattern"], parameters[name]["maxLength"]) == (
            check.pattern,
            check.max_length,
        )


def test_the_list_limit_is_documented_with_its_bounds() -> None:
    limit = next(p for p in _documented()[("GET", "/jobs")]["parameters"] if p["name"] == "limit")["schema"]
    assert (limit["minimum"], limit["maximum"], limit["default"]) == (
        API.LIMIT.minimum,
        API.LIMIT.maximum,
        API.LIMIT.default,
    )


def _member_schema(schema: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The schema of a member without its `null` alternative, and whether null is allowed."""
    alternatives = schema.get("anyOf")
    if alternatives is None:
        return schema, False
    others = [a for a in alternatives if a.get("type") != "null"]
    assert len(others) == 1
    return others[0], len(others) < len(alternatives)


@pytest.mark.parametrize("name", sorted(BODIES))
def test_a_body_check_declares_what_its_schema_says(name: str) -> None:
    schema, body = SCHEMAS[name], BODIES[name]
    assert list(schema["properties"]) == sorted(body.members) or set(schema["properties"]) == set(
        body.members
    )
    assert set(schema.get("required", ())) == {n for n, m in body.members.items() if m.required}
    assert schema.get("additionalProperties", True) is body.extra_allowed
    for member_name, member in body.members.items():
        declared, nullable = _member_schema(schema["properties"][member_name])
        assert (declared["type"], nullable) == (member.kind, member.nullable), member_name
        assert declared.get("minimum") == member.minimum, member_name
        assert declared.get("maximum") == member.maximum, member_name
        assert (declared.get("items") or {}).get("type") == member.items, member_name


def _accepts(body: Body, value: Any) -> bool:
    try:
        body.check(value)
    except RequestInvalid:
        return False
    return True


#: JSON values of every kind. Floats are never whole: JSON Schema counts 3.0 as an integer, the checks (like
#: the strict validation before them) do not.
VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**6), max_value=10**6)
    | st.floats(allow_nan=False).filter(lambda x: not x.is_integer())
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


def _edges(minimum: int | None, maximum: int | None) -> list[int]:
    """Integers on and beside a member's bounds."""
    return [edge + step for edge in (minimum, maximum) if edge is not None for step in (-1, 0, 1)] or [0]


def _bodies(body: Body) -> st.SearchStrategy[Any]:
    """Objects made of the body's own members (each maybe left out) and some others, or any JSON value."""
    members = {
        name: VALUES
        | st.sampled_from(_edges(member.minimum, member.maximum))
        | (st.lists(st.dictionaries(st.text(max_size=2), VALUES, max_size=2), max_size=2))
        for name, member in body.members.items()
    }
    objects = st.fixed_dictionaries({}, optional=members).flatmap(
        lambda chosen: st.dictionaries(st.sampled_from(["x", "Tags2"]), VALUES, max_size=1).map(
            lambda extra: {**extra, **chosen}
        )
    )
    return objects | VALUES


@pytest.mark.parametrize("name", sorted(BODIES))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_the_checks_accept_what_the_document_accepts(name: str, data: st.DataObject) -> None:
    body = BODIES[name]
    value = data.draw(_bodies(body))
    validator = Draft202012Validator({**SCHEMAS[name], "components": DOCUMENT["components"]})
    documented = value is not None and validator.is_valid(value)
    assert _accepts(body, value) is documented, value


def _answer_validator(name: str) -> Draft202012Validator:
    return Draft202012Validator({**SCHEMAS[name], "components": DOCUMENT["components"]})


@pytest.mark.parametrize(
    "share",
    [
        # a quota removed: the use case gives only its team and pool
        {"team": "a", "pool": "ml.trn1.32xlarge", "removed": True},
        # a quota set: no waiting count
        {
            "team": "a",
            "pool": "ml.trn1.32xlarge",
            "nominal": 4,
            "borrowing_limit": None,
            "lending_limit": 1,
            "used": 5,
            "borrowed": 1,
            "lent": 0,
            "borrowable": 3,
        },
        # a listed share, with a member the document does not name
        {"team": "b", "pool": "plan:p", "nominal": 0, "used": 2, "waiting": 7, "internal": "x"},
        # a quota set above what the pool holds beside the others'
        {
            "team": "c",
            "pool": "ml.trn1.32xlarge",
            "nominal": 3,
            "warning": "the nominal quotas of all teams in ml.trn1.32xlarge sum to 5, above its capacity of 4",
        },
    ],
    ids=["removed", "set", "listed", "warned"],
)
def test_a_quota_answer_has_exactly_the_documented_members(share: dict[str, Any]) -> None:
    answer = quota_answer(share)
    assert set(answer) == set(SCHEMAS["QuotaOut"]["properties"])
    _answer_validator("QuotaOut").validate(answer)
    assert {k: answer[k] for k in share if k in answer} == {k: v for k, v in share.items() if k != "internal"}
    assert answer["removed"] is share.get("removed", False)
    assert answer["waiting"] == share.get("waiting", 0)
    assert answer["warning"] == share.get("warning")


def test_a_job_answer_has_exactly_the_documented_members() -> None:
    job = Job(
        name="j1",
        request={"ResourceConfig": {"InstanceType": "ml.trn1.32xlarge", "InstanceCount": 2}},
        priority=5,
        owner="arn:aws:iam::123456789012:role/u",
        submitted_at=datetime(2026, 1, 1, tzinfo=UTC),
        team="a",
    )
    answer = job.to_api()
    assert set(answer) == set(SCHEMAS["JobOut"]["properties"])
    _answer_validator("JobOut").validate(answer)
    assert (answer["team"], answer["on_loan_for"]) == ("a", None)
