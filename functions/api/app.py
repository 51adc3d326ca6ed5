"""The REST API's handler: routes parse the request, call one use case, and shape the answer.

Routes and JSON follow docs/contracts.md; the OpenAPI document (docs/openapi.json) is generated from these
routes and the models in sagequeue_core.service.http.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Path, Query
from aws_lambda_powertools.utilities.typing import LambdaContext

from sagequeue_core.defaults import TRAINING_JOB_NAME_MAX_LENGTH
from sagequeue_core.observability import logger, metrics
from sagequeue_core.runtime import dependencies
from sagequeue_core.service import jobs, submit, teams
from sagequeue_core.service.access import is_admin, require_caller
from sagequeue_core.service.http import (
    NAME_PATTERN,
    POOL_PATTERN,
    CapacityRequest,
    ChangeRequest,
    ExemptionOut,
    JobDetailOut,
    JobList,
    JobOut,
    PoolList,
    PoolOut,
    QuotaList,
    QuotaOut,
    QuotaRequest,
    SubmitRequest,
    WhoAmI,
    answers,
    error_answer,
    precheck,
    validation_message,
)

app = APIGatewayRestResolver(enable_validation=True)

#: Path parameters, checked whole (fullmatch) before any use case runs.
JobName = Annotated[
    str,
    Path(pattern=NAME_PATTERN, max_length=TRAINING_JOB_NAME_MAX_LENGTH, description="a training job name"),
]
InstanceType = Annotated[
    str,
    Path(
        pattern=POOL_PATTERN, max_length=69, description="e.g. ml.trn1.32xlarge, or plan:<training plan name>"
    ),
]

TeamName = Annotated[
    str, Path(pattern=r"^[A-Za-z0-9._-]{1,64}$", max_length=64, description="a team, as its tag names it")
]

QUEUED_RESPONSES = answers(201, "the job, queued", JobOut)


def _caller() -> str | None:
    identity = app.current_event.request_context.identity
    return identity.user_arn if identity is not None else None


def _submit() -> dict[str, Any]:
    raw = app.current_event.body or ""
    job = submit.submit(dependencies(), app.current_event.json_body, _caller(), len(raw.encode()))
    return job.to_api()


@app.post("/jobs", status_code=201, responses=QUEUED_RESPONSES, summary="Queue a training job")
def submit_job(request: SubmitRequest) -> JobOut:
    return JobOut(**_submit())


@app.post("/add-job", status_code=201, responses=QUEUED_RESPONSES, summary="Queue a training job (alias)")
def add_job(request: SubmitRequest) -> JobOut:
    return JobOut(**_submit())


@app.get(
    "/jobs",
    responses=answers(200, "a page of jobs", JobList),
    summary="List jobs (the caller's when no filter is given)",
)
def list_jobs(
    state: Annotated[str | None, Query()] = None,
    pool: Annotated[str | None, Query()] = None,
    owner: Annotated[str | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=jobs.MAX_PAGE)] = 50,
    next_token: Annotated[str | None, Query()] = None,
) -> JobList:
    page = jobs.list_jobs(
        dependencies(), _caller(), state=state, pool=pool, owner=owner, limit=limit, next_token=next_token
    )
    return JobList(jobs=[JobOut(**job.to_api()) for job in page.jobs], next_token=page.next_token)


@app.get(
    "/jobs/<name>",
    responses=answers(200, "the job", JobDetailOut),
    summary="A job, its place in the queue and its history",
)
def get_job(name: JobName) -> JobDetailOut:
    return JobDetailOut(**jobs.get_job(dependencies(), name).to_api())


@app.delete(
    "/jobs/<name>",
    responses=answers(200, "the job, cancelled or stopping", JobOut),
    summary="Cancel a job (dequeue, or stop its attempt)",
)
def cancel_job(name: JobName) -> JobOut:
    return JobOut(**jobs.cancel(dependencies(), name, _caller()).to_api())


@app.patch(
    "/jobs/<name>",
    responses=answers(200, "the job, changed", JobOut),
    summary="Change a job's priority; hold or release it",
)
def change_job(name: JobName, change: ChangeRequest) -> JobOut:
    job = jobs.change(dependencies(), name, _caller(), priority=change.priority, held=change.held)
    return JobOut(**job.to_api())


@app.get(
    "/pools",
    responses=answers(200, "every pool", PoolList),
    summary="Pools: capacity, used, queued and warm instances",
)
def list_pools() -> PoolList:
    return PoolList(pools=[PoolOut(**view.to_api()) for view in jobs.pools(dependencies())])


@app.put(
    "/pools/<instanceType>",
    responses=answers(200, "the pool", PoolOut),
    summary="Set a pool's capacity (admin)",
)
def set_pool(instanceType: InstanceType, request: CapacityRequest) -> PoolOut:
    view = jobs.set_pool(dependencies(), instanceType, request.capacity, _caller())
    return PoolOut(**view.to_api())


@app.get(
    "/teams",
    responses=answers(200, "every team's quota and usage per pool", QuotaList),
    summary="Teams: nominal, used, borrowed, lent and waiting per pool",
)
def list_teams() -> QuotaList:
    return QuotaList(quotas=[QuotaOut(**share) for share in teams.all_teams(dependencies())])


@app.get(
    "/teams/<team>/quotas",
    responses=answers(200, "the team's quota and usage per pool", QuotaList),
    summary="A team's quotas: nominal, used, borrowed, lent per pool",
)
def get_team_quotas(team: TeamName) -> QuotaList:
    return QuotaList(quotas=[QuotaOut(**share) for share in teams.team_quotas(dependencies(), team)])


@app.put(
    "/teams/<team>/quotas",
    responses=answers(200, "the team's quota in the pool", QuotaOut),
    summary="Set a team's quota in a pool (admin)",
)
def set_team_quota(team: TeamName, request: QuotaRequest) -> QuotaOut:
    return QuotaOut(**teams.set_quota(dependencies(), team, request.model_dump(), _caller()))


@app.put(
    "/exemptions/<trainingJobName>",
    responses=answers(200, "the exemption, recorded", ExemptionOut),
    summary="Exempt a training job from the policy rules and idle stops (admin)",
)
def exempt(trainingJobName: JobName) -> ExemptionOut:
    return ExemptionOut(**jobs.exempt(dependencies(), trainingJobName, _caller()).to_api())


@app.get(
    "/whoami",
    responses=answers(200, "the caller", WhoAmI),
    summary="The caller's identity and whether it is an admin",
)
def whoami() -> WhoAmI:
    caller = require_caller(_caller())
    return WhoAmI(arn=caller, admin=is_admin(caller, dependencies().settings.admin_role_arns))


@app.not_found
def _no_route(exc: NotFoundError) -> Response[Any]:
    event = app.current_event
    path = event.path or "/"
    routes = [*getattr(app, "_static_routes", ()), *getattr(app, "_dynamic_routes", ())]
    allowed = sorted({route.method for route in routes if route.rule.match(path)})
    if allowed:
        return _error(
            405,
            {
                "message": f"{event.http_method} is not allowed here; allowed: {', '.join(allowed)}",
                "code": "MethodNotAllowed",
            },
        )
    return _error(404, {"message": f"no route for {event.http_method} {path!r}", "code": "NotFound"})


@app.exception_handler(RequestValidationError)
def _invalid(exc: RequestValidationError) -> Response[Any]:
    return _error(400, {"message": validation_message(exc.errors()), "code": "ValidationError"})


@app.exception_handler(Exception)
def _failed(exc: Exception) -> Response[Any]:
    status, body = error_answer(exc)
    if status >= 500:
        logger.exception("request failed")
    return _error(status, body)


def _error(status: int, body: dict[str, str]) -> Response[Any]:
    return Response(status_code=status, content_type="application/json", body=body)


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    refused = precheck(event)
    if refused is not None:
        status, body = refused
        return {
            "statusCode": status,
            "headers": {"Content-Type": "application/json"},
            "body": json.dumps(body),
            "isBase64Encoded": False,
        }
    return app.resolve(event, context)
