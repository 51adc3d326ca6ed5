"""The scheduler's use cases: apply SageMaker's state changes, reconcile on the timer, run one pass.

A pass reads a bounded snapshot by Query (pools, the first K queued jobs of each pool, live attempts,
tracked warm pools), asks the pure policy for a plan, and carries it out. Every job write is conditional on
the version read, so a duplicated, stale or reordered event changes nothing: it either names an attempt
that is not the job's current one, or asks for a move the job's state does not allow.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sagequeue_core.defaults import (
    ATTEMPT_TAG,
    JOB_TAG,
    SAGEQUEUE_EVENT_SOURCE,
    SUBMITTED_BY_TAG,
)
from sagequeue_core.domain import (
    ATTEMPT_NAME_CHOICES,
    TRANSITIONS,
    Job,
    JobState,
    Reservation,
    ResourceKey,
    StopReason,
    attempt_name,
    tags_to_dict,
)
from sagequeue_core.errors import (
    AttemptNameTaken,
    ResourceLimitExceeded,
    SageMakerError,
    SageMakerUnavailable,
    SageMakerValidationError,
    StaleVersion,
    Throttled,
    TrainingJobNotFound,
)
from sagequeue_core.events import (
    EventType,
    MalformedEvent,
    TrainingJobChange,
    announce,
    is_training_job_event,
    parse_description,
    parse_training_job_event,
)
from sagequeue_core.observability import (
    FINISHED,
    OLDEST_WAIT,
    PREEMPTIONS,
    QUEUE_DEPTH,
    REQUEUES,
    RESUMES,
    STARTS,
    WARM_POOL_RELEASES,
    WARM_POOL_REUSES,
    MetricUnit,
    count,
    logger,
    pool_gauge,
)
from sagequeue_core.policy import Preempt, ReleaseWarmPool, Start, plan
from sagequeue_core.runtime import Dependencies
from sagequeue_core.sagemaker import CreateResult, FailureKind, classify_failure
from sagequeue_core.snapshot import build_snapshot, policy_settings
from sagequeue_core.store import ExternalAttempt, PoolStatus, TrackedWarmPool

#: SecondaryStatus values under InProgress before the instances are the job's.
_NOT_YET_RUNNING = frozenset({"", "Starting", "Pending", "LaunchingMLInstances"})
#: SecondaryStatus values under InProgress once the job has begun to train.
_TRAINING_OR_LATER = frozenset({"Training", "Uploading"})
#: SecondaryStatus values under Stopped that SageMaker chose, not anyone's StopTrainingJob.
_SAGEMAKER_STOPS = frozenset({"MaxRuntimeExceeded", "MaxWaitTimeExceeded"})
#: How often a write is retried after another writer changed the job in between.
_WRITE_ATTEMPTS = 3


@dataclass
class PassReport:
    """What one invocation did: for logs, metrics and tests."""

    started: list[str] = field(default_factory=list)  # training job names created
    adopted: list[str] = field(default_factory=list)  # attempts found already created (crash recovery)
    preempted: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # jobs SageMaker refused
    waiting: dict[str, str] = field(default_factory=dict)
    applied: list[str] = field(default_factory=list)  # "<training job>: <outcome>" per change

    def merge(self, other: PassReport) -> None:
        self.started += other.started
        self.adopted += other.adopted
        self.preempted += other.preempted
        self.released += other.released
        self.failed += other.failed
        self.waiting.update(other.waiting)
        self.applied += other.applied


# --- entry point ------------------------------------------------------------------------------------------------


def handle_event(deps: Dependencies, event: Mapping[str, Any]) -> PassReport:
    """One scheduler invocation: apply what the event says, reconcile on the timer, then run a pass."""
    report = PassReport()
    deps.ensure_pools()  # an event may be a cold start's first call: managed pools must exist to match it
    if is_training_job_event(event):
        try:
            change = parse_training_job_event(event)
        except MalformedEvent as exc:
            logger.warning("ignoring a malformed SageMaker event", extra={"problem": str(exc)})
        else:
            report.applied.append(f"{change.training_job_name}: {apply_change(deps, change)}")
            if not change.ended:
                # Capacity comes back only when an attempt ends. An in-progress step (Downloading,
                # Training, ...) or a job started by hand can only hold instances the last pass already
                # counted or leave fewer free, so no pass could start anything more; the timer's pass
                # retries what failed and preempts what has run long enough.
                return report
    elif event.get("source") == "aws.events" or event.get("detail-type") == "Scheduled Event":
        report.merge(reconcile(deps))
    elif event.get("source") != SAGEQUEUE_EVENT_SOURCE:
        logger.warning("unexpected event; running a pass anyway", extra={"source": event.get("source")})
    report.merge(run_pass(deps))
    return report


# --- applying SageMaker's view ------------------------------------------------------------------------------------


def apply_change(deps: Dependencies, change: TrainingJobChange) -> str:
    """Bring the job that owns `change`'s training job up to date; returns what happened, in words."""

    def step(fresh: Job) -> str:
        return _apply_to_job(deps, fresh, change)

    tagged = change.tags.get(JOB_TAG)
    job = deps.store.find_job(tagged) if tagged else None
    if job is not None:
        # a consistent read by key: as fresh as the one a retry makes, so it serves as the first try
        return _with_retries(deps, job.name, step, first=job)
    # an index read may lag behind the table: decide on a fresh read of the job
    job = deps.store.find_job_by_training_job(change.training_job_name)
    if job is None:
        return _apply_external(deps, change)
    return _with_retries(deps, job.name, step)


def _with_retries(
    deps: Dependencies, name: str, step: Callable[[Job], str], *, first: Job | None = None
) -> str:
    """Run `step` on a freshly read job (`first`, if the caller just read it), again if someone else
    wrote it in between."""
    job = first
    for _ in range(_WRITE_ATTEMPTS):
        if job is None:
            job = deps.store.get_job(name)
        try:
            return step(job)
        except StaleVersion:
            job = None
    return "gave up: the job kept changing"


def _apply_to_job(deps: Dependencies, job: Job, change: TrainingJobChange) -> str:
    now = deps.now()
    name = change.training_job_name
    if job.training_job_name != name:
        # Our next attempt, created by a pass that failed before recording it: adopt it.
        if (
            job.state is JobState.QUEUED
            and job.is_next_attempt(name)
            and not change.ended
            and change.tags.get(JOB_TAG) == job.name
        ):
            _record_start(deps, job, name, now, reason="attempt found already created")
            return "adopted"
        if change.ended:
            _track_warm_pool(deps, change, job.name)
        return "ignored: not the job's current attempt"
    was = job.state
    if change.status == "InProgress":
        outcome = "no change"
        if was is JobState.STARTING and change.secondary_status not in _NOT_YET_RUNNING:
            job.transition(JobState.RUNNING, now, reason=change.secondary_status)
            outcome = "running"
        trained = _training_since(change, now)
        if job.training_started_at is None and trained is not None and job.state.is_live:
            job.training_started_at = trained
            outcome = "training" if outcome == "no change" else outcome
        if outcome != "no change":
            deps.store.save_job(job, was=was)
        return outcome
    if not change.ended:
        return "no change"
    if not was.is_live:
        # A duplicate of the end already applied: the job has moved on (requeued, or finished).
        return f"ignored: the attempt already ended ({was.value})"
    target, reason = _end_state(deps, job, change)
    if target not in TRANSITIONS[was]:
        return f"ignored: a {was.value} job cannot become {target.value}"
    if target is JobState.QUEUED:
        if job.stop_reason is StopReason.PREEMPTED and was is JobState.PREEMPTING:
            job.preemptions += 1
        else:
            job.retries += 1
            job.not_before = now + timedelta(seconds=_backoff(deps, job.retries))
        job.stop_reason = None
    job.transition(target, now, reason=reason)
    deps.store.save_job(job, was=was)
    _track_warm_pool(deps, change, job.name)
    _announce_end(deps, job, target)
    logger.info(
        "attempt ended",
        extra={"job": job.name, "attempt": job.attempt, "status": change.status, "state": target.value},
    )
    return target.value


def _training_since(change: TrainingJobChange, now: datetime) -> datetime | None:
    """When the attempt began to train, if it has: the minimum runtime before preemption counts from here."""
    if change.training_phase_started_at is not None:
        return change.training_phase_started_at
    if change.secondary_status in _TRAINING_OR_LATER:
        return now
    return None


def _end_state(deps: Dependencies, job: Job, change: TrainingJobChange) -> tuple[JobState, str]:
    if change.status == "Completed":
        return JobState.COMPLETED, "Completed"
    if change.status == "Failed":
        reason = change.failure_reason or "Failed"
        if job.stop_reason is not None and job.stop_reason is not StopReason.PREEMPTED:
            # stopped on purpose (cancel, idle, policy) and failed on the way down: the purpose decides
            return job.stop_reason.final_state, reason
        kind = classify_failure(change.failure_reason)
        if kind is not FailureKind.JOB:
            if job.retries + 1 < deps.settings.max_attempts:
                return JobState.QUEUED, f"retrying after {kind.value} failure: {reason}"
            return JobState.FAILED, f"gave up after {job.retries + 1} attempts: {reason}"
        return JobState.FAILED, reason
    # Stopped
    if change.secondary_status in _SAGEMAKER_STOPS and job.stop_reason is None:
        return JobState.FAILED, f"stopped by SageMaker: {change.secondary_status}"
    if job.stop_reason is not None:
        # Governance records why it stopped an idle or rule-breaking attempt; keep that as the final reason.
        recorded = job.reason if job.stop_reason in (StopReason.IDLE, StopReason.POLICY) else None
        return job.stop_reason.final_state, recorded or f"stopped: {job.stop_reason.value}"
    return JobState.CANCELLED, "stopped outside sagequeue"


def _backoff(deps: Dependencies, retries: int) -> int:
    base = deps.settings.retry_backoff_seconds
    return int(min(base * 2 ** max(retries - 1, 0), deps.settings.max_backoff_seconds))


def _announce_end(deps: Dependencies, job: Job, target: JobState) -> None:
    if target is JobState.QUEUED:
        count(REQUEUES)
        return
    if target.is_terminal:
        count(FINISHED)
        announce(
            deps.publisher,
            EventType.JOB_FINISHED,
            {
                "name": job.name,
                "state": target.value,
                "attempt": job.attempt,
                "training_job_name": job.training_job_name,
                "reason": job.reason,
            },
        )


def _track_warm_pool(deps: Dependencies, change: TrainingJobChange, job_name: str | None) -> None:
    """An ended job with a keep-alive leaves its instances Available for a matching job; count them."""
    if change.keep_alive_seconds <= 0:
        return
    if change.warm_pool_status is not None and change.warm_pool_status != "Available":
        deps.store.forget_warm_pool(change.training_job_name)
        return
    if change.warm_pool_status is None and change.training_start_time is None:
        return  # never launched: nothing was retained
    key = ResourceKey.from_request(change.detail)
    if key is None:
        return
    ended = change.training_end_time or deps.now()
    expires = ended + timedelta(seconds=change.keep_alive_seconds)
    if expires <= deps.now():
        return
    deps.store.track_warm_pool(TrackedWarmPool(change.training_job_name, key, expires, job_name))


def _apply_external(deps: Dependencies, change: TrainingJobChange) -> str:
    """A training job sagequeue did not start: it counts against a managed pool while it holds instances."""
    managed = {status.pool.instance_type for status in deps.store.pools()}
    if not managed & set(change.demand):
        return "ignored: not on a managed pool"
    if change.ended:
        deps.store.forget_external_attempt(change.training_job_name)
        _track_warm_pool(deps, change, None)
        return "external attempt ended"
    deps.store.record_external_attempt(
        ExternalAttempt(
            change.training_job_name,
            dict(change.demand),
            change.creation_time or deps.now(),
        )
    )
    return "external attempt recorded"


# --- reconcile (the timer) ---------------------------------------------------------------------------------------


def reconcile(deps: Dependencies) -> PassReport:
    """Compare every live attempt and tracked warm pool with DescribeTrainingJob, so a lost event only
    delays: a missed end is applied, a stop that did not land is repeated, a gone warm pool is dropped."""
    report = PassReport()
    for job in deps.store.live_jobs():
        if not job.training_job_name:
            continue
        try:
            described = deps.sagemaker.describe(job.training_job_name)
        except TrainingJobNotFound:
            outcome = _with_retries(deps, job.name, lambda fresh: _vanished(deps, fresh))
            report.applied.append(f"{job.training_job_name}: {outcome}")
            continue
        except SageMakerError as exc:
            logger.warning("describe failed", extra={"job": job.name, "error": str(exc)})
            continue
        change = parse_description(described)
        if job.state in (JobState.PREEMPTING, JobState.STOPPING) and change.status == "InProgress":
            try:
                deps.sagemaker.stop(job.training_job_name)
            except SageMakerError as exc:
                logger.warning("stop failed again", extra={"job": job.name, "error": str(exc)})
                continue
            report.applied.append(f"{job.training_job_name}: stop repeated")
            continue
        report.applied.append(f"{job.training_job_name}: {_apply_described(deps, job.name, change)}")
    for external in deps.store.external_attempts():
        try:
            change = parse_description(deps.sagemaker.describe(external.training_job_name))
        except TrainingJobNotFound:
            deps.store.forget_external_attempt(external.training_job_name)
            continue
        if change.ended:
            report.applied.append(f"{external.training_job_name}: {_apply_external(deps, change)}")
    now = deps.now()
    for warm in deps.store.warm_pools():
        if warm.expires_at <= now:
            deps.store.forget_warm_pool(warm.training_job_name)
            continue
        try:
            described = deps.sagemaker.describe(warm.training_job_name)
        except TrainingJobNotFound:
            deps.store.forget_warm_pool(warm.training_job_name)
            continue
        status = (described.get("WarmPoolStatus") or {}).get("Status")
        if status != "Available":
            deps.store.forget_warm_pool(warm.training_job_name)
    return report


def _apply_described(deps: Dependencies, job_name: str, change: TrainingJobChange) -> str:
    return _with_retries(deps, job_name, lambda fresh: _apply_to_job(deps, fresh, change))


def _vanished(deps: Dependencies, job: Job) -> str:
    """SageMaker has no such training job (deleted by hand): the attempt is over, the job goes on."""
    if not job.state.is_live:
        return "no change"
    was = job.state
    stop = job.stop_reason
    target = stop.final_state if stop is not None else JobState.QUEUED
    if target is JobState.QUEUED:
        job.stop_reason = None
    job.transition(target, deps.now(), reason=f"training job {job.training_job_name} no longer exists")
    deps.store.save_job(job, was=was)
    _announce_end(deps, job, target)
    return target.value


# --- one pass ------------------------------------------------------------------------------------------------------


def run_pass(deps: Dependencies) -> PassReport:
    deps.ensure_pools()
    now = deps.now()
    settings = deps.settings
    report = PassReport()
    pool_statuses = deps.store.pools()
    capacity = {status.pool.instance_type: status.pool.capacity for status in pool_statuses}
    quota = {
        status.pool.instance_type: limit
        for status in pool_statuses
        if (limit := status.quota_at(now)) is not None and limit < status.pool.capacity
    }
    queued: dict[str, Job] = {}
    for instance_type in capacity:
        # jobs wider than the pool cannot start: they must not fill the window (GET /jobs says why they wait)
        fitting = capacity[instance_type] or None
        window = deps.store.queued_jobs(instance_type, settings.queue_lookahead, fitting=fitting)
        queued.update((job.name, job) for job in window)
        _queue_metrics(instance_type, window, now)
    for status in pool_statuses:
        pool_gauge(QUEUE_DEPTH, status.pool.instance_type, status.queued)
    live = {job.name: job for job in deps.store.live_jobs()}
    externals = deps.store.external_attempts()
    warm_pools = []
    for warm in deps.store.warm_pools():
        if warm.expires_at > now:
            warm_pools.append(warm)
        else:
            deps.store.forget_warm_pool(warm.training_job_name)
    snapshot = build_snapshot(
        now=now,
        capacity=capacity,
        quota=quota,
        queued=queued.values(),
        live=live.values(),
        external=externals,
        warm_pools=warm_pools,
    )
    decided = plan(snapshot, policy_settings(settings))
    report.waiting.update(decided.waiting)
    statuses = {status.pool.instance_type: status for status in pool_statuses}
    held: Counter[str] = Counter()
    for attempt in snapshot.running:
        held.update(attempt.demand)
    warm_by_name = {pool.training_job_name: pool for pool in snapshot.warm_pools}
    for retained in snapshot.warm_pools:
        held[retained.pool] += retained.instances
    blocked: set[str] = set()  # jobs whose capacity a failed release did not free
    for action in decided.actions:
        if isinstance(action, Preempt):
            _preempt(deps, action, report)
        elif isinstance(action, ReleaseWarmPool):
            if _release(deps, action, report):
                released = warm_by_name[action.training_job_name]
                held[released.pool] -= released.instances
            else:
                blocked.add(action.for_job)
        elif isinstance(action, Start):
            if action.job_name in blocked:
                report.waiting[action.job_name] = "waiting for a warm pool to be released"
                continue
            _start(deps, queued[action.job_name], action, report, held, statuses)
    _note_waiting(deps, queued, report.waiting, decided.reservations)
    logger.info(
        "pass done",
        extra={
            "started": report.started,
            "preempted": report.preempted,
            "released": report.released,
            "waiting": len(report.waiting),
        },
    )
    return report


def _learn_quota(deps: Dependencies, job: Job, held: Mapping[str, int]) -> None:
    """SageMaker refused a create for the account's quota: what it holds for us now is that quota."""
    if len(job.demand) != 1:
        return  # a heterogeneous job does not say which of its types hit the limit
    deps.store.record_quota(job.pool, held.get(job.pool, 0), deps.now())
    logger.warning(
        "account quota below the pool's capacity",
        extra={"pool": job.pool, "quota": held.get(job.pool, 0), "job": job.name},
    )


def _note_waiting(
    deps: Dependencies,
    queued: Mapping[str, Job],
    waiting: Mapping[str, str],
    reservations: Mapping[str, Reservation],
) -> None:
    """Store why each job waits (its `reason`) and what it was promised (its reservation): only jobs where
    either changed are written, many per request; a job changed since this pass read it is skipped (the
    next pass decides again)."""
    changed: list[tuple[Job, str | None, Reservation | None]] = []
    for name, job in queued.items():
        if name not in waiting and job.reservation is None:
            continue  # started in this pass: nothing to say
        reason = waiting.get(name, job.reason)
        reservation = reservations.get(name)
        if job.reason != reason or job.reservation != reservation:
            changed.append((job, reason, reservation))
    if not changed:
        return
    before = {job.name: job.reservation for job, _, _ in changed}
    written = set(deps.store.note_waiting(changed))
    for job, _, reservation in changed:
        if job.name in written and before[job.name] != reservation:
            _announce_reservation(deps, job, before[job.name], reservation)


def _announce_reservation(
    deps: Dependencies, job: Job, was: Reservation | None, reservation: Reservation | None
) -> None:
    detail: dict[str, Any] = {"name": job.name, "pool": job.pool}
    if reservation is None:
        detail["reservation"] = None
        detail["ended"] = was.kind.value if was else None
    else:
        detail["reservation"] = reservation.to_dict()
    announce(deps.publisher, EventType.JOB_RESERVED, detail)


def _queue_metrics(pool: str, window: list[Job], now: datetime) -> None:
    if window:
        oldest = min(job.submitted_at for job in window)
        pool_gauge(OLDEST_WAIT, pool, (now - oldest).total_seconds(), MetricUnit.Seconds)


def attempt_request(
    job: Job, attempt: int, keep_alive_seconds: int | None, *, choice: int = 0
) -> dict[str, Any]:
    """The CreateTrainingJob request of attempt `attempt`: the submitted request (same CheckpointConfig,
    so training resumes from its checkpoints) under the attempt's name, with sagequeue's tags."""
    request = copy.deepcopy(job.request)
    request["TrainingJobName"] = attempt_name(job.name, attempt, choice)
    tags = tags_to_dict(request.get("Tags"))
    tags.update({JOB_TAG: job.name, ATTEMPT_TAG: str(attempt), SUBMITTED_BY_TAG: job.owner})
    request["Tags"] = [{"Key": key, "Value": value} for key, value in tags.items()]
    if keep_alive_seconds:
        config = dict(request.get("ResourceConfig") or {})
        config["KeepAlivePeriodInSeconds"] = max(
            int(config.get("KeepAlivePeriodInSeconds") or 0), keep_alive_seconds
        )
        request["ResourceConfig"] = config
    return request


def _create(deps: Dependencies, job: Job, attempt: int, action: Start) -> CreateResult:
    """Create the attempt under the first of its names that no foreign training job holds: a job outside
    the queue that took the name makes the attempt choose the next name, never fails the job. The names are
    tried in a fixed order, so a retried pass finds its own earlier create (ResourceInUse on our job)."""
    taken: AttemptNameTaken | None = None
    for choice in range(ATTEMPT_NAME_CHOICES):
        request = attempt_request(job, attempt, action.keep_alive_seconds, choice=choice)
        try:
            return deps.sagemaker.create_attempt(request, job_name=job.name)
        except AttemptNameTaken as exc:
            logger.warning(
                "attempt name held by a foreign training job; choosing another",
                extra={"job": job.name, "attempt": attempt, "training_job_name": request["TrainingJobName"]},
            )
            taken = exc
    assert taken is not None
    raise taken


def _start(
    deps: Dependencies,
    job: Job,
    action: Start,
    report: PassReport,
    held: Counter[str],
    quotas: Mapping[str, PoolStatus],
) -> None:
    """Create the attempt. `held` counts the instances SageMaker holds per pool (live attempts and warm
    pools, updated here); `quotas` the pools, with the account quota each last met."""
    attempt = job.attempt + 1
    try:
        result = _create(deps, job, attempt, action)
    except (ResourceLimitExceeded, Throttled, SageMakerUnavailable) as exc:
        # Nothing was created: the job keeps its place and the next pass tries again.
        if isinstance(exc, ResourceLimitExceeded):
            _learn_quota(deps, job, held)
        report.waiting[job.name] = f"SageMaker {exc.code or type(exc).__name__}: {exc}"
        logger.warning("create deferred", extra={"job": job.name, "attempt": attempt, "code": exc.code})
        return
    except (SageMakerValidationError, AttemptNameTaken) as exc:
        # The request itself is refused (or every name the attempt may take is held): it fails alone, with
        # the reason, and the rest of the pass goes on.
        message = str(exc)
        outcome = _with_retries(deps, job.name, lambda fresh: _refused(deps, fresh, message))
        report.failed.append(job.name)
        logger.warning("create refused", extra={"job": job.name, "attempt": attempt, "outcome": outcome})
        return
    except SageMakerError as exc:
        # An error sagequeue has no rule for: nothing is known to be created, so the job keeps its place
        # and the rest of the plan still runs; the next pass tries again (ResourceInUse if it was).
        report.waiting[job.name] = f"SageMaker {exc.code or type(exc).__name__}: {exc}"
        logger.exception("create failed", extra={"job": job.name, "attempt": attempt, "code": exc.code})
        return
    outcome = _with_retries(
        deps,
        job.name,
        lambda fresh: _record_start(
            deps,
            fresh,
            result.training_job_name,
            deps.now(),
            warm_pool=action.warm_pool,
            keep_alive_seconds=action.keep_alive_seconds or 0,
        ),
    )
    (report.adopted if result.already_started else report.started).append(result.training_job_name)
    if action.warm_pool is None:
        held.update(job.demand)
    for pool in job.demand:
        status = quotas.get(pool)
        if status is not None and status.quota is not None and held[pool] > status.quota:
            deps.store.forget_quota(pool)  # SageMaker granted more than the quota it once refused at
    if outcome != "started":
        logger.warning("start not recorded", extra={"job": job.name, "outcome": outcome})


def _record_start(
    deps: Dependencies,
    job: Job,
    training_job_name: str,
    now: datetime,
    *,
    reason: str | None = None,
    warm_pool: str | None = None,
    keep_alive_seconds: int = 0,
) -> str:
    if job.training_job_name == training_job_name and job.state is not JobState.QUEUED:
        return "started"  # recorded already (an event adopted it first)
    if job.state is not JobState.QUEUED or not job.is_next_attempt(training_job_name):
        return f"not started: the job is {job.state.value}"
    was = job.state
    job.attempt += 1
    job.training_job_name = training_job_name
    job.started_at = now
    job.stop_reason = None
    job.not_before = None
    job.reused_warm_pool_of = warm_pool
    job.keep_alive_seconds = keep_alive_seconds
    job.reason = None  # why it waited no longer applies
    job.transition(
        JobState.STARTING, now, reason=reason or (f"on warm pool of {warm_pool}" if warm_pool else None)
    )
    deps.store.save_job(job, was=was)
    logger.append_keys(job=job.name, attempt=job.attempt)
    logger.info("attempt started", extra={"training_job_name": training_job_name, "warm_pool": warm_pool})
    logger.remove_keys(["job", "attempt"])
    detail = {"name": job.name, "attempt": job.attempt, "training_job_name": training_job_name}
    if job.attempt == 1:
        count(STARTS)
        announce(deps.publisher, EventType.JOB_STARTED, detail)
    else:
        count(RESUMES)
        announce(deps.publisher, EventType.JOB_RESUMED, {**detail, "preemptions": job.preemptions})
    if warm_pool:
        deps.store.forget_warm_pool(warm_pool)
        count(WARM_POOL_REUSES)
        announce(deps.publisher, EventType.WARM_POOL_REUSED, {**detail, "warm_pool_of": warm_pool})
    return "started"


def _refused(deps: Dependencies, job: Job, message: str) -> str:
    if job.state is not JobState.QUEUED:
        return f"not failed: the job is {job.state.value}"
    was = job.state
    job.transition(JobState.FAILED, deps.now(), reason=f"SageMaker refused the job: {message}")
    deps.store.save_job(job, was=was)
    _announce_end(deps, job, JobState.FAILED)
    return "failed"


def _preempt(deps: Dependencies, action: Preempt, report: PassReport) -> None:
    def step(job: Job) -> str:
        if job.training_job_name != action.training_job_name or job.state not in (
            JobState.STARTING,
            JobState.RUNNING,
        ):
            return f"not preempted: the job is {job.state.value}"
        was = job.state
        job.stop_reason = StopReason.PREEMPTED
        job.transition(JobState.PREEMPTING, deps.now(), reason=f"preempted for {action.for_job}")
        deps.store.save_job(job, was=was)
        return "preempting"

    if _with_retries(deps, action.job_name, step) != "preempting":
        return
    try:
        deps.sagemaker.stop(action.training_job_name)
    except SageMakerError as exc:
        # Recorded as preempting: the reconcile timer repeats the stop.
        logger.warning("stop failed", extra={"job": action.job_name, "error": str(exc)})
    report.preempted.append(action.training_job_name)
    count(PREEMPTIONS)
    announce(
        deps.publisher,
        EventType.JOB_PREEMPTED,
        {"name": action.job_name, "training_job_name": action.training_job_name, "for_job": action.for_job},
    )


def _release(deps: Dependencies, action: ReleaseWarmPool, report: PassReport) -> bool:
    """Release a warm pool's instances; False when it could not be, and still holds them."""
    try:
        deps.sagemaker.set_keep_alive(action.training_job_name, 0)
    except (SageMakerValidationError, TrainingJobNotFound):
        pass  # no longer Available: it is gone either way
    except SageMakerError as exc:
        # Still held: keep tracking it, and let the job it was released for wait for the next pass.
        logger.warning(
            "warm pool release failed", extra={"warm_pool": action.training_job_name, "error": str(exc)}
        )
        return False
    deps.store.forget_warm_pool(action.training_job_name)
    report.released.append(action.training_job_name)
    count(WARM_POOL_RELEASES)
    return True


__all__ = [
    "PassReport",
    "apply_change",
    "attempt_request",
    "handle_event",
    "reconcile",
    "run_pass",
]
