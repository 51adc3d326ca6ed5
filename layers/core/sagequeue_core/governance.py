"""Governance rules for training jobs, all pure: what the API and the governance function decide, never
how they carry it out.

- Tag and policy rules, shared by the API (reject at submit) and the governance function (stop jobs
  started outside the queue that break them). They run on a CreateTrainingJob request and on a
  DescribeTrainingJob-shaped event detail alike, since the fields they read (ResourceConfig,
  StoppingCondition, Tags) have the same shape in both.
- Idle-alarm specs: which metric shows that a host does no work, and the alarms that watch it.
- Recovery: resume after transient failures, leave managed spot after repeated interruptions.
- `govern`: from one state change of a training job to the actions governance takes.
"""

from __future__ import annotations

import copy
import hashlib
import hmac
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from sagequeue_core.defaults import (
    ATTEMPT_TAG,
    EXEMPT_TAG,
    HOST_DIMENSION,
    IDLE_ALARM_PREFIX,
    JOB_TAG,
    METRIC_NAMESPACE_ENV,
    NEURON_COMPILING_METRIC,
    NEURON_METRIC_NAMESPACE,
    NEURONCORE_UTILIZATION_METRIC,
    SAGEMAKER_METRIC_NAMESPACE,
    SEAL_TAG,
    SUBMITTED_BY_TAG,
    host_dimension_value,
    is_gpu_instance,
    is_neuron_instance,
    team_metric_namespace,
)
from sagequeue_core.domain import (
    DomainError,
    attempt_name,
    check_tag_pattern,
    demand_of,
    parse_time,
    tags_to_dict,
)

#: What SageMaker uses when StoppingCondition.MaxRuntimeInSeconds is absent (one day).
SAGEMAKER_DEFAULT_MAX_RUNTIME_SECONDS = 86_400


@dataclass(frozen=True)
class Violation:
    rule: str  # required_tags | allowed_instance_types | max_instances_per_job | max_runtime_seconds
    message: str


@dataclass(frozen=True)
class PolicyRules:
    #: tag key -> regular expression its value must match in full (None: any value, only presence)
    required_tags: Mapping[str, str | None] = field(default_factory=dict)
    #: empty: every instance type is allowed
    allowed_instance_types: frozenset[str] = frozenset()
    max_instances_per_job: int | None = None
    max_runtime_seconds: int | None = None
    exempt_tag: str = EXEMPT_TAG

    def __post_init__(self) -> None:
        for key, pattern in self.required_tags.items():
            if pattern is not None:
                check_tag_pattern(key, pattern)


def is_exempt(tags: Mapping[str, str], rules: PolicyRules) -> bool:
    return tags.get(rules.exempt_tag, "").strip().lower() == "true"


def check_policy(
    job: Mapping[str, Any], rules: PolicyRules, tags: Mapping[str, str] | None = None
) -> list[Violation]:
    """Every rule `job` breaks, in a stable order; empty when it complies or carries the exempt tag.

    `job` is a CreateTrainingJob request or a DescribeTrainingJob detail; `tags` overrides the job's own
    Tags (an event's tags may arrive separately, as a dict or a list).
    """
    tag_map = dict(tags) if tags is not None else tags_to_dict(job.get("Tags"))
    if is_exempt(tag_map, rules):
        return []
    violations: list[Violation] = []
    for key, pattern in rules.required_tags.items():
        value = tag_map.get(key)
        if value is None or value == "":
            violations.append(Violation("required_tags", f"missing required tag {key!r}"))
        elif pattern is not None and not re.fullmatch(pattern, value):
            violations.append(
                Violation("required_tags", f"tag {key!r} value {value!r} does not match {pattern!r}")
            )
    try:
        demand = demand_of(job)
    except DomainError as exc:
        violations.append(Violation("allowed_instance_types", str(exc)))
        demand = {}
    if rules.allowed_instance_types:
        for instance_type in demand:
            if instance_type not in rules.allowed_instance_types:
                allowed = ", ".join(sorted(rules.allowed_instance_types))
                violations.append(
                    Violation(
                        "allowed_instance_types",
                        f"instance type {instance_type} is not allowed (allowed: {allowed})",
                    )
                )
    instances = sum(demand.values())
    if rules.max_instances_per_job is not None and instances > rules.max_instances_per_job:
        violations.append(
            Violation(
                "max_instances_per_job",
                f"{instances} instances requested; at most {rules.max_instances_per_job} per job",
            )
        )
    if rules.max_runtime_seconds is not None:
        stopping = job.get("StoppingCondition") or {}
        # SageMaker applies its own default when the request has none, so that is what the job may run.
        runtime = int(stopping.get("MaxRuntimeInSeconds") or SAGEMAKER_DEFAULT_MAX_RUNTIME_SECONDS)
        if runtime > rules.max_runtime_seconds:
            violations.append(
                Violation(
                    "max_runtime_seconds",
                    f"MaxRuntimeInSeconds {runtime} exceeds the limit of {rules.max_runtime_seconds}",
                )
            )
    return violations


def owner_of(job: Mapping[str, Any], tags: Mapping[str, str]) -> str:
    """Who to name in a notification: the submitter recorded by the API, else an `owner` tag, else the
    role the job runs as (a job started by hand carries nothing better)."""
    for key in (SUBMITTED_BY_TAG, "owner", "Owner"):
        if tags.get(key):
            return tags[key]
    return str(job.get("RoleArn") or "unknown")


# --- Idle alarms -------------------------------------------------------------------------------------------
#
# Two alarms watch each host (docs/adr/0002-idle-alarms.md): the idle alarm fires when the host reports
# utilization at or below the threshold for the idle window; the silence alarm fires when the host has
# reported nothing at all for a longer window. The silence alarm is only created once the host has been
# training for that whole window, because CloudWatch evaluates a new alarm over the past window at once and
# would count the minutes before the job existed as missing (breaching) data.

#: The idle alarm's name is IDLE_ALARM_PREFIX + host; the silence alarm's adds this suffix.
SILENCE_ALARM_SUFFIX = "/no-data"

#: The idle alarm of a Neuron host reads this metric math: NeuronCoreUtilization, but 100 in any period in
#: which the host reported a compile running (a cold neuronx-cc compile reads ~0% for 30-60 minutes). A
#: period without utilization data stays missing unless the host was compiling.
COMPILING_AS_BUSY_EXPRESSION = "IF(FILL(compiling, 0) > 0, 100, utilization)"

#: CloudWatch rejects alarms whose Period x EvaluationPeriods exceeds one day (for periods under an hour).
MAX_ALARM_WINDOW_SECONDS = 86_400


class AlarmKind(StrEnum):
    IDLE = "idle"  # utilization reported, at or below the threshold for the idle window
    SILENCE = "silence"  # nothing reported for the silence window


class IdleSignal(StrEnum):
    """Which metric tells that a host's accelerators (or CPUs) do no work."""

    NEURON = "neuron"  # NeuronCoreUtilization, published by the job image
    GPU = "gpu"  # SageMaker's GPUUtilization
    CPU = "cpu"  # SageMaker's CPUUtilization

    def namespace(self, team: str | None = None) -> str:
        """Where the signal of a host of `team`'s job is published: the job image publishes a team's
        NeuronCore metrics into the team's own namespace (team_metric_namespace); SageMaker publishes its
        own for every job in one."""
        return team_metric_namespace(team) if self is IdleSignal.NEURON else SAGEMAKER_METRIC_NAMESPACE

    @property
    def metric_name(self) -> str:
        return {
            IdleSignal.NEURON: NEURONCORE_UTILIZATION_METRIC,
            IdleSignal.GPU: "GPUUtilization",
            IdleSignal.CPU: "CPUUtilization",
        }[self]


def idle_signal(instance_type: str) -> IdleSignal:
    # SageMaker publishes no NeuronCore metric and a trn1 host never reports GPUUtilization: an alarm on it
    # would wait for data forever.
    if is_neuron_instance(instance_type):
        return IdleSignal.NEURON
    if is_gpu_instance(instance_type):
        return IdleSignal.GPU
    return IdleSignal.CPU


@dataclass(frozen=True)
class IdleRules:
    threshold_percent: float = 5.0
    period_seconds: int = 300
    periods: int = 6
    #: The silence window is this many idle windows: long enough that a late or bursty publisher is not
    #: mistaken for a dead one.
    silence_factor: int = 2

    def __post_init__(self) -> None:
        if not 0 <= self.threshold_percent <= 100:
            raise DomainError(
                f"idle threshold must be a percentage in [0, 100], got {self.threshold_percent}"
            )
        if self.period_seconds < 60 or self.period_seconds % 60:
            raise DomainError(
                f"idle period must be a positive multiple of 60 seconds, got {self.period_seconds}"
            )
        if self.periods < 1:
            raise DomainError(f"idle periods must be at least 1, got {self.periods}")
        if self.silence_factor < 1:
            raise DomainError(f"silence factor must be at least 1, got {self.silence_factor}")
        if self.silence_window_seconds > MAX_ALARM_WINDOW_SECONDS:
            raise DomainError(
                f"the silence window ({self.silence_window_seconds} s = idle period {self.period_seconds} s x "
                f"{self.periods} periods x {self.silence_factor}) exceeds CloudWatch's one-day alarm window"
            )

    @property
    def idle_window_seconds(self) -> int:
        return self.period_seconds * self.periods

    @property
    def silence_periods(self) -> int:
        return self.periods * self.silence_factor

    @property
    def silence_window_seconds(self) -> int:
        return self.period_seconds * self.silence_periods


@dataclass(frozen=True)
class AlarmSpec:
    """One CloudWatch metric alarm on one host, as PutMetricAlarm takes it (less the actions)."""

    name: str
    training_job_name: str
    host: str  # "<job>/algo-<n>", the Host dimension
    kind: AlarmKind
    signal: IdleSignal
    statistic: str
    comparison: str
    threshold: float
    period_seconds: int
    evaluation_periods: int
    treat_missing_data: str
    description: str
    #: The team of the queue entry whose attempt the job is (None for a job started outside the queue):
    #: its NeuronCore metrics are read from the team's namespace, where no other team's role may publish.
    team: str | None = None

    @property
    def namespace(self) -> str:
        return self.signal.namespace(self.team)

    @property
    def metric_name(self) -> str:
        return self.signal.metric_name

    @property
    def busy_expression(self) -> str | None:
        """Metric math the idle alarm of a Neuron host evaluates: a compiling host counts as 100% busy."""
        if self.kind is AlarmKind.IDLE and self.signal is IdleSignal.NEURON:
            return COMPILING_AS_BUSY_EXPRESSION
        return None

    def put_metric_alarm_args(self, actions: Sequence[str]) -> dict[str, Any]:
        args: dict[str, Any] = {
            "AlarmName": self.name,
            "AlarmDescription": self.description,
            "ActionsEnabled": True,
            "AlarmActions": list(actions),
            "EvaluationPeriods": self.evaluation_periods,
            "DatapointsToAlarm": self.evaluation_periods,
            "Threshold": self.threshold,
            "ComparisonOperator": self.comparison,
            "TreatMissingData": self.treat_missing_data,
            "Tags": [{"Key": JOB_TAG_FOR_ALARMS, "Value": self.training_job_name}],
        }
        dimensions = [{"Name": HOST_DIMENSION, "Value": self.host}]
        expression = self.busy_expression
        if expression is None:
            return {
                **args,
                "Namespace": self.namespace,
                "MetricName": self.metric_name,
                "Dimensions": dimensions,
                "Statistic": self.statistic,
                "Period": self.period_seconds,
            }

        def stat(query_id: str, metric: str, statistic: str) -> dict[str, Any]:
            return {
                "Id": query_id,
                "MetricStat": {
                    "Metric": {"Namespace": self.namespace, "MetricName": metric, "Dimensions": dimensions},
                    "Period": self.period_seconds,
                    "Stat": statistic,
                },
                "ReturnData": False,
            }

        return {
            **args,
            "Metrics": [
                stat("utilization", self.metric_name, self.statistic),
                stat("compiling", NEURON_COMPILING_METRIC, "Maximum"),
                {
                    "Id": "busy",
                    "Expression": expression,
                    "Label": "NeuronCore utilization, 100 while compiling",
                    "ReturnData": True,
                },
            ],
        }


#: Tag on every idle alarm naming the training job it watches, for whoever browses alarms in the console.
JOB_TAG_FOR_ALARMS = "sagequeue:training-job"

#: The members of a metric alarm that decide when it goes to ALARM (its name, description, actions and
#: tags do not).
ALARM_DEFINITION_MEMBERS = (
    "Namespace",
    "MetricName",
    "Dimensions",
    "Statistic",
    "ExtendedStatistic",
    "Period",
    "Unit",
    "EvaluationPeriods",
    "DatapointsToAlarm",
    "Threshold",
    "ComparisonOperator",
    "TreatMissingData",
    "EvaluateLowSampleCountPercentile",
    "ThresholdMetricId",
    "Metrics",
)


def _dimensions(value: Any) -> Any:
    if not value:
        return None
    return tuple(sorted((str(d.get("Name")), str(d.get("Value"))) for d in value if isinstance(d, Mapping)))


def _query(query: Mapping[str, Any]) -> tuple[Any, ...]:
    stat = query.get("MetricStat") or {}
    metric = stat.get("Metric") or {}
    return (
        query.get("Id"),
        query.get("Expression") or None,
        query.get("ReturnData", True) is not False,
        query.get("Period") or None,
        query.get("AccountId") or None,
        metric.get("Namespace"),
        metric.get("MetricName"),
        _dimensions(metric.get("Dimensions")),
        stat.get("Period"),
        stat.get("Stat"),
        stat.get("Unit") or None,
    )


def _definition_value(alarm: Mapping[str, Any], member: str) -> Any:
    value = alarm.get(member)
    if member == "Dimensions":
        return _dimensions(value)
    if member == "Metrics":
        return tuple(sorted((_query(q) for q in value or () if isinstance(q, Mapping)), key=repr)) or None
    if member == "DatapointsToAlarm" and value is None:
        value = alarm.get("EvaluationPeriods")  # CloudWatch's default
    if member == "TreatMissingData" and not value:
        return "missing"  # CloudWatch's default
    if isinstance(value, bool) or value in ("", [], {}):
        return value or None
    if isinstance(value, int | float):
        return float(value)
    return value


def alarm_definition_difference(alarm: Mapping[str, Any], spec: AlarmSpec) -> str | None:
    """The first member in which an alarm as DescribeAlarms shows it differs from the one governance
    creates for `spec`, or None when it is that alarm. Anyone allowed PutMetricAlarm can replace an alarm
    of our name with one that fires on anything (a threshold of 100, a statistic forged datapoints pull
    down); only the definition governance made may stop a job."""
    wanted = spec.put_metric_alarm_args(())
    for member in ALARM_DEFINITION_MEMBERS:
        if _definition_value(alarm, member) != _definition_value(wanted, member):
            return member
    return None


@dataclass(frozen=True)
class AlarmRef:
    """What an alarm's name says: the training job, the host and which of its two alarms."""

    training_job_name: str
    host: str
    kind: AlarmKind


def alarm_name(host: str, kind: AlarmKind) -> str:
    return IDLE_ALARM_PREFIX + host + (SILENCE_ALARM_SUFFIX if kind is AlarmKind.SILENCE else "")


def alarm_prefix(training_job_name: str) -> str:
    """Prefix shared by every alarm of one training job and no other (names cannot contain '/')."""
    return f"{IDLE_ALARM_PREFIX}{training_job_name}/"


_ALARM_NAME_RE = re.compile(
    re.escape(IDLE_ALARM_PREFIX)
    + r"(?P<job>[^/]+)/(?P<host>algo-\d+)(?P<silence>"
    + re.escape(SILENCE_ALARM_SUFFIX)
    + ")?"
)


def parse_alarm_name(name: str) -> AlarmRef | None:
    """The job and host an idle alarm watches; None for an alarm that is not one of ours."""
    match = _ALARM_NAME_RE.fullmatch(name)
    if match is None:
        return None
    job = match["job"]
    return AlarmRef(
        training_job_name=job,
        host=f"{job}/{match['host']}",
        kind=AlarmKind.SILENCE if match["silence"] else AlarmKind.IDLE,
    )


def hosts_of(job: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(Host dimension, instance type) of every host of a DescribeTrainingJob-shaped job.

    Heterogeneous clusters number their hosts algo-1.. across instance groups in the order the groups are
    declared.
    """
    name = job.get("TrainingJobName")
    if not isinstance(name, str) or not name:
        raise DomainError("TrainingJobName is required to name a job's hosts")
    config = job.get("ResourceConfig")
    if not isinstance(config, Mapping):
        raise DomainError(f"training job {name}: ResourceConfig is required to name its hosts")
    groups = config.get("InstanceGroups") or [config]
    hosts: list[tuple[str, str]] = []
    for group in groups:
        instance_type = str(group.get("InstanceType", ""))
        for _ in range(int(group.get("InstanceCount") or 0)):
            hosts.append((host_dimension_value(name, len(hosts) + 1), instance_type))
    return hosts


def idle_alarm_specs(
    job: Mapping[str, Any], rules: IdleRules, *, now: datetime | None = None, team: str | None = None
) -> list[AlarmSpec]:
    """The alarms a job in its Training phase should have.

    Silence alarms are included only when `now` is given and the job's current Training phase began at
    least one silence window before it (see the module note above); the reconcile timer adds them later.
    `team` is the team of the job's queue entry (never a tag): a Neuron host's alarms read its team's
    namespace.
    """
    name = str(job.get("TrainingJobName"))
    training_since = training_phase_start(job)
    with_silence = (
        now is not None
        and training_since is not None
        and (now - training_since).total_seconds() >= rules.silence_window_seconds
    )
    specs: list[AlarmSpec] = []
    for host, instance_type in hosts_of(job):
        signal = idle_signal(instance_type)
        specs.append(
            AlarmSpec(
                name=alarm_name(host, AlarmKind.IDLE),
                training_job_name=name,
                host=host,
                kind=AlarmKind.IDLE,
                signal=signal,
                # The highest datapoint of each period: datapoints anyone allowed PutMetricData may add
                # for this host (zeros) cannot pull it down, while a host that is really idle reports
                # nothing above the threshold (docs/adr/0006, #27).
                statistic="Maximum",
                comparison="LessThanOrEqualToThreshold",
                threshold=float(rules.threshold_percent),
                period_seconds=rules.period_seconds,
                evaluation_periods=rules.periods,
                # A gap is not evidence of idleness; the silence alarm is the one that judges gaps.
                treat_missing_data="notBreaching",
                description=(
                    f"sagequeue idle stop: highest {signal.metric_name} of {host} at or below "
                    f"{rules.threshold_percent:g}% for {rules.idle_window_seconds // 60} minutes"
                ),
                team=team,
            )
        )
        if with_silence:
            specs.append(
                AlarmSpec(
                    name=alarm_name(host, AlarmKind.SILENCE),
                    training_job_name=name,
                    host=host,
                    kind=AlarmKind.SILENCE,
                    signal=signal,
                    # Any datapoint at all gives a SampleCount of at least 1; only a period without data
                    # (treated as breaching) can fall below it.
                    statistic="SampleCount",
                    comparison="LessThanThreshold",
                    threshold=1.0,
                    period_seconds=rules.period_seconds,
                    evaluation_periods=rules.silence_periods,
                    treat_missing_data="breaching",
                    description=(
                        f"sagequeue idle stop: no {signal.metric_name} from {host} "
                        f"for {rules.silence_window_seconds // 60} minutes"
                    ),
                    team=team,
                )
            )
    return specs


def published_team(job: Mapping[str, Any], known: Callable[[str], bool]) -> str | None:
    """The team whose namespace a training job says it publishes to (SAGEQUEUE_METRIC_NAMESPACE in its own
    Environment, which the scheduler sets on a team's attempts), when that is `SageQueue/TrainingJobs/<team>`
    of a team `known` admits; else None (the namespace of jobs without a team).

    Only for a job the table cannot place in a team (a live attempt entered again after the table was lost):
    its alarms then read where its job image publishes. Whoever creates the job chooses its Environment, so
    the answer decides only about that job: a namespace its role may not publish to leaves its own alarms
    without data (its silence alarm stops it), and no other job's alarms read its namespace by it."""
    environment = job.get("Environment")
    named = environment.get(METRIC_NAMESPACE_ENV) if isinstance(environment, Mapping) else None
    if not isinstance(named, str):
        return None
    prefix = NEURON_METRIC_NAMESPACE + "/"
    namespace = named.strip()  # as the job image reads it
    if not namespace.startswith(prefix):
        return None
    team = namespace[len(prefix) :]
    return team if team and "/" not in team and known(team) else None


def alarm_team(
    entry_team: str | None,
    job: Mapping[str, Any],
    named_teams: Collection[str],
    quotas: Callable[[], Iterable[Any]],
) -> str | None:
    """The team whose namespace a training job's idle alarms read: its queue entry's (`entry_team`); for a
    job the table places in no team (started outside the queue, or entered again after the table was lost
    with a role of no single team), the team whose namespace its own Environment names
    (`published_team`), if the settings name it (`named_teams`) or one of the table's `quotas` is its.
    Never a tag (docs/adr/0015)."""
    if entry_team:
        return entry_team

    def known(team: str) -> bool:
        return team in named_teams or any(quota.team == team for quota in quotas())

    return published_team(job, known)


# --- Times in events --------------------------------------------------------------------------------------


def _transitions(job: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    raw = job.get("SecondaryStatusTransitions") or []
    return [t for t in raw if isinstance(t, Mapping)] if isinstance(raw, list) else []


def training_phase_start(job: Mapping[str, Any]) -> datetime | None:
    """When the job's current Training phase began: the last Training transition (a spot job trains again
    after each interruption), else TrainingStartTime."""
    starts = [parse_time(t.get("StartTime")) for t in _transitions(job) if t.get("Status") == "Training"]
    known = [s for s in starts if s is not None]
    if known:
        return max(known)
    return parse_time(job.get("TrainingStartTime"))


# --- Recovery: resume after transient failures, leave spot after repeated interruptions ------------------

#: FailureReason prefixes of failures that are SageMaker's, not the job's: worth another attempt.
TRANSIENT_FAILURE_PREFIXES = ("InternalServerError", "CapacityError")

#: On clones governance makes of jobs started outside the queue: the first attempt's name, this clone's
#: attempt number, and how many resumes after failures the lineage has used. Queue entries are never cloned
#: (the scheduler starts their next attempt), so these stay apart from the queue's JOB_TAG and ATTEMPT_TAG.
CLONE_OF_TAG = "sagequeue:clone-of"
CLONE_ATTEMPT_TAG = "sagequeue:clone-attempt"
RESUMES_TAG = "sagequeue:resumes"


@dataclass(frozen=True)
class RecoveryRules:
    resume_after_failure_min_runtime_seconds: int = 600
    max_resumes: int = 2
    max_spot_interruptions: int = 3

    def __post_init__(self) -> None:
        for field_name in (
            "resume_after_failure_min_runtime_seconds",
            "max_resumes",
            "max_spot_interruptions",
        ):
            if getattr(self, field_name) < 0:
                raise DomainError(f"{field_name} must not be negative, got {getattr(self, field_name)}")


def is_transient_failure(reason: str | None) -> bool:
    return bool(reason) and str(reason).lstrip().startswith(TRANSIENT_FAILURE_PREFIXES)


def runtime_seconds(job: Mapping[str, Any]) -> float | None:
    """How long the attempt ran: its training time when it reached training, else its whole life (a job
    that failed on capacity never trains, yet may have waited long for it)."""
    end = parse_time(job.get("TrainingEndTime")) or parse_time(job.get("LastModifiedTime"))
    start = parse_time(job.get("TrainingStartTime")) or parse_time(job.get("CreationTime"))
    if end is None or start is None:
        return None
    return max(0.0, (end - start).total_seconds())


@dataclass(frozen=True)
class Lineage:
    """Where a training job stands in the chain of clones sagequeue made of it."""

    root: str  # name of the first attempt, from which clone names derive
    attempt: int  # 1 for the original
    resumes: int  # clones made after failures so far

    @property
    def next_attempt_name(self) -> str:
        return attempt_name(self.root, self.attempt + 1)

    def next(self, *, resumed: bool) -> Lineage:
        """The lineage of this job's clone (a resume after a failure counts against max_resumes)."""
        return Lineage(self.root, self.attempt + 1, self.resumes + (1 if resumed else 0))


def clone_seal(secret: str, training_job_name: str, lineage: Lineage) -> str:
    """The seal (SEAL_TAG) of clone `training_job_name` standing at `lineage`, under its root's secret.

    It covers the counters with the name, so a clone whose `sagequeue:resumes` someone lowered (AddTags)
    no longer verifies, and a seal seen on one clone is worth nothing on another name or lineage."""
    message = f"{training_job_name}\n{lineage.root}\n{lineage.attempt}\n{lineage.resumes}"
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()[:32]


def claimed_root(tags: Mapping[str, str]) -> str | None:
    """The root a training job's tags claim it is a clone of (anyone allowed AddTags can write it)."""
    return tags.get(CLONE_OF_TAG) or None


def lineage_of(training_job_name: str, tags: Mapping[str, str], secret: str | None = None) -> Lineage:
    """Where `training_job_name` stands, from its clone tags when they carry a seal that verifies under its
    root's `secret` (kept in the table by governance); otherwise it is an original, whatever its tags say.

    The tags alone prove nothing: anyone allowed CreateTrainingJob or AddTags can write them, and a
    training job trusted as another's clone would name its own clone after that lineage, taking the name
    the real job's resume needs."""
    original = Lineage(root=training_job_name, attempt=1, resumes=0)
    root = claimed_root(tags)
    seal = tags.get(SEAL_TAG)
    if root is None or secret is None or seal is None:
        return original
    try:
        claimed = Lineage(
            root=root,
            attempt=max(1, int(tags.get(CLONE_ATTEMPT_TAG) or 1)),
            resumes=max(0, int(tags.get(RESUMES_TAG) or 0)),
        )
    except ValueError:
        return original
    if not hmac.compare_digest(clone_seal(secret, training_job_name, claimed), seal):
        return original
    return claimed


@dataclass(frozen=True)
class ResumeDecision:
    resume: bool
    reason: str


def decide_resume(job: Mapping[str, Any], rules: RecoveryRules, resumes_so_far: int) -> ResumeDecision:
    """Whether a Failed attempt should get another one, and why (or why not), in words for the record."""
    name = job.get("TrainingJobName")
    if job.get("TrainingJobStatus") != "Failed":
        return ResumeDecision(False, f"{name} did not fail")
    failure = str(job.get("FailureReason") or "")
    if not is_transient_failure(failure):
        return ResumeDecision(False, f"{name} failed for a reason of its own: {failure or 'unknown'}")
    runtime = runtime_seconds(job)
    if runtime is None or runtime < rules.resume_after_failure_min_runtime_seconds:
        ran = "an unknown time" if runtime is None else f"{runtime:.0f} s"
        return ResumeDecision(
            False,
            f"{name} ran {ran}, less than the {rules.resume_after_failure_min_runtime_seconds} s a resume needs",
        )
    if resumes_so_far >= rules.max_resumes:
        return ResumeDecision(
            False, f"{name} was already resumed {resumes_so_far} times (max {rules.max_resumes})"
        )
    return ResumeDecision(
        True, f"resume {resumes_so_far + 1} of {rules.max_resumes} after {failure.split(':')[0]}"
    )


def spot_interruptions(job: Mapping[str, Any]) -> int:
    return sum(1 for t in _transitions(job) if t.get("Status") == "Interrupted")


@dataclass(frozen=True)
class SpotDecision:
    replace: bool
    interruptions: int
    reason: str


def decide_spot(job: Mapping[str, Any], rules: RecoveryRules) -> SpotDecision:
    """Whether a managed spot job has been interrupted too often and should run on demand instead."""
    count = spot_interruptions(job)
    name = job.get("TrainingJobName")
    if not job.get("EnableManagedSpotTraining"):
        return SpotDecision(False, count, f"{name} does not use managed spot")
    if job.get("TrainingJobStatus") != "InProgress":
        return SpotDecision(False, count, f"{name} is no longer in progress")
    if count <= rules.max_spot_interruptions:
        return SpotDecision(
            False, count, f"{name} was interrupted {count} times (max {rules.max_spot_interruptions})"
        )
    return SpotDecision(
        True,
        count,
        f"{name} was interrupted {count} times, more than {rules.max_spot_interruptions}: restarted without spot",
    )


#: DescribeTrainingJob fields that CreateTrainingJob accepts unchanged; everything else is read-only state.
CLONABLE_FIELDS = (
    "AlgorithmSpecification",
    "RoleArn",
    "HyperParameters",
    "InputDataConfig",
    "OutputDataConfig",
    "ResourceConfig",
    "VpcConfig",
    "StoppingCondition",
    "EnableNetworkIsolation",
    "EnableInterContainerTrafficEncryption",
    "EnableManagedSpotTraining",
    "CheckpointConfig",
    "DebugHookConfig",
    "DebugRuleConfigurations",
    "TensorBoardOutputConfig",
    "ExperimentConfig",
    "ProfilerConfig",
    "ProfilerRuleConfigurations",
    "Environment",
    "RetryStrategy",
    "RemoteDebugConfig",
    "InfraCheckConfig",
    "SessionChainingConfig",
)


def clone_request(
    job: Mapping[str, Any],
    *,
    lineage: Lineage,
    tags: Mapping[str, str],
    resumed: bool,
    disable_spot: bool = False,
    name: str | None = None,
    secret: str | None = None,
) -> dict[str, Any]:
    """The CreateTrainingJob request of the next attempt of `job` (a DescribeTrainingJob response), named
    `name` (by default the lineage's next attempt name; a fallback name when that one is held), sealed
    under its root's `secret` when one is given.

    The clone keeps the job's CheckpointConfig, so a job that checkpoints resumes where it stopped. Its
    tags carry the lineage, which bounds resumes; its seal (SEAL_TAG) makes them count.
    """
    request: dict[str, Any] = {
        key: copy.deepcopy(job[key]) for key in CLONABLE_FIELDS if job.get(key) not in (None, {}, [])
    }
    request["TrainingJobName"] = name or lineage.next_attempt_name
    if disable_spot:
        request["EnableManagedSpotTraining"] = False
        # MaxWaitTimeInSeconds is only valid with managed spot.
        stopping = dict(request.get("StoppingCondition") or {})
        stopping.pop("MaxWaitTimeInSeconds", None)
        if stopping:
            request["StoppingCondition"] = stopping
    # aws: tags are reserved; queue tags would make the clone look like an attempt of a queue entry, and a
    # seal copied from the job would be worth nothing on the clone's name.
    clone_tags = {
        k: v
        for k, v in tags.items()
        if not k.startswith("aws:") and k not in (JOB_TAG, ATTEMPT_TAG, SEAL_TAG)
    }
    following = lineage.next(resumed=resumed)
    clone_tags[CLONE_OF_TAG] = following.root
    clone_tags[CLONE_ATTEMPT_TAG] = str(following.attempt)
    clone_tags[RESUMES_TAG] = str(following.resumes)
    if secret is not None:
        clone_tags[SEAL_TAG] = clone_seal(secret, request["TrainingJobName"], following)
    request["Tags"] = [{"Key": k, "Value": v} for k, v in clone_tags.items()]
    return request


# --- One state change, the actions it calls for -------------------------------------------------------------

#: SecondaryStatus values during which a host is not expected to work or report: its alarms go.
_NO_ALARM_PHASES = frozenset({"Interrupted", "Uploading", "Restarting", "Stopping"})


@dataclass(frozen=True)
class GovernanceRules:
    policy: PolicyRules = field(default_factory=PolicyRules)
    idle: IdleRules = field(default_factory=IdleRules)
    recovery: RecoveryRules = field(default_factory=RecoveryRules)


@dataclass(frozen=True)
class StopForPolicy:
    violations: tuple[Violation, ...]

    @property
    def reason(self) -> str:
        return "policy violation: " + "; ".join(v.message for v in self.violations)


@dataclass(frozen=True)
class EnsureAlarms:
    specs: tuple[AlarmSpec, ...]


@dataclass(frozen=True)
class DeleteAlarms:
    training_job_name: str


@dataclass(frozen=True)
class Resume:
    reason: str


@dataclass(frozen=True)
class ReplaceSpot:
    reason: str


Action = StopForPolicy | EnsureAlarms | DeleteAlarms | Resume | ReplaceSpot


def govern(
    job: Mapping[str, Any],
    tags: Mapping[str, str],
    rules: GovernanceRules,
    *,
    now: datetime,
    resumes_so_far: int | None = None,
    team: str | None = None,
) -> list[Action]:
    """The actions one state change of a training job calls for, in the order to take them.

    `job` is the event detail (or a DescribeTrainingJob response), `tags` its tags as a dict. Every action
    is safe to repeat, so a duplicated or replayed event only repeats harmless work. An exempt job is never
    stopped nor watched; it may still be resumed after a transient failure, which only helps it.
    `resumes_so_far` is the count of the job's verified lineage (`lineage_of` with its root's secret); left
    out, the job counts as an original (its clone tags unverified). `team` is the team of the queue entry
    the job is an attempt of (its alarms read that team's namespace).
    """
    name = str(job.get("TrainingJobName"))
    status = job.get("TrainingJobStatus")
    secondary = job.get("SecondaryStatus")
    exempt = is_exempt(tags, rules.policy)
    if status == "InProgress":
        if not exempt:
            # Checked at every in-progress event, not only Starting: events may be lost or arrive late, and
            # a job must not escape the rules because its Starting event did.
            violations = check_policy(job, rules.policy, tags)
            if violations:
                return [StopForPolicy(tuple(violations)), DeleteAlarms(name)]
            spot = decide_spot(job, rules.recovery)
            if spot.replace:
                return [ReplaceSpot(spot.reason), DeleteAlarms(name)]
        if secondary == "Training" and not exempt:
            return [EnsureAlarms(tuple(idle_alarm_specs(job, rules.idle, now=now, team=team)))]
        if secondary in _NO_ALARM_PHASES or (secondary == "Training" and exempt):
            return [DeleteAlarms(name)]
        return []
    actions: list[Action] = [DeleteAlarms(name)]
    if status == "Failed":
        count = lineage_of(name, tags).resumes if resumes_so_far is None else resumes_so_far
        decision = decide_resume(job, rules.recovery, count)
        if decision.resume:
            actions.append(Resume(decision.reason))
    return actions
