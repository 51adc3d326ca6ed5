"""Settings, read once from the environment and validated.

Every variable sagequeue reads is named here, once, with its default. Field names are the snake_case of
the stack parameters (`Capacity` -> `capacity`); the environment variable is `SAGEQUEUE_` plus the field
name in upper case (`SAGEQUEUE_CAPACITY`). Lists are comma-separated; the capacity is
`<instance type>=<instances>` pairs, e.g. `ml.trn1.32xlarge=2,ml.trn2.48xlarge=1`.

Settings are a plain dataclass whose fields each name their parser: every handler reads them at its cold
start, and a validation library would cost more to import than the handler's own code
(docs/adr/0004-cold-start-budget.md).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from sagequeue_core.defaults import EXEMPT_TAG
from sagequeue_core.domain import DomainError, is_pool_name, parse_required_tags

if TYPE_CHECKING:
    from sagequeue_core.governance import IdleRules, PolicyRules

ENV_PREFIX = "SAGEQUEUE_"

_INSTANCE_TYPE = re.compile(r"ml\.[a-z0-9]+\.[a-z0-9]+")
_ROLE_ARN = re.compile(r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+")
_PRINCIPAL_ARN = re.compile(r"arn:aws[a-z-]*:(iam|sts)::\d{12}:[\w+=,.@/-]+")
_INTEGER = re.compile(r"[+-]?\d+")

Parser = Callable[[Any], Any]


class ConfigError(ValueError):
    """A setting is missing or invalid; the message names the environment variable."""


def env_name(field_name: str) -> str:
    return ENV_PREFIX + field_name.upper()


def parse_capacity(spec: str) -> dict[str, int]:
    """`ml.trn1.32xlarge=2,ml.trn2.48xlarge=1` -> {ml.trn1.32xlarge: 2, ml.trn2.48xlarge: 1}."""
    capacity: dict[str, int] = {}
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            continue
        instance_type, sep, count = (part.strip() for part in entry.partition("="))
        if not sep or not is_pool_name(instance_type):
            raise ValueError(
                f"entry {entry!r} must be <pool>=<instances>, the pool an instance type or a training plan's "
                "plan:<name>, e.g. ml.trn1.32xlarge=2,plan:my-plan=4"
            )
        if not count.isdigit():
            raise ValueError(f"entry {entry!r}: instances must be a non-negative integer")
        if instance_type in capacity:
            raise ValueError(f"instance type {instance_type} is listed twice")
        capacity[instance_type] = int(count)
    return capacity


# --- parsers: a value as given (a string from the environment, or a typed value) -> the typed value ------------


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"must be a string, got {value!r}")
    return value


def _bounded(number: Any, ge: float | None, le: float | None) -> Any:
    if ge is not None and number < ge:
        raise ValueError(f"must be greater than or equal to {ge}, got {number}")
    if le is not None and number > le:
        raise ValueError(f"must be less than or equal to {le}, got {number}")
    return number


def _to_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError(f"must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
        return int(value.strip())
    raise ValueError(f"must be an integer, got {value!r}")


def _integer(*, ge: int | None = None, le: int | None = None) -> Parser:
    def parse(value: Any) -> int:
        number: int = _bounded(_to_int(value), ge, le)
        return number

    return parse


_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off"})


def _boolean(value: Any) -> bool:
    """true/false as a stack parameter or an environment variable gives it (also 1/0, yes/no, on/off)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"must be true or false, got {value!r}")


def _optional_integer(*, ge: int | None = None) -> Parser:
    """None, an empty string or 0 (how a stack parameter says "no limit") mean None."""

    def parse(value: Any) -> int | None:
        if value is None or (isinstance(value, str) and value.strip() in ("", "0")):
            return None
        number: int = _bounded(_to_int(value), ge, None)
        return number

    return parse


def _number(*, ge: float | None = None, le: float | None = None) -> Parser:
    def parse(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError(f"must be a number, got {value!r}")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"must be a number, got {value!r}") from None
        if not math.isfinite(number):
            raise ValueError(f"must be a finite number, got {value!r}")
        result: float = _bounded(number, ge, le)
        return result

    return parse


def _list(pattern: re.Pattern[str], what: str) -> Parser:
    """A comma-separated string or a sequence of strings, each matching `pattern` in full."""

    def parse(value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            items = tuple(part.strip() for part in value.split(",") if part.strip())
        elif isinstance(value, list | tuple | set | frozenset):
            items = tuple(value)
        else:
            raise ValueError(f"must be a comma-separated list, got {value!r}")
        for item in items:
            if not isinstance(item, str) or not pattern.fullmatch(item):
                raise ValueError(f"{item!r} is not {what}")
        return items

    return parse


def _capacity(value: Any) -> dict[str, int]:
    if isinstance(value, str):
        return parse_capacity(value)
    if not isinstance(value, Mapping):
        raise ValueError(f"must be <instance type>=<instances> pairs, got {value!r}")
    capacity: dict[str, int] = {}
    for instance_type, count in value.items():
        if not is_pool_name(instance_type):
            raise ValueError(
                f"{instance_type!r} is not a pool: an instance type like ml.trn1.32xlarge or plan:<name>"
            )
        try:
            capacity[instance_type] = _to_int(count)
        except ValueError:
            raise ValueError(f"capacity of {instance_type} must be an integer, got {count!r}") from None
        if capacity[instance_type] < 0:
            raise ValueError(f"capacity of {instance_type} must not be negative")
    return capacity


def _required_tags(value: Any) -> str:
    spec = _text(value)
    try:
        parse_required_tags(spec)
    except DomainError as exc:
        raise ValueError(str(exc)) from exc
    return spec


def _team_roles(value: Any) -> dict[str, str]:
    """`arn:aws:iam::123456789012:role/vision=vision,...` (or a mapping) -> {role ARN: team}."""
    from sagequeue_core.quotas import QuotaError, check_team_name

    if isinstance(value, Mapping):
        pairs = [(str(k), str(v)) for k, v in value.items()]
    else:
        pairs = []
        for raw in _text(value).split(","):
            entry = raw.strip()
            if entry:
                arn, sep, team = (part.strip() for part in entry.rpartition("="))
                if not sep:
                    raise ValueError(f"entry {entry!r} must be <role ARN>=<team>")
                pairs.append((arn, team))
    roles: dict[str, str] = {}
    for arn, team in pairs:
        if not _PRINCIPAL_ARN.fullmatch(arn):
            raise ValueError(f"{arn!r} is not an IAM role ARN")
        try:
            roles[arn] = check_team_name(team)
        except QuotaError as exc:
            raise ValueError(str(exc)) from None
    return roles


def _team_execution_roles(value: Any) -> dict[str, tuple[str, ...]]:
    """`vision=arn:aws:iam::123456789012:role/vision-data,...` (a team may come back with more roles; or a
    mapping of team to role ARNs) -> {team: (role ARN, ...)}."""
    from sagequeue_core.quotas import QuotaError, check_team_name

    pairs: list[tuple[str, str]] = []
    if isinstance(value, Mapping):
        for team, roles in value.items():
            for role in [roles] if isinstance(roles, str) else roles:
                pairs.append((str(team), str(role)))
    else:
        for raw in _text(value).split(","):
            entry = raw.strip()
            if entry:
                team, sep, role = (part.strip() for part in entry.partition("="))
                if not sep:
                    raise ValueError(f"entry {entry!r} must be <team>=<role ARN>")
                pairs.append((team, role))
    by_team: dict[str, tuple[str, ...]] = {}
    for team, role in pairs:
        if not _ROLE_ARN.fullmatch(role):
            raise ValueError(f"{role!r} is not an IAM role ARN")
        try:
            check_team_name(team)
        except QuotaError as exc:
            raise ValueError(str(exc)) from None
        if role not in by_team.get(team, ()):
            by_team[team] = (*by_team.get(team, ()), role)
    return by_team


def _priority_ceilings(value: Any) -> dict[str, int]:
    """`speech=300,arn:aws:iam::123456789012:role/ci=100` (or a mapping) -> {team or principal ARN: ceiling}."""
    from sagequeue_core.quotas import QuotaError, check_team_name

    if isinstance(value, Mapping):
        pairs = [(str(k), v) for k, v in value.items()]
    else:
        pairs = []
        for raw in _text(value).split(","):
            entry = raw.strip()
            if entry:
                key, sep, ceiling = (part.strip() for part in entry.rpartition("="))
                if not sep:
                    raise ValueError(f"entry {entry!r} must be <team or principal ARN>=<priority>")
                pairs.append((key, ceiling))
    ceilings: dict[str, int] = {}
    for key, ceiling in pairs:
        if key.startswith("arn:"):
            if not _PRINCIPAL_ARN.fullmatch(key):
                raise ValueError(f"{key!r} is not an IAM principal ARN")
        else:
            try:
                check_team_name(key)
            except QuotaError as exc:
                raise ValueError(str(exc)) from None
        ceilings[key] = _bounded(_to_int(ceiling), 0, 1000)
    return ceilings


def setting(default: Any, parse: Parser) -> Any:
    """A settings field: its default and the parser its values go through."""
    return dataclasses.field(default=default, metadata={"parse": parse})


@dataclasses.dataclass(frozen=True)
class Settings:
    """sagequeue's settings; `Settings.from_env()` reads them, each from `SAGEQUEUE_<FIELD>`. Values given
    to the constructor are parsed as the environment's strings are; an invalid one raises ConfigError."""

    # --- where things live ------------------------------------------------------------------------------
    #: The DynamoDB table that holds jobs, pools, warm pools and the idempotency ledger.
    table_name: str = setting("sagequeue", _text)
    #: The EventBridge bus sagequeue publishes its own events on.
    event_bus_name: str = setting("sagequeue", _text)
    #: The stack's own partition, region and account: only training plans of these are pools (empty: any).
    partition: str = setting("", _text)
    region: str = setting("", _text)
    account_id: str = setting("", _text)

    # --- scheduler ----------------------------------------------------------------------------------------
    #: Instances per pool (instance type), seeded into the table; PUT /pools changes them at runtime.
    capacity: dict[str, int] = dataclasses.field(default_factory=dict, metadata={"parse": _capacity})
    #: Roles a submitted job may pass to SageMaker (RoleArn). Empty refuses every submission: the scheduler
    #: passes the role, so an open list would let any submitter run code as any role.
    allowed_role_arns: tuple[str, ...] = setting(
        (), _list(_ROLE_ARN, "an IAM role ARN (arn:aws:iam::<account>:role/<name>)")
    )
    #: Principals (role or user ARNs) that may change any job and set pool capacity.
    admin_role_arns: tuple[str, ...] = setting((), _list(_PRINCIPAL_ARN, "an IAM principal ARN"))
    #: Highest priority a non-admin may submit or set, unless priority_ceilings says otherwise for the
    #: caller or its team; admins may use the whole range. Below the top, so some priorities stay admins'.
    max_priority_for_non_admins: int = setting(900, _integer(ge=0, le=1000))
    #: `<team or principal ARN>=<priority>` pairs: the highest priority that principal (first) or that
    #: team's callers may submit or set, instead of max_priority_for_non_admins.
    priority_ceilings: dict[str, int] = dataclasses.field(
        default_factory=dict, metadata={"parse": _priority_ceilings}
    )
    #: A running attempt is not preempted before it has run this long, so preemption cannot thrash.
    min_runtime_before_preemption_seconds: int = setting(600, _integer(ge=0))
    #: Past this many preemptions a job is not preempted again until it ends, except to end a loan it runs
    #: on; apart, past this many loans taken back it borrows no more (0: no limit).
    max_preemptions_per_job: int = setting(3, _integer(ge=0, le=1000))
    #: A job waiting at the head of its pool this long reserves the instances it needs, so smaller jobs
    #: behind it stop overtaking it (drain; 0 never reserves).
    reserve_after_seconds: int = setting(1800, _integer(ge=0))
    #: A reservation still waiting for running work to end lends its idle instances to smaller jobs that
    #: resume from checkpoints; it preempts them (whatever their runtime) the moment it can start.
    lend_reserved_capacity: bool = setting(True, _boolean)
    #: Jobs at or above this priority may preempt a victim before its minimum runtime and beyond its
    #: preemption budget, up to TopPriorityBudgetFactor times the budget (0: no override).
    top_priority: int = setting(0, _integer(ge=0, le=1000))
    #: How far past MaxPreemptionsPerJob a top-priority job may preempt a victim (a multiple, at least 1).
    top_priority_budget_factor: int = setting(2, _integer(ge=1, le=10))
    #: The longest a job that preempts waits for a victim's due checkpoint before stopping it, so the victim
    #: loses nothing (docs/adr/0023); 0 stops victims at once.
    checkpoint_wait_seconds: int = setting(300, _integer(ge=0, le=3600))
    #: Keep-alive set on a start when a queued job would reuse its instances next (0 disables it).
    default_keep_alive_seconds: int = setting(600, _integer(ge=0, le=21_600))
    #: Attempts per job before capacity or internal failures fail it for good.
    max_attempts: int = setting(5, _integer(ge=1, le=100))
    #: Queued jobs read per pool per pass (K): the pass reads this many, whatever the queue's length.
    queue_lookahead: int = setting(50, _integer(ge=1, le=1000))
    #: First backoff after a capacity or internal failure; doubles per retry up to max_backoff_seconds.
    retry_backoff_seconds: int = setting(60, _integer(ge=0))
    max_backoff_seconds: int = setting(1800, _integer(ge=0))
    #: Largest request body the API accepts, in bytes (the job item must fit DynamoDB's 400 KB).
    max_request_bytes: int = setting(131_072, _integer(ge=1024, le=300_000))

    # --- governance ---------------------------------------------------------------------------------------
    #: Tags every job must carry: `team,project=^[a-z-]+$` (a key, optionally `=<regex>` for its value).
    required_tags: str = setting("", _required_tags)
    #: Instance types jobs may use; empty allows every type.
    allowed_instance_types: tuple[str, ...] = setting(
        (), _list(_INSTANCE_TYPE, "an instance type like ml.trn1.32xlarge")
    )
    #: Instances one job may request in total; None: no limit.
    max_instances_per_job: int | None = setting(None, _optional_integer(ge=1))
    #: Longest StoppingCondition.MaxRuntimeInSeconds a job may ask for; None: no limit.
    max_runtime_seconds: int | None = setting(None, _optional_integer(ge=1))
    #: A job tagged `<exempt_tag>=true` is exempt from the tag and policy rules and from the idle stop.
    exempt_tag: str = setting(EXEMPT_TAG, _text)
    #: A host is idle below this NeuronCore (or GPU) utilization, in percent.
    idle_threshold_percent: float = setting(5.0, _number(ge=0.0, le=100.0))
    #: Length of one idle-alarm evaluation period.
    idle_period_seconds: int = setting(300, _integer(ge=60))
    #: Consecutive idle periods before a job is stopped.
    idle_periods: int = setting(6, _integer(ge=1))
    #: A host that reports no metrics at all is stopped after this many idle windows (docs/adr/0002).
    idle_silence_factor: int = setting(2, _integer(ge=1))
    #: A job that fails after running at least this long may be resumed from its checkpoints.
    resume_after_failure_min_runtime_seconds: int = setting(600, _integer(ge=0))
    #: Resumes after failures per job.
    max_resumes: int = setting(2, _integer(ge=0))
    #: Spot interruptions per job before it is no longer resumed.
    max_spot_interruptions: int = setting(3, _integer(ge=0))
    #: SNS topic the idle alarms notify; empty until the governance part of the stack exists.
    alarm_topic_arn: str = setting("", _text)
    #: SNS topic for notifications to people (policy violations, idle stops).
    notification_topic_arn: str = setting("", _text)
    #: SNS topic of job notices to their owners (start, preemption, requeue, finish; docs/adr/0020).
    job_notices_topic_arn: str = setting("", _text)
    #: The tag whose value names a job's team (team quotas, docs/adr/0011-team-quotas.md).
    team_tag: str = setting("team", _text)
    #: `<role ARN>=<team>` pairs: the team of a job without the tag, from the role that submitted it.
    team_roles: dict[str, str] = dataclasses.field(default_factory=dict, metadata={"parse": _team_roles})
    #: `<team>=<role ARN>` pairs: an execution role listed here may be passed only by that team's callers
    #: (and admins); an allowed role no team lists may be passed by anyone (docs/guardrails.md).
    team_execution_roles: dict[str, tuple[str, ...]] = dataclasses.field(
        default_factory=dict, metadata={"parse": _team_execution_roles}
    )
    #: Half-life of the decaying instance-hours counter that orders teams within a priority (fair share).
    fair_share_half_life_seconds: int = setting(86_400, _integer(ge=0))

    def __post_init__(self) -> None:
        problems = []
        for spec in dataclasses.fields(self):
            try:
                parsed = spec.metadata["parse"](getattr(self, spec.name))
            except (ValueError, TypeError) as exc:
                problems.append(f"{env_name(spec.name)}: {exc}")
                continue
            object.__setattr__(self, spec.name, parsed)
        if not problems:
            unknown = sorted(
                {r for roles in self.team_execution_roles.values() for r in roles}
                - set(self.allowed_role_arns)
            )
            if unknown:
                problems.append(
                    f"{env_name('team_execution_roles')}: {', '.join(unknown)} not among "
                    f"{env_name('allowed_role_arns')} (the only roles the scheduler may pass)"
                )
        if problems:
            raise ConfigError("invalid settings: " + "; ".join(problems))
        for role, teams in self.shared_execution_roles.items():
            logging.getLogger("sagequeue").warning(
                "%s gives %s to the teams %s: no warm pool of it is kept, since SageMaker would hand one "
                "team's warm pool to the other's next job of the same resources",
                env_name("team_execution_roles"),
                role,
                ", ".join(teams),
            )

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """Every setting's name, in declaration order."""
        return tuple(spec.name for spec in dataclasses.fields(cls))

    @property
    def policy_rules(self) -> PolicyRules:
        """The governance rules submissions and running jobs are checked against."""
        from sagequeue_core.governance import PolicyRules  # only the API and governance need the rules

        return PolicyRules(
            required_tags=parse_required_tags(self.required_tags),
            allowed_instance_types=frozenset(self.allowed_instance_types),
            max_instances_per_job=self.max_instances_per_job,
            max_runtime_seconds=self.max_runtime_seconds,
            exempt_tag=self.exempt_tag,
        )

    def teams_of_role(self, role_arn: str) -> tuple[str, ...]:
        """The teams that own an execution role (TeamExecutionRoles); empty for a role any caller may pass."""
        return tuple(team for team, roles in self.team_execution_roles.items() if role_arn in roles)

    @property
    def named_teams(self) -> frozenset[str]:
        """The teams the settings name: those TeamRoles maps principals to and those TeamExecutionRoles
        gives roles to."""
        return frozenset(self.team_roles.values()) | frozenset(self.team_execution_roles)

    @property
    def shared_execution_roles(self) -> dict[str, tuple[str, ...]]:
        """Roles TeamExecutionRoles gives to more than one team, with those teams."""
        roles = {role for owned in self.team_execution_roles.values() for role in owned}
        return {role: self.teams_of_role(role) for role in sorted(roles) if len(self.teams_of_role(role)) > 1}

    @property
    def warm_pool_roles(self) -> frozenset[str] | None:
        """The execution roles whose warm pools the queue keeps; None: any role (fewer than two teams).

        SageMaker hands a warm pool to the next job with the same execution role and resources, whoever
        submitted it, and the pool keeps what the last job left in its cache directory. With two teams or
        more, only a role TeamExecutionRoles gives to one team keeps a pool within that team; a role any
        caller may pass, or one two teams share, keeps none (docs/guardrails.md)."""
        teams = set(self.team_roles.values()) | set(self.team_execution_roles)
        if len(teams) < 2:
            return None
        owned = {role for roles in self.team_execution_roles.values() for role in roles}
        return frozenset(role for role in owned if len(self.teams_of_role(role)) == 1)

    @property
    def idle_rules(self) -> IdleRules:
        """The idle alarms' rules; ConfigError when CloudWatch would refuse the alarms they describe."""
        from sagequeue_core.governance import IdleRules  # only governance and the idle stop need them

        try:
            return IdleRules(
                threshold_percent=self.idle_threshold_percent,
                period_seconds=self.idle_period_seconds,
                periods=self.idle_periods,
                silence_factor=self.idle_silence_factor,
            )
        except DomainError as exc:
            raise ConfigError(
                f"{env_name('idle_period_seconds')} / {env_name('idle_periods')} / "
                f"{env_name('idle_silence_factor')} / {env_name('idle_threshold_percent')}: {exc}"
            ) from exc

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """Settings from `SAGEQUEUE_*` variables; raises ConfigError naming the variable that is wrong."""
        values = {name: environ[env_name(name)] for name in cls.field_names() if env_name(name) in environ}
        return cls.build(**values)

    @classmethod
    def build(cls, **values: Any) -> Settings:
        """Settings from keyword values (strings as in the environment, or typed values)."""
        unknown = sorted(set(values) - set(cls.field_names()))
        if unknown:
            raise ConfigError(
                f"invalid settings: unknown setting(s) {', '.join(unknown)}; "
                f"known: {', '.join(cls.field_names())}"
            )
        return cls(**values)
