"""The scheduler's use cases: apply SageMaker's state changes, reconcile on the timer, run one pass.

A pass reads a bounded snapshot by Query (pools, the first K queued jobs of each pool, live attempts,
tracked warm pools), asks the pure policy for a plan, and carries it out. Every job write is conditional on
the version read, so a duplicated, stale or reordered event changes nothing: it either names an attempt
that is not the job's current one, or asks for a move the job's state does not allow.
"""

from __future__ import annotations

import copy
import dataclasses
import secrets
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sagequeue_core.defaults import (
    ATTEMPT_TAG,
    INTENT_IN_FLIGHT_SECONDS,
    JOB_TAG,
    METRIC_NAMESPACE_ENV,
    PRIORITY_TAG,
    QUOTA_MEMORY_SECONDS,
    SAGEQUEUE_EVENT_SOURCE,
    SEAL_TAG,
    STATED_QUOTA_MEMORY_SECONDS,
    SUBMITTED_BY_TAG,
    team_metric_namespace,
)
from sagequeue_core.domain import (
    ATTEMPT_NAME_CHOICES,
    ATTEMPT_SECRET_BYTES,
    FALLBACK_TOKEN_LENGTH,
    PRIORITY_MIN,
    TRANSITIONS,
    UNVERIFIED_OWNER,
    Job,
    JobState,
    Reservation,
    ResourceKey,
    StopReason,
    attempt_name,
    demand_of,
    parse_time,
    tags_to_dict,
)
from sagequeue_core.errors import (
    AttemptNameTaken,
    JobAlreadyExists,
    LedgerMoved,
    ResourceLimitExceeded,
    SageMakerError,
    SageMakerValidationError,
    StaleVersion,
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
    JOBS_REBUILT,
    OLDEST_WAIT,
    PREEMPTIONS,
    QUEUE_DEPTH,
    REQUEUES,
    RESUMES,
    SKIPPED_ON_ERROR,
    STARTS,
    TEAM_BORROWED,
    TEAM_USED,
    WARM_POOL_RELEASES,
    WARM_POOL_REUSES,
    MetricUnit,
    count,
    logger,
    pool_gauge,
    team_gauge,
)
from sagequeue_core.policy import Action, Preempt, ReleaseWarmPool, Snapshot, Start, plan
from sagequeue_core.quotas import NO_TEAM, TeamLedger, TeamQuota, UsageCounter, team_label
from sagequeue_core.runtime import Dependencies
from sagequeue_core.sagemaker import FailureKind, classify_failure
from sagequeue_core.service.checkpoints import read_checkpoints
from sagequeue_core.snapshot import build_snapshot, policy_settings
from sagequeue_core.store import ExternalAttempt, PoolStatus, TrackedWarmPool

#: SecondaryStatus values under InProgress before the instances are the job's.
_NOT_YET_RUNNING = frozenset({"", "Starting", "Pending", "LaunchingMLInstances"})
#: SecondaryStatus values under InProgress in which SageMaker may be waiting for capacity (ADR 0017).
_MAY_WAIT = frozenset({"Starting", "Pending"})
#: SecondaryStatus values under InProgress once the job has begun to train.
_TRAINING_OR_LATER = frozenset({"Training", "Uploading"})
#: SecondaryStatus values under Stopped that SageMaker chose, not anyone's StopTrainingJob.
_SAGEMAKER_STOPS = frozenset({"MaxRuntimeExceeded", "MaxWaitTimeExceeded"})
#: The reason of a job whose attempt was stopped outside sagequeue (console, CLI, another tool).
STOPPED_EXTERNALLY = "stopped externally"
#: Claim kind recording an InProgress training job that is neither ours nor on a managed pool.
_FOREIGN = "foreign-training-job"
#: How far back the reconcile lists training jobs: the longest runtime (28 days) plus a day of keep-alive.
_LISTED_DAYS = 29
#: A pool found Terminated this soon after its job ended was not retained (warm-pool quota), not expired.
_NOT_RETAINED_WINDOW = 300
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
            confirmed = False
            if change.ended:
                # An end frees capacity and may requeue the job: act on what SageMaker says now, not on
                # the event, which may be late, repeated or forged (a forged Failed once gave a job two
                # live attempts). If SageMaker cannot say, the timer's reconcile will.
                described = _confirm_end(deps, change)
                if described is None:
                    report.applied.append(
                        f"{change.training_job_name}: end not confirmed; left to the reconcile"
                    )
                    return report
                change, confirmed = described, True
            report.applied.append(
                f"{change.training_job_name}: {apply_change(deps, change, confirmed=confirmed)}"
            )
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


def _confirm_end(deps: Dependencies, change: TrainingJobChange) -> TrainingJobChange | None:
    """The training job an event says ended, as DescribeTrainingJob tells it now; None when SageMaker does
    not answer (or knows no such job)."""
    try:
        return parse_description(deps.sagemaker.describe(change.training_job_name))
    except SageMakerError as exc:
        logger.warning(
            "end not confirmed; the reconcile will",
            extra={"job": change.training_job_name, "error": str(exc)},
        )
        return None


def apply_change(deps: Dependencies, change: TrainingJobChange, *, confirmed: bool = False) -> str:
    """Bring the job that owns `change`'s training job up to date; returns what happened, in words.

    `confirmed`: the change is SageMaker's answer to DescribeTrainingJob just now, not an event (a hint
    that may be late, repeated or out of order)."""

    def step(fresh: Job) -> str:
        return _apply_to_job(deps, fresh, change, confirmed=confirmed)

    tagged = change.tags.get(JOB_TAG)
    job = deps.store.find_job(tagged) if tagged else None
    if job is not None and job.started(change.training_job_name, change.tags):
        # a consistent read by key: as fresh as the one a retry makes, so it serves as the first try
        return _with_retries(deps, job.name, step, first=job)
    # The tag alone decides nothing (anyone allowed AddTags sets it): the table's own record does. An index
    # read may lag behind the table: decide on a fresh read of the job
    job = deps.store.find_job_by_training_job(change.training_job_name)
    if job is None:
        return _apply_external(deps, change, confirmed=confirmed)
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


def _apply_to_job(deps: Dependencies, job: Job, change: TrainingJobChange, *, confirmed: bool = False) -> str:
    now = deps.now()
    name = change.training_job_name
    if job.training_job_name != name:
        if change.status == "InProgress" and job.started(name, change.tags):
            # An attempt of ours that is not the job's current one (every create is recorded first, so
            # this is a create that answered an error but went through): it must not hold instances. Its
            # seal proves it ours; a job merely tagged with this job's name is someone else's to run.
            _stop_quietly(deps, name, job.name)
            return "stopped: not the job's current attempt"
        if change.ended:
            _track_warm_pool(deps, change, job.name, confirmed=confirmed)
        return "ignored: not the job's current attempt"
    was = job.state
    if change.status == "InProgress":
        outcome = "no change"
        if was is JobState.STARTING and change.capacity_wait != job.capacity_wait:
            # SageMaker accepted the attempt but has no instances for it yet (docs/adr/0017): it keeps its
            # place in the pool and says what it waits for, since when.
            job.capacity_wait = change.capacity_wait
            if change.capacity_wait is not None:
                job.reason = change.capacity_wait.describe()
                outcome = job.reason
            else:
                job.reason = None
                outcome = "launching"
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
    if (
        target not in TRANSITIONS[was]
        and reason == STOPPED_EXTERNALLY
        and JobState.STOPPING in TRANSITIONS[was]
    ):
        # Stopped outside sagequeue: the stop nobody here asked for is recorded on the way to its end.
        job.transition(JobState.STOPPING, now, reason=reason)
    if target not in TRANSITIONS[job.state]:
        return f"ignored: a {was.value} job cannot become {target.value}"
    if target is JobState.QUEUED:
        if job.stop_reason is not None and job.stop_reason.requeues and was is JobState.PREEMPTING:
            job.count_requeue()
        elif _ran_out_of_capacity(job, change):
            job.capacity_requeues += 1
            job.not_before = now + timedelta(seconds=_backoff(deps, job.capacity_requeues))
        else:
            job.retries += 1
            job.not_before = now + timedelta(seconds=_backoff(deps, job.retries))
        job.stop_reason = None
    job.count_ended_attempt(change.seconds_trained)
    job.transition(target, now, reason=reason)
    # The pool is counted before the attempt stops counting: a crash in between over-counts for a
    # moment (the reconcile drops what is not Available), never lets a pass overbook.
    _track_warm_pool(deps, change, job.name, confirmed=confirmed)
    deps.store.save_job(job, was=was)
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
        if job.stop_reason is not None and not job.stop_reason.requeues:
            # stopped on purpose (cancel, idle, policy) and failed on the way down: the purpose decides
            return job.stop_reason.final_state, reason
        kind = classify_failure(change.failure_reason)
        if kind is FailureKind.CAPACITY:
            # Scarcity, not a fault of the job: it waits its turn again, backing off, however often.
            return JobState.QUEUED, f"requeued: SageMaker ran out of capacity: {reason}"
        if kind is not FailureKind.JOB:
            if job.retries + 1 < deps.settings.max_attempts:
                return JobState.QUEUED, f"retrying after {kind.value} failure: {reason}"
            return JobState.FAILED, f"gave up after {job.retries + 1} attempts: {reason}"
        return JobState.FAILED, reason
    # Stopped
    if job.stop_reason is None and _pending_expired(change):
        return JobState.QUEUED, (
            "requeued: its training plan had no capacity for it within MaxPendingTimeInSeconds"
        )
    if change.secondary_status in _SAGEMAKER_STOPS and job.stop_reason is None:
        return JobState.FAILED, f"stopped by SageMaker: {change.secondary_status}"
    if job.stop_reason is not None:
        # Governance records why it stopped an idle or rule-breaking attempt; keep that as the final reason.
        recorded = job.reason if job.stop_reason in (StopReason.IDLE, StopReason.POLICY) else None
        return job.stop_reason.final_state, recorded or f"stopped: {job.stop_reason.value}"
    return JobState.CANCELLED, STOPPED_EXTERNALLY


def behind_capacity_backoff(queued: Iterable[Job], now: datetime) -> dict[str, str]:
    """Queued jobs that must not start yet because a more important job of their pool backs off after
    SageMaker ran out of capacity for it (docs/adr/0017), with why. Started in its place, a less important
    job would take the EC2 (or plan) capacity the backing-off job waits for, and be first in line for it."""
    jobs = list(queued)
    backing_off: dict[str, Job] = {}
    for job in jobs:
        if job.capacity_requeues and job.not_before is not None and job.not_before > now:
            ahead = backing_off.get(job.pool)
            if ahead is None or job.priority > ahead.priority:
                backing_off[job.pool] = job
    held: dict[str, str] = {}
    for job in jobs:
        ahead = backing_off.get(job.pool)
        if ahead is not None and ahead is not job and job.priority < ahead.priority:
            held[job.name] = (
                f"waiting: {ahead.name} (priority {ahead.priority}) goes first; it backs off until "
                f"{ahead.not_before.strftime('%Y-%m-%dT%H:%M:%SZ')} after SageMaker ran out of capacity"  # type: ignore[union-attr]
            )
    return held


def _pending_expired(change: TrainingJobChange) -> bool:
    """SageMaker stopped the attempt because it waited in Pending (for its training plan's capacity) for
    StoppingCondition.MaxPendingTimeInSeconds: it never launched, and its Pending phase lasted that long.
    SageMaker gives it no secondary status of its own (it ends Stopped/Stopped)."""
    if change.status != "Stopped" or change.training_start_time is not None:
        return False
    stopping = change.detail.get("StoppingCondition")
    limit = stopping.get("MaxPendingTimeInSeconds") if isinstance(stopping, Mapping) else None
    transitions = change.detail.get("SecondaryStatusTransitions")
    if not isinstance(limit, int | float) or not isinstance(transitions, list):
        return False
    for transition in transitions:
        if isinstance(transition, Mapping) and transition.get("Status") == "Pending":
            start, end = parse_time(transition.get("StartTime")), parse_time(transition.get("EndTime"))
            if start is not None and end is not None and (end - start).total_seconds() >= limit:
                return True
    return False


def _ran_out_of_capacity(job: Job, change: TrainingJobChange) -> bool:
    """The attempt ended because SageMaker had no instances for it (EC2's or its plan's)."""
    if change.status == "Failed":
        return classify_failure(change.failure_reason) is FailureKind.CAPACITY
    return job.stop_reason is None and _pending_expired(change)


def _backoff(deps: Dependencies, retries: int) -> int:
    base = deps.settings.retry_backoff_seconds
    return int(min(base * 2 ** max(retries - 1, 0), deps.settings.max_backoff_seconds))


def _announce_end(deps: Dependencies, job: Job, target: JobState) -> None:
    if target is JobState.QUEUED:
        count(REQUEUES)
        announce(
            deps.publisher,
            EventType.JOB_REQUEUED,
            {"name": job.name, "attempt": job.attempt, "reason": job.reason},
        )
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


def _track_warm_pool(
    deps: Dependencies, change: TrainingJobChange, job_name: str | None, *, confirmed: bool = False
) -> None:
    """An ended job with a keep-alive leaves its instances Available for a matching job; count them.

    An event's WarmPoolStatus is a snapshot: a late or repeated Stopped event still says Available after
    another job reused the pool. Unless `change` is a DescribeTrainingJob answer of just now, SageMaker is
    asked before the pool is counted, so a pool already reused is never tracked again (a phantom pool)."""
    if change.keep_alive_seconds <= 0:
        return
    if change.warm_pool_status is not None and change.warm_pool_status != "Available":
        deps.store.forget_warm_pool(change.training_job_name)
        if change.warm_pool_status == "Terminated" and _not_retained(deps, change):
            if confirmed:
                _learn_warm_pool_quota(deps, change)
            else:
                try:
                    now_said = parse_description(deps.sagemaker.describe(change.training_job_name))
                except SageMakerError:
                    return  # unconfirmed: learn nothing from a hint
                if now_said.warm_pool_status == "Terminated" and _not_retained(deps, now_said):
                    _learn_warm_pool_quota(deps, now_said)
        return
    if change.warm_pool_status is None and change.training_start_time is None:
        return  # never launched: nothing was retained
    if not confirmed:
        try:
            described = deps.sagemaker.describe(change.training_job_name)
        except TrainingJobNotFound:
            deps.store.forget_warm_pool(change.training_job_name)
            return
        except SageMakerError as exc:
            # Unknown: count it (over-counting only delays a start); the reconcile checks it again.
            logger.warning(
                "warm pool not confirmed", extra={"warm_pool": change.training_job_name, "error": str(exc)}
            )
        else:
            _track_warm_pool(deps, parse_description(described), job_name, confirmed=True)
            return
    key = ResourceKey.from_request(change.detail)
    if key is None:
        return
    ended = change.training_end_time or deps.now()
    expires = ended + timedelta(seconds=change.keep_alive_seconds)
    if expires <= deps.now():
        return
    deps.store.track_warm_pool(TrackedWarmPool(change.training_job_name, key, expires, job_name))
    if confirmed:
        _forget_warm_quota_exceeded(deps, key.pool)


def _forget_warm_quota_exceeded(deps: Dependencies, pool: str) -> None:
    """SageMaker now retains more of `pool` than the warm-pool quota sagequeue saw: it was raised."""
    status = next((s for s in deps.store.pools() if s.pool.instance_type == pool), None)
    if status is None or status.warm_quota is None:
        return
    kept = sum(w.resource_key.instance_count for w in deps.store.warm_pools() if w.resource_key.pool == pool)
    if kept > status.warm_quota:
        deps.store.forget_warm_quota(pool)


def _not_retained(deps: Dependencies, change: TrainingJobChange) -> bool:
    """A pool SageMaker terminated as its job ended, long before its keep-alive ran out: not retained, as
    AWS does beyond the account's warm-pool quota (0 by default). A pool released (keep-alive 0), reused
    or expired does not look like this."""
    ended = change.training_end_time
    if ended is None or change.training_start_time is None or not change.ended:
        return False
    if change.status == "Failed" and classify_failure(change.failure_reason) is not FailureKind.JOB:
        return False  # an internal or capacity failure leaves no cluster to retain
    return (deps.now() - ended).total_seconds() < min(change.keep_alive_seconds, _NOT_RETAINED_WINDOW)


def _learn_warm_pool_quota(deps: Dependencies, change: TrainingJobChange) -> None:
    """SageMaker did not retain a pool: what it keeps Available for us of that type now is the account's
    warm-pool quota (ADR 0017), remembered like the instance quota."""
    if len(change.demand) != 1:
        return
    (pool,) = change.demand
    if pool not in {status.pool.instance_type for status in deps.store.pools()}:
        return
    kept = sum(
        warm.resource_key.instance_count
        for warm in deps.store.warm_pools()
        if warm.resource_key.pool == pool and warm.expires_at > deps.now()
    )
    deps.store.record_warm_quota(pool, kept, deps.now())
    logger.warning(
        "warm pool not retained: the account's warm-pool quota is reached",
        extra={"pool": pool, "warm_quota": kept, "training_job_name": change.training_job_name},
    )


def keep_alive_within_warm_quota(
    keep_alive_seconds: int | None,
    demand: Mapping[str, int],
    held_warm: Mapping[str, int],
    warm_quota: int | None,
) -> int | None:
    """The keep-alive a start may ask for: none when the pool it would leave goes beyond the warm-pool
    quota SageMaker showed (the pool would not be retained, and a warm start planned on it never comes)."""
    if not keep_alive_seconds or warm_quota is None or len(demand) != 1:
        return keep_alive_seconds
    (count,) = demand.values()
    (pool,) = demand
    return keep_alive_seconds if held_warm.get(pool, 0) + count <= warm_quota else None


def _apply_external(deps: Dependencies, change: TrainingJobChange, *, confirmed: bool = False) -> str:
    """A training job sagequeue did not start: it counts against a managed pool while it holds instances."""
    managed = {status.pool.instance_type for status in deps.store.pools()}
    if not managed & set(change.demand):
        return "ignored: not on a managed pool"
    if change.ended:
        _track_warm_pool(deps, change, None, confirmed=confirmed)
        deps.store.forget_external_attempt(change.training_job_name)
        return "external attempt ended"
    deps.store.record_external_attempt(
        ExternalAttempt(
            change.training_job_name,
            dict(change.demand),
            change.creation_time or deps.now(),
        )
    )
    return "external attempt recorded"


def _settle_warm_pools(deps: Dependencies, key: ResourceKey | None, started: str) -> str | None:
    """After a start that may have taken a warm pool: SageMaker, not sagequeue, picks which matching
    Available pool a job reuses (the oldest), so every tracked pool of the same key is checked and the
    ones no longer Available are dropped. Same-key pools are interchangeable capacity. Returns the pool
    the start really reused, if sagequeue tracked it."""
    donor: str | None = None
    if key is None:
        return None
    for warm in deps.store.warm_pools():
        if warm.resource_key != key:
            continue
        try:
            status = deps.sagemaker.describe(warm.training_job_name).get("WarmPoolStatus") or {}
        except TrainingJobNotFound:
            deps.store.forget_warm_pool(warm.training_job_name)
            continue
        except SageMakerError as exc:
            logger.warning(
                "warm pool not checked", extra={"warm_pool": warm.training_job_name, "error": str(exc)}
            )
            continue
        if status.get("Status") != "Available":
            deps.store.forget_warm_pool(warm.training_job_name)
            if status.get("ReusedByJob") == started:
                donor = warm.training_job_name
    return donor


# --- reconcile (the timer) ---------------------------------------------------------------------------------------


def reconcile(deps: Dependencies) -> PassReport:
    """Bring the table in line with what SageMaker holds, so a lost event, a crash or a lost table only
    delays: a missed end is applied, a stop that did not land is repeated, a gone warm pool is dropped, an
    Available pool nobody tracks is adopted, an attempt of ours that is not its job's current one is
    stopped, and a live attempt the table lost is entered again from its tags.

    SageMaker is read by listing (InProgress jobs, Available warm pools; all pages, as its filters apply
    after MaxResults) and described only where a list cannot tell: a live attempt that is no longer
    InProgress, a pool or job it has not seen before. One job that cannot be handled is logged, counted
    and skipped; it never stops the others."""
    report = PassReport()
    managed = _ensure_configured_pools(deps)
    in_progress = _listed(deps, StatusEquals="InProgress")
    live_names: set[str] = set()
    for job in deps.store.live_jobs():
        if job.training_job_name:
            live_names.add(job.training_job_name)
        _guarded(report, job.name, _reconcile_live, deps, job, in_progress, report)
    externals = deps.store.external_attempts()
    for external in externals:
        _guarded(
            report,
            external.training_job_name,
            _reconcile_external,
            deps,
            external,
            in_progress,
            report,
        )
    known = live_names | {external.training_job_name for external in externals}
    if in_progress is not None:
        for name, summary in in_progress.items():
            if name not in known:
                _guarded(report, name, _sweep, deps, summary, managed, report)
    _reconcile_warm_pools(deps, report, managed)
    return report


def _guarded(report: PassReport, subject: str, step: Callable[..., Any], *args: Any) -> None:
    """Run one job's step; a failure (a poisoned item, a refused write) is logged, counted and skipped."""
    try:
        step(*args)
    except Exception as exc:  # noqa: BLE001 - one bad job must not stop the others
        logger.exception("skipped after an error", extra={"subject": subject})
        count(SKIPPED_ON_ERROR)
        report.applied.append(f"{subject}: skipped ({type(exc).__name__})")


def _ensure_configured_pools(deps: Dependencies) -> set[str]:
    """A table restored or recreated has lost its pools: enter the deploy-time capacity again. Returns the
    managed pools (read once per reconcile)."""
    present = {status.pool.instance_type for status in deps.store.pools()}
    if set(deps.settings.capacity) - present:
        deps.store.seed_pools(deps.settings.capacity)
    return present | set(deps.settings.capacity)


def _listed(deps: Dependencies, **filters: Any) -> dict[str, dict[str, Any]] | None:
    """Every summary matching `filters` by name; None when SageMaker could not be listed (the caller
    falls back to describing what it tracks)."""
    # No training job runs longer than 28 days and a warm pool does not outlive that either: older jobs
    # are left out, so the pages do not grow with the account's history.
    since = deps.now() - timedelta(days=_LISTED_DAYS)
    try:
        return {
            summary["TrainingJobName"]: summary
            for summary in deps.sagemaker.list_training_jobs(
                MaxResults=100, CreationTimeAfter=since, **filters
            )
        }
    except SageMakerError as exc:
        logger.warning("listing failed", extra={"filters": filters, "error": str(exc)})
        return None


def _reconcile_live(
    deps: Dependencies, job: Job, in_progress: Mapping[str, Mapping[str, Any]] | None, report: PassReport
) -> None:
    name = job.training_job_name
    if not name:
        return
    summary = in_progress.get(name) if in_progress is not None else None
    if summary is None:
        try:
            described = deps.sagemaker.describe(name)
        except TrainingJobNotFound:
            if _create_may_be_in_flight(deps, job):
                report.applied.append(f"{name}: not created yet; its pass may be inside the create")
                return
            outcome = _with_retries(deps, job.name, lambda fresh: _vanished(deps, fresh, name))
            report.applied.append(f"{name}: {outcome}")
            return
        except SageMakerError as exc:
            logger.warning("describe failed", extra={"job": job.name, "error": str(exc)})
            return
        change = parse_description(described)
    else:
        change = parse_description(summary)  # the list says all an InProgress attempt needs
    if job.state in (JobState.PREEMPTING, JobState.STOPPING) and change.status == "InProgress":
        if _stop_quietly(deps, name, job.name):
            report.applied.append(f"{name}: stop repeated")
        return
    if summary is not None and job.state is JobState.STARTING and change.secondary_status in _MAY_WAIT:
        # A list's summary has no transitions, and only they say whether the attempt waits for capacity:
        # an event saying so may be lost (ADR 0017). Few attempts are starting at once.
        try:
            change = parse_description(deps.sagemaker.describe(name))
        except SageMakerError as exc:
            logger.warning("describe failed", extra={"job": job.name, "error": str(exc)})
            return
        if change.capacity_wait != job.capacity_wait:
            report.applied.append(f"{name}: {_apply_described(deps, job.name, change)}")
        return
    if (
        summary is not None
        and not (job.state is JobState.STARTING and change.secondary_status not in _NOT_YET_RUNNING)
        and not (job.training_started_at is None and change.secondary_status in _TRAINING_OR_LATER)
    ):
        return  # InProgress and recorded as such (its training too, once it trains): nothing to do
    report.applied.append(f"{name}: {_apply_described(deps, job.name, change)}")


def _reconcile_external(
    deps: Dependencies,
    external: ExternalAttempt,
    in_progress: Mapping[str, Mapping[str, Any]] | None,
    report: PassReport,
) -> None:
    name = external.training_job_name
    if in_progress is not None and name in in_progress:
        return
    try:
        change = parse_description(deps.sagemaker.describe(name))
    except TrainingJobNotFound:
        deps.store.forget_external_attempt(name)
        return
    if change.ended:
        report.applied.append(f"{name}: {_apply_external(deps, change, confirmed=True)}")


def _sweep(deps: Dependencies, summary: Mapping[str, Any], managed: set[str], report: PassReport) -> None:
    """An InProgress training job the table does not count: stop it if it is an attempt of ours that is
    not its job's current live attempt (a cancel that won a race, a create that answered an error but went
    through), enter it again if its job is gone from the table, count it if it is someone else's."""
    name = str(summary["TrainingJobName"])
    if deps.store.get_claim(_FOREIGN, name) is not None:
        return  # seen before: not ours, not on a managed pool
    arn = summary.get("TrainingJobArn")
    tags = deps.sagemaker.tags(str(arn)) if arn else {}
    owner = tags.get(JOB_TAG)
    job = deps.store.find_job(owner) if owner is not None else None
    if owner is None or (job is not None and not job.started(name, tags)):
        # not ours: no tag, or the tag of a queue entry whose attempt it is not (its seal does not verify)
        change = parse_description(deps.sagemaker.describe(name))
        if managed & set(change.demand):
            report.applied.append(f"{name}: {_apply_external(deps, change, confirmed=True)}")
        else:
            deps.store.claim(_FOREIGN, name)
        return
    if job is None:
        report.applied.append(f"{name}: {_rebuild(deps, name, tags)}")
        return
    if job.training_job_name == name and job.state.is_live:
        return  # counted: the live index had not caught up
    _stop_quietly(deps, name, owner)
    report.applied.append(f"{name}: stopped: not the current attempt of {owner} ({job.state.value})")


#: Fields of a DescribeTrainingJob answer that are CreateTrainingJob parameters (to re-enter a lost job).
_REQUEST_FIELDS = (
    "AlgorithmSpecification",
    "RoleArn",
    "InputDataConfig",
    "OutputDataConfig",
    "ResourceConfig",
    "VpcConfig",
    "StoppingCondition",
    "HyperParameters",
    "EnableNetworkIsolation",
    "EnableInterContainerTrafficEncryption",
    "EnableManagedSpotTraining",
    "CheckpointConfig",
    "Environment",
    "RetryStrategy",
    "DebugHookConfig",
    "TensorBoardOutputConfig",
)


def _rebuild(deps: Dependencies, training_job_name: str, tags: Mapping[str, str]) -> str:
    """The table lost the job of a live attempt tagged as ours (restored from an old backup, recreated):
    enter it again as a live job, so its instances are counted and its work is not lost.

    Its seal cannot be verified: the secret that made it was in the lost table. So nothing its tags say
    decides its standing (anyone allowed CreateTrainingJob can create a job tagged as our attempt, with a
    priority and a submitter of their choosing): it is entered at the lowest priority, and with no owner
    (only an admin may change or cancel it). Its team is the one TeamExecutionRoles gives its execution role
    to, when that is exactly one team: an admin's word, not the tags' (only that team's principals may pass
    the role); else none (it draws on no team's quota: it only borrows, and any team under its quota may
    reclaim it), and its alarms read the namespace its own Environment names (`governance.alarm_team`).
    The tags are kept in its history and announced (`JobEnteredAgain`) for an admin to restore what is
    right."""
    described = deps.sagemaker.describe(training_job_name)
    change = parse_description(described)
    if change.ended:
        return "ended meanwhile"
    name = tags[JOB_TAG]
    request: dict[str, Any] = {key: described[key] for key in _REQUEST_FIELDS if key in described}
    request["TrainingJobName"] = name
    # sagequeue's tags are the queue's to set; a priority tag is an input of a submission, which this is not
    request["Tags"] = [
        {"Key": k, "Value": v}
        for k, v in tags.items()
        if not k.startswith(("sagequeue:", "aws:")) and k != PRIORITY_TAG
    ]
    now = deps.now()
    started = change.creation_time or now
    try:
        attempt = max(1, int(tags.get(ATTEMPT_TAG) or 1))
    except ValueError:
        attempt = 1
    running = change.secondary_status not in _NOT_YET_RUNNING
    claimed = {
        "owner": tags.get(SUBMITTED_BY_TAG),
        "priority": tags.get(PRIORITY_TAG),
        "team": tags.get(deps.settings.team_tag) if deps.settings.team_tag else None,
    }
    said = ", ".join(f"{key} {value!r}" for key, value in claimed.items() if value) or "nothing more"
    role_teams = deps.settings.teams_of_role(str(described.get("RoleArn") or ""))
    team = role_teams[0] if len(role_teams) == 1 else None
    standing = f"team {team!r} (its execution role's, TeamExecutionRoles)" if team else "no team"
    job = Job(
        name=name,
        request=request,
        priority=PRIORITY_MIN,
        owner=UNVERIFIED_OWNER,
        team=team,
        submitted_at=started,
        state=JobState.RUNNING if running else JobState.STARTING,
        attempt=attempt,
        training_job_name=training_job_name,
        started_at=started,
        reason=(
            f"entered again after the table lost it, from training job {training_job_name}, whose seal "
            f"cannot be verified: lowest priority, {standing}, no owner until an admin sets them (its tags "
            f"say {said})"
        ),
    )
    job.history.append(
        {"at": now.isoformat(), "state": job.state.value, "attempt": attempt, "reason": job.reason}
    )
    try:
        deps.store.create_job(job)
    except JobAlreadyExists:
        return "entered meanwhile"
    count(JOBS_REBUILT)
    announce(
        deps.publisher,
        EventType.JOB_ENTERED_AGAIN,
        {
            "job": name,
            "training_job_name": training_job_name,
            "state": job.state.value,
            "priority": job.priority,
            "owner": job.owner,
            "team": job.team,
            "tagged": {key: value for key, value in claimed.items() if value},
            "reason": job.reason,
        },
    )
    return f"entered again as {job.state.value}, unverified"


def _reconcile_warm_pools(deps: Dependencies, report: PassReport, managed: set[str]) -> None:
    """Tracked pools that are no longer Available are dropped; Available pools of managed instance types
    that nobody tracks (a crash between steps, a lost event, a lost table) are adopted."""
    now = deps.now()
    available = _listed(deps, WarmPoolStatusEquals="Available")
    tracked: set[str] = set()
    for warm in deps.store.warm_pools():
        tracked.add(warm.training_job_name)
        if warm.expires_at <= now:
            deps.store.forget_warm_pool(warm.training_job_name)
        elif available is not None:
            if warm.training_job_name not in available:
                deps.store.forget_warm_pool(warm.training_job_name)
        else:
            _guarded(report, warm.training_job_name, _confirm_warm_pool, deps, warm.training_job_name)
    if available is None:
        return
    for name in available:
        if name not in tracked:
            _guarded(report, name, _adopt_warm_pool, deps, name, managed, report)


def _confirm_warm_pool(deps: Dependencies, training_job_name: str) -> None:
    try:
        described = deps.sagemaker.describe(training_job_name)
    except TrainingJobNotFound:
        deps.store.forget_warm_pool(training_job_name)
        return
    if (described.get("WarmPoolStatus") or {}).get("Status") != "Available":
        deps.store.forget_warm_pool(training_job_name)


def _adopt_warm_pool(
    deps: Dependencies, training_job_name: str, managed: set[str], report: PassReport
) -> None:
    change = parse_description(deps.sagemaker.describe(training_job_name))
    if not managed & set(change.demand) or change.warm_pool_status != "Available":
        return
    _track_warm_pool(deps, change, change.tags.get(JOB_TAG), confirmed=True)
    report.applied.append(f"{training_job_name}: untracked warm pool adopted")


def _apply_described(deps: Dependencies, job_name: str, change: TrainingJobChange) -> str:
    return _with_retries(deps, job_name, lambda fresh: _apply_to_job(deps, fresh, change))


def _create_may_be_in_flight(deps: Dependencies, job: Job) -> bool:
    """An intent younger than INTENT_IN_FLIGHT_SECONDS: the pass that wrote it may not have reached
    SageMaker yet. Called lost now, the job would be requeued and its instances given to others while the
    create still lands (a pass beside the one creating: SageMaker would hold more than the pool)."""
    if job.state is not JobState.STARTING or job.started_at is None:
        return False
    return (deps.now() - job.started_at).total_seconds() < INTENT_IN_FLIGHT_SECONDS


def _vanished(deps: Dependencies, job: Job, training_job_name: str) -> str:
    """SageMaker has no such training job: never created (a crash between the intent and the create), or
    deleted by hand. The attempt is over; the job goes back to the queue, or ends as its stop asked."""
    if not job.state.is_live or job.training_job_name != training_job_name:
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


# --- team quotas ---------------------------------------------------------------------------------------------------


def _team_usage(
    deps: Dependencies,
    quotas: list[TeamQuota],
    counter: UsageCounter | None,
    live: Iterable[Job],
    now: datetime,
) -> dict[str, float]:
    """The fair-share counter, advanced to `now` by what each team holds and stored (conditionally: of two
    racing passes, one advances it). Nothing to write without quotas."""
    if not quotas:
        return {}
    holding: Counter[str] = Counter()
    for job in live:
        holding[job.team or NO_TEAM] += sum(job.demand.values())
    advanced = (counter or UsageCounter(as_of=now)).advance(
        now, holding, deps.settings.fair_share_half_life_seconds
    )
    if counter is None or advanced.as_of != counter.as_of:
        deps.store.save_usage_counter(advanced, was=counter)
    return dict(advanced.hours)


def _announce_quota_moves(
    deps: Dependencies,
    snapshot: Snapshot,
    actions: Iterable[Action],
    queued: Mapping[str, Job],
    live: Mapping[str, Job],
) -> None:
    """Events for starts on borrowed capacity and for reclaims, and a gauge per team and pool."""
    if not snapshot.team_quotas:
        return
    ledger = TeamLedger(snapshot.team_quotas, snapshot.capacity, snapshot.running)
    for action in actions:
        if isinstance(action, Start) and action.job_name in queued:
            job = queued[action.job_name]
            ledger.take(job.team, job.demand)
            for pool in job.demand:
                borrowed = ledger.share(job.team or NO_TEAM, pool).borrowed if ledger.governs(pool) else 0
                if borrowed > 0:
                    announce(
                        deps.publisher,
                        EventType.QUOTA_BORROWED,
                        {"name": job.name, "team": job.team, "pool": pool, "borrowed": borrowed},
                    )
        elif isinstance(action, Preempt):
            victim = live.get(action.job_name)
            for_job = queued.get(action.for_job)
            if victim is not None and for_job is not None and victim.team != for_job.team:
                announce(
                    deps.publisher,
                    EventType.QUOTA_RECLAIMED,
                    {
                        "name": victim.name,
                        "team": victim.team,
                        "for_job": for_job.name,
                        "for_team": for_job.team,
                        "pool": victim.pool,
                    },
                )
    for share in ledger.shares():
        team_gauge(TEAM_USED, team_label(share.team), share.pool, share.used)
        team_gauge(TEAM_BORROWED, team_label(share.team), share.pool, share.borrowed)


# --- one pass ------------------------------------------------------------------------------------------------------


def run_pass(deps: Dependencies) -> PassReport:
    deps.ensure_pools()
    now = deps.now()
    settings = deps.settings
    report = PassReport()
    pool_statuses, team_quotas, counter = deps.store.pools_and_teams()
    capacity = {status.pool.instance_type: status.pool.capacity for status in pool_statuses}
    queued: dict[str, Job] = {}
    for instance_type in capacity:
        # jobs wider than the pool cannot start: they must not fill the window (GET /jobs says why they wait)
        fitting = capacity[instance_type] or None
        window = deps.store.queued_jobs(instance_type, settings.queue_lookahead, fitting=fitting)
        queued.update((job.name, job) for job in window)
        _queue_metrics(instance_type, window, now)
        for team in sorted({q.team for q in team_quotas if q.pool == instance_type}):
            # each team with a quota here has a window of its own: one team's flood cannot hide another's
            own = deps.store.queued_jobs(instance_type, settings.queue_lookahead, fitting=fitting, team=team)
            queued.update((job.name, job) for job in own)
    for status in pool_statuses:
        pool_gauge(QUEUE_DEPTH, status.pool.instance_type, status.queued)
    live = {job.name: job for job in deps.store.live_jobs()}
    _add_unindexed_starts(deps, pool_statuses, live, now)
    read_checkpoints(deps, live.values())
    externals = deps.store.external_attempts()
    warm_pools = []
    for warm in deps.store.warm_pools():
        if warm.expires_at > now:
            warm_pools.append(warm)
        else:
            deps.store.forget_warm_pool(warm.training_job_name)
    team_usage = _team_usage(deps, team_quotas, counter, live.values(), now)
    by_type = _held_by_type(live.values(), externals, warm_pools)
    quota = _quota_limits(pool_statuses, by_type, queued.values(), now)
    held_back = behind_capacity_backoff(queued.values(), now)
    snapshot = build_snapshot(
        now=now,
        capacity=capacity,
        quota=quota,
        queued=[job for job in queued.values() if job.name not in held_back],
        live=live.values(),
        external=externals,
        warm_pools=warm_pools,
        team_quotas=team_quotas,
        team_usage=team_usage,
    )
    decided = plan(snapshot, policy_settings(settings))
    _announce_quota_moves(deps, snapshot, decided.actions, queued, live)
    report.waiting.update(decided.waiting)
    report.waiting.update(held_back)
    statuses = {status.pool.instance_type: status for status in pool_statuses}
    # each pool's ledger as this pass read it, before the live jobs: a start is recorded only if no other
    # pass started on its pools since (and moves the ledger on, here and in the table)
    ledger = {status.pool.instance_type: status.ledger for status in pool_statuses}
    held: Counter[str] = Counter()
    for attempt in snapshot.running:
        held.update(attempt.demand)
    warm_by_name = {pool.training_job_name: pool for pool in snapshot.warm_pools}
    for retained in snapshot.warm_pools:
        held[retained.pool] += retained.instances
    blocked: set[str] = set()  # jobs whose capacity a failed release did not free
    warm_held: Counter[str] = Counter()
    for retained in snapshot.warm_pools:
        warm_held[retained.pool] += retained.instances
    warm_quotas = {pool: status.warm_quota_at(now) for pool, status in statuses.items()}
    for action in decided.actions:
        if isinstance(action, Preempt):
            _guarded(report, action.job_name, _preempt, deps, action, report)
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
            demand = queued[action.job_name].demand
            keep = keep_alive_within_warm_quota(
                action.keep_alive_seconds, demand, warm_held, warm_quotas.get(next(iter(demand)))
            )
            if keep != action.keep_alive_seconds:
                action = dataclasses.replace(action, keep_alive_seconds=keep)
            elif keep:
                warm_held.update(demand)  # the pool it leaves counts toward the quota of the next start
            _guarded(
                report,
                action.job_name,
                _start,
                deps,
                queued[action.job_name],
                action,
                report,
                held,
                statuses,
                ledger,
                by_type,
            )
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


#: How long a start is re-read by key rather than trusted to the live index (GSIs are eventually
#: consistent; their lag is normally well under a second).
INDEX_LAG_SECONDS = 120


def _add_unindexed_starts(
    deps: Dependencies, pool_statuses: list[PoolStatus], live: dict[str, Job], now: datetime
) -> None:
    """Capacity decisions never rest on the live index alone: jobs that recently left the queue (recorded on
    their pool's item, read consistently) and that the index does not show yet are read by key."""
    for status in pool_statuses:
        stale = []
        for at, name in status.recent_starts:
            if (now - at).total_seconds() > INDEX_LAG_SECONDS:
                stale.append((at, name))
            elif name not in live:
                job = deps.store.find_job(name)
                if job is not None and job.state.is_live:
                    live[name] = job
        if stale:
            deps.store.forget_recent_starts(status.pool.instance_type, stale)


def _held_by_type(
    live: Iterable[Job], externals: Iterable[ExternalAttempt], warm_pools: Iterable[TrackedWarmPool]
) -> Counter[tuple[str, str]]:
    """Instances SageMaker holds for the account per (instance type, pool): the account's quota is per
    instance type, whatever pool (on-demand or a training plan's) the instances are counted in."""
    held: Counter[tuple[str, str]] = Counter()
    for job in live:
        pool = job.pool
        for instance_type, n in demand_of(job.request).items():
            held[instance_type, pool] += n
    for external in externals:
        for pool, n in external.demand.items():
            held[pool, pool] += n  # started by hand on a managed pool: an instance-type pool
    for warm in warm_pools:
        held[warm.resource_key.instance_type, warm.resource_key.pool] += warm.resource_key.instance_count
    return held


def _quota_limits(
    pool_statuses: Iterable[PoolStatus],
    by_type: Mapping[tuple[str, str], int],
    queued: Iterable[Job],
    now: datetime,
) -> dict[str, int]:
    """What each pool may hold under the account's quotas learned from refusals, where below its capacity.

    A quota learned for an instance type (stored on that type's pool) is shared by every pool of the type:
    a pool may hold the quota minus what the other pools of the type hold. A quota stored on a training
    plan's pool (no on-demand pool of its type to carry it) limits that pool alone."""
    statuses = list(pool_statuses)
    by_type_quota = {s.pool.instance_type: q for s in statuses if (q := s.quota_at(now)) is not None}
    types_in: dict[str, set[str]] = {}
    for (instance_type, pool), n in by_type.items():
        if n > 0:
            types_in.setdefault(pool, set()).add(instance_type)
    for job in queued:
        types_in.setdefault(job.pool, set()).update(demand_of(job.request))
    limits: dict[str, int] = {}
    for status in statuses:
        pool, capacity = status.pool.instance_type, status.pool.capacity
        candidates = []
        if pool in by_type_quota:
            candidates.append(
                by_type_quota[pool] - sum(n for (t, p), n in by_type.items() if t == pool and p != pool)
            )
        for instance_type in types_in.get(pool, set()) - {pool}:
            if instance_type in by_type_quota:
                elsewhere = sum(n for (t, p), n in by_type.items() if t == instance_type and p != pool)
                candidates.append(by_type_quota[instance_type] - elsewhere)
        if candidates and (limit := max(min(candidates), 0)) < capacity:
            limits[pool] = limit
    return limits


def _learn_quota(
    deps: Dependencies, job: Job, exc: ResourceLimitExceeded, by_type: Mapping[tuple[str, str], int]
) -> None:
    """SageMaker refused a create for the account's quota of an instance type. Its message states the quota
    and the account's current use of the type: the queue may hold the quota minus what others use. A
    message without the figures leaves what the queue holds of the type as the best guess (a heterogeneous
    job then does not say which of its types hit the limit)."""
    held = Counter[str]()
    for (instance_type, _), n in by_type.items():
        held[instance_type] += n
    memory = QUOTA_MEMORY_SECONDS
    if exc.instance_type is not None and exc.limit is not None:
        instance_type = exc.instance_type
        outside = max((exc.utilization or 0) - held[instance_type], 0)
        limit = max(exc.limit - outside, 0)
        memory = STATED_QUOTA_MEMORY_SECONDS
    else:
        types = demand_of(job.request)
        if len(types) != 1:
            return
        instance_type = next(iter(types))
        limit = held[instance_type]
    known = {status.pool.instance_type for status in deps.store.pools()}
    # stored on the instance type's pool, shared by every pool of the type (`_quota_limits`)
    where = instance_type if instance_type in known else job.pool
    deps.store.record_quota(where, limit, deps.now(), memory)
    logger.warning(
        "account quota below the pool's capacity",
        extra={"instance_type": instance_type, "quota": limit, "stored_on": where, "job": job.name},
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
    written: set[str] = set()
    try:
        written.update(deps.store.note_waiting(changed))
    except Exception:  # noqa: BLE001 - one job's refused write cancels the whole request, not the pass
        logger.warning("waiting notes refused as a batch; writing them one by one", exc_info=True)
        skipped = PassReport()
        for note in changed:
            _guarded(skipped, note[0].name, lambda one: written.update(deps.store.note_waiting([one])), note)
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
    job: Job, attempt: int, keep_alive_seconds: int | None, *, token: str = "", keep_warm: bool = True
) -> dict[str, Any]:
    """The CreateTrainingJob request of attempt `attempt`: the submitted request (same CheckpointConfig,
    so training resumes from its checkpoints) under the attempt's name (its fallback name with `token`),
    with sagequeue's tags. Without `keep_warm` (a role more than one team may pass:
    `PolicySettings.keeps_warm`), it asks for no warm pool, whatever the submitted request asked."""
    request = copy.deepcopy(job.request)
    request["TrainingJobName"] = attempt_name(job.name, attempt, token)
    tags = tags_to_dict(request.get("Tags"))
    tags.update({JOB_TAG: job.name, ATTEMPT_TAG: str(attempt), SUBMITTED_BY_TAG: job.owner})
    seal = job.seal(request["TrainingJobName"])
    if seal is not None:
        tags[SEAL_TAG] = seal
    request["Tags"] = [{"Key": key, "Value": value} for key, value in tags.items()]
    if job.team:
        # Where the job image publishes its utilization: its team's namespace, the one the attempt's idle
        # alarms read and only the team's execution roles may publish to (docs/guardrails.md). A job without
        # a team publishes to the image's default namespace, as before teams.
        environment = dict(request.get("Environment") or {})
        environment[METRIC_NAMESPACE_ENV] = team_metric_namespace(job.team)
        request["Environment"] = environment
    if not keep_warm:
        config = dict(request.get("ResourceConfig") or {})
        if config.pop("KeepAlivePeriodInSeconds", None) is not None:
            request["ResourceConfig"] = config
        return request
    if keep_alive_seconds:
        config = dict(request.get("ResourceConfig") or {})
        config["KeepAlivePeriodInSeconds"] = max(
            int(config.get("KeepAlivePeriodInSeconds") or 0), keep_alive_seconds
        )
        request["ResourceConfig"] = config
    return request


def _start(
    deps: Dependencies,
    job: Job,
    action: Start,
    report: PassReport,
    held: Counter[str],
    quotas: Mapping[str, PoolStatus],
    ledger: dict[str, int] | None = None,
    by_type: Counter[tuple[str, str]] | None = None,
) -> None:
    """Intent, side effect, confirmation: the attempt is recorded (conditional on the job's version) before
    CreateTrainingJob, so a cancel or hold that wins the race leaves nothing to start, and a crash after the
    create leaves a live entry that counts the instances (the reconcile finds what happened).

    A training job outside the queue holding the attempt's name makes the attempt take a fallback name with
    a random part nobody can create ahead (`<name>--<n>x<token>`); it costs the job no attempt and never
    fails it: should every name tried in a pass be held, the job waits, saying so, for the next pass. `held` counts the instances SageMaker holds
    per pool (live attempts and warm pools, updated here); `quotas` the pools, with the account quota each
    last met. `ledger`: each pool's ledger as the pass read it (moved on by each start it records); the
    intent is written only if no other pass started on the job's pools since, so two passes never both
    start on one instance."""
    if action.warm_pool is not None and not _warm_start_is_safe(deps, job, action.warm_pool, held, quotas):
        # The plan counted the pool's instances as the job's: started cold, it would take instances the
        # ledger does not have. The job keeps its place; the next pass plans with what is really there.
        report.waiting[job.name] = f"waiting: warm pool {action.warm_pool} is no longer available"
        logger.info("warm start deferred", extra={"job": job.name, "warm_pool": action.warm_pool})
        return
    current: Job | None = job
    held_names: list[str] = []
    for choice in range(ATTEMPT_NAME_CHOICES):
        fresh_job = current or deps.store.get_job(job.name)
        if fresh_job.attempt_secret is None:
            # recorded with the intent; the attempt's seal (SEAL_TAG) is made with it
            fresh_job.attempt_secret = secrets.token_hex(ATTEMPT_SECRET_BYTES)
        attempt = fresh_job.attempt + 1
        token = secrets.token_hex(FALLBACK_TOKEN_LENGTH // 2) if choice else ""
        request = attempt_request(
            fresh_job,
            attempt,
            action.keep_alive_seconds,
            token=token,
            keep_warm=policy_settings(deps.settings).keeps_warm(fresh_job.request.get("RoleArn")),
        )
        name = request["TrainingJobName"]
        undo = partial(_not_created, deps, name=name, previous=fresh_job.training_job_name)
        planned = None if ledger is None else {pool: ledger.get(pool, 0) for pool in job.demand}
        try:
            intent = _with_retries(
                deps,
                job.name,
                partial(
                    _intent, deps, name=name, action=action, ledger=planned, secret=fresh_job.attempt_secret
                ),
                first=fresh_job,
            )
        except LedgerMoved:
            report.waiting[job.name] = "waiting: another pass started work on its pool since this one planned"
            logger.info("start abandoned: the pool's ledger moved", extra={"job": job.name})
            return
        if planned is not None and ledger is not None and intent == "started":
            for pool in planned:
                ledger[pool] = planned[pool] + 1
        if intent != "started":
            report.waiting.pop(job.name, None)
            logger.info("start abandoned", extra={"job": job.name, "attempt": attempt, "outcome": intent})
            return
        try:
            result = deps.sagemaker.create_attempt(request, job_name=job.name)
        except AttemptNameTaken:
            held_names.append(name)
            logger.warning(
                "attempt name held by a training job sagequeue did not start; trying a fallback name",
                extra={"job": job.name, "attempt": attempt, "training_job_name": name},
            )
            why = (
                f"training job{'s' if len(held_names) > 1 else ''} {', '.join(held_names)} "
                f"{'are' if len(held_names) > 1 else 'is'} held by someone else; attempt {attempt} takes "
                "another name"
            )
            # Nothing was created: the attempt's number is given back, so a foreign job costs no attempt.
            _with_retries(deps, job.name, partial(undo, why=why, release=True))
            if choice + 1 < ATTEMPT_NAME_CHOICES:
                current = None
                continue
            report.waiting[job.name] = f"waiting: {why} at the next pass"
            logger.warning("every attempt name tried is held", extra={"job": job.name, "names": held_names})
            return
        except SageMakerValidationError as exc:
            outcome = _with_retries(deps, job.name, partial(undo, refused=str(exc)))
            report.failed.append(job.name)
            logger.warning("create refused", extra={"job": job.name, "attempt": attempt, "outcome": outcome})
            return
        except SageMakerError as exc:
            # Nothing is known to be created: the job keeps its place and the next pass tries again. Had it
            # been created after all, the reconcile's sweep stops it (it is not the job's current attempt).
            if isinstance(exc, ResourceLimitExceeded):
                _learn_quota(deps, job, exc, by_type if by_type is not None else Counter())
            why = f"SageMaker {exc.code or type(exc).__name__}: {exc}"
            report.waiting[job.name] = why
            _with_retries(deps, job.name, partial(undo, why=why))
            logger.warning("create deferred", extra={"job": job.name, "attempt": attempt, "code": exc.code})
            return
        break
    (report.adopted if result.already_started else report.started).append(name)
    if action.warm_pool is None:
        held.update(job.demand)
        if by_type is not None:
            for instance_type, n in demand_of(job.request).items():
                by_type[instance_type, job.pool] += n
    for pool in job.demand:
        status = quotas.get(pool)
        if status is not None and status.quota is not None and held[pool] > status.quota:
            deps.store.forget_quota(pool)  # SageMaker granted more than the quota it once refused at
    for instance_type in demand_of(job.request):
        # a create of the type succeeded beyond the quota learned for it: raised, or freed elsewhere
        status = quotas.get(instance_type)
        of_type = sum(n for (t, _), n in (by_type or {}).items() if t == instance_type)
        if status is not None and status.quota is not None and of_type > status.quota:
            deps.store.forget_quota(instance_type)
    fresh = deps.store.get_job(job.name)
    if fresh.training_job_name != name or fresh.state not in (JobState.STARTING, JobState.RUNNING):
        # A cancel (or any stop) won the race after the intent: what was just created must not run.
        _stop_quietly(deps, name, job.name)
        logger.info("created attempt stopped", extra={"job": job.name, "state": fresh.state.value})
        return
    _announce_start(deps, fresh)
    donor = _settle_warm_pools(deps, job.resource_key, name)
    if donor != action.warm_pool:
        _with_retries(deps, job.name, lambda j: _correct_warm_start(deps, j, name, donor), first=fresh)
    if donor:
        count(WARM_POOL_REUSES)
        detail = {"name": job.name, "attempt": fresh.attempt, "training_job_name": name}
        announce(deps.publisher, EventType.WARM_POOL_REUSED, {**detail, "warm_pool_of": donor})


def _warm_start_is_safe(
    deps: Dependencies,
    job: Job,
    training_job_name: str,
    held: Mapping[str, int],
    statuses: Mapping[str, PoolStatus],
) -> bool:
    """Whether a start planned on a tracked warm pool may go ahead. A tracked pool can be a phantom: a late
    event re-tracks a pool another start already took, while DescribeTrainingJob still leaves WarmPoolStatus
    out (right after a job ends); two passes would then plan cold starts as warm ones and run the pool over
    its capacity. Available: go. Reused, InUse, Terminated or gone: no (and it is forgotten). Unknown (the
    status left out, or SageMaker not answering): go only if a cold start would fit too, that is if what
    the pool holds counting this pool (which a cold start would not use) is within its limit."""
    try:
        status = (deps.sagemaker.describe(training_job_name).get("WarmPoolStatus") or {}).get("Status")
    except TrainingJobNotFound:
        deps.store.forget_warm_pool(training_job_name)
        return False
    except SageMakerError as exc:
        logger.warning("warm pool not checked", extra={"warm_pool": training_job_name, "error": str(exc)})
        status = None
    if status == "Available":
        return True
    if status is not None:
        deps.store.forget_warm_pool(training_job_name)  # Reused, InUse or Terminated: gone for good
        return False
    for pool in job.demand:
        found = statuses.get(pool)
        if found is None:
            return False
        quota = found.quota_at(deps.now())
        limit = found.pool.capacity if quota is None else min(found.pool.capacity, quota)
        if held.get(pool, 0) > limit:
            return False
    return True


def _intent(
    deps: Dependencies,
    job: Job,
    *,
    name: str,
    action: Start,
    ledger: Mapping[str, int] | None = None,
    secret: str | None = None,
) -> str:
    """The start recorded before CreateTrainingJob (announced once SageMaker has it), conditional on the
    pools' `ledger` as the pass planned on it, with the secret that seals the attempt (a job read again
    after a concurrent write has it only if that write kept it)."""
    if job.attempt_secret is None:
        job.attempt_secret = secret
    reason = None
    if action.ends_before is not None:
        reason = (
            f"backfilled: its MaxRuntimeInSeconds ends before {action.ends_before}, which holds these "
            "instances, can start"
        )
    return _record_start(
        deps,
        job,
        name,
        deps.now(),
        reason=reason,
        warm_pool=action.warm_pool,
        keep_alive_seconds=action.keep_alive_seconds or 0,
        on_loan_for=action.on_loan_for,
        created=False,
        ledger=ledger,
    )


def _record_start(
    deps: Dependencies,
    job: Job,
    training_job_name: str,
    now: datetime,
    *,
    reason: str | None = None,
    warm_pool: str | None = None,
    keep_alive_seconds: int = 0,
    on_loan_for: str | None = None,
    created: bool = True,
    ledger: Mapping[str, int] | None = None,
) -> str:
    """Record `training_job_name` as the job's current attempt. `created` is False for the intent written
    before CreateTrainingJob: the start is announced once SageMaker has it."""
    if job.training_job_name == training_job_name and job.state in (JobState.STARTING, JobState.RUNNING):
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
    job.on_loan_for = on_loan_for
    job.training_started_at = None  # the minimum runtime counts from this attempt's own training
    job.checkpoint = None  # and its work lost from there until its own first checkpoint (docs/adr/0025)
    job.reason = None  # why it waited no longer applies
    if reason is None and warm_pool:
        reason = f"on warm pool of {warm_pool}"
    elif reason is None and on_loan_for:
        reason = f"on loan: capacity reserved for {on_loan_for}, which preempts this attempt as soon as it can start"
    job.transition(JobState.STARTING, now, reason=reason)
    deps.store.save_job(job, was=was, ledger=ledger)
    logger.append_keys(job=job.name, attempt=job.attempt)
    logger.info("attempt started", extra={"training_job_name": training_job_name, "warm_pool": warm_pool})
    logger.remove_keys(["job", "attempt"])
    if created:
        _announce_start(deps, job)
    return "started"


def _announce_start(deps: Dependencies, job: Job) -> None:
    detail: dict[str, Any] = {
        "name": job.name,
        "attempt": job.attempt,
        "training_job_name": job.training_job_name,
    }
    if job.on_loan_for:
        detail["on_loan_for"] = job.on_loan_for
    if job.attempt == 1:
        count(STARTS)
        announce(deps.publisher, EventType.JOB_STARTED, detail)
    else:
        count(RESUMES)
        announce(deps.publisher, EventType.JOB_RESUMED, {**detail, "preemptions": job.preemptions})


def _stop_quietly(deps: Dependencies, training_job_name: str, job_name: str | None) -> bool:
    try:
        return deps.sagemaker.stop(training_job_name)
    except SageMakerError as exc:
        logger.warning(
            "stop failed", extra={"job": job_name, "training_job_name": training_job_name, "error": str(exc)}
        )
        return False


def _correct_warm_start(deps: Dependencies, job: Job, name: str, donor: str | None) -> str:
    """SageMaker reused another pool than the one named, or none: the job says what really happened."""
    if job.training_job_name != name or job.reused_warm_pool_of == donor:
        return "no change"
    job.reused_warm_pool_of = donor
    if job.history and job.history[-1].get("state") == JobState.STARTING.value:
        job.history[-1]["reason"] = f"on warm pool of {donor}" if donor else None
    deps.store.save_job(job, was=job.state)
    return "corrected"


def _not_created(
    deps: Dependencies,
    job: Job,
    name: str,
    previous: str | None,
    *,
    refused: str | None = None,
    why: str | None = None,
    release: bool = False,
) -> str:
    """Undo an intent whose CreateTrainingJob did not go through: back in the queue (or failed, when
    SageMaker refused the request); a job cancelled meanwhile ends as its stop asked. `release` gives the
    attempt's number back: only when SageMaker is known not to have created the attempt (its name is held
    by a training job that is not ours)."""
    if job.training_job_name != name or not job.state.is_live:
        return "no change"
    was = job.state
    now = deps.now()
    if was is JobState.STARTING:
        if refused is not None:
            job.transition(JobState.FAILED, now, reason=f"SageMaker refused the job: {refused}")
        else:
            # The attempt's number stays used: had the create gone through after all, that training job is
            # stopped as not current (the sweep), never adopted by a later start of the same name.
            job.training_job_name = previous
            job.reused_warm_pool_of = None
            if release:
                job.attempt -= 1
            job.transition(JobState.QUEUED, now, reason=why or f"training job {name} was not created")
    else:
        target = job.stop_reason.final_state if job.stop_reason else JobState.CANCELLED
        if target is JobState.QUEUED:
            job.stop_reason = None
        job.transition(target, now, reason=f"training job {name} was never created")
    deps.store.save_job(job, was=was)
    if job.state.is_terminal:
        _announce_end(deps, job, job.state)
    return job.state.value


def _preempt(deps: Dependencies, action: Preempt, report: PassReport) -> None:
    def step(job: Job) -> str:
        if job.training_job_name != action.training_job_name or job.state not in (
            JobState.STARTING,
            JobState.RUNNING,
        ):
            return f"not preempted: the job is {job.state.value}"
        was = job.state
        job.stop_reason = StopReason.TAKEN_BACK if action.taken_back else StopReason.PREEMPTED
        if not action.taken_back:
            reason = f"preempted for {action.for_job}"
        elif action.for_job == job.on_loan_for:
            reason = f"taken back by {action.for_job}, which lent the capacity"
        else:
            reason = (
                f"loan of {job.on_loan_for}'s capacity ended for {action.for_job}, more important than it"
            )
        if action.work_lost_seconds is not None:
            reason += f"; loses {_duration(action.work_lost_seconds)} of training since its last checkpoint"
        job.transition(JobState.PREEMPTING, deps.now(), reason=reason)
        if action.work_lost_seconds is not None:
            job.history[-1]["work_lost_seconds"] = round(action.work_lost_seconds)
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
        {
            "name": action.job_name,
            "training_job_name": action.training_job_name,
            "for_job": action.for_job,
            # a loan ended for its lender or a job more important than it: counted in loans_taken_back
            "taken_back": action.taken_back,
            # seconds trained since the victim's last checkpoint, which the stop throws away; None: unknown
            "work_lost_seconds": None
            if action.work_lost_seconds is None
            else round(action.work_lost_seconds),
        },
    )


def _duration(seconds: float) -> str:
    """`42s`, `17m`, `3h05m`: how long, for people."""
    whole = max(round(seconds), 0)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


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
