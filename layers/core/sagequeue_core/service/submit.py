"""Submit: validate a CreateTrainingJob request, queue it, announce it. Nothing is stored on error."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from sagequeue_core.defaults import (
    ATTEMPT_TAG,
    JOB_TAG,
    METRIC_NAMESPACE_ENV,
    PRIORITY_TAG,
    SEAL_TAG,
    SUBMITTED_BY_TAG,
)
from sagequeue_core.domain import (
    DomainError,
    Job,
    JobState,
    parse_priority,
    plan_home,
    pool_demand_of,
    priority_of,
    tags_to_dict,
    validate_job_name,
)
from sagequeue_core.errors import Forbidden, RequestInvalid
from sagequeue_core.events import EventType, announce
from sagequeue_core.governance import check_policy
from sagequeue_core.observability import SUBMISSIONS, count, logger
from sagequeue_core.quotas import QuotaError, check_team_name
from sagequeue_core.runtime import Dependencies
from sagequeue_core.service.access import (
    is_admin,
    owner_of_caller,
    require_caller,
    require_priority_allowed,
    require_role_allowed,
    submission_team,
)
from sagequeue_core.validation import validate_create_training_job

#: CreateTrainingJob's required members (ResourceConfig included: sagequeue needs it to schedule).
REQUIRED_FIELDS = (
    "TrainingJobName",
    "RoleArn",
    "AlgorithmSpecification",
    "OutputDataConfig",
    "ResourceConfig",
    "StoppingCondition",
)
#: Tags only sagequeue sets: a submitter must not forge who submitted or which job an attempt belongs to.
RESERVED_TAGS = (JOB_TAG, ATTEMPT_TAG, SUBMITTED_BY_TAG, SEAL_TAG)
#: SageMaker accepts at most 50 tags; sagequeue adds four of its own to every attempt.
MAX_USER_TAGS = 50 - len(RESERVED_TAGS)
#: SageMaker's maximum of Environment variables in one CreateTrainingJob request.
MAX_ENVIRONMENT_VARIABLES = 100
#: Top-level members sagequeue reads from the body and does not pass on to SageMaker.
QUEUE_FIELDS = ("priority",)


def validate(deps: Dependencies, body: Any, caller: str, body_bytes: int | None = None) -> Job:
    """The job a submission describes, or RequestInvalid / Forbidden naming the problem."""
    settings = deps.settings
    if body_bytes is not None and body_bytes > settings.max_request_bytes:
        raise RequestInvalid(f"request body is {body_bytes} bytes; at most {settings.max_request_bytes}")
    if not isinstance(body, Mapping):
        raise RequestInvalid("request body must be a JSON object (a CreateTrainingJob request)")
    request = copy.deepcopy(dict(body))
    explicit_priority = request.pop("priority", None)
    if explicit_priority is not None and (
        isinstance(explicit_priority, bool) or not isinstance(explicit_priority, int)
    ):
        raise RequestInvalid(f"priority must be an integer, got {explicit_priority!r}")
    missing = [name for name in REQUIRED_FIELDS if request.get(name) in (None, "", {}, [])]
    if missing:
        raise RequestInvalid(f"missing required field{'s' if len(missing) > 1 else ''}: {', '.join(missing)}")
    try:
        name = validate_job_name(request["TrainingJobName"])
        validate_create_training_job(request)
        refuse_instance_type_with_groups(request["ResourceConfig"])
        refuse_foreign_plan(request["ResourceConfig"], settings)
        priority = priority_of(request, explicit_priority)
        demand = pool_demand_of(request)
        tags = tags_to_dict(request.get("Tags"))
    except DomainError as exc:
        raise RequestInvalid(str(exc)) from None
    for field in ("AlgorithmSpecification", "OutputDataConfig", "StoppingCondition"):
        if not isinstance(request[field], Mapping):
            raise RequestInvalid(f"{field} must be an object")
    role = request["RoleArn"]
    if role not in settings.allowed_role_arns:
        allowed = ", ".join(settings.allowed_role_arns) or "none configured"
        raise RequestInvalid(f"RoleArn {role!r} is not one of the allowed roles ({allowed})")
    reserved = sorted(set(tags) & set(RESERVED_TAGS))
    if reserved:
        raise RequestInvalid(f"Tags: {', '.join(reserved)} are set by sagequeue and may not be submitted")
    if len(tags) > MAX_USER_TAGS:
        raise RequestInvalid(f"Tags: {len(tags)} tags; at most {MAX_USER_TAGS} (sagequeue adds its own)")
    rules = settings.policy_rules
    if tags.get(rules.exempt_tag, "").strip().lower() == "true" and not is_admin(
        caller, settings.admin_role_arns
    ):
        raise Forbidden(f"only an admin may submit a job tagged {rules.exempt_tag}=true")
    pools = {status.pool.instance_type: status.pool.capacity for status in deps.store.pools()}
    for instance_type, need in demand.items():
        if instance_type not in pools:
            known = ", ".join(sorted(pools)) or "none"
            field_name = "TrainingPlanArn" if instance_type.startswith("plan:") else "InstanceType"
            raise RequestInvalid(
                f"ResourceConfig.{field_name}: {instance_type} is not a pool sagequeue manages (pools: {known})"
            )
        if need > pools[instance_type] > 0:  # a drained pool (capacity 0) queues: it may come back
            raise RequestInvalid(
                f"ResourceConfig.InstanceCount: the job needs {need} {instance_type}; "
                f"the pool has {pools[instance_type]}"
            )
    violations = check_policy(request, rules, tags)
    if violations:
        raise RequestInvalid("; ".join(f"policy {v.rule}: {v.message}" for v in violations))
    require_priority_allowed(priority, caller, settings)
    if explicit_priority is not None and PRIORITY_TAG in tags:
        agree_priority_tag(request, tags[PRIORITY_TAG], priority, caller, settings)
    tagged = tags.get(settings.team_tag, "").strip() if settings.team_tag else ""
    if tagged:
        try:
            check_team_name(tagged)
        except QuotaError as exc:
            raise RequestInvalid(f"tag {settings.team_tag!r}: {exc}") from None
    team = submission_team(tagged, caller, settings)
    require_role_allowed(role, team, caller, settings)
    if team:
        leave_room_for_the_metric_namespace(request.get("Environment"))
    return Job(
        name=name,
        request=request,
        priority=priority,
        owner=owner_of_caller(caller),
        submitted_at=deps.now(),
        team=team,
    )


def agree_priority_tag(request: dict[str, Any], tag: str, priority: int, caller: str, settings: Any) -> None:
    """A `priority` tag beside an explicit priority: the explicit one is the job's, but the tag goes to
    SageMaker with every attempt, where whoever reads tags (a table rebuilt from live attempts, a report)
    would take it. A tag above the caller's ceiling is refused as it is alone (403 naming the ceiling); one
    within it is set to the stored priority, so that the attempts say what the queue stores."""
    try:
        tagged = parse_priority(tag, field_name=f"tag {PRIORITY_TAG!r}")
    except DomainError as exc:
        raise RequestInvalid(str(exc)) from None
    try:
        require_priority_allowed(tagged, caller, settings)
    except Forbidden as exc:
        raise Forbidden(f"tag {PRIORITY_TAG!r}: {exc}") from None
    request["Tags"] = [
        {**t, "Value": str(priority)} if isinstance(t, Mapping) and t.get("Key") == PRIORITY_TAG else t
        for t in request.get("Tags") or ()
    ]


def leave_room_for_the_metric_namespace(environment: Any) -> None:
    """Every attempt of a team's job carries METRIC_NAMESPACE_ENV (its team's metric namespace): a request
    whose Environment already fills SageMaker's maximum without it would fail at create time."""
    if (
        isinstance(environment, Mapping)
        and METRIC_NAMESPACE_ENV not in environment
        and len(environment) >= MAX_ENVIRONMENT_VARIABLES
    ):
        raise RequestInvalid(
            f"Environment: {len(environment)} variables; a team's job may have at most "
            f"{MAX_ENVIRONMENT_VARIABLES - 1} (sagequeue sets {METRIC_NAMESPACE_ENV} on every attempt)"
        )


def refuse_instance_type_with_groups(resources: Any) -> None:
    """SageMaker refuses InstanceType beside InstanceGroups at create time; the queue would learn it only
    when the job starts."""
    if isinstance(resources, Mapping) and resources.get("InstanceType") and resources.get("InstanceGroups"):
        raise RequestInvalid(
            "ResourceConfig.InstanceType and ResourceConfig.InstanceGroups: give one or the other (a "
            "heterogeneous cluster names its instance types in InstanceGroups only)"
        )


def refuse_foreign_plan(resources: Any, settings: Any) -> None:
    """A training plan of another partition, region or account is no pool of this stack, even when its
    name is that of one of ours (pools are named `plan:<name>`)."""
    plan = resources.get("TrainingPlanArn") if isinstance(resources, Mapping) else None
    home = plan_home(plan) if isinstance(plan, str) else None
    if home is None:
        return  # not a plan ARN: pool_demand_of names the problem
    ours = (settings.partition, settings.region, settings.account_id)
    for what, theirs, mine in zip(("partition", "region", "account"), home, ours, strict=True):
        if mine and theirs != mine:
            raise RequestInvalid(
                f"ResourceConfig.TrainingPlanArn: the plan is in {what} {theirs}; this stack's training plans "
                f"are in {what} {mine}"
            )


def submit(deps: Dependencies, body: Any, caller: str | None, body_bytes: int | None = None) -> Job:
    """Queue a job; JobAlreadyExists (409) for a name in use."""
    owner = require_caller(caller)
    deps.ensure_pools()
    job = validate(deps, body, owner, body_bytes)
    job.history.append(
        {
            "at": job.submitted_at.isoformat(),
            "state": JobState.QUEUED.value,
            "attempt": 0,
            "reason": f"submitted by {owner}",
        }
    )
    deps.store.create_job(job)
    logger.info("job queued", extra={"job": job.name, "pool": job.pool, "priority": job.priority})
    count(SUBMISSIONS)
    announce(
        deps.publisher,
        EventType.JOB_QUEUED,
        {"name": job.name, "pool": job.pool, "priority": job.priority, "owner": job.owner},
    )
    return job
