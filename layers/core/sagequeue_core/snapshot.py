"""What the policy sees: the snapshot of one pass, built from domain objects.

The scheduler service reads jobs, pools, external attempts and warm pools from the table and hands them
here; the capacity simulator (`sagequeue.sim`) hands its own domain `Job` objects to the same function. One
construction, so that what the simulator measures is what the scheduler decides.

Pure: no clock, no table, no AWS. The inputs are read through small protocols, so neither the store's
records nor the validated `Settings` (pydantic) have to be imported by a caller that has none.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Protocol

from sagequeue_core.defaults import SAGEMAKER_DEFAULT_MAX_RUNTIME_SECONDS
from sagequeue_core.domain import PRIORITY_MAX, Job, JobState, ResourceKey
from sagequeue_core.policy import PolicySettings, QueuedJob, RunningAttempt, Snapshot, WarmPool
from sagequeue_core.quotas import TeamQuota

#: Live states whose instances come back without anything left to decide.
_STOPPING_STATES = frozenset({JobState.PREEMPTING, JobState.STOPPING})


class SchedulerSettings(Protocol):
    """The settings a pass plans with (`sagequeue_core.config.Settings` has them all)."""

    @property
    def min_runtime_before_preemption_seconds(self) -> int: ...

    @property
    def default_keep_alive_seconds(self) -> int: ...

    @property
    def max_preemptions_per_job(self) -> int: ...

    @property
    def reserve_after_seconds(self) -> int: ...

    @property
    def lend_reserved_capacity(self) -> bool: ...

    @property
    def top_priority(self) -> int: ...

    @property
    def top_priority_budget_factor(self) -> int: ...

    @property
    def checkpoint_wait_seconds(self) -> int: ...

    @property
    def warm_pool_roles(self) -> frozenset[str] | None: ...


class HeldOutsideQueue(Protocol):
    """A training job started outside the queue on a managed pool (`store.ExternalAttempt`)."""

    @property
    def training_job_name(self) -> str: ...

    @property
    def demand(self) -> Mapping[str, int]: ...

    @property
    def started_at(self) -> datetime: ...


class RetainedWarmPool(Protocol):
    """An Available warm pool until its keep-alive runs out (`store.TrackedWarmPool`)."""

    @property
    def training_job_name(self) -> str: ...

    @property
    def resource_key(self) -> ResourceKey: ...

    @property
    def expires_at(self) -> datetime: ...

    @property
    def job_name(self) -> str | None: ...  # the queue entry whose attempt left it; None if not ours


def policy_settings(settings: SchedulerSettings) -> PolicySettings:
    """The policy's settings from the scheduler's."""
    return PolicySettings(
        min_runtime_before_preemption_seconds=settings.min_runtime_before_preemption_seconds,
        default_keep_alive_seconds=settings.default_keep_alive_seconds,
        max_preemptions_per_job=settings.max_preemptions_per_job,
        reserve_after_seconds=settings.reserve_after_seconds,
        lend_reserved_capacity=settings.lend_reserved_capacity,
        top_priority=settings.top_priority,
        top_priority_budget_factor=settings.top_priority_budget_factor,
        checkpoint_wait_seconds=settings.checkpoint_wait_seconds,
        warm_pool_roles=settings.warm_pool_roles,
    )


def build_snapshot(
    *,
    now: datetime,
    capacity: Mapping[str, int],
    quota: Mapping[str, int] | None = None,
    queued: Iterable[Job],
    live: Iterable[Job],
    external: Iterable[HeldOutsideQueue] = (),
    warm_pools: Iterable[RetainedWarmPool] = (),
    team_quotas: Iterable[TeamQuota] = (),
    team_usage: Mapping[str, float] | None = None,
) -> Snapshot:
    """The snapshot of one pass.

    `quota`: pools where the account's quota, learned from a refusal, is below the capacity.
    `queued`: the lookahead window of every pool (the first `queue_lookahead` queued jobs of each, in queue
    order). `live`: jobs whose attempt holds instances (starting, running, preempting, stopping).
    `external`: attempts started outside the queue; they count at the highest priority and are never
    preempted. `warm_pools`: tracked Available warm pools; those whose keep-alive has run out by `now` are
    left out. `team_quotas`: every team's quota per pool; `team_usage`: decayed instance-hours per team.
    """
    queued = list(queued)
    live = list(live)
    # a warm pool left by an attempt that ran on loan belongs to the lender while the lender waits
    lenders = {job.name: job.on_loan_for for job in (*queued, *live) if job.on_loan_for}
    return Snapshot(
        now=now,
        capacity=dict(capacity),
        quota=dict(quota or {}),
        queued=[
            QueuedJob(
                name=job.name,
                priority=job.priority,
                submitted_at=job.submitted_at,
                demand=job.demand,
                resource_key=job.resource_key,
                not_before=job.not_before,
                reservation=job.reservation,
                queued_since=job.queued_since,
                preemptions=job.preemptions,
                checkpointed=job.checkpointed,
                team=job.team,
                loans_taken_back=job.loans_taken_back,
                max_runtime_seconds=job.max_runtime_seconds,
            )
            for job in queued
        ],
        running=[
            RunningAttempt(
                training_job_name=job.training_job_name or job.name,
                demand=job.demand,
                priority=job.priority,
                started_at=job.started_at or now,
                job_name=job.name,
                stopping=job.state in _STOPPING_STATES,
                training_started_at=job.training_started_at,
                preemptions=job.preemptions,
                checkpointed=job.checkpointed,
                on_loan_for=job.on_loan_for,
                team=job.team,
                loans_taken_back=job.loans_taken_back,
                max_runtime_seconds=job.max_runtime_seconds or SAGEMAKER_DEFAULT_MAX_RUNTIME_SECONDS,
                waiting_for_capacity=job.capacity_wait is not None and job.state is JobState.STARTING,
                last_checkpoint_at=_last_checkpoint_at(job),
                checkpoint_interval_seconds=_checkpoint_interval(job),
            )
            for job in live
        ]
        + [
            RunningAttempt(
                training_job_name=attempt.training_job_name,
                demand=attempt.demand,
                priority=PRIORITY_MAX,
                started_at=attempt.started_at,
            )
            for attempt in external
        ],
        warm_pools=[
            WarmPool(w.training_job_name, w.resource_key, lent_by=lenders.get(w.job_name or ""))
            for w in warm_pools
            if w.expires_at > now
        ],
        team_quotas=tuple(team_quotas),
        team_usage=dict(team_usage or {}),
    )


def _last_checkpoint_at(job: Job) -> datetime | None:
    """The current attempt's last checkpoint, as read from its marker (docs/adr/0025); None: none yet."""
    record = job.last_checkpoint
    return record.at if record is not None else None


def _checkpoint_interval(job: Job) -> float | None:
    """Seconds between the current attempt's checkpoints; None until it has written two."""
    record = job.checkpoint
    if record is None or record.training_job_name != job.training_job_name:
        return None
    return record.interval_seconds


__all__ = [
    "HeldOutsideQueue",
    "RetainedWarmPool",
    "SchedulerSettings",
    "build_snapshot",
    "policy_settings",
]
