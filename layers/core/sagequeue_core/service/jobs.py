"""Reading and changing jobs (owner or admin), and the pools' capacity (admin)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sagequeue_core.domain import (
    PLAN_POOL_PREFIX,
    DomainError,
    InvalidTransition,
    Job,
    JobState,
    Pool,
    StopReason,
    attempt_name,
    beyond_window,
    check_training_job_name,
    never_fits,
    parse_priority,
    parse_time,
)
from sagequeue_core.errors import RequestInvalid, SageMakerError, StaleVersion, TrainingJobNotFound
from sagequeue_core.events import EventType, announce
from sagequeue_core.forecasts import StartForecast
from sagequeue_core.observability import logger
from sagequeue_core.runtime import Dependencies
from sagequeue_core.service.access import (
    owner_of_caller,
    require_admin,
    require_caller,
    require_owner_or_admin,
    require_priority_allowed,
)
from sagequeue_core.service.exemptions import EXEMPTION_CLAIM, exemption_claim_kind, grant_exemption
from sagequeue_core.store import Page
from sagequeue_core.validation import check_training_instance_type

MAX_PAGE = 100
#: An ARN is at most 2048 characters; no owner or pool filter is longer.
MAX_FILTER_CHARS = 2048


@dataclass(frozen=True)
class JobDetail:
    job: Job
    position: int | None
    #: the stored forecast of a waiting job, when one is fresh and made for its current attempt
    forecast: StartForecast | None = None

    def to_api(self) -> dict[str, Any]:
        out = self.job.to_api()
        out["position"] = self.position
        out["forecast"] = self.forecast.to_api() if self.forecast else None
        attempts = [attempt_name(self.job.name, n) for n in range(1, self.job.attempt + 1)]
        if attempts and self.job.training_job_name:
            attempts[-1] = self.job.training_job_name  # it may have had to choose another name
        out["attempts"] = attempts
        out["history"] = list(self.job.history)
        return out


@dataclass(frozen=True)
class PoolView:
    instance_type: str
    capacity: int
    used: int
    queued: int
    warm: int
    #: the account quota SageMaker last refused a create at, while it limits the pool
    quota: int | None = None
    #: the warm-pool quota SageMaker last showed by not retaining a pool (docs/adr/0017); None: not seen
    warm_quota: int | None = None

    @property
    def effective_capacity(self) -> int:
        return self.capacity if self.quota is None else min(self.capacity, self.quota)

    @property
    def warning(self) -> str | None:
        if self.quota is None or self.quota >= self.capacity:
            return None
        return (
            f"SageMaker refused a start at {self.quota} {self.instance_type} (ResourceLimitExceeded): the "
            f"account's quota is below the pool's capacity of {self.capacity}; the scheduler plans with "
            f"{self.quota} until the quota is raised"
        )

    def to_api(self) -> dict[str, Any]:
        return {
            "instance_type": self.instance_type,
            "capacity": self.capacity,
            "used": self.used,
            "queued": self.queued,
            "warm": self.warm,
            "free": max(self.effective_capacity - self.used - self.warm, 0),
            "quota": self.quota,
            "warm_quota": self.warm_quota,
            "warning": self.warning,
        }


def get_job(deps: Dependencies, name: str) -> JobDetail:
    job = deps.store.get_job(name)
    position = deps.store.queue_position(job)
    if job.state is JobState.QUEUED:
        # a job no pass reads (wider than its pool, or beyond the window) is told why here
        capacity = {pool: deps.store.get_pool(pool).pool.capacity for pool in job.demand}
        lookahead = deps.settings.queue_lookahead
        reason = never_fits(job.demand, capacity)
        if reason is None and job.reason is None and position is not None and position > lookahead:
            reason = beyond_window(job.pool, position, lookahead)
        if reason is not None:
            job.reason = reason
    return JobDetail(job, position, _fresh_forecast(deps, job))


def _fresh_forecast(deps: Dependencies, job: Job) -> StartForecast | None:
    """The forecast function's latest forecast of a queued job: one GetItem, no simulation here. None when
    there is none, it is older than FRESH_SECONDS, or it was made before the job's latest attempt."""
    if job.state is not JobState.QUEUED:
        return None
    stored = deps.store.job_forecast(job.name)
    if stored is None:
        return None
    made = stored[0]
    if made.attempt != job.attempt or not made.fresh_at(deps.now()):
        return None
    return made


def list_jobs(
    deps: Dependencies,
    caller: str | None,
    *,
    state: str | None = None,
    pool: str | None = None,
    owner: str | None = None,
    limit: int = 50,
    next_token: str | None = None,
    order: str | None = None,
) -> Page:
    """Jobs filtered by state, pool and owner; with no filter, the caller's own jobs. In submission order:
    `order` "oldest" (the default) or "newest" first."""
    me = require_caller(caller)
    if order not in (None, "oldest", "newest"):
        raise RequestInvalid(f"order must be oldest or newest, got {order!r}")
    try:
        wanted_state = JobState(state) if state else None
    except ValueError:
        states = ", ".join(s.value for s in JobState)
        raise RequestInvalid(f"state must be one of {states}, got {state!r}") from None
    if not 1 <= limit <= MAX_PAGE:
        raise RequestInvalid(f"limit must be between 1 and {MAX_PAGE}, got {limit}")
    for label, value in (("owner", owner), ("pool", pool)):
        if value is not None and not (0 < len(value) <= MAX_FILTER_CHARS and value.isprintable()):
            raise RequestInvalid(
                f"{label} must be 1 to {MAX_FILTER_CHARS} printable characters when given, got {value!r}"
            )
    if owner is None and wanted_state is None and pool is None:
        owner = me
    if owner is not None:
        owner = owner_of_caller(owner)  # a session's jobs are its role's
    try:
        return deps.store.list_jobs(
            owner=owner,
            state=wanted_state,
            pool=pool,
            limit=limit,
            next_token=next_token,
            newest_first=order == "newest",
        )
    except ValueError as exc:
        raise RequestInvalid(str(exc)) from None


#: How often a user's change is re-applied when the scheduler wrote the job in between.
CHANGE_ATTEMPTS = 3


def _apply(deps: Dependencies, name: str, step: Callable[[Job], bool]) -> Job:
    """Read the job, let `step` change it (False: nothing to write), write it; read and apply again if the
    scheduler wrote the job in between, so a user is not told 409 for the queue's own bookkeeping."""
    for attempt in range(CHANGE_ATTEMPTS):
        job = deps.store.get_job(name)
        was = job.state
        if not step(job):
            return job
        try:
            deps.store.save_job(job, was=was)
        except StaleVersion:
            if attempt == CHANGE_ATTEMPTS - 1:
                raise
            continue
        return job
    raise AssertionError("unreachable")  # pragma: no cover


def cancel(deps: Dependencies, name: str, caller: str | None) -> Job:
    """Dequeue a waiting job, or stop its running attempt (the job is `stopping` until SageMaker stops it)."""
    me = require_caller(caller)

    def step(job: Job) -> bool:
        require_owner_or_admin(job, me, deps.settings.admin_role_arns)
        if job.state is JobState.STOPPING and job.stop_reason is StopReason.CANCELLED:
            return False
        if job.state.is_terminal:
            raise InvalidTransition(f"job {name!r} is already {job.state.value}")
        now = deps.now()
        if job.state in (JobState.QUEUED, JobState.HELD):
            job.transition(JobState.CANCELLED, now, reason=f"cancelled by {me}")
        else:
            job.stop_reason = StopReason.CANCELLED
            job.transition(JobState.STOPPING, now, reason=f"cancelled by {me}")
        return True

    job = _apply(deps, name, step)
    if job.state is JobState.STOPPING and job.training_job_name:
        try:
            deps.sagemaker.stop(job.training_job_name)
        except SageMakerError:
            # The job is recorded as stopping; the scheduler's reconcile repeats the stop.
            logger.exception("stop failed; the reconcile timer will retry", extra={"job": name})
    announce(deps.publisher, EventType.JOB_CHANGED, {"name": name, "change": "cancelled"})
    if job.state.is_terminal:
        announce(deps.publisher, EventType.JOB_FINISHED, {"name": name, "state": job.state.value})
    return job


def change(
    deps: Dependencies,
    name: str,
    caller: str | None,
    *,
    priority: Any = None,
    held: bool | None = None,
) -> Job:
    """Change a job's priority and/or hold or release it."""
    me = require_caller(caller)
    if priority is None and held is None:
        raise RequestInvalid("nothing to change: give priority and/or held")
    try:
        new_priority = parse_priority(priority) if priority is not None else None
    except DomainError as exc:
        raise RequestInvalid(str(exc)) from None

    if new_priority is not None:
        require_priority_allowed(new_priority, me, deps.settings)

    def step(job: Job) -> bool:
        require_owner_or_admin(job, me, deps.settings.admin_role_arns)
        if job.state.is_terminal:
            raise InvalidTransition(f"job {name!r} is already {job.state.value}")
        now = deps.now()
        if new_priority is not None:
            job.priority = new_priority
        if held is True and job.state is not JobState.HELD:
            if job.state is not JobState.QUEUED:
                raise InvalidTransition(f"only a queued job can be held; {name!r} is {job.state.value}")
            job.transition(JobState.HELD, now, reason=f"held by {me}")
        elif held is False:
            if job.state is not JobState.HELD:
                raise InvalidTransition(f"only a held job can be released; {name!r} is {job.state.value}")
            job.transition(JobState.QUEUED, now, reason=f"released by {me}")
        return True

    job = _apply(deps, name, step)
    announce(
        deps.publisher,
        EventType.JOB_CHANGED,
        {"name": name, "change": "changed", "priority": job.priority, "state": job.state},
    )
    return job


def pools(deps: Dependencies) -> list[PoolView]:
    """Every pool with its capacity, the instances in use (ours and external), queued jobs, warm instances."""
    deps.ensure_pools()
    used: Counter[str] = Counter()
    for job in deps.store.live_jobs():
        used.update(job.demand)
    for external in deps.store.external_attempts():
        used.update(external.demand)
    warm: Counter[str] = Counter()
    now = deps.now()
    for tracked in deps.store.warm_pools():
        if tracked.expires_at > now:
            warm[tracked.resource_key.pool] += tracked.resource_key.instance_count
    views = []
    for status in deps.store.pools():
        quota = status.quota_at(now)
        views.append(
            PoolView(
                instance_type=status.pool.instance_type,
                capacity=status.pool.capacity,
                used=used[status.pool.instance_type],
                queued=status.queued,
                warm=warm[status.pool.instance_type],
                quota=quota if quota is not None and quota < status.pool.capacity else None,
                warm_quota=status.warm_quota_at(now),
            )
        )
    return views


def set_pool(deps: Dependencies, instance_type: str, capacity: Any, caller: str | None) -> PoolView:
    me = require_caller(caller)
    require_admin(me, deps.settings.admin_role_arns, "set a pool's capacity")
    if isinstance(capacity, bool) or not isinstance(capacity, int):
        raise RequestInvalid(f"capacity must be a non-negative integer, got {capacity!r}")
    try:
        pool = Pool(instance_type, capacity)
    except DomainError as exc:
        raise RequestInvalid(str(exc)) from None
    if not instance_type.startswith(PLAN_POOL_PREFIX):
        try:
            check_training_instance_type(instance_type, "pool")
        except DomainError as exc:
            raise RequestInvalid(str(exc)) from None
    deps.ensure_pools()
    deps.store.set_capacity(pool)
    announce(
        deps.publisher,
        EventType.JOB_CHANGED,
        {"pool": instance_type, "change": "capacity", "capacity": capacity},
    )
    logger.info("pool capacity set", extra={"pool": instance_type, "capacity": capacity, "by": me})
    return next(view for view in pools(deps) if view.instance_type == instance_type)


@dataclass(frozen=True)
class Exemption:
    training_job_name: str
    granted_by: str
    granted_at: str

    def to_api(self) -> dict[str, Any]:
        return {
            "training_job_name": self.training_job_name,
            "granted_by": self.granted_by,
            "granted_at": self.granted_at,
        }


def exempt(deps: Dependencies, training_job_name: str, caller: str | None) -> Exemption:
    """An admin exempts a training job (queued or not) from the policy rules and idle stops. Governance
    honours an exempt tag only when an admin granted it: here, or by submitting the job with the tag.

    A grant by training job name is bound to the training job that has the name now (its CreationTime),
    or, when none has it yet, to the first one created within EXEMPTION_WINDOW_SECONDS: a name SageMaker
    frees when its job is deleted must not carry the exemption to whoever creates a job under it later."""
    me = require_caller(caller)
    require_admin(me, deps.settings.admin_role_arns, "exempt a training job")
    try:
        name = check_training_job_name(training_job_name)
    except DomainError as exc:
        raise RequestInvalid(str(exc)) from None
    created = None
    if exemption_claim_kind(deps.store, name) == EXEMPTION_CLAIM:
        created = _creation_time(deps, name)
    grant_exemption(deps.store, name, me, deps.now(), created)
    record = deps.store.get_claim(exemption_claim_kind(deps.store, name), name) or {}
    logger.info("exemption granted", extra={"training_job_name": name, "by": me})
    return Exemption(name, str(record.get("by", me)), str(record.get("at", "")))


def _creation_time(deps: Dependencies, training_job_name: str) -> datetime | None:
    """When the training job of that name was created; None when there is none (or SageMaker cannot say
    now: the grant then covers the first job of that name met within the window, the existing one)."""
    try:
        return parse_time(deps.sagemaker.describe(training_job_name).get("CreationTime"))
    except TrainingJobNotFound:
        return None
    except SageMakerError as exc:
        logger.warning("describe failed; exemption bound at first use", extra={"error": str(exc)})
        return None
