"""The HTTP API's shapes (pydantic models, so the OpenAPI document comes from them) and the one place where
named errors become HTTP answers (docs/contracts.md: `{"message", "code"}`)."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sagequeue_core.domain import PRIORITY_MAX, PRIORITY_MIN, DomainError, InvalidTransition
from sagequeue_core.errors import (
    Forbidden,
    JobAlreadyExists,
    JobNotFound,
    PoolNotFound,
    StaleVersion,
    Throttled,
)

#: Path parameters as whole-string patterns (pydantic's regex engine: `$` is the very end, a trailing
#: newline does not pass).
NAME_PATTERN = r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$"
INSTANCE_TYPE_PATTERN = r"^ml\.[a-z0-9]+\.[a-z0-9]+$"
#: A pool: an instance type, or a training plan's `plan:<name>`.
POOL_PATTERN = r"^(ml\.[a-z0-9]+\.[a-z0-9]+|plan:[A-Za-z0-9-]{1,64})$"

#: A pool larger than any account's quota is a typo (training plans hold at most 64 instances).
MAX_POOL_CAPACITY = 100_000

# --- requests --------------------------------------------------------------------------------------------------


class SubmitRequest(BaseModel):
    """A CreateTrainingJob request as the SageMaker SDK builds it, plus an optional `priority`.

    Only the members sagequeue reads are described; every other CreateTrainingJob member is accepted and
    passed to SageMaker unchanged.
    """

    model_config = ConfigDict(extra="allow", strict=True)

    TrainingJobName: str = Field(description="1-63 letters, digits and hyphens; the first attempt's name")
    RoleArn: str = Field(description="execution role; must be one of the stack's AllowedRoleArns")
    AlgorithmSpecification: dict[str, Any]
    OutputDataConfig: dict[str, Any]
    ResourceConfig: dict[str, Any] = Field(
        description="InstanceType must be a pool's; InstanceCount counts against its capacity"
    )
    StoppingCondition: dict[str, Any]
    Tags: list[dict[str, Any]] | None = Field(
        default=None, description="a `priority` tag sets the priority when the body has none"
    )
    priority: int | None = Field(
        default=None, ge=PRIORITY_MIN, le=PRIORITY_MAX, description="higher runs first (default 0)"
    )


class ChangeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    priority: int | None = Field(default=None, ge=PRIORITY_MIN, le=PRIORITY_MAX)
    held: bool | None = Field(default=None, description="true holds a queued job, false releases it")


class CapacityRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    capacity: int = Field(ge=0, le=MAX_POOL_CAPACITY, description="instances of this type the queue may use")


class QuotaRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    pool: str = Field(description="instance type or plan:<name>")
    nominal: int | None = Field(ge=0, le=MAX_POOL_CAPACITY, description="instances guaranteed; null removes")
    borrowing_limit: int | None = Field(default=None, ge=0, description="above nominal; null: unlimited")
    lending_limit: int | None = Field(default=None, ge=0, description="of unused nominal; null: all of it")


# --- answers ---------------------------------------------------------------------------------------------------


class QuotaOut(BaseModel):
    team: str
    pool: str
    nominal: int | None = None
    borrowing_limit: int | None = None
    lending_limit: int | None = None
    used: int = 0
    borrowed: int = Field(default=0, description="instances held above the nominal quota")
    lent: int = Field(default=0, description="of the nominal quota, instances other teams hold now")
    borrowable: int = Field(default=0, description="what the team could borrow now")
    waiting: int = Field(default=0, description="the team's jobs queued in the pool")
    removed: bool = False


class QuotaList(BaseModel):
    quotas: list[QuotaOut]


class ReservationOut(BaseModel):
    instances: dict[str, int] = Field(description="instances held per pool")
    since: str
    kind: str = Field(description="preempted, released or drain")


class JobOut(BaseModel):
    name: str
    state: str = Field(
        description="queued held starting running preempting stopping completed failed cancelled idle_stopped"
    )
    priority: int
    pool: str
    attempt: int = Field(description="number of the current attempt, 0 before the first start")
    training_job_name: str | None
    owner: str
    submitted_at: str
    started_at: str | None
    ended_at: str | None
    reason: str | None
    preemptions: int
    retries: int
    attempts_ended: int = Field(
        default=0, description="attempts that ran on SageMaker and ended (each counted once)"
    )
    seconds_trained: int = Field(
        default=0, description="seconds the ended attempts spent in SageMaker's Training phase, in total"
    )
    instances: int
    reservation: ReservationOut | None = Field(
        default=None, description="capacity promised to the job while it waits (kept between passes)"
    )
    training_started_at: str | None = Field(
        default=None, description="when the current attempt began to train (minimum runtime counts from here)"
    )
    on_loan_for: str | None = Field(
        default=None,
        description="the waiting job whose reserved capacity the current attempt borrows; that job preempts "
        "it as soon as it can start",
    )
    warnings: list[str] = Field(default_factory=list, description="how the queue will treat the job")
    team: str | None = Field(default=None, description="whose quota the job draws on")


class HistoryEntry(BaseModel):
    at: str
    state: str
    attempt: int
    reason: str | None


class JobDetailOut(JobOut):
    position: int | None = Field(description="1-based place among the pool's queued jobs, when queued")
    attempts: list[str] = Field(description="training job names of every attempt so far")
    history: list[HistoryEntry] = Field(
        description="the submission and the latest changes (at most 40 entries; the counters keep totals)"
    )


class JobList(BaseModel):
    jobs: list[JobOut]
    next_token: str | None


class PoolOut(BaseModel):
    instance_type: str
    capacity: int
    used: int
    queued: int
    warm: int
    free: int | None = Field(default=None, description="instances neither used nor warm, within the quota")
    quota: int | None = Field(
        default=None, description="the account quota SageMaker refused a start at, while below capacity"
    )
    warning: str | None = None


class PoolList(BaseModel):
    pools: list[PoolOut]


class WhoAmI(BaseModel):
    arn: str
    admin: bool


class ExemptionOut(BaseModel):
    training_job_name: str
    granted_by: str
    granted_at: str


class ErrorOut(BaseModel):
    message: str
    code: str


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

ERROR_RESPONSES: dict[int, Any] = {
    429: {"description": "Throttled", "content": {"application/json": {"model": ErrorOut}}},
    **{
        status: {"description": code, "content": {"application/json": {"model": ErrorOut}}}
        for status, code in (
            (400, "ValidationError"),
            (403, "Forbidden"),
            (404, "NotFound"),
            (405, "MethodNotAllowed"),
            (409, "Conflict"),
            (415, "UnsupportedMediaType"),
        )
    },
}


def answers(status: int, description: str, model: type[BaseModel]) -> dict[int, Any]:
    """A route's documented answers: its success and every error the API gives."""
    return {
        status: {"description": description, "content": {"application/json": {"model": model}}},
        **ERROR_RESPONSES,
    }


def tidy_openapi(document: dict[str, Any]) -> dict[str, Any]:
    """The generated OpenAPI document without the 422 answer the generator adds to every route: this API
    answers request-validation failures with 400 {message, code}, never 422."""
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            operation.get("responses", {}).pop("422", None)
    schemas = document.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError", "ResponseValidationError"):
        schemas.pop(unused, None)
    return document


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


def validation_message(errors: Any) -> str:
    """A request-validation failure as one sentence naming each field."""
    parts = []
    for error in errors or ():
        loc = [str(p) for p in error.get("loc", ()) if p not in ("body", "query", "path")]
        where = ".".join(loc) or "request"
        parts.append(f"{where}: {error.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"
