"""Settings, read once from the environment and validated.

Every variable sagequeue reads is named here, once, with its default. Field names are the snake_case of
the stack parameters (`Capacity` -> `capacity`); the environment variable is `SAGEQUEUE_` plus the field
name in upper case (`SAGEQUEUE_CAPACITY`). Lists are comma-separated; the capacity is
`<instance type>=<instances>` pairs, e.g. `ml.trn1.32xlarge=2,ml.trn2.48xlarge=1`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sagequeue_core.defaults import EXEMPT_TAG
from sagequeue_core.domain import DomainError
from sagequeue_core.governance import PolicyRules, parse_required_tags

ENV_PREFIX = "SAGEQUEUE_"

_INSTANCE_TYPE = re.compile(r"ml\.[a-z0-9]+\.[a-z0-9]+")
_ROLE_ARN = re.compile(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+")
_PRINCIPAL_ARN = re.compile(r"arn:aws[a-z-]*:(iam|sts)::\d{12}:[\w+=,.@/-]+")


class ConfigError(ValueError):
    """A setting is missing or invalid; the message names the environment variable."""


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def _split(value: Any) -> Any:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


def parse_capacity(spec: str) -> dict[str, int]:
    """`ml.trn1.32xlarge=2,ml.trn2.48xlarge=1` -> {ml.trn1.32xlarge: 2, ml.trn2.48xlarge: 1}."""
    capacity: dict[str, int] = {}
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            continue
        instance_type, sep, count = (part.strip() for part in entry.partition("="))
        if not sep or not _INSTANCE_TYPE.fullmatch(instance_type):
            raise ValueError(f"entry {entry!r} must be <instance type>=<instances>, e.g. ml.trn1.32xlarge=2")
        if not count.isdigit():
            raise ValueError(f"entry {entry!r}: instances must be a non-negative integer")
        if instance_type in capacity:
            raise ValueError(f"instance type {instance_type} is listed twice")
        capacity[instance_type] = int(count)
    return capacity


class Settings(BaseModel):
    """sagequeue's settings; `Settings.from_env()` reads them, each from `SAGEQUEUE_<FIELD>`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # --- where things live ------------------------------------------------------------------------------
    #: The DynamoDB table that holds jobs, pools, warm pools and the idempotency ledger.
    table_name: str = "sagequeue"
    #: The EventBridge bus sagequeue publishes its own events on.
    event_bus_name: str = "sagequeue"

    # --- scheduler ----------------------------------------------------------------------------------------
    #: Instances per pool (instance type), seeded into the table; PUT /pools changes them at runtime.
    capacity: dict[str, int] = Field(default_factory=dict)
    #: Roles a submitted job may pass to SageMaker (RoleArn). Empty refuses every submission: the scheduler
    #: passes the role, so an open list would let any submitter run code as any role.
    allowed_role_arns: tuple[str, ...] = ()
    #: Principals (role or user ARNs) that may change any job and set pool capacity.
    admin_role_arns: tuple[str, ...] = ()
    #: Highest priority a non-admin may submit or set; admins may use the whole range.
    max_priority_for_non_admins: int = Field(default=1000, ge=0, le=1000)
    #: A running attempt is not preempted before it has run this long, so preemption cannot thrash.
    min_runtime_before_preemption_seconds: int = Field(default=600, ge=0)
    #: Keep-alive set on a start when a queued job would reuse its instances next (0 disables it).
    default_keep_alive_seconds: int = Field(default=600, ge=0, le=21_600)
    #: Attempts per job before capacity or internal failures fail it for good.
    max_attempts: int = Field(default=5, ge=1, le=100)
    #: Queued jobs read per pool per pass (K): the pass reads this many, whatever the queue's length.
    queue_lookahead: int = Field(default=50, ge=1, le=1000)
    #: First backoff after a capacity or internal failure; doubles per retry up to max_backoff_seconds.
    retry_backoff_seconds: int = Field(default=60, ge=0)
    max_backoff_seconds: int = Field(default=1800, ge=0)
    #: Largest request body the API accepts, in bytes (the job item must fit DynamoDB's 400 KB).
    max_request_bytes: int = Field(default=131_072, ge=1024, le=300_000)

    # --- governance ---------------------------------------------------------------------------------------
    #: Tags every job must carry: `team,project=^[a-z-]+$` (a key, optionally `=<regex>` for its value).
    required_tags: str = ""
    #: Instance types jobs may use; empty allows every type.
    allowed_instance_types: tuple[str, ...] = ()
    #: Instances one job may request in total; None: no limit.
    max_instances_per_job: int | None = Field(default=None, ge=1)
    #: Longest StoppingCondition.MaxRuntimeInSeconds a job may ask for; None: no limit.
    max_runtime_seconds: int | None = Field(default=None, ge=1)
    #: A job tagged `<exempt_tag>=true` is exempt from the tag and policy rules and from the idle stop.
    exempt_tag: str = EXEMPT_TAG
    #: A host is idle below this NeuronCore (or GPU) utilization, in percent.
    idle_threshold_percent: float = Field(default=5.0, ge=0.0, le=100.0)
    #: Length of one idle-alarm evaluation period.
    idle_period_seconds: int = Field(default=300, ge=60)
    #: Consecutive idle periods before a job is stopped.
    idle_periods: int = Field(default=6, ge=1)
    #: A host that reports no metrics at all is stopped after this many idle windows (docs/adr/0002).
    idle_silence_factor: int = Field(default=2, ge=1)
    #: A job that fails after running at least this long may be resumed from its checkpoints.
    resume_after_failure_min_runtime_seconds: int = Field(default=600, ge=0)
    #: Resumes after failures per job.
    max_resumes: int = Field(default=2, ge=0)
    #: Spot interruptions per job before it is no longer resumed.
    max_spot_interruptions: int = Field(default=3, ge=0)
    #: SNS topic the idle alarms notify; empty until the governance part of the stack exists.
    alarm_topic_arn: str = ""
    #: SNS topic for notifications to people (policy violations, idle stops).
    notification_topic_arn: str = ""

    @field_validator("capacity", mode="before")
    @classmethod
    def _parse_capacity(cls, value: Any) -> Any:
        if isinstance(value, str):
            return parse_capacity(value)
        return value

    @field_validator("capacity")
    @classmethod
    def _check_capacity(cls, value: dict[str, int]) -> dict[str, int]:
        for instance_type, count in value.items():
            if not _INSTANCE_TYPE.fullmatch(instance_type):
                raise ValueError(f"{instance_type!r} is not an instance type like ml.trn1.32xlarge")
            if count < 0:
                raise ValueError(f"capacity of {instance_type} must not be negative")
        return value

    @field_validator("allowed_role_arns", "admin_role_arns", "allowed_instance_types", mode="before")
    @classmethod
    def _parse_list(cls, value: Any) -> Any:
        return _split(value)

    @field_validator("allowed_role_arns")
    @classmethod
    def _check_roles(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for arn in value:
            if not _ROLE_ARN.fullmatch(arn):
                raise ValueError(f"{arn!r} is not an IAM role ARN (arn:aws:iam::<account>:role/<name>)")
        return value

    @field_validator("admin_role_arns")
    @classmethod
    def _check_admins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for arn in value:
            if not _PRINCIPAL_ARN.fullmatch(arn):
                raise ValueError(f"{arn!r} is not an IAM principal ARN")
        return value

    @field_validator("allowed_instance_types")
    @classmethod
    def _check_types(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for instance_type in value:
            if not _INSTANCE_TYPE.fullmatch(instance_type):
                raise ValueError(f"{instance_type!r} is not an instance type like ml.trn1.32xlarge")
        return value

    @field_validator("required_tags")
    @classmethod
    def _check_required_tags(cls, value: str) -> str:
        try:
            PolicyRules(required_tags=parse_required_tags(value))
        except DomainError as exc:
            raise ValueError(str(exc)) from exc
        return value

    @field_validator("max_instances_per_job", "max_runtime_seconds", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip() in ("", "0"):
            return None
        return value

    @property
    def policy_rules(self) -> PolicyRules:
        """The governance rules submissions and running jobs are checked against."""
        return PolicyRules(
            required_tags=parse_required_tags(self.required_tags),
            allowed_instance_types=frozenset(self.allowed_instance_types),
            max_instances_per_job=self.max_instances_per_job,
            max_runtime_seconds=self.max_runtime_seconds,
            exempt_tag=self.exempt_tag,
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """Settings from `SAGEQUEUE_*` variables; raises ConfigError naming the variable that is wrong."""
        values = {name: environ[env_name(name)] for name in cls.model_fields if env_name(name) in environ}
        return cls.build(**values)

    @classmethod
    def build(cls, **values: Any) -> Settings:
        """Settings from keyword values (strings as in the environment, or typed values)."""
        try:
            return cls(**values)
        except ValidationError as exc:
            problems = []
            for error in exc.errors():
                field = str(error["loc"][0]) if error["loc"] else "settings"
                name = env_name(field) if field in cls.model_fields else field
                message = str(error["msg"]).removeprefix("Value error, ")
                problems.append(f"{name}: {message}")
            raise ConfigError("invalid settings: " + "; ".join(problems)) from None
