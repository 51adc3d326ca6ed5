"""The discrete-event simulation: a trace's submissions, the modelled SageMaker's steps and the scheduler's
one-minute timer, in time order, with a scheduling pass wherever the scheduler service runs one.

The queue is kept as the service keeps it: domain `Job` objects moved through `Job.transition`, so a field
the policy comes to need (a reservation, a preemption count, the first Training time) is there to read.
A pass runs, as in `sagequeue_core.service.schedule.handle_event`, after a submission (JobQueued), after an
attempt ended (its state-change event) and on the timer; never after an in-progress step.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

from sagequeue.sim.metrics import Recorder
from sagequeue.sim.sagemaker import Attempt, ModelledSageMaker, Outcome, ResourceLimitExceeded, Timings
from sagequeue.sim.trace import Trace, TraceJob
from sagequeue_core.domain import Job, JobState, ResourceKey, StopReason, attempt_name
from sagequeue_core.policy import Preempt, ReleaseWarmPool, Start
from sagequeue_core.quotas import TeamQuota

#: Settings in seconds that no policy compares the clock with: backoff is already a time on the job
#: (`not_before`), keep-alive a time on the warm pool, the timer the simulation's own.
_NOT_THRESHOLDS = frozenset(
    {
        "retry_backoff_seconds",
        "max_backoff_seconds",
        "default_keep_alive_seconds",
        "timer_seconds",
        "fair_share_half_life_seconds",
        # the policy says when a wait for a checkpoint ends (Plan.wake_at)
        "checkpoint_wait_seconds",
    }
)
#: The account every simulated role lives in.
_ACCOUNT = "123456789012"


@dataclass(frozen=True)
class SimSettings:
    """The scheduler's settings, under the names `sagequeue_core.config.Settings` gives them, plus what the
    simulation alone needs. `policy_settings()` reads them as it reads the deployed settings."""

    capacity: Mapping[str, int] = field(default_factory=dict)
    min_runtime_before_preemption_seconds: int = 600
    default_keep_alive_seconds: int = 600
    queue_lookahead: int = 50
    max_attempts: int = 5
    retry_backoff_seconds: int = 60
    max_backoff_seconds: int = 1800
    #: how long a job waits at the head of its pool before capacity is reserved for it
    reserve_after_seconds: int = 1800
    #: preemptions of one job before it is not preempted again until it ends
    max_preemptions_per_job: int = 3
    #: lend the idle part of a waiting reservation to checkpointing jobs, taken back when it can start
    lend_reserved_capacity: bool = True
    #: jobs at or above it may preempt before the minimum runtime and beyond the budget (0: none)
    top_priority: int = 0
    #: how far past the budget a top-priority job may preempt (a multiple)
    top_priority_budget_factor: int = 2
    #: the longest a preemptor waits for a victim's due checkpoint (0: victims are stopped at once)
    checkpoint_wait_seconds: int = 300
    #: attempts report their checkpoints to the scheduler (docs/adr/0023); False: the policy learns none
    checkpoint_reports: bool = True
    #: choose victims by the training they would lose; False: by victim order alone, as before it
    victims_by_work_lost: bool = True
    #: SageMaker's account limit per instance type (creates beyond it fail); None: the pool's capacity
    quota: Mapping[str, int] | None = None
    #: the scheduler's timer period
    timer_seconds: float = 60.0
    #: team quotas per pool (sagequeue_core.quotas); none: pools are not divided among teams
    team_quotas: tuple[TeamQuota, ...] = ()
    #: half-life of the decaying instance-hours counter behind fair share
    fair_share_half_life_seconds: int = 86_400

    @property
    def limits(self) -> dict[str, int]:
        limits = dict(self.capacity)
        limits.update(self.quota or {})
        return limits

    def with_changes(self, **changes: Any) -> SimSettings:
        return replace(self, **changes)


class SimJob(Job):
    """A domain Job whose request never changes, so its demand and key are read once, not per pass."""

    @cached_property
    def demand(self) -> dict[str, int]:
        return super().demand

    @cached_property
    def resource_key(self) -> ResourceKey | None:
        return super().resource_key

    @cached_property
    def pool(self) -> str:
        return next(iter(self.demand))

    @cached_property
    def checkpointed(self) -> bool:
        return super().checkpointed


@dataclass(eq=False)
class JobRun:
    """What the simulation tracks of a job besides the domain Job: its workload and its training progress."""

    spec: TraceJob
    job: SimJob
    saved_work: float = 0.0  # training seconds kept by checkpoints (all of it, once completed)
    #: the interval between the last two checkpoints its ended attempts wrote: what the job's checkpoint
    #: prefix tells of it before its current attempt wrote two
    checkpoint_interval: float | None = None
    attempt: Attempt | None = None


class Scheduler:
    """A scheduling pass: reads the simulation's state, returns the policy's actions (Start, Preempt,
    ReleaseWarmPool) for the simulation to carry out as the service does."""

    name = "scheduler"
    #: a pass that decided nothing waits for a checkpoint: the next timer pass must look again
    awaiting_checkpoint: bool = False

    def decide(self, sim: Simulation) -> list[Start | Preempt | ReleaseWarmPool] | None:
        """The pass's actions; None when the scheduler knows, without deciding again, that the pass would
        decide nothing (the engine counts it as skipped)."""
        raise NotImplementedError


class Simulation:
    def __init__(
        self,
        trace: Trace,
        scheduler: Scheduler,
        settings: SimSettings,
        timings: Timings | None = None,
        *,
        horizon_seconds: float | None = None,
        seed: int = 0,
        progress: Callable[[float], None] | None = None,
        timeline: bool = True,
        exact: bool = False,
    ) -> None:
        trace.check_pools(settings.capacity)
        self.trace = trace
        self.scheduler = scheduler
        self.settings = settings
        self.timings = timings or Timings()
        self.start: datetime = trace.start
        self.horizon = (
            horizon_seconds if horizon_seconds is not None else trace.last_submit_seconds + 7 * 86400
        )
        self.now = 0.0
        self._events: list[tuple[float, int, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._progress = progress
        self.recorder = Recorder(
            settings.capacity, timeline=timeline, preemption_budget=settings.max_preemptions_per_job
        )
        self.sagemaker = ModelledSageMaker(
            self.timings,
            settings.limits,
            schedule=self._at_sagemaker,
            on_end=self._attempt_ended,
            on_change=self._occupancy_changed,
            on_training=self._training_started,
            on_launched=self._launched,
            seed=seed,
        )
        self.runs: dict[str, JobRun] = {}
        self.queued: dict[str, dict[str, SimJob]] = {pool: {} for pool in settings.capacity}
        self.live: dict[str, SimJob] = {}
        self.by_attempt: dict[str, JobRun] = {}
        self.passes = 0
        self.skipped_passes = 0
        self.exact = exact
        self.changes = 0
        self._last_pass: tuple[int, bool] = (-1, True)
        self._wake = 0.0
        self.refused_creates = 0

    # --- time ----------------------------------------------------------------------------------------------

    def at(self, seconds: float) -> datetime:
        return self.start + timedelta(seconds=seconds)

    @property
    def now_dt(self) -> datetime:
        return self.at(self.now)

    # Order of simultaneous happenings: SageMaker's steps, then submissions, then the timer, each in the order
    # they were scheduled.
    def _push(self, at: float, rank: int, step: Callable[[], None]) -> None:
        heapq.heappush(self._events, (at, rank, next(self._seq), step))

    def _at_sagemaker(self, at: float, step: Callable[[], None]) -> None:
        self._push(at, 0, step)

    # --- run -----------------------------------------------------------------------------------------------

    def run(self) -> Recorder:
        for spec in self.trace.jobs:
            self._push(spec.submit_seconds, 1, functools.partial(self._submit, spec))
        self._push(self.settings.timer_seconds, 2, self._timer)
        while self._events:
            at, _, _, step = heapq.heappop(self._events)
            if at > self.horizon:
                break
            self.now = at
            self.sagemaker.now = at
            step()
            if self._finished():
                break
            if self._progress is not None:
                self._progress(self.now)
        self.recorder.close(self.now, self)
        return self.recorder

    def _finished(self) -> bool:
        return len(self.recorder.finished) == len(self.trace.jobs)

    def _timer(self) -> None:
        if self.exact or not self._quiet_since_last_pass():
            self._pass()
        else:
            self.skipped_passes += 1
        self._push(self.now + self.settings.timer_seconds, 2, self._timer)

    # --- the queue -----------------------------------------------------------------------------------------

    def _submit(self, spec: TraceJob) -> None:
        job = SimJob(
            name=spec.name,
            request=_request(spec),
            priority=spec.priority,
            owner="sim",
            submitted_at=self.now_dt,
            team=spec.team,
        )
        self.changes += 1
        run = JobRun(spec, job)
        self.runs[spec.name] = run
        self.queued[job.pool][job.name] = job
        self.recorder.submitted(run, self.now)
        self.recorder.occupancy(self, job.pool, self.now)
        self._pass()

    def _pass(self) -> None:
        if not any(self.queued.values()):
            return  # nothing waits: no policy starts, releases or preempts anything
        actions = self.scheduler.decide(self)
        if actions is None:
            self.skipped_passes += 1
            actions = []
        else:
            self.passes += 1
            self.carry_out(actions)
        self._last_pass = (self._version(), bool(actions))
        self._wake = self._next_wake() if not actions and not self.scheduler.awaiting_checkpoint else self.now

    @property
    def wake(self) -> float:
        """When, with nothing else changing, a pass that just decided nothing could decide something."""
        return self._wake

    # A timer pass on a queue nothing has changed since a pass that decided nothing decides nothing again,
    # unless the clock crossed a threshold the policy compares with. Policies compare times the jobs carry
    # (submitted, started, backing off until, ...) plus durations the settings give (minimum runtime, ...);
    # so the next pass that matters is at the earliest "job time + setting duration" still ahead. Both are
    # found generically (every datetime field of a Job, every `*_seconds` setting), so a new field or
    # setting is covered without a change here; `exact=True` runs every timer pass, and a test checks that
    # both give the same result.
    def _quiet_since_last_pass(self) -> bool:
        changes, acted = self._last_pass
        return changes == self._version() and not acted and self.now < self._wake

    def _version(self) -> int:
        return self.changes + self.sagemaker.version

    def _next_wake(self) -> float:
        durations = {0.0} | {
            float(value)
            for name, value in vars(self.settings).items()
            if name.endswith("_seconds") and name not in _NOT_THRESHOLDS and isinstance(value, int | float)
        }
        now = self.now_dt
        wake = math.inf
        for pool in self.queued.values():
            for job in pool.values():
                wake = min(wake, self._job_wake(job, now, durations))
        for job in self.live.values():
            wake = min(wake, self._job_wake(job, now, durations))
        for attempt in self.sagemaker.live.values():
            if attempt.first_training_at is not None:
                for duration in durations:
                    if attempt.first_training_at + duration > self.now:
                        wake = min(wake, attempt.first_training_at + duration)
        return wake

    def _job_wake(self, job: Job, now: datetime, durations: set[float]) -> float:
        wake = math.inf
        for value in vars(job).values():
            if isinstance(value, datetime):
                ahead = (value - now).total_seconds()
                for duration in durations:
                    if ahead + duration > 0:
                        wake = min(wake, self.now + ahead + duration)
        return wake

    def queued_job(self, name: str) -> SimJob | None:
        run = self.runs.get(name)
        if run is None or run.job.state is not JobState.QUEUED:
            return None
        return run.job

    def window(self, pool: str) -> list[SimJob]:
        """The first `queue_lookahead` queued jobs of `pool`, in queue order, passing over jobs wider than
        the pool: what `Store.queued_jobs` reads. With team quotas in the pool, each such team's first
        `queue_lookahead` jobs too, as the service reads each team's window."""
        capacity = self.settings.capacity.get(pool, 0)
        jobs = sorted(self.queued[pool].values(), key=lambda j: (-j.priority, j.submitted_at, j.name))
        if capacity:
            jobs = [job for job in jobs if job.demand.get(pool, 0) <= capacity]
        lookahead = self.settings.queue_lookahead
        window = jobs[:lookahead]
        teams = {q.team for q in self.settings.team_quotas if q.pool == pool}
        if teams:
            seen = {job.name for job in window}
            taken: Counter[str] = Counter()
            for job in jobs:
                if job.team in teams and taken[job.team] < lookahead:
                    taken[job.team] += 1
                    if job.name not in seen:
                        window.append(job)
        return window

    def carry_out(self, actions: list[Start | Preempt | ReleaseWarmPool]) -> None:
        """The plan's actions, in order, as `run_pass` carries them out."""
        for action in actions:
            if isinstance(action, Preempt):
                self._preempt(action)
            elif isinstance(action, ReleaseWarmPool):
                # a pool no longer Available is gone either way; the modelled SageMaker never refuses
                self.sagemaker.release(action.training_job_name)
            elif isinstance(action, Start):
                self._start(action)

    def _preempt(self, action: Preempt) -> None:
        job = self.live.get(action.job_name)
        if job is None or job.training_job_name != action.training_job_name:
            return
        if job.state not in (JobState.STARTING, JobState.RUNNING):
            return
        job.stop_reason = StopReason.TAKEN_BACK if action.taken_back else StopReason.PREEMPTED
        job.transition(JobState.PREEMPTING, self.now_dt, reason=f"preempted for {action.for_job}")
        self.sagemaker.stop(action.training_job_name)
        self.recorder.preempted(self.runs[job.name], self.now)

    def _start(self, action: Start) -> None:
        run = self.runs[action.job_name]
        job = run.job
        if job.state is not JobState.QUEUED:
            return
        attempt_number = job.attempt + 1
        name = attempt_name(job.name, attempt_number)
        # the keep-alive of the attempt: the request's, raised to the policy's (attempt_request's rule)
        keep_alive = max(run.spec.keep_alive_seconds, action.keep_alive_seconds or 0)
        checkpoint = run.spec.checkpoint_minutes * 60 if run.spec.checkpoint_minutes else None
        try:
            attempt = self.sagemaker.create(
                name=name,
                job_name=job.name,
                pool=job.pool,
                instances=job.demand[job.pool],
                key=job.resource_key,
                keep_alive_seconds=keep_alive,
                remaining_work=run.spec.duration_seconds - run.saved_work,
                checkpoint_seconds=checkpoint,
                checkpoint_drift=run.spec.checkpoint_drift or 0.0,
            )
        except ResourceLimitExceeded:
            # nothing was created: the job keeps its place and a later pass tries again
            self.refused_creates += 1
            return
        job.attempt = attempt_number
        job.training_job_name = name
        job.started_at = self.now_dt
        job.training_started_at = None  # the attempt's own, as the service resets it at a start
        job.stop_reason = None
        job.not_before = None
        job.reused_warm_pool_of = attempt.reused
        job.keep_alive_seconds = action.keep_alive_seconds or 0
        job.on_loan_for = action.on_loan_for
        job.reason = None
        job.transition(JobState.STARTING, self.now_dt)
        run.attempt = attempt
        del self.queued[job.pool][job.name]
        self.live[job.name] = job
        self.by_attempt[name] = run
        self.recorder.started(run, attempt, self.now)
        self.recorder.occupancy(self, job.pool, self.now)

    # --- SageMaker's events ---------------------------------------------------------------------------------

    def _launched(self, attempt: Attempt) -> None:
        # the service moves a job to RUNNING at the first secondary status past Starting (Downloading)
        run = self.by_attempt[attempt.name]
        if run.job.state is JobState.STARTING:
            run.job.transition(JobState.RUNNING, self.now_dt, reason="Downloading")

    def _training_started(self, attempt: Attempt) -> None:
        """The attempt's first Training: the minimum runtime before preemption counts from here, as the
        service records it from SecondaryStatusTransitions."""
        job = self.by_attempt[attempt.name].job
        if job.training_started_at is None and job.state.is_live:
            job.training_started_at = self.now_dt
            self.changes += 1

    def _attempt_ended(self, attempt: Attempt) -> None:
        run = self.by_attempt[attempt.name]
        job = run.job
        kept = attempt.saved_work()
        interval = attempt.checkpoints(self.now)[1]
        if interval is not None:
            run.checkpoint_interval = interval
        lost = attempt.trained - kept
        run.saved_work += kept
        was = job.state
        if attempt.outcome is Outcome.COMPLETED:
            job.transition(JobState.COMPLETED, self.now_dt, reason="Completed")
        elif attempt.outcome is Outcome.STOPPED:
            if job.stop_reason is not None and job.stop_reason.requeues and was is JobState.PREEMPTING:
                job.count_requeue()
            job.stop_reason = None
            job.transition(JobState.QUEUED, self.now_dt, reason="preempted")
        else:  # a capacity error: retried with backoff, as the service does
            if job.retries + 1 < self.settings.max_attempts:
                job.retries += 1
                backoff = min(
                    self.settings.retry_backoff_seconds * 2 ** max(job.retries - 1, 0),
                    self.settings.max_backoff_seconds,
                )
                job.not_before = self.now_dt + timedelta(seconds=backoff)
                job.transition(JobState.QUEUED, self.now_dt, reason="retrying after capacity failure")
            else:
                job.transition(JobState.FAILED, self.now_dt, reason="CapacityError")
        del self.live[job.name]
        if job.state is JobState.QUEUED:
            self.queued[job.pool][job.name] = job
        self.recorder.ended(run, attempt, lost, self.now)
        self.recorder.occupancy(self, job.pool, self.now)
        self._pass()

    def _occupancy_changed(self, pool: str, at: float) -> None:
        self.recorder.occupancy(self, pool, at)


def _request(spec: TraceJob) -> dict[str, Any]:
    """The CreateTrainingJob request of a trace job: what the warm-pool key and the demand are read from."""
    resources: dict[str, Any] = {
        "InstanceType": spec.instance_type,
        "InstanceCount": spec.instance_count,
        "VolumeSizeInGB": 512,
    }
    if spec.keep_alive_seconds:
        resources["KeepAlivePeriodInSeconds"] = spec.keep_alive_seconds
    request: dict[str, Any] = {
        "TrainingJobName": spec.name,
        # one role per sweep family: jobs of a family share a resource key, other jobs have their own
        "RoleArn": f"arn:aws:iam::{_ACCOUNT}:role/sim-{spec.family or spec.name}",
        "ResourceConfig": resources,
    }
    if spec.checkpoint_minutes:
        # what tells the policy the job resumes from checkpoints (victim order, loans)
        request["CheckpointConfig"] = {"S3Uri": f"s3://sim-checkpoints/{spec.name}/"}
    return request


__all__ = ["JobRun", "Scheduler", "SimJob", "SimSettings", "Simulation"]
