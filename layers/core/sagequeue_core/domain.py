"""The queue's vocabulary: jobs and their states, pools, warm-pool match keys, attempt names.

Pure Python with no AWS import: the policy, the store, the SageMaker emulator and the SDK all share it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sagequeue_core.checkpoints import CheckpointRecord
from sagequeue_core.defaults import (
    JOB_TAG,
    PRIORITY_TAG,
    SEAL_TAG,
    TRAINING_JOB_NAME_MAX_LENGTH,
    TRAINING_JOB_NAME_PATTERN,
)

#: Priorities are integers in this closed range; higher runs first.
PRIORITY_MIN = 0
PRIORITY_MAX = 1000
DEFAULT_PRIORITY = 0
#: The owner of a job nobody can be shown to have submitted (a live attempt entered again after the table
#: was lost: its submitter tag is anyone's to write). It matches no caller, so only admins act on the job.
UNVERIFIED_OWNER = "unverified"

_NAME_RE = re.compile(TRAINING_JOB_NAME_PATTERN)


class DomainError(ValueError):
    """A request or a change that the queue's rules refuse; the message names the problem."""


class InvalidTransition(DomainError):
    """A job was asked to move to a state its current state cannot reach."""


class JobState(StrEnum):
    QUEUED = "queued"
    HELD = "held"
    STARTING = "starting"
    RUNNING = "running"
    PREEMPTING = "preempting"
    STOPPING = "stopping"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    IDLE_STOPPED = "idle_stopped"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def is_live(self) -> bool:
        """An attempt exists on SageMaker and holds instances."""
        return self in LIVE_STATES


TERMINAL_STATES = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.IDLE_STOPPED})
LIVE_STATES = frozenset({JobState.STARTING, JobState.RUNNING, JobState.PREEMPTING, JobState.STOPPING})
WAITING_STATES = frozenset({JobState.QUEUED, JobState.HELD})

_S = JobState
#: Every allowed move. A move not listed here is a bug or a stale event, and is refused.
TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    # QUEUED -> FAILED: SageMaker refused the request (ValidationException) or attempts ran out.
    _S.QUEUED: frozenset({_S.STARTING, _S.HELD, _S.CANCELLED, _S.FAILED}),
    _S.HELD: frozenset({_S.QUEUED, _S.CANCELLED}),
    # STARTING -> QUEUED: capacity or internal failure, retried with backoff. STARTING -> COMPLETED/FAILED:
    # a short job whose intermediate events were lost; the reconcile timer sees only the end.
    _S.STARTING: frozenset(
        {_S.RUNNING, _S.QUEUED, _S.COMPLETED, _S.FAILED, _S.PREEMPTING, _S.STOPPING, _S.CANCELLED}
    ),
    _S.RUNNING: frozenset({_S.COMPLETED, _S.FAILED, _S.QUEUED, _S.PREEMPTING, _S.STOPPING}),
    # A preempted job goes back to the queue; it may also finish before the stop lands.
    _S.PREEMPTING: frozenset({_S.QUEUED, _S.COMPLETED, _S.FAILED, _S.STOPPING}),
    _S.STOPPING: frozenset({_S.CANCELLED, _S.IDLE_STOPPED, _S.FAILED, _S.COMPLETED}),
    _S.COMPLETED: frozenset(),
    _S.FAILED: frozenset(),
    _S.CANCELLED: frozenset(),
    _S.IDLE_STOPPED: frozenset(),
}


class StopReason(StrEnum):
    """Why sagequeue stopped a running attempt; decides the state the job lands in once Stopped."""

    PREEMPTED = "preempted"
    #: an attempt that ran on loan, stopped to give back the capacity it was lent (Preempt.taken_back)
    TAKEN_BACK = "taken back"
    CANCELLED = "cancelled"
    IDLE = "idle"
    POLICY = "policy"

    @property
    def requeues(self) -> bool:
        """Stopped for another job: the job goes back to the queue, and the stop counts in a budget."""
        return self in (StopReason.PREEMPTED, StopReason.TAKEN_BACK)

    @property
    def final_state(self) -> JobState:
        return {
            StopReason.PREEMPTED: JobState.QUEUED,
            StopReason.TAKEN_BACK: JobState.QUEUED,
            StopReason.CANCELLED: JobState.CANCELLED,
            StopReason.IDLE: JobState.IDLE_STOPPED,
            StopReason.POLICY: JobState.FAILED,
        }[self]


def check_transition(current: JobState, target: JobState) -> None:
    if target not in TRANSITIONS[current]:
        raise InvalidTransition(f"a {current.value} job cannot become {target.value}")


# --- Names ---------------------------------------------------------------------------------------------------


#: Two hyphens in a row mark a name sagequeue made (a later attempt, or another choice of name for one). No
#: submitted name may contain them, so no user can take, or be refused by, an attempt's name.
RESERVED_NAME_MARK = "--"
#: How many names an attempt may try in one pass when training jobs sagequeue did not start hold them.
ATTEMPT_NAME_CHOICES = 5
#: Hex digits of the random part of an attempt's fallback name (`<name>--<n>x<token>`).
FALLBACK_TOKEN_LENGTH = 12
#: Random bytes of a job's attempt secret (Job.attempt_secret), which seals its attempts.
ATTEMPT_SECRET_BYTES = 16
_FALLBACK_TOKEN = re.compile(f"[0-9a-f]{{{FALLBACK_TOKEN_LENGTH}}}")
_FALLBACK_TAIL = re.compile(f"x([0-9a-f]{{{FALLBACK_TOKEN_LENGTH}}})$")


def validate_job_name(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise DomainError("TrainingJobName is required and must be a string")
    if len(name) > TRAINING_JOB_NAME_MAX_LENGTH:
        raise DomainError(
            f"TrainingJobName {name!r} is {len(name)} characters; at most {TRAINING_JOB_NAME_MAX_LENGTH}"
        )
    if not _NAME_RE.fullmatch(name):
        raise DomainError(
            f"TrainingJobName {name!r} must match {TRAINING_JOB_NAME_PATTERN} "
            "(letters, digits and hyphens, starting with a letter or digit)"
        )
    if RESERVED_NAME_MARK in name:
        raise DomainError(
            f"TrainingJobName {name!r} contains {RESERVED_NAME_MARK!r}, which is reserved for the names "
            "sagequeue gives later attempts"
        )
    return name


def check_training_job_name(name: Any) -> str:
    """A name SageMaker accepts for a training job (attempt names included), or DomainError."""
    if not isinstance(name, str) or len(name) > TRAINING_JOB_NAME_MAX_LENGTH or not _NAME_RE.fullmatch(name):
        raise DomainError(f"{name!r} is not a training job name (it must match {TRAINING_JOB_NAME_PATTERN})")
    return name


def attempt_name(job_name: str, attempt: int, token: str = "") -> str:
    """The SageMaker training job name of attempt `attempt` (1-based) of queue entry `job_name`.

    The first attempt keeps the user's exact name, so what the SDK printed is what runs. Later attempts are
    `<name>--<n>`, a form no submitted name can take (RESERVED_NAME_MARK). When a training job sagequeue did
    not start holds that name, the attempt falls back on `<name>--<n>x<token>`, `token` random hex chosen
    just before the create: any fixed sequence of names could be created ahead by anyone allowed
    CreateTrainingJob, a random one cannot. When a name would exceed SageMaker's 63 characters it is
    shortened and a hash of the full name keeps it unique. The name is written with the intent before the
    create, so creating an attempt twice is harmless: SageMaker answers ResourceInUse for the second.
    """
    if attempt < 1:
        raise ValueError(f"attempts count from 1, got {attempt}")
    if token and not _FALLBACK_TOKEN.fullmatch(token):
        raise ValueError(f"a fallback token is {FALLBACK_TOKEN_LENGTH} lowercase hex digits, got {token!r}")
    if attempt == 1 and not token:
        return job_name
    suffix = f"{RESERVED_NAME_MARK}{attempt}" + (f"x{token}" if token else "")
    candidate = job_name + suffix
    if len(candidate) <= TRAINING_JOB_NAME_MAX_LENGTH:
        return candidate
    digest = hashlib.sha256(job_name.encode()).hexdigest()[:8]
    keep = TRAINING_JOB_NAME_MAX_LENGTH - len(suffix) - len(digest) - 1
    return f"{job_name[:keep].rstrip('-')}-{digest}{suffix}"


def is_attempt_name(training_job_name: str, job_name: str, attempt: int) -> bool:
    """Whether `training_job_name` is a name attempt `attempt` of `job_name` may have (its own or a
    fallback)."""
    if training_job_name == attempt_name(job_name, attempt):
        return True
    tail = _FALLBACK_TAIL.search(training_job_name)
    return tail is not None and training_job_name == attempt_name(job_name, attempt, tail.group(1))


def attempt_seal(secret: str, training_job_name: str) -> str:
    """The seal of attempt `training_job_name` under its queue entry's secret (the SEAL_TAG's value)."""
    return hmac.new(secret.encode(), training_job_name.encode(), hashlib.sha256).hexdigest()[:32]


# --- Priority --------------------------------------------------------------------------------------------------


def parse_priority(value: Any, *, field_name: str = "priority") -> int:
    """An integer priority in [PRIORITY_MIN, PRIORITY_MAX] from an int or a decimal string (a tag value)."""
    if isinstance(value, bool):
        raise DomainError(f"{field_name} must be an integer, got {value!r}")
    if isinstance(value, str):
        text = value.strip()
        if not re.fullmatch(r"[+-]?\d+", text):
            raise DomainError(f"{field_name} must be an integer, got {value!r}")
        value = int(text)
    if not isinstance(value, int):
        raise DomainError(f"{field_name} must be an integer, got {value!r}")
    if not PRIORITY_MIN <= value <= PRIORITY_MAX:
        raise DomainError(f"{field_name} must be between {PRIORITY_MIN} and {PRIORITY_MAX}, got {value}")
    return value


def tags_to_dict(tags: Any) -> dict[str, str]:
    """Tags as SageMaker requests carry them (`[{Key, Value}]`) or as events do (`{key: value}`)."""
    if tags is None:
        return {}
    if isinstance(tags, Mapping):
        return {str(k): "" if v is None else str(v) for k, v in tags.items()}
    if isinstance(tags, list):
        out: dict[str, str] = {}
        for tag in tags:
            if not isinstance(tag, Mapping) or "Key" not in tag:
                raise DomainError(f"each tag must be an object with Key and Value, got {tag!r}")
            out[str(tag["Key"])] = "" if tag.get("Value") is None else str(tag["Value"])
        return out
    raise DomainError(
        f"Tags must be a list of {{Key, Value}} objects or a mapping, got {type(tags).__name__}"
    )


def priority_of(request: Mapping[str, Any], explicit: Any = None) -> int:
    """The job's priority: the explicit value if given, else the `priority` tag, else the default."""
    if explicit is not None:
        return parse_priority(explicit)
    tag = tags_to_dict(request.get("Tags")).get(PRIORITY_TAG)
    if tag is not None:
        return parse_priority(tag, field_name=f"tag {PRIORITY_TAG!r}")
    return DEFAULT_PRIORITY


# --- Resources -------------------------------------------------------------------------------------------------


def demand_of(request: Mapping[str, Any]) -> dict[str, int]:
    """Instances a CreateTrainingJob request needs, per instance type (pool).

    A homogeneous job needs `InstanceCount` of `InstanceType`; a heterogeneous one (InstanceGroups) needs
    each group's count in that group's type.
    """
    config = request.get("ResourceConfig")
    if not isinstance(config, Mapping):
        raise DomainError("ResourceConfig is required")
    groups = config.get("InstanceGroups")
    demand: dict[str, int] = {}
    if groups:
        if not isinstance(groups, list):
            raise DomainError("ResourceConfig.InstanceGroups must be a list")
        for index, group in enumerate(groups):
            if not isinstance(group, Mapping):
                raise DomainError(f"ResourceConfig.InstanceGroups[{index}] must be an object")
            itype = _instance_type(group.get("InstanceType"), f"ResourceConfig.InstanceGroups[{index}]")
            count = _instance_count(group.get("InstanceCount"), f"ResourceConfig.InstanceGroups[{index}]")
            demand[itype] = demand.get(itype, 0) + count
        return demand
    itype = _instance_type(config.get("InstanceType"), "ResourceConfig")
    count = _instance_count(config.get("InstanceCount"), "ResourceConfig")
    return {itype: count}


#: A training plan's pool is named after the plan: `plan:<name>` (plan names are unique per account and
#: region, and the name is safe in a URL path where the ARN is not).
PLAN_POOL_PREFIX = "plan:"
_INSTANCE_TYPE_RE = re.compile(r"ml\.[a-z0-9]+\.[a-z0-9]+")
_PLAN_ARN_RE = re.compile(
    r"arn:(?P<partition>aws[a-z-]*):sagemaker:(?P<region>[a-z0-9-]+):(?P<account>\d{12}):training-plan/"
    r"(?P<name>[A-Za-z0-9-]{1,64})"
)
_PLAN_POOL_RE = re.compile(PLAN_POOL_PREFIX + r"[A-Za-z0-9-]{1,64}")


def is_pool_name(name: Any) -> bool:
    """An instance type (on-demand capacity) or `plan:<name>` (a training plan's reserved capacity)."""
    return isinstance(name, str) and bool(_INSTANCE_TYPE_RE.fullmatch(name) or _PLAN_POOL_RE.fullmatch(name))


def plan_pool(plan_arn: Any, where: str = "ResourceConfig.TrainingPlanArn") -> str:
    """The pool of a training plan, from its ARN."""
    match = _PLAN_ARN_RE.fullmatch(plan_arn) if isinstance(plan_arn, str) else None
    if match is None:
        raise DomainError(
            f"{where} must be a training plan ARN like "
            f"arn:aws:sagemaker:us-east-1:123456789012:training-plan/my-plan, got {plan_arn!r}"
        )
    return PLAN_POOL_PREFIX + match["name"]


def plan_home(plan_arn: str) -> tuple[str, str, str] | None:
    """(partition, region, account) of a training plan ARN, or None when it is not one."""
    match = _PLAN_ARN_RE.fullmatch(plan_arn)
    return (match["partition"], match["region"], match["account"]) if match else None


def pool_demand_of(request: Mapping[str, Any]) -> dict[str, int]:
    """Instances a request needs per pool: its instance types, or its training plan's pool when it runs on
    reserved capacity (ResourceConfig.TrainingPlanArn), which is separate from on-demand capacity."""
    demand = demand_of(request)
    config = request.get("ResourceConfig") or {}
    plan = config.get("TrainingPlanArn") if isinstance(config, Mapping) else None
    if not plan:
        return demand
    return {plan_pool(plan): sum(demand.values())}


def _instance_type(value: Any, where: str) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"ml\.[a-z0-9]+\.[a-z0-9]+", value):
        raise DomainError(
            f"{where}.InstanceType must be an instance type like ml.trn1.32xlarge, got {value!r}"
        )
    return value


def _instance_count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DomainError(f"{where}.InstanceCount must be an integer of at least 1, got {value!r}")
    return value


def has_checkpoints(request: Mapping[str, Any]) -> bool:
    config = request.get("CheckpointConfig")
    return isinstance(config, Mapping) and bool(config.get("S3Uri"))


def primary_pool(demand: Mapping[str, int]) -> str:
    """The pool a job is queued in: its only instance type, or the first group's."""
    return next(iter(demand))


@dataclass(frozen=True)
class ResourceKey:
    """What must be identical for a new job to reuse a warm pool (SageMaker's documented match rule).

    Image, hyperparameters, inputs, environment and tags may differ; these may not.
    """

    role_arn: str
    instance_type: str
    instance_count: int
    volume_size_gb: int
    volume_kms_key_id: str = ""
    subnets: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    inter_container_encryption: bool = False
    network_isolation: bool = False
    training_plan_arn: str = ""

    @property
    def pool(self) -> str:
        """The pool whose instances a warm pool of this key holds."""
        return plan_pool(self.training_plan_arn) if self.training_plan_arn else self.instance_type

    @classmethod
    def from_request(cls, request: Mapping[str, Any]) -> ResourceKey | None:
        """The key of a CreateTrainingJob request or DescribeTrainingJob response; None when the job
        cannot use a warm pool at all (managed spot, heterogeneous clusters, incomplete config)."""
        config = request.get("ResourceConfig") or {}
        if config.get("InstanceGroups") or request.get("EnableManagedSpotTraining"):
            return None
        instance_type = config.get("InstanceType")
        count = config.get("InstanceCount")
        if not isinstance(instance_type, str) or not isinstance(count, int):
            return None
        vpc = request.get("VpcConfig") or {}
        return cls(
            role_arn=str(request.get("RoleArn", "")),
            instance_type=instance_type,
            instance_count=count,
            volume_size_gb=int(config.get("VolumeSizeInGB", 0) or 0),
            volume_kms_key_id=str(config.get("VolumeKmsKeyId", "") or ""),
            subnets=tuple(sorted(vpc.get("Subnets") or ())),
            security_group_ids=tuple(sorted(vpc.get("SecurityGroupIds") or ())),
            inter_container_encryption=bool(request.get("EnableInterContainerTrafficEncryption", False)),
            network_isolation=bool(request.get("EnableNetworkIsolation", False)),
            training_plan_arn=str(config.get("TrainingPlanArn", "") or ""),
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ResourceKey:
        return cls(
            role_arn=data["role_arn"],
            instance_type=data["instance_type"],
            instance_count=int(data["instance_count"]),
            volume_size_gb=int(data["volume_size_gb"]),
            volume_kms_key_id=data.get("volume_kms_key_id", ""),
            subnets=tuple(data.get("subnets", ())),
            security_group_ids=tuple(data.get("security_group_ids", ())),
            inter_container_encryption=bool(data.get("inter_container_encryption", False)),
            network_isolation=bool(data.get("network_isolation", False)),
            training_plan_arn=str(data.get("training_plan_arn", "") or ""),
        )


class ReservationKind(StrEnum):
    """Why a job holds capacity between passes."""

    PREEMPTED = "preempted"  # it stopped lower-priority work for itself
    RELEASED = "released"  # it released warm pools or waits for stopping attempts' instances
    DRAIN = "drain"  # it waited at the head of its pool long enough: nothing smaller may overtake it


@dataclass(frozen=True)
class Reservation:
    """Capacity promised to a waiting job, stored with the job so that it outlives the pass."""

    instances: Mapping[str, int]  # pool -> instances the job holds (free, returning or released)
    since: datetime
    kind: ReservationKind

    def to_dict(self) -> dict[str, Any]:
        return {"instances": dict(self.instances), "since": self.since.isoformat(), "kind": self.kind.value}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Reservation:
        since = parse_time(data.get("since"))
        if since is None:
            raise DomainError(f"reservation without a time: {data!r}")
        return cls(
            instances={str(k): int(v) for k, v in dict(data.get("instances") or {}).items()},
            since=since,
            kind=ReservationKind(data.get("kind", ReservationKind.DRAIN.value)),
        )

    def describe(self, demand: Mapping[str, int]) -> str:
        held = ", ".join(
            f"{self.instances.get(pool, 0)} of {need} {pool}" for pool, need in sorted(demand.items())
        )
        return f"reserved ({self.kind.value}) since {self.since:%Y-%m-%dT%H:%M:%SZ}: holds {held}"


@dataclass(frozen=True)
class Pool:
    """A set of interchangeable instances the queue may fill: one instance type, a capacity in instances."""

    instance_type: str
    capacity: int

    def __post_init__(self) -> None:
        if not is_pool_name(self.instance_type):
            raise DomainError(
                f"a pool is an instance type like ml.trn1.32xlarge or a training plan's plan:<name>, "
                f"got {self.instance_type!r}"
            )
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int) or self.capacity < 0:
            raise DomainError(f"capacity of {self.instance_type} must be a non-negative integer")


def never_fits(demand: Mapping[str, int], capacity: Mapping[str, int]) -> str | None:
    """Why a job cannot start whatever runs, while the pools keep their capacity; None if it can."""
    for pool, need in sorted(demand.items()):
        size = capacity.get(pool, 0)
        if size == 0:
            return f"pool drained: {pool} has capacity 0"
        if need > size:
            return f"can never fit: needs {need} {pool}, the pool's capacity is {size}"
    return None


def beyond_window(pool: str, position: int, lookahead: int) -> str:
    return (
        f"waiting: position {position} in the {pool} queue; each pass considers the first {lookahead} jobs "
        "that fit"
    )


def active_quota(
    quota: int | None, seen_at: datetime | None, now: datetime, memory_seconds: int
) -> int | None:
    """An account quota learned from a refusal, while it is recent enough to plan with; else None."""
    if quota is None or seen_at is None or (now - seen_at).total_seconds() >= memory_seconds:
        return None
    return quota


class CapacityWaitKind(StrEnum):
    EC2 = "ec2"  # InProgress/Starting: "Insufficient capacity error from EC2 while launching instances, retrying!"
    TRAINING_PLAN = "training-plan"  # InProgress/Pending: the plan's reserved instances are all in use


@dataclass(frozen=True)
class CapacityWait:
    """An attempt SageMaker accepted but cannot launch yet: what it waits for, and since when."""

    kind: CapacityWaitKind
    since: datetime

    def describe(self) -> str:
        what = "EC2 capacity" if self.kind is CapacityWaitKind.EC2 else "capacity in its training plan"
        return f"waiting for {what} since {self.since.strftime('%Y-%m-%dT%H:%M:%SZ')}"

    def to_dict(self) -> dict[str, str]:
        return {"kind": self.kind.value, "since": self.since.isoformat()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CapacityWait:
        return cls(CapacityWaitKind(data["kind"]), datetime.fromisoformat(str(data["since"])))


@dataclass
class Job:
    """One queue entry and the state of its current attempt."""

    name: str
    request: dict[str, Any]
    priority: int
    owner: str
    submitted_at: datetime
    state: JobState = JobState.QUEUED
    attempt: int = 0  # number of the current (or last) attempt; 0 until it first starts
    training_job_name: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    reason: str | None = None
    stop_reason: StopReason | None = None
    #: times an attempt was stopped for another job (MaxPreemptionsPerJob): a more important job, a team
    #: reclaiming its quota, or a loan ended for a job no more important than its lender
    preemptions: int = 0
    #: times an attempt that ran on loan was stopped for its lender, or for a job more important than its
    #: lender (Preempt.taken_back): counted apart, against a budget of the same size checked when the job
    #: borrows (docs/adr/0001-scheduling-policy.md)
    loans_taken_back: int = 0
    retries: int = 0  # requeues after transient SageMaker failures
    #: attempts that ran on SageMaker and ended, and their seconds in SageMaker's Training phase: totals that
    #: outlive the bounded history (see count_ended_attempt)
    attempts_ended: int = 0
    seconds_trained: int = 0
    #: the last attempt whose end is in the totals: each attempt is counted once, whatever arrives twice
    counted_attempt: int = 0
    not_before: datetime | None = None  # backoff: not started again before this time
    reused_warm_pool_of: str | None = None  # training job whose warm pool the current attempt reuses
    keep_alive_seconds: int = 0  # keep-alive the scheduler set on the current attempt
    #: the waiting job whose reserved capacity the current attempt borrows: that job preempts it as soon as
    #: it can start, whatever the minimum runtime
    on_loan_for: str | None = None
    #: when the current attempt first reached SageMaker's Training phase; the minimum runtime before
    #: preemption counts from here, so a slow provisioning cannot make a victim of a job that never trained
    training_started_at: datetime | None = None
    #: when the job last entered the queue (submission or requeue): how long it has waited at its place
    queued_since: datetime | None = None
    #: capacity promised to the job by an earlier pass; kept until it starts, is held, cancelled or outranked
    reservation: Reservation | None = None
    #: whose quota the job draws on (docs/adr/0011-team-quotas.md); None: no team
    team: str | None = None
    #: the current attempt waits for capacity SageMaker does not have (docs/adr/0017): EC2's, retrying in
    #: Starting, or its training plan's, in Pending; since when SageMaker says. None: it is not waiting
    capacity_wait: CapacityWait | None = None
    #: requeues after SageMaker ran out of capacity (CapacityError, MaxPendingTimeInSeconds): they back off
    #: but do not count against max_attempts, which bounds failures, not scarcity
    capacity_requeues: int = 0
    #: random, kept in the table and never returned by the API: seals the job's attempts (SEAL_TAG); set
    #: when its first attempt is recorded
    attempt_secret: str | None = None
    #: what the scheduler last read of the current attempt's checkpoint marker (docs/adr/0025); None before
    #: the first read of the attempt, and again when a new attempt starts
    checkpoint: CheckpointRecord | None = None
    version: int = 0  # optimistic-locking counter, owned by the store
    history: list[dict[str, Any]] = field(default_factory=list)  # [{at, state, attempt, reason}]

    @property
    def demand(self) -> dict[str, int]:
        """Instances per pool: instance types, or the training plan's pool."""
        return pool_demand_of(self.request)

    @property
    def pool(self) -> str:
        return primary_pool(self.demand)

    @property
    def resource_key(self) -> ResourceKey | None:
        return ResourceKey.from_request(self.request)

    @property
    def warnings(self) -> list[str]:
        """What the owner should know about how the queue will treat the job."""
        if self.checkpointed:
            return []
        return [
            "no CheckpointConfig: if this job is preempted it restarts from the beginning; it is preempted "
            "only after jobs that resume from checkpoints"
        ]

    @property
    def checkpointed(self) -> bool:
        """It resumes from checkpoints after a preemption (CheckpointConfig.S3Uri), or restarts from zero."""
        return has_checkpoints(self.request)

    @property
    def max_runtime_seconds(self) -> int | None:
        """StoppingCondition.MaxRuntimeInSeconds as the submitter gave it; None when left to SageMaker's
        default. SageMaker stops the job once it has trained this long, so it bounds when it ends."""
        condition = self.request.get("StoppingCondition")
        value = condition.get("MaxRuntimeInSeconds") if isinstance(condition, Mapping) else None
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    @property
    def last_checkpoint(self) -> CheckpointRecord | None:
        """The current attempt's checkpoint record, if it has seen one; None: none written yet, or not known."""
        record = self.checkpoint
        if record is None or record.at is None or record.training_job_name != self.training_job_name:
            return None
        return record

    def next_attempt_name(self) -> str:
        return attempt_name(self.name, self.attempt + 1)

    def is_next_attempt(self, training_job_name: str) -> bool:
        """Whether `training_job_name` is one of the names the job's next attempt may have."""
        return is_attempt_name(training_job_name, self.name, self.attempt + 1)

    def seal(self, training_job_name: str) -> str | None:
        """The seal an attempt of this job named `training_job_name` carries (None before any attempt)."""
        return attempt_seal(self.attempt_secret, training_job_name) if self.attempt_secret else None

    def started(self, training_job_name: str, tags: Mapping[str, str]) -> bool:
        """Whether the scheduler started training job `training_job_name` (whose tags are `tags`) as an
        attempt of this job: it is the current attempt (`holds`), or it carries this job's tag and a seal
        that verifies. The tags alone prove nothing: anyone allowed AddTags can set them."""
        if self.holds(training_job_name, tags):
            return True
        seal = self.seal(training_job_name)
        found = tags.get(SEAL_TAG)
        return (
            tags.get(JOB_TAG) == self.name
            and seal is not None
            and found is not None
            and hmac.compare_digest(seal, found)
        )

    def holds(self, training_job_name: str, tags: Mapping[str, str]) -> bool:
        """Whether training job `training_job_name` (whose tags are `tags`) is this job's current attempt. The
        table names the attempt from its intent on, before CreateTrainingJob: while the job is starting, a
        training job of that name is its attempt only with its seal. Without it, it is someone else's that
        held the name (the create is refused and the attempt takes another name): what is done about that
        training job (a policy or idle stop) is not done about this job. A job that has no secret (entered
        before seals) is held by the name alone."""
        if self.training_job_name != training_job_name:
            return False
        seal = self.seal(training_job_name)
        if self.state is not JobState.STARTING or seal is None:
            return True
        found = tags.get(SEAL_TAG)
        return found is not None and hmac.compare_digest(seal, found)

    def count_ended_attempt(self, seconds_trained: float | None) -> bool:
        """Add the current attempt, which has just ended, to the totals; False if it is counted already."""
        if self.attempt <= self.counted_attempt:
            return False
        self.counted_attempt = self.attempt
        self.attempts_ended += 1
        self.seconds_trained += max(round(seconds_trained or 0), 0)
        return True

    def count_requeue(self) -> None:
        """The attempt stopped for another job has ended: count the stop in its budget."""
        if self.stop_reason is StopReason.TAKEN_BACK:
            self.loans_taken_back += 1
        else:
            self.preemptions += 1

    def transition(self, target: JobState, now: datetime, reason: str | None = None) -> None:
        """Move to `target`, recording when and why; refuses moves not in TRANSITIONS."""
        check_transition(self.state, target)
        self.state = target
        if target is not JobState.STARTING:
            self.capacity_wait = None  # an attempt waits for capacity only while it is starting
        if target is JobState.QUEUED:
            self.queued_since = now
        else:
            self.reservation = None  # a promise to a waiting job ends when it leaves the queue
        if reason is not None:
            self.reason = reason
        if target.is_terminal:
            self.ended_at = now
        self.history.append(
            {"at": now.isoformat(), "state": target.value, "attempt": self.attempt, "reason": reason}
        )

    def to_api(self) -> dict[str, Any]:
        """The job as the API reports it."""
        return {
            "name": self.name,
            "state": self.state.value,
            "priority": self.priority,
            "pool": self.pool,
            "attempt": self.attempt,
            "training_job_name": self.training_job_name,
            "owner": self.owner,
            "submitted_at": _iso(self.submitted_at),
            "started_at": _iso(self.started_at),
            "ended_at": _iso(self.ended_at),
            "reason": self.reason,
            "preemptions": self.preemptions,
            "loans_taken_back": self.loans_taken_back,
            "retries": self.retries,
            "attempts_ended": self.attempts_ended,
            "seconds_trained": self.seconds_trained,
            "reservation": self.reservation.to_dict() if self.reservation else None,
            "warnings": self.warnings,
            "training_started_at": _iso(self.training_started_at),
            "instances": sum(self.demand.values()),
            "team": self.team,
            "on_loan_for": self.on_loan_for if self.state.is_live else None,
            "capacity_wait": self.capacity_wait.to_dict() if self.capacity_wait else None,
            "capacity_requeues": self.capacity_requeues,
            "max_runtime_seconds": self.max_runtime_seconds,
            "checkpoint": self._checkpoint_api(),
        }

    def _checkpoint_api(self) -> dict[str, Any] | None:
        """The live attempt's last checkpoint (docs/adr/0025); None when it has none or is not live."""
        record = self.last_checkpoint
        if record is None or not self.state.is_live:
            return None
        return {
            "at": _iso(record.at),
            "step": record.step,
            "count": record.count,
            "interval_seconds": record.interval_seconds,
        }


def parse_time(value: Any) -> datetime | None:
    """Epoch milliseconds (real events), epoch seconds, ISO 8601 strings, or datetimes; None if unreadable."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, int | float):
        # Anything after 2001-09-09 in milliseconds is above 1e12; in seconds it is far below.
        seconds = value / 1000 if value > 1e11 else value
        return datetime.fromtimestamp(seconds, UTC)
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        if text.replace(".", "", 1).isdigit():
            return parse_time(float(text))
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return None


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def check_tag_pattern(key: str, pattern: str) -> None:
    """DomainError unless `pattern`, the rule a required tag's value must match, is a regular expression."""
    try:
        re.compile(pattern)
    except re.error as exc:
        raise DomainError(f"required tag {key!r}: invalid pattern {pattern!r}: {exc}") from exc


def parse_required_tags(spec: str) -> dict[str, str | None]:
    """`team,project=^[a-z-]+$,cost-center` -> {team: None, project: '^[a-z-]+$', cost-center: None}.

    Entries are separated by commas; a key may carry `=<regex>` that its value must match in full. It lives
    here rather than in governance so that reading the settings does not load the governance rules.
    """
    rules: dict[str, str | None] = {}
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            continue
        key, sep, pattern = entry.partition("=")
        key = key.strip()
        if not key:
            raise DomainError(f"required tag entry {entry!r} has no key")
        rules[key] = pattern.strip() if sep else None
        if sep:
            check_tag_pattern(key, rules[key] or "")
    return rules
