"""The REST API's handler: routes check the request, call one use case, and shape the answer.

Routes and JSON follow docs/contracts.md and docs/openapi.json (tests hold the routes and the request checks
of sagequeue_core.service.http to that document).
"""

from __future__ import annotations

from typing import Any

from sagequeue_core.forecasts import SCORE_HOURS_DEFAULT, SCORE_HOURS_MAX, score_answer
from sagequeue_core.observability import logger, metrics
from sagequeue_core.runtime import dependencies
from sagequeue_core.service import forecasts, jobs, submit, teams
from sagequeue_core.service.access import is_admin, require_caller
from sagequeue_core.service.http import (
    CAPACITY,
    CHANGE,
    JOB_NAME,
    POOL,
    QUOTA,
    STORED_TEAM,
    SUBMIT,
    TEAM,
    IntQuery,
    Request,
    Router,
    error_answer,
    precheck,
    proxy_answer,
    quota_answer,
)

app = Router()

LIMIT = IntQuery(default=50, minimum=1, maximum=jobs.MAX_PAGE)
HOURS = IntQuery(default=SCORE_HOURS_DEFAULT, minimum=1, maximum=SCORE_HOURS_MAX)


def _submit(request: Request) -> dict[str, Any]:
    job = submit.submit(dependencies(), request.body, request.caller, len(request.raw_body.encode()))
    return job.to_api()


@app.route("POST", "/jobs", status=201, body=SUBMIT, summary="Queue a training job")
def submit_job(request: Request) -> dict[str, Any]:
    return _submit(request)


@app.route("POST", "/add-job", status=201, body=SUBMIT, summary="Queue a training job (alias)")
def add_job(request: Request) -> dict[str, Any]:
    return _submit(request)


@app.route("GET", "/jobs", summary="List jobs (the caller's when no filter is given)")
def list_jobs(request: Request) -> dict[str, Any]:
    limit = LIMIT.parse("limit", request.query("limit"))
    page = jobs.list_jobs(
        dependencies(),
        request.caller,
        state=request.query("state"),
        pool=request.query("pool"),
        owner=request.query("owner"),
        limit=limit,
        next_token=request.query("next_token"),
        order=request.query("order"),
    )
    return {"jobs": [job.to_api() for job in page.jobs], "next_token": page.next_token}


@app.route("GET", "/jobs/<name>", name=JOB_NAME, summary="A job, its place in the queue and its history")
def get_job(request: Request) -> dict[str, Any]:
    return jobs.get_job(dependencies(), request.path["name"]).to_api()


@app.route("DELETE", "/jobs/<name>", name=JOB_NAME, summary="Cancel a job (dequeue, or stop its attempt)")
def cancel_job(request: Request) -> dict[str, Any]:
    return jobs.cancel(dependencies(), request.path["name"], request.caller).to_api()


@app.route(
    "PATCH", "/jobs/<name>", body=CHANGE, name=JOB_NAME, summary="Change a job's priority; hold or release it"
)
def change_job(request: Request) -> dict[str, Any]:
    change = request.body
    job = jobs.change(
        dependencies(),
        request.path["name"],
        request.caller,
        priority=change.get("priority"),
        held=change.get("held"),
    )
    return job.to_api()


@app.route("GET", "/pools", summary="Pools: capacity, used, queued and warm instances")
def list_pools(request: Request) -> dict[str, Any]:
    return {"pools": [view.to_api() for view in jobs.pools(dependencies())]}


@app.route(
    "PUT", "/pools/<instanceType>", body=CAPACITY, instanceType=POOL, summary="Set a pool's capacity (admin)"
)
def set_pool(request: Request) -> dict[str, Any]:
    capacity = request.body["capacity"]
    return jobs.set_pool(dependencies(), request.path["instanceType"], capacity, request.caller).to_api()


@app.route("GET", "/teams", summary="Teams: nominal, used, borrowed, lent and waiting per pool")
def list_teams(request: Request) -> dict[str, Any]:
    return {"quotas": [quota_answer(share) for share in teams.all_teams(dependencies())]}


@app.route(
    "GET",
    "/teams/<team>/quotas",
    team=TEAM,
    summary="A team's quotas: nominal, used, borrowed, lent per pool",
)
def get_team_quotas(request: Request) -> dict[str, Any]:
    shares = teams.team_quotas(dependencies(), request.path["team"])
    return {"quotas": [quota_answer(share) for share in shares]}


@app.route(
    "PUT",
    "/teams/<team>/quotas",
    body=QUOTA,
    team=STORED_TEAM,
    summary="Set a team's quota in a pool (admin)",
)
def set_team_quota(request: Request) -> dict[str, Any]:
    share = teams.set_quota(dependencies(), request.path["team"], request.body, request.caller)
    return quota_answer(share)


@app.route(
    "PUT",
    "/exemptions/<trainingJobName>",
    trainingJobName=JOB_NAME,
    summary="Exempt a training job from the policy rules and idle stops (admin)",
)
def exempt(request: Request) -> dict[str, Any]:
    return jobs.exempt(dependencies(), request.path["trainingJobName"], request.caller).to_api()


@app.route("GET", "/forecasts/score", summary="How past start forecasts did, per pool")
def forecast_score(request: Request) -> dict[str, Any]:
    hours = HOURS.parse("hours", request.query("hours"))
    deps = dependencies()
    return score_answer(forecasts.scores(deps, request.caller, hours), hours, deps.now())


@app.route("GET", "/forecasts/calibration", summary="How start forecasts' ranges are calibrated, per pool")
def forecast_calibration(request: Request) -> dict[str, Any]:
    return forecasts.calibration(dependencies(), request.caller)


@app.route("GET", "/whoami", summary="The caller's identity and whether it is an admin")
def whoami(request: Request) -> dict[str, Any]:
    caller = require_caller(request.caller)
    return {"arn": caller, "admin": is_admin(caller, dependencies().settings.admin_role_arns)}


def _failed(exc: BaseException) -> tuple[int, dict[str, str]]:
    status, body = error_answer(exc)
    if status >= 500:
        logger.exception("request failed")
    return status, body


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    refused = precheck(event)
    if refused is not None:
        return proxy_answer(*refused)
    return app.resolve(event, _failed)
