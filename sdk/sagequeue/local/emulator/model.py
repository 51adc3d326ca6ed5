"""One simulated training job: its SageMaker-visible state and the timed steps that move it along.

Pure state machine, no locks and no I/O: every method takes the moment it happens at, so the backend can
replay due steps in time order whatever the clock says now. Each step changes at most one status or
secondary status, so the backend can publish one event per call.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cached_property
from typing import Any

from sagequeue.local.emulator.errors import ValidationError
from sagequeue.local.emulator.simulation import CAPACITY_FAILURE_REASON, Outcome, SimPlan, Timings
from sagequeue.local.emulator.validation import DEFAULT_MAX_RUNTIME_SECONDS
from sagequeue_core.checkpoint_marker import CheckpointReport
from sagequeue_core.defaults import METRIC_PERIOD_SECONDS
from sagequeue_core.domain import ResourceKey, demand_of

#: A warm pool can move from job to job for at most this long after its cluster first launched.
WARM_POOL_CHAIN_LIMIT = timedelta(days=28)

IN_PROGRESS = "InProgress"
COMPLETED = "Completed"
FAILED = "Failed"
STOPPING = "Stopping"
STOPPED = "Stopped"
#: SageMaker has no secondary status of its own for it: the job ends Stopped/Stopped, its message says why.
MAX_PENDING_STOPPED = "MaxPendingTimeExceeded"
TERMINAL_STATUSES = frozenset({COMPLETED, FAILED, STOPPED})


class Step(StrEnum):
    """What happens to a job when its `next_at` comes."""

    DOWNLOAD = "download"
    TRAIN = "train"
    INTERRUPT = "interrupt"
    RESTART = "restart"
    UPLOAD = "upload"
    COMPLETE = "complete"
    FAIL = "fail"
    CAPACITY_FAIL = "capacity_fail"
    STOP_UPLOAD = "stop_upload"
    PENDING_TIMEOUT = "pending_timeout"
    STOPPED = "stopped"


class WarmPoolState(StrEnum):
    IN_USE = "InUse"
    AVAILABLE = "Available"
    REUSED = "Reused"
    TERMINATED = "Terminated"


# Status messages as SageMaker shows them in SecondaryStatusTransitions (they are informational only).
MSG_LAUNCHING = "Launching requested ML instances"
MSG_PENDING_PLAN = "Waiting for capacity in the training plan"
MSG_MAX_PENDING = (
    "Training job stopped: it waited in Pending longer than StoppingCondition.MaxPendingTimeInSeconds"
)
MSG_WARM_START = "Preparing the instances for training"
MSG_CAPACITY_RETRY = "Insufficient capacity error from EC2 while launching instances, retrying!"
MSG_DOWNLOADING = "Downloading input data"
MSG_TRAINING = "Training image download completed. Training in progress."
MSG_UPLOADING = "Uploading generated training model"
MSG_COMPLETED = "Training job completed"
MSG_FAILED = "Training job failed"
MSG_STOPPING = "Stopping the training job"
MSG_STOPPED = "Training job stopped"
MSG_MAX_RUNTIME = "Training job stopped: it exceeded StoppingCondition.MaxRuntimeInSeconds"
MSG_MAX_WAIT = "Training job stopped: it exceeded StoppingCondition.MaxWaitTimeInSeconds"
MSG_INTERRUPTED = "Training interrupted: the Spot instances were reclaimed. Waiting for capacity to resume"

# Request members DescribeTrainingJob echoes back as they were sent.
_ECHOED = (
    "HyperParameters",
    "AlgorithmSpecification",
    "RoleArn",
    "InputDataConfig",
    "OutputDataConfig",
    "VpcConfig",
    "EnableNetworkIsolation",
    "EnableInterContainerTrafficEncryption",
    "EnableManagedSpotTraining",
    "CheckpointConfig",
    "DebugHookConfig",
    "ExperimentConfig",
    "DebugRuleConfigurations",
    "TensorBoardOutputConfig",
    "ProfilerConfig",
    "ProfilerRuleConfigurations",
    "Environment",
    "RetryStrategy",
    "RemoteDebugConfig",
    "InfraCheckConfig",
)


def _seconds(delta: timedelta) -> float:
    return delta.total_seconds()


def _whole_seconds(seconds: float) -> int:
    return max(0, math.ceil(seconds - 1e-9))


@dataclass
class WarmPool:
    """The instances a job keeps (or borrowed) beyond its own run."""

    status: WarmPoolState
    chain_started: datetime | None = None  # when the pool's cluster first launched, carried on reuse
    available_since: datetime | None = None
    expires_at: datetime | None = None
    retained_seconds: float = 0.0  # fixed once the pool is Reused or Terminated
    reused_by: str | None = None

    def retained(self, now: datetime) -> int:
        if self.status is WarmPoolState.AVAILABLE and self.available_since is not None:
            return _whole_seconds(_seconds(now - self.available_since))
        return _whole_seconds(self.retained_seconds)

    def end(self, at: datetime, status: WarmPoolState, reused_by: str | None = None) -> None:
        if self.status is WarmPoolState.AVAILABLE and self.available_since is not None:
            self.retained_seconds = _seconds(at - self.available_since)
        self.status = status
        self.expires_at = None
        self.reused_by = reused_by


@dataclass
class TrainingJob:
    name: str
    arn: str
    request: dict[str, Any]
    created_at: datetime
    plan: SimPlan
    timings: Timings
    tags: dict[str, str] = field(default_factory=dict)
    status: str = IN_PROGRESS
    secondary: str = "Starting"
    transitions: list[dict[str, Any]] = field(default_factory=list)
    last_modified: datetime | None = None
    failure_reason: str | None = None
    next_at: datetime | None = None
    next_step: Step | None = None
    runtime_deadline: datetime | None = None
    wait_deadline: datetime | None = None
    stop_secondary: str = STOPPED
    training_start: datetime | None = None
    training_end: datetime | None = None
    launched: bool = False
    segment_start: datetime | None = None  # when the current run on instances began (Downloading)
    run_seconds: float = 0.0  # time on instances in finished segments: MaxRuntime and spot billing
    training_phase_start: datetime | None = None
    trained_seconds: float = 0.0  # Training-phase time done, kept across spot interruptions
    interruptions_left: int = 0
    keep_alive: int = 0
    warm_pool: WarmPool | None = None
    reused_from: str | None = None
    metric_next: datetime | None = None
    pending_metrics: list[datetime] = field(default_factory=list)
    checkpoint_next: datetime | None = None  # when the running Training phase writes its next checkpoint
    checkpoints: list[CheckpointReport] = field(default_factory=list)  # written, in order
    pending_checkpoints: list[CheckpointReport] = field(default_factory=list)  # written, not synced yet
    created_with_pool: bool = False  # KeepAlivePeriodInSeconds > 0 at create, or a reused pool
    compile_until: datetime | None = None  # NeuronCores idle while the graph compiles, up to this mark
    deleted: bool = False  # DeleteTrainingJob: kept only so that list cursors keep their places
    waiting_for_capacity: bool = False  # in Starting, retrying until the region has the instances

    # --- creation --------------------------------------------------------------------------------------

    def start(
        self,
        at: datetime,
        reused_pool: WarmPool | None = None,
        reused_from: str | None = None,
        *,
        has_capacity: bool = True,
        on_plan: bool = False,
    ) -> None:
        """Enters InProgress/Starting; with `reused_pool` the instances are already there (fast start).
        Without `has_capacity` the region lacks the instances: the job retries in Starting until
        `grant_capacity`, and fails with CapacityError if that does not come in time."""
        config = self.request.setdefault("ResourceConfig", {})
        self.keep_alive = int(config.get("KeepAlivePeriodInSeconds") or 0)
        self.interruptions_left = self.plan.interruptions
        self.request.setdefault("StoppingCondition", {"MaxRuntimeInSeconds": DEFAULT_MAX_RUNTIME_SECONDS})
        wait = self.request["StoppingCondition"].get("MaxWaitTimeInSeconds")
        if self.spot and wait:
            self.wait_deadline = at + timedelta(seconds=wait)
        self.created_with_pool = self.keep_alive > 0 or reused_pool is not None
        if reused_pool is not None:
            self.reused_from = reused_from
            self.launched = True
            self.warm_pool = WarmPool(WarmPoolState.IN_USE, chain_started=reused_pool.chain_started)
            self._enter(at, IN_PROGRESS, "Starting", MSG_WARM_START)
            self._schedule(at, self.timings.warm_start_seconds, Step.DOWNLOAD)
            return
        if self.keep_alive > 0:
            self.warm_pool = WarmPool(WarmPoolState.IN_USE)
        if not has_capacity and on_plan:
            # A training plan's job waits in Pending for the plan's reserved instances, at most
            # StoppingCondition.MaxPendingTimeInSeconds.
            self.waiting_for_capacity = True
            self._enter(at, IN_PROGRESS, "Pending", MSG_PENDING_PLAN)
            pending = self.request["StoppingCondition"].get("MaxPendingTimeInSeconds")
            if pending:
                self._schedule(at, float(pending), Step.PENDING_TIMEOUT)
            return
        if self.plan.outcome is Outcome.CAPACITY_ERROR or not has_capacity:
            self.waiting_for_capacity = self.plan.outcome is not Outcome.CAPACITY_ERROR
            self._enter(at, IN_PROGRESS, "Starting", MSG_CAPACITY_RETRY)
            self._schedule(at, self.timings.capacity_error_after_seconds, Step.CAPACITY_FAIL)
        else:
            self._enter(at, IN_PROGRESS, "Starting", MSG_LAUNCHING)
            self._schedule(at, self.timings.provisioning_seconds, Step.DOWNLOAD)

    def grant_capacity(self, at: datetime) -> bool:
        """The instances this job waited for are there: they launch now. True when the secondary status
        changed (Pending to Starting); a job retrying in Starting only changes its message."""
        self.waiting_for_capacity = False
        self.last_modified = at
        self._schedule(at, self.timings.provisioning_seconds, Step.DOWNLOAD)
        if self.secondary == "Pending":
            self._enter(at, IN_PROGRESS, "Starting", MSG_LAUNCHING)
            return True
        self.transitions[-1]["StatusMessage"] = MSG_LAUNCHING
        return False

    # --- properties ------------------------------------------------------------------------------------

    @property
    def spot(self) -> bool:
        return bool(self.request.get("EnableManagedSpotTraining"))

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL_STATUSES

    # Instance types, counts and the match key never change after creation (UpdateTrainingJob touches only
    # the keep-alive), so they are worked out once: the backend asks for them on every create.
    @cached_property
    def resource_key(self) -> ResourceKey | None:
        return ResourceKey.from_request(self.request)

    @cached_property
    def demand(self) -> dict[str, int]:
        return demand_of(self.request)

    @property
    def instance_count(self) -> int:
        return sum(self.demand.values())

    @property
    def max_runtime(self) -> float:
        return float(
            self.request["StoppingCondition"].get("MaxRuntimeInSeconds") or DEFAULT_MAX_RUNTIME_SECONDS
        )

    def held_instances(self) -> dict[str, int]:
        """Instances counted against the account's limit: a live job's, or its Available warm pool's."""
        if not self.ended:
            return self.demand
        if self.warm_pool is not None and self.warm_pool.status is WarmPoolState.AVAILABLE:
            return self.demand
        return {}

    def due(self) -> datetime | None:
        """When this job next changes on its own, or None."""
        moments = [self.next_at, self.runtime_deadline, self.wait_deadline]
        if self.warm_pool is not None and self.warm_pool.status is WarmPoolState.AVAILABLE:
            moments.append(self.warm_pool.expires_at)
        present = [m for m in moments if m is not None]
        return min(present) if present else None

    # --- timed steps -----------------------------------------------------------------------------------

    def fire(self, at: datetime) -> bool:
        """Runs the step due at `at`; True when the status or secondary status changed (an event)."""
        pool = self.warm_pool
        if (
            self.ended
            and pool is not None
            and pool.status is WarmPoolState.AVAILABLE
            and pool.expires_at is not None
            and pool.expires_at <= at
        ):
            pool.end(pool.expires_at, WarmPoolState.TERMINATED)
            self.last_modified = at
            return False
        deadlines = [d for d in (self.runtime_deadline, self.wait_deadline) if d is not None]
        first_deadline = min(deadlines) if deadlines else None
        if (
            self.next_at is not None
            and self.next_at <= at
            and (first_deadline is None or self.next_at <= first_deadline)
        ):
            step, self.next_at, self.next_step = self.next_step, None, None
            assert step is not None
            self._run(step, at)
            return True
        if self.runtime_deadline is not None and self.runtime_deadline <= at:
            self.begin_stop(at, secondary_when_stopped="MaxRuntimeExceeded")
            return True
        if self.wait_deadline is not None and self.wait_deadline <= at:
            self.begin_stop(at, secondary_when_stopped="MaxWaitTimeExceeded")
            return True
        raise RuntimeError(f"training job {self.name} has nothing due at {at.isoformat()}")

    def _run(self, step: Step, at: datetime) -> None:
        timings = self.timings
        if step is Step.DOWNLOAD:
            if not self.launched:
                self.launched = True
                if self.warm_pool is not None and self.warm_pool.chain_started is None:
                    self.warm_pool.chain_started = at
            if self.training_start is None:
                self.training_start = at
            self.segment_start = at
            self.runtime_deadline = at + timedelta(seconds=max(0.0, self.max_runtime - self.run_seconds))
            self._enter(at, IN_PROGRESS, "Downloading", MSG_DOWNLOADING)
            self._schedule(at, timings.download_seconds, Step.TRAIN)
        elif step is Step.TRAIN:
            self._enter(at, IN_PROGRESS, "Training", MSG_TRAINING)
            self.training_phase_start = at
            self.compile_until = at + timedelta(seconds=self.plan.compile_seconds)
            self.metric_next = at + timedelta(seconds=METRIC_PERIOD_SECONDS)
            if self.plan.checkpoint_seconds is not None:
                self.checkpoint_next = at + timedelta(seconds=self._checkpoint_gap())
            remaining = max(0.0, self.plan.duration_seconds - self.trained_seconds)
            if self.interruptions_left > 0:
                segment = self.plan.duration_seconds / (self.plan.interruptions + 1)
                self._schedule(at, min(segment, remaining), Step.INTERRUPT)
            elif self.plan.outcome is Outcome.FAILED:
                self._schedule(at, remaining, Step.FAIL)
            else:
                self._schedule(at, remaining, Step.UPLOAD)
        elif step is Step.INTERRUPT:
            self._leave_training(at)
            self._end_segment(at)
            self.interruptions_left -= 1
            self._enter(at, IN_PROGRESS, "Interrupted", MSG_INTERRUPTED)
            self._schedule(at, timings.spot_interruption_seconds, Step.RESTART)
        elif step is Step.RESTART:
            self._enter(at, IN_PROGRESS, "Starting", MSG_LAUNCHING)
            self._schedule(at, timings.provisioning_seconds, Step.DOWNLOAD)
        elif step is Step.UPLOAD:
            self._leave_training(at)
            self._enter(at, IN_PROGRESS, "Uploading", MSG_UPLOADING)
            self._schedule(at, timings.upload_seconds, Step.COMPLETE)
        elif step is Step.COMPLETE:
            self._finish(at, COMPLETED, COMPLETED, MSG_COMPLETED, keeps_pool=True)
        elif step is Step.FAIL:
            self._leave_training(at)
            self.failure_reason = self.plan.failure_reason
            # An algorithm or client error leaves the cluster behind; an internal error does not.
            keeps = not self.plan.failure_reason.startswith("InternalServerError")
            self._finish(at, FAILED, FAILED, MSG_FAILED, keeps_pool=keeps)
        elif step is Step.CAPACITY_FAIL:
            self.waiting_for_capacity = False
            self.failure_reason = CAPACITY_FAILURE_REASON
            self._finish(at, FAILED, FAILED, MSG_FAILED, keeps_pool=False)
        elif step is Step.PENDING_TIMEOUT:
            # "The maximum length of time ... that a training job can be pending before it is stopped"
            # (StoppingCondition): stopped, not failed, and never launched, so nothing to upload.
            self.begin_stop(at, secondary_when_stopped=MAX_PENDING_STOPPED)
        elif step is Step.STOP_UPLOAD:
            # After SIGTERM's grace the container is gone; what it wrote to /opt/ml/model is uploaded.
            self._enter(at, STOPPING, "Uploading", MSG_UPLOADING)
            self._schedule(at, timings.upload_seconds, Step.STOPPED)
        elif step is Step.STOPPED:
            message = {
                "MaxRuntimeExceeded": MSG_MAX_RUNTIME,
                "MaxWaitTimeExceeded": MSG_MAX_WAIT,
                MAX_PENDING_STOPPED: MSG_MAX_PENDING,
            }.get(self.stop_secondary, MSG_STOPPED)
            secondary = STOPPED if self.stop_secondary == MAX_PENDING_STOPPED else self.stop_secondary
            self._finish(at, STOPPED, secondary, message, keeps_pool=True)

    # --- requests --------------------------------------------------------------------------------------

    def begin_stop(self, at: datetime, secondary_when_stopped: str = STOPPED) -> None:
        """StopTrainingJob (or a stopping condition): SIGTERM now, the kill after the grace period, then (when
        instances had launched) Uploading what the job saved, then Stopped."""
        if self.status != IN_PROGRESS:
            raise ValidationError(
                f"The request was rejected because the training job is in status {self.status}."
            )
        self._leave_training(at)
        self.runtime_deadline = None
        self.wait_deadline = None
        self.waiting_for_capacity = False
        self.stop_secondary = secondary_when_stopped
        self._enter(at, STOPPING, "Stopping", MSG_STOPPING)
        after_grace = Step.STOP_UPLOAD if self.launched else Step.STOPPED
        self._schedule(at, self.timings.stop_grace_seconds, after_grace)

    def update_keep_alive(self, at: datetime, seconds: int) -> None:
        """UpdateTrainingJob(ResourceConfig.KeepAlivePeriodInSeconds) on a live job or an Available pool."""
        if self.spot or self.request["ResourceConfig"].get("InstanceGroups"):
            raise ValidationError(
                f"Training job {self.name} cannot have a warm pool: warm pools are not supported with managed "
                "spot training or heterogeneous clusters."
            )
        pool = self.warm_pool
        if not self.created_with_pool:
            raise ValidationError(
                f"Training job {self.name} was created without a warm pool (KeepAlivePeriodInSeconds); its "
                "keep-alive cannot be updated."
            )
        if not self.ended:
            raise ValidationError(
                f"The request was rejected because the training job is in status {self.status}: "
                "KeepAlivePeriodInSeconds can be updated once the warm pool is Available."
            )
        if not self.ended:
            self._set_keep_alive(at, seconds)
            if seconds > 0 and pool is None:
                # The chain counts from the cluster's first launch, which may predate this update.
                launched_at = self.training_start if self.launched else None
                self.warm_pool = WarmPool(WarmPoolState.IN_USE, chain_started=launched_at)
            elif seconds == 0 and pool is not None and self.reused_from is None:
                self.warm_pool = None
            return
        if pool is None or pool.status is not WarmPoolState.AVAILABLE:
            state = "no warm pool" if pool is None else f"a {pool.status.value} warm pool"
            raise ValidationError(
                f"Training job {self.name} has ended and has {state}; KeepAlivePeriodInSeconds can only be "
                "updated while the job runs or while its warm pool is Available."
            )
        self._set_keep_alive(at, seconds)
        assert pool.available_since is not None
        assert pool.chain_started is not None
        expires = min(
            pool.available_since + timedelta(seconds=seconds), pool.chain_started + WARM_POOL_CHAIN_LIMIT
        )
        if seconds == 0 or expires <= at:
            pool.end(at, WarmPoolState.TERMINATED)
        else:
            pool.expires_at = expires

    def hand_over_pool(self, at: datetime, to_job: str) -> WarmPool:
        """This job's Available pool moves to `to_job`; returns it (the new job carries its chain on)."""
        pool = self.warm_pool
        assert pool is not None
        assert pool.status is WarmPoolState.AVAILABLE
        pool.end(at, WarmPoolState.REUSED, reused_by=to_job)
        self.last_modified = at
        return pool

    def pool_is_reusable(self, at: datetime) -> bool:
        pool = self.warm_pool
        return (
            pool is not None
            and pool.status is WarmPoolState.AVAILABLE
            and pool.expires_at is not None
            and pool.expires_at > at
            and pool.chain_started is not None
            and at < pool.chain_started + WARM_POOL_CHAIN_LIMIT
        )

    def collect_metrics(self, upto: datetime) -> None:
        """Queues one utilization mark per full minute of Training reached by `upto`."""
        if self.secondary != "Training" or self.metric_next is None or self.status != IN_PROGRESS:
            return
        while self.metric_next <= upto:
            self.pending_metrics.append(self.metric_next)
            self.metric_next += timedelta(seconds=METRIC_PERIOD_SECONDS)
        self._write_checkpoints(upto)

    def _write_checkpoints(self, upto: datetime) -> None:
        """The checkpoints of the Training phase reached by `upto`, each with the job image's marker."""
        if self.plan.checkpoint_seconds is None or self.checkpoint_next is None:
            return
        while self.checkpoint_next <= upto:
            at = self.checkpoint_next
            previous = self.checkpoints[-1] if self.checkpoints else None
            step = int(self.trained_seconds + _seconds(at - (self.training_phase_start or at)))
            report = (
                previous.following(at, step, "script")
                if previous is not None
                else CheckpointReport(self.plan.checkpoint_as or self.name, at, step)
            )
            self.checkpoints.append(report)
            self.pending_checkpoints.append(report)
            self.checkpoint_next = at + timedelta(seconds=self._checkpoint_gap())

    def _checkpoint_gap(self) -> float:
        """Seconds of Training until the next checkpoint: the plan's gaps in turn, the last repeating."""
        gaps = self.plan.checkpoint_seconds or (math.inf,)
        return gaps[min(len(self.checkpoints), len(gaps) - 1)]

    # --- internals -------------------------------------------------------------------------------------

    def _set_keep_alive(self, at: datetime, seconds: int) -> None:
        self.keep_alive = seconds
        self.request["ResourceConfig"]["KeepAlivePeriodInSeconds"] = seconds
        self.last_modified = at

    def _schedule(self, at: datetime, seconds: float, step: Step) -> None:
        self.next_at = at + timedelta(seconds=seconds)
        self.next_step = step

    def _enter(self, at: datetime, status: str, secondary: str, message: str) -> None:
        if self.transitions and "EndTime" not in self.transitions[-1]:
            self.transitions[-1]["EndTime"] = at
        entry: dict[str, Any] = {"Status": secondary, "StartTime": at, "StatusMessage": message}
        self.transitions.append(entry)
        self.status = status
        self.secondary = secondary
        self.last_modified = at

    def _leave_training(self, at: datetime) -> None:
        if self.secondary == "Training" and self.training_phase_start is not None:
            self.collect_metrics(at)
            self.trained_seconds += _seconds(at - self.training_phase_start)
            self.training_phase_start = None
            self.metric_next = None
            self.checkpoint_next = None

    def _end_segment(self, at: datetime) -> None:
        if self.segment_start is not None:
            self.run_seconds += _seconds(at - self.segment_start)
            self.segment_start = None
        self.runtime_deadline = None

    def _finish(self, at: datetime, status: str, secondary: str, message: str, *, keeps_pool: bool) -> None:
        self._leave_training(at)
        self._end_segment(at)
        self.next_at = self.next_step = None
        self.runtime_deadline = self.wait_deadline = None
        self._enter(at, status, secondary, message)
        self.transitions[-1]["EndTime"] = at
        self.training_end = at
        self._settle_warm_pool(at, keeps_pool)

    def _settle_warm_pool(self, at: datetime, keeps_pool: bool) -> None:
        pool = self.warm_pool
        if pool is None:
            return
        if keeps_pool and self.launched and self.keep_alive > 0 and pool.chain_started is not None:
            expires = min(at + timedelta(seconds=self.keep_alive), pool.chain_started + WARM_POOL_CHAIN_LIMIT)
            if expires > at:
                pool.status = WarmPoolState.AVAILABLE
                pool.available_since = at
                pool.expires_at = expires
                return
        pool.status = WarmPoolState.TERMINATED
        pool.expires_at = None

    # --- views -----------------------------------------------------------------------------------------

    def _shows_warm_pool(self, now: datetime) -> bool:
        """SageMaker's WarmPoolStatus goes missing for a moment right after the job ends."""
        if self.warm_pool is None:
            return False
        if self.ended and self.training_end is not None:
            lag = timedelta(seconds=self.timings.warm_pool_status_lag_seconds)
            return now >= self.training_end + lag
        return True

    def describe(self, now: datetime, *, for_event: bool = False) -> dict[str, Any]:
        """DescribeTrainingJob's answer, with datetimes (the protocol layer encodes them)."""
        out: dict[str, Any] = {"TrainingJobName": self.name, "TrainingJobArn": self.arn}
        output_path = str(self.request.get("OutputDataConfig", {}).get("S3OutputPath", "")).rstrip("/")
        out["ModelArtifacts"] = {"S3ModelArtifacts": f"{output_path}/{self.name}/output/model.tar.gz"}
        out["TrainingJobStatus"] = self.status
        out["SecondaryStatus"] = self.secondary
        if self.failure_reason:
            out["FailureReason"] = self.failure_reason
        for key in _ECHOED:
            if key in self.request:
                out[key] = copy.deepcopy(self.request[key])
        # What SageMaker fills in when the request left it out (SDK v2's Estimator.attach reads
        # OutputDataConfig.KmsKeyId and EnableNetworkIsolation without a default).
        for flag in (
            "EnableNetworkIsolation",
            "EnableInterContainerTrafficEncryption",
            "EnableManagedSpotTraining",
        ):
            out.setdefault(flag, False)
        output = out.setdefault("OutputDataConfig", {})
        output.setdefault("KmsKeyId", "")
        output.setdefault("CompressionType", "GZIP")
        out.setdefault("HyperParameters", {})
        out["ResourceConfig"] = copy.deepcopy(self.request["ResourceConfig"])
        out["StoppingCondition"] = copy.deepcopy(self.request["StoppingCondition"])
        if self.warm_pool is not None and (for_event or self._shows_warm_pool(now)):
            out["WarmPoolStatus"] = self.warm_pool_status(now)
        out["CreationTime"] = self.created_at
        if self.training_start is not None:
            out["TrainingStartTime"] = self.training_start
        if self.training_end is not None:
            out["TrainingEndTime"] = self.training_end
        out["LastModifiedTime"] = self.last_modified or self.created_at
        out["SecondaryStatusTransitions"] = [dict(t) for t in self.transitions]
        if self.ended and self.training_start is not None and self.training_end is not None:
            wall = _seconds(self.training_end - self.training_start)
            out["TrainingTimeInSeconds"] = max(1, math.floor(wall + 1e-9))  # SageMaker truncates
            # Spot bills only the time on instances; on demand, the whole run.
            billable = self.run_seconds if self.spot else wall
            out["BillableTimeInSeconds"] = max(1, _whole_seconds(billable))
        return out

    def warm_pool_status(self, now: datetime) -> dict[str, Any]:
        pool = self.warm_pool
        assert pool is not None
        status: dict[str, Any] = {"Status": pool.status.value}
        if pool.status is not WarmPoolState.IN_USE:
            status["ResourceRetainedBillableTimeInSeconds"] = pool.retained(now)
        if pool.reused_by:
            status["ReusedByJob"] = pool.reused_by
        return status

    def summary(self, now: datetime) -> dict[str, Any]:
        out: dict[str, Any] = {
            "TrainingJobName": self.name,
            "TrainingJobArn": self.arn,
            "CreationTime": self.created_at,
            "LastModifiedTime": self.last_modified or self.created_at,
            "TrainingJobStatus": self.status,
            "SecondaryStatus": self.secondary,
        }
        if self.training_end is not None:
            out["TrainingEndTime"] = self.training_end
        if self._shows_warm_pool(now):
            out["WarmPoolStatus"] = self.warm_pool_status(now)
        plan = self.request.get("ResourceConfig", {}).get("TrainingPlanArn")
        if plan:
            out["TrainingPlanArn"] = plan
        return out
