"""The HTTP API's requests, routing and answers, without a validation framework: a handler's cold start pays
for every module it imports, and pydantic with Powertools' OpenAPI layer cost the API more than boto3 itself
(docs/adr/0012-api-without-a-framework-and-a-compiled-layer.md).

Request checks are declared once here (`Body`, `PathParameter`, `IntQuery`) and refuse what the documented
schemas in docs/openapi.json refuse, naming each member at fault in one sentence; the tests hold the two to
each other. Named errors become HTTP answers in one place (docs/contracts.md: `{"message", "code"}`).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from sagequeue_core.defaults import TRAINING_JOB_NAME_MAX_LENGTH
from sagequeue_core.domain import PRIORITY_MAX, PRIORITY_MIN, DomainError, InvalidTransition
from sagequeue_core.errors import (
    Forbidden,
    JobAlreadyExists,
    JobNotFound,
    PoolNotFound,
    StaleVersion,
    Throttled,
)
from sagequeue_core.quotas import (
    STORED_TEAM_NAME_PATTERN,
    TEAM_NAME_MAX_LENGTH,
    TEAM_NAME_PATTERN,
    QuotaError,
    check_stored_team_name,
    check_team_name,
)

#: Path parameters as whole-string patterns (`$` is the very end: a trailing newline does not pass).
NAME_PATTERN = r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$"
#: A pool: an instance type, or a training plan's `plan:<name>`.
POOL_PATTERN = r"^(ml\.[a-z0-9]+\.[a-z0-9]+|plan:[A-Za-z0-9-]{1,64})$"
#: Longest pool name: `plan:` and a training plan's name of at most 64 characters.
POOL_MAX_LENGTH = 69
#: A team, as its tag names it (sagequeue_core.quotas.check_team_name says the same in words).
TEAM_PATTERN = TEAM_NAME_PATTERN
#: A team a quota may be stored under, where a quota is set or removed: names the rule refuses that earlier
#: versions stored ("none", "-ops") reach the use case, which removes their quotas and sets none.
STORED_TEAM_PATTERN = STORED_TEAM_NAME_PATTERN

#: A pool larger than any account's quota is a typo (training plans hold at most 64 instances).
MAX_POOL_CAPACITY = 100_000


# --- request checks --------------------------------------------------------------------------------------------


class RequestInvalid(DomainError):
    """A request the API refuses before any use case runs (400); `problems` are `where: what` phrases."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(self.problems) or "invalid request")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


#: What each JSON kind a member may be is checked with, and what a member of another kind is told.
_KINDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "string": (lambda value: isinstance(value, str), "Input should be a valid string"),
    "integer": (_is_int, "Input should be a valid integer"),
    "boolean": (lambda value: isinstance(value, bool), "Input should be a valid boolean"),
    "object": (lambda value: isinstance(value, dict), "Input should be a valid dictionary"),
    "array": (lambda value: isinstance(value, list), "Input should be a valid list"),
}


@dataclass(frozen=True)
class Member:
    """One member of a JSON request body: its kind, whether it must be there, whether null stands for absent,
    an integer's bounds, and an array's item kind."""

    kind: str
    required: bool = False
    nullable: bool = False
    minimum: int | None = None
    maximum: int | None = None
    items: str | None = None

    def problems(self, name: str, value: Any) -> list[str]:
        if value is None and self.nullable:
            return []
        accepts, wrong = _KINDS[self.kind]
        if not accepts(value):
            return [f"{name}: {wrong}"]
        if self.minimum is not None and value < self.minimum:
            return [f"{name}: Input should be greater than or equal to {self.minimum}"]
        if self.maximum is not None and value > self.maximum:
            return [f"{name}: Input should be less than or equal to {self.maximum}"]
        if self.items is not None:
            item_accepts, item_wrong = _KINDS[self.items]
            return [f"{name}.{i}: {item_wrong}" for i, item in enumerate(value) if not item_accepts(item)]
        return []


@dataclass(frozen=True)
class Body:
    """A JSON object body: its members in the order problems are named, and whether others may come too."""

    members: Mapping[str, Member]
    extra_allowed: bool

    def check(self, body: Any) -> dict[str, Any]:
        """`body` when it fits; RequestInvalid naming every member at fault, declared ones first."""
        if body is None:
            raise RequestInvalid(["request: Field required"])
        if not isinstance(body, dict):
            raise RequestInvalid(
                ["request: Input should be a valid dictionary or object to extract fields from"]
            )
        problems: list[str] = []
        for name, member in self.members.items():
            if name not in body:
                if member.required:
                    problems.append(f"{name}: Field required")
                continue
            problems += member.problems(name, body[name])
        if not self.extra_allowed:
            problems += [
                f"{name}: Extra inputs are not permitted" for name in body if name not in self.members
            ]
        if problems:
            raise RequestInvalid(problems)
        return body


_PRIORITY = Member("integer", nullable=True, minimum=PRIORITY_MIN, maximum=PRIORITY_MAX)

#: A CreateTrainingJob request as the SageMaker SDK builds it, plus an optional `priority`; members not
#: listed pass to SageMaker unchanged (and are checked against SageMaker's model by the submit use case).
SUBMIT = Body(
    {
        "TrainingJobName": Member("string", required=True),
        "RoleArn": Member("string", required=True),
        "AlgorithmSpecification": Member("object", required=True),
        "OutputDataConfig": Member("object", required=True),
        "ResourceConfig": Member("object", required=True),
        "StoppingCondition": Member("object", required=True),
        "Tags": Member("array", nullable=True, items="object"),
        "priority": _PRIORITY,
    },
    extra_allowed=True,
)
CHANGE = Body({"priority": _PRIORITY, "held": Member("boolean", nullable=True)}, extra_allowed=False)
CAPACITY = Body(
    {"capacity": Member("integer", required=True, minimum=0, maximum=MAX_POOL_CAPACITY)}, extra_allowed=False
)
QUOTA = Body(
    {
        "pool": Member("string", required=True),
        "nominal": Member("integer", required=True, nullable=True, minimum=0, maximum=MAX_POOL_CAPACITY),
        "borrowing_limit": Member("integer", nullable=True, minimum=0, maximum=MAX_POOL_CAPACITY),
        "lending_limit": Member("integer", nullable=True, minimum=0, maximum=MAX_POOL_CAPACITY),
    },
    extra_allowed=False,
)


@dataclass(frozen=True)
class PathParameter:
    """A path parameter: at most `max_length` characters, all of them matching `pattern`."""

    pattern: str
    max_length: int
    _compiled: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # `$` in the documented pattern is the end of the text, as JSON Schema means it (Python's would
        # also match before a final newline).
        object.__setattr__(self, "_compiled", re.compile(self.pattern.removesuffix("$") + r"\Z"))

    def problems(self, name: str, value: str) -> list[str]:
        if len(value) > self.max_length:
            return [f"{name}: String should have at most {self.max_length} characters"]
        if self._compiled.match(value) is None:
            return [f"{name}: String should match pattern '{self.pattern}'"]
        return []


@dataclass(frozen=True)
class TeamParameter(PathParameter):
    """A team in the path: refused as the pattern refuses it, with the rule it breaks in words (`rule`, which
    says in words what `pattern` says)."""

    rule: Callable[[object], str] = check_team_name

    def problems(self, name: str, value: str) -> list[str]:
        found = super().problems(name, value)
        if not found or len(value) > self.max_length:
            return found
        try:
            self.rule(value)
        except QuotaError as exc:
            return [f"{name}: {exc}"]
        return found


JOB_NAME = PathParameter(NAME_PATTERN, TRAINING_JOB_NAME_MAX_LENGTH)
POOL = PathParameter(POOL_PATTERN, POOL_MAX_LENGTH)
TEAM = TeamParameter(TEAM_PATTERN, TEAM_NAME_MAX_LENGTH)
STORED_TEAM = TeamParameter(STORED_TEAM_PATTERN, TEAM_NAME_MAX_LENGTH, rule=check_stored_team_name)

#: An integer in a query string: blanks around it, an optional sign, digits with single underscores between
#: them, and a fraction of zeros at most ("5", " +5 ", "1_000", "5.0").
_QUERY_INT = re.compile(r"([+-]?[0-9](?:_?[0-9])*)(?:\.0+)?")


@dataclass(frozen=True)
class IntQuery:
    """An integer query parameter with bounds and a default."""

    default: int
    minimum: int
    maximum: int

    def parse(self, name: str, text: str | None) -> int:
        if text is None:
            return self.default
        found = _QUERY_INT.fullmatch(text.strip())
        if found is None:
            raise RequestInvalid(
                [f"{name}: Input should be a valid integer, unable to parse string as an integer"]
            )
        value = int(found.group(1))
        if value < self.minimum:
            raise RequestInvalid([f"{name}: Input should be greater than or equal to {self.minimum}"])
        if value > self.maximum:
            raise RequestInvalid([f"{name}: Input should be less than or equal to {self.maximum}"])
        return value


# --- answers ---------------------------------------------------------------------------------------------------

#: A team's quota and usage in one pool as the API answers it (docs/openapi.json: QuotaOut), each member
#: after `team` and `pool` with the value it has when the use case leaves it out.
QUOTA_ANSWER: dict[str, Any] = {
    "nominal": None,
    "borrowing_limit": None,
    "lending_limit": None,
    "used": 0,
    "borrowed": 0,
    "lent": 0,
    "borrowable": 0,
    "waiting": 0,
    "removed": False,
    "warning": None,
}


def quota_answer(share: Mapping[str, Any]) -> dict[str, Any]:
    """A QuotaOut from a use case's quota: its team and pool, each other member or its default, nothing
    else."""
    return {
        "team": share["team"],
        "pool": share["pool"],
        **{k: share.get(k, v) for k, v in QUOTA_ANSWER.items()},
    }


# --- a REST proxy event and its routes --------------------------------------------------------------------------


class Request:
    """What a route reads from an API Gateway REST proxy event."""

    def __init__(self, event: Mapping[str, Any], path: Mapping[str, str]) -> None:
        self.event = event
        self.path = path
        #: the JSON body, checked, for a route that takes one
        self.body: Any = None

    @property
    def caller(self) -> str | None:
        identity = (self.event.get("requestContext") or {}).get("identity") or {}
        arn = identity.get("userArn")
        return str(arn) if arn is not None else None

    @property
    def raw_body(self) -> str:
        return self.event.get("body") or ""

    def body_text(self) -> str | None:
        raw = self.event.get("body")
        if raw is None:
            return None
        if self.event.get("isBase64Encoded"):
            return base64.b64decode(raw).decode("utf-8")
        return str(raw)

    def json_body(self) -> Any:
        """The body parsed as JSON (None without a body); a body that is not JSON names where it breaks."""
        text = self.body_text()
        if not text:
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise RequestInvalid([f"{exc.pos}: JSON decode error"]) from exc

    def query(self, name: str) -> str | None:
        """A query parameter's first value; None when absent."""
        multi = self.event.get("multiValueQueryStringParameters")
        if multi:
            values = multi.get(name)
            return str(values[0]) if values else None
        single = self.event.get("queryStringParameters") or {}
        value = single.get(name)
        return str(value) if value is not None else None

    def check(self, body: Body | None = None, **path: PathParameter) -> Any:
        """The JSON body checked against `body` (None for a route without one), once every path parameter
        fits its check; RequestInvalid names every problem, path first. A body that is not JSON at all is
        named alone."""
        parsed = self.json_body() if body is not None else None
        problems = [p for name, check in path.items() for p in check.problems(name, self.path[name])]
        if body is not None:
            try:
                body.check(parsed)
            except RequestInvalid as exc:
                problems += exc.problems
        if problems:
            raise RequestInvalid(problems)
        return parsed


Answer = tuple[int, Any]

#: A path parameter's characters, as API Gateway passes them on (RFC 3986's safe and unsafe characters).
_SEGMENT = r"[-._~()'!*:@,;=+&$%<> \[\]{}|^\w]+"
_PARAMETER = re.compile(r"<(\w+)>")


@dataclass(frozen=True)
class Route:
    """A method and path, the checks its request must pass, and the function that answers it."""

    method: str
    path: str
    function: Callable[[Request], Any]
    summary: str
    status: int
    body: Body | None
    parameters: Mapping[str, PathParameter]
    pattern: re.Pattern[str]


class Router:
    """Method and path to a route function, with the API's 404 and 405 answers and one error mapping.

    A path matches with or without trailing slashes; routes without parameters are tried first. A route's
    path parameters and body are checked before its function runs, which finds the body in `request.body`."""

    def __init__(self) -> None:
        self.routes: list[Route] = []

    def route(
        self,
        method: str,
        path: str,
        *,
        summary: str,
        status: int = 200,
        body: Body | None = None,
        **parameters: PathParameter,
    ) -> Callable[[Callable[[Request], Any]], Callable[[Request], Any]]:
        names = _PARAMETER.findall(path)
        if sorted(names) != sorted(parameters):
            raise ValueError(f"{method} {path}: checks for {sorted(parameters)}, parameters {sorted(names)}")

        def register(function: Callable[[Request], Any]) -> Callable[[Request], Any]:
            regex = _PARAMETER.sub(lambda m: f"(?P<{m.group(1)}>{_SEGMENT})", path.rstrip("/"))
            route = Route(
                method, path, function, summary, status, body, parameters, re.compile(f"^{regex}/*$")
            )
            self.routes.append(route)
            self.routes.sort(key=lambda known: "<" in known.path)
            return function

        return register

    def resolve(
        self, event: Mapping[str, Any], on_error: Callable[[BaseException], Answer]
    ) -> dict[str, Any]:
        method = str(event.get("httpMethod") or "").upper()
        path = str(event.get("path") or "/")
        allowed: set[str] = set()
        try:
            for route in self.routes:
                found = route.pattern.match(path)
                if found is None:
                    continue
                if route.method != method:
                    allowed.add(route.method)
                    continue
                request = Request(event, found.groupdict())
                request.body = request.check(route.body, **route.parameters)
                return proxy_answer(route.status, route.function(request))
        except Exception as exc:  # noqa: BLE001 - every error becomes an answer; on_error logs the unnamed
            return proxy_answer(*on_error(exc))
        if allowed:
            return proxy_answer(
                405,
                {
                    "message": f"{method} is not allowed here; allowed: {', '.join(sorted(allowed))}",
                    "code": "MethodNotAllowed",
                },
            )
        return proxy_answer(404, {"message": f"no route for {method} {path!r}", "code": "NotFound"})


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def proxy_answer(status: int, body: Any) -> dict[str, Any]:
    """A REST proxy integration's answer: JSON body, compact."""
    return {
        "statusCode": status,
        "body": json.dumps(body, separators=(",", ":"), default=_json_default),
        "isBase64Encoded": False,
        "multiValueHeaders": {"Content-Type": ["application/json"]},
    }


# --- errors ----------------------------------------------------------------------------------------------------

#: Named error -> (HTTP status, code). The most specific class listed first wins.
ERROR_STATUS: tuple[tuple[type[BaseException], int, str], ...] = (
    (InvalidTransition, 409, "Conflict"),
    (JobAlreadyExists, 409, "Conflict"),
    (StaleVersion, 409, "Conflict"),
    (DomainError, 400, "ValidationError"),
    (Forbidden, 403, "Forbidden"),
    (JobNotFound, 404, "NotFound"),
    (PoolNotFound, 404, "NotFound"),
    (Throttled, 429, "Throttled"),
)

#: Deepest JSON nesting a request may have (a CreateTrainingJob request is about 5 deep); deeper bodies are
#: refused before they are parsed, so a hostile body cannot exhaust the parser's recursion.
MAX_JSON_DEPTH = 32
#: Media types a request body may declare.
JSON_MEDIA_TYPES = frozenset({"application/json"})


def precheck(event: Mapping[str, Any]) -> tuple[int, dict[str, str]] | None:
    """What is wrong with a proxy event's body before any route sees it (status and error body), or None.

    415 for a body of another media type than JSON; 400 for a body that is not UTF-8 or nests deeper
    than MAX_JSON_DEPTH. A request without a body passes (the route decides whether it needs one)."""
    raw = event.get("body")
    if raw is None or raw == "":
        return None
    headers = {str(k).lower(): str(v) for k, v in (event.get("headers") or {}).items()}
    media = headers.get("content-type", "application/json").split(";", 1)[0].strip().lower()
    if media not in JSON_MEDIA_TYPES:
        return 415, {
            "message": f"Content-Type must be application/json, got {media!r}",
            "code": "UnsupportedMediaType",
        }
    if not isinstance(raw, str):
        return 400, {"message": "the request body must be UTF-8 JSON text", "code": "ValidationError"}
    try:
        text = base64.b64decode(raw, validate=True).decode("utf-8") if event.get("isBase64Encoded") else raw
        text.encode("utf-8")
    except (ValueError, UnicodeError):
        return 400, {"message": "the request body is not valid UTF-8", "code": "ValidationError"}
    if json_depth(text) > MAX_JSON_DEPTH:
        return 400, {
            "message": f"the request body nests deeper than {MAX_JSON_DEPTH} levels",
            "code": "ValidationError",
        }
    return None


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON text, counted without parsing it (strings skipped)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def error_answer(exc: BaseException) -> tuple[int, dict[str, str]]:
    """The HTTP status and body for an error; anything unnamed is a 500 that reveals nothing."""
    for kind, status, code in ERROR_STATUS:
        if isinstance(exc, kind):
            return status, {"message": str(exc), "code": code}
    return 500, {"message": "internal error", "code": "InternalError"}
