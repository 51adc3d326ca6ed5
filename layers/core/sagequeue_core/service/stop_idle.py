"""Idle stop: an idle alarm went to ALARM, so the job it watches is stopped and the reason recorded.

CloudWatch sends every state change of an idle alarm to the alarm topic; SNS delivers at least once. Only
ALARM transitions of sagequeue's own alarms act. The stop is idempotent, the queue entry's state change is a
conditional write, and the IdleStopped event and notification go out once per training job (the store's
claim ledger), so a repeated delivery or a second host's alarm changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sagequeue_core.alarms import CloudWatchAlarms, alarms_of
from sagequeue_core.domain import JobState, StopReason, parse_time, tags_to_dict
from sagequeue_core.errors import StaleVersion, TrainingJobNotFound
from sagequeue_core.events import EventType, Publisher
from sagequeue_core.governance import (
    HOST_DIMENSION,
    JOB_TAG,
    AlarmKind,
    IdleRules,
    PolicyRules,
    alarm_definition_difference,
    alarm_prefix,
    alarm_team,
    idle_alarm_specs,
    is_exempt,
    owner_of,
    parse_alarm_name,
)
from sagequeue_core.notify import Notifier, notifier_of
from sagequeue_core.observability import IDLE_STOPS, count, logger
from sagequeue_core.sagemaker import SageMakerAdapter
from sagequeue_core.service.exemptions import honoured_tags
from sagequeue_core.store import Repository

IDLE_STOP_CLAIM = "governance-idle-stop"

#: What AlarmDescription starts with on our alarms; the rest is the human-readable condition.
_DESCRIPTION_PREFIX = "sagequeue idle stop: "


class MalformedAlarmMessage(ValueError):
    """An SNS record does not carry a CloudWatch alarm message."""


@dataclass(frozen=True)
class AlarmNotice:
    """The parts of a CloudWatch alarm message that idle stop reads."""

    alarm_name: str
    new_state: str
    reason: str  # NewStateReason: CloudWatch's account of the datapoints
    description: str
    changed_at: str


@dataclass(frozen=True)
class IdleStopOutcome:
    alarm_name: str
    training_job_name: str | None
    stopped: bool
    detail: str  # what happened, in words (also when nothing did)


def parse_alarm_notices(event: Mapping[str, Any]) -> list[AlarmNotice]:
    """The alarm messages in an SNS-triggered Lambda event (MalformedAlarmMessage if one is not)."""
    records = event.get("Records")
    if not isinstance(records, list):
        raise MalformedAlarmMessage("SNS event without Records")
    notices: list[AlarmNotice] = []
    for record in records:
        sns = record.get("Sns") if isinstance(record, Mapping) else None
        raw = sns.get("Message") if isinstance(sns, Mapping) else None
        if not isinstance(raw, str):
            raise MalformedAlarmMessage("SNS record without a Message")
        try:
            message = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise MalformedAlarmMessage(f"SNS message is not JSON: {exc}") from exc
        if not isinstance(message, Mapping) or not message.get("AlarmName"):
            raise MalformedAlarmMessage("SNS message is not a CloudWatch alarm message (no AlarmName)")
        notices.append(
            AlarmNotice(
                alarm_name=str(message["AlarmName"]),
                new_state=str(message.get("NewStateValue") or ""),
                reason=str(message.get("NewStateReason") or ""),
                description=str(message.get("AlarmDescription") or ""),
                changed_at=str(message.get("StateChangeTime") or ""),
            )
        )
    return notices


def idle_reason(notice: AlarmNotice, kind: AlarmKind) -> str:
    """The reason recorded on the job: what the alarm watches, then what CloudWatch saw."""
    condition = notice.description.removeprefix(_DESCRIPTION_PREFIX) if notice.description else ""
    if not condition:
        condition = "no metrics" if kind is AlarmKind.SILENCE else "idle"
    return (
        f"idle: {condition} (alarm {notice.alarm_name}: {notice.reason})"
        if notice.reason
        else f"idle: {condition}"
    )


class IdleStop:
    def __init__(
        self,
        *,
        sagemaker: SageMakerAdapter,
        alarms: CloudWatchAlarms,
        store: Repository,
        publisher: Publisher,
        notifier: Notifier,
        policy: PolicyRules,
        clock: Callable[[], datetime],
        idle: IdleRules,
        alarm_topic_arn: str = "",
        teams: frozenset[str] = frozenset(),
    ) -> None:
        self.teams = teams
        self.alarm_topic_arn = alarm_topic_arn
        self.idle = idle
        self.sagemaker = sagemaker
        self.alarms = alarms
        self.store = store
        self.publisher = publisher
        self.notifier = notifier
        self.policy = policy
        self.clock = clock

    def on_sns(self, event: Mapping[str, Any]) -> list[IdleStopOutcome]:
        return [self.on_alarm(notice) for notice in parse_alarm_notices(event)]

    def on_alarm(self, notice: AlarmNotice) -> IdleStopOutcome:
        ref = parse_alarm_name(notice.alarm_name)
        if ref is None:
            return IdleStopOutcome(notice.alarm_name, None, False, "not a sagequeue idle alarm")
        name = ref.training_job_name
        if notice.new_state != "ALARM":
            return IdleStopOutcome(
                notice.alarm_name, name, False, f"alarm went to {notice.new_state}, not ALARM"
            )
        # The message is only a hint: anyone allowed to publish on the topic can write one. Act on what
        # CloudWatch says about the alarm now.
        doubt = self._unverified(notice.alarm_name, ref.host)
        if doubt:
            logger.warning("idle alarm message not acted on: %s", doubt, extra={"alarm": notice.alarm_name})
            return IdleStopOutcome(notice.alarm_name, name, False, doubt)
        try:
            detail = self.sagemaker.describe(name)
        except TrainingJobNotFound:
            self._drop_alarms(name)
            return IdleStopOutcome(notice.alarm_name, name, False, "the training job does not exist")
        status = detail.get("TrainingJobStatus")
        if status != "InProgress":
            # An alarm that outlived its job (its end event not handled yet): nothing to stop.
            self._drop_alarms(name)
            return IdleStopOutcome(notice.alarm_name, name, False, f"the training job is already {status}")
        arn = detail.get("TrainingJobArn")
        tags = self.sagemaker.tags(str(arn)) if arn else tags_to_dict(detail.get("Tags"))
        team = self._team_of(name, tags, detail)
        forged = self._not_governances(notice.alarm_name, detail, team) or self._not_idle_now(
            notice.alarm_name
        )
        if forged:
            logger.warning("idle alarm not acted on: %s", forged, extra={"alarm": notice.alarm_name})
            return IdleStopOutcome(notice.alarm_name, name, False, forged)
        tags = honoured_tags(
            self.store,
            self.publisher,
            name,
            tags,
            self.policy.exempt_tag,
            parse_time(detail.get("CreationTime")),
        )
        if is_exempt(tags, self.policy):
            # Exempted by an admin after its alarms were made: honour it, and stop watching.
            self._drop_alarms(name)
            return IdleStopOutcome(notice.alarm_name, name, False, "the training job is exempt")

        reason = idle_reason(notice, ref.kind)
        self.sagemaker.stop(name)
        self._record(name, tags, reason)
        # Its other hosts' alarms would only repeat the news; the job is stopping.
        self._drop_alarms(name)
        owner = owner_of(detail, tags)
        record = {
            "training_job_name": name,
            "host": ref.host,
            "alarm": notice.alarm_name,
            "owner": owner,
            "reason": reason,
            "at": self.clock().isoformat(),
        }
        if self.store.claim(IDLE_STOP_CLAIM, name, record):
            count(IDLE_STOPS)
            self.publisher.publish(EventType.IDLE_STOPPED, record)
            self.notifier.notify(
                f"sagequeue stopped idle training job {name}",
                f"Training job {name} (owner {owner}) was stopped because host {ref.host} "
                f"{'reported no metrics' if ref.kind is AlarmKind.SILENCE else 'was idle'}.\n\n{reason}\n\n"
                "It is not requeued. An admin can exempt a job from idle stops (submit it tagged "
                f"{self.policy.exempt_tag}=true, or PUT /exemptions/<training job name>).",
                {"event": "IdleStopped", "training_job_name": name, "owner": owner},
            )
            logger.info("stopped idle training job %s: %s", name, reason)
        return IdleStopOutcome(notice.alarm_name, name, True, reason)

    def _unverified(self, alarm_name: str, host: str) -> str | None:
        """Why the alarm cannot be trusted to stop the job, or None: it must exist, watch this very host
        (its Host dimension), send to our topic when we know it, and be in ALARM now."""
        alarm = self.alarms.describe(alarm_name)
        if alarm is None:
            return "no such alarm in CloudWatch"
        if host not in _hosts_watched(alarm):
            return f"the alarm does not watch host {host}"
        if self.alarm_topic_arn and self.alarm_topic_arn not in (alarm.get("AlarmActions") or ()):
            return "the alarm does not notify sagequeue's alarm topic"
        state = alarm.get("StateValue")
        if state != "ALARM":
            return f"the alarm is {state} now, not ALARM"
        return None

    def _team_of(
        self, training_job_name: str, tags: Mapping[str, str], detail: Mapping[str, Any]
    ) -> str | None:
        """The team whose namespace the training job's alarms read, as governance decides it
        (`alarm_team`): that of the queue entry it is an attempt of (its current one, or an earlier one its
        seal proves); for a job the table places in no team, the one its own Environment names. Never a
        tag's word."""
        job = self.store.find_job_by_training_job(training_job_name)
        if job is not None and not job.holds(training_job_name, tags):
            job = None
        if job is None and tags.get(JOB_TAG):
            tagged = self.store.find_job(tags[JOB_TAG])
            job = tagged if tagged is not None and tagged.started(training_job_name, tags) else None
        return alarm_team(job.team if job is not None else None, detail, self.teams, self.store.team_quotas)

    def _not_governances(self, alarm_name: str, detail: Mapping[str, Any], team: str | None) -> str | None:
        """Why the alarm is not the one governance creates for this job now (anyone allowed PutMetricAlarm
        can overwrite it under its name, or point it at a namespace other tenants publish to), or None. A
        replaced alarm is put back as governance makes it: it evaluates the same datapoints, so a host that
        is really idle is stopped at its next evaluation."""
        wanted = {
            spec.name: spec for spec in idle_alarm_specs(detail, self.idle, now=self.clock(), team=team)
        }
        spec = wanted.get(alarm_name)
        if spec is None:
            return "governance creates no alarm of that name for the training job now"
        alarm = self.alarms.describe(alarm_name)
        if alarm is None:
            return "no such alarm in CloudWatch"
        member = alarm_definition_difference(alarm, spec)
        if member is None:
            return None
        self.alarms.put(spec, [self.alarm_topic_arn] if self.alarm_topic_arn else [])
        return f"the alarm's {member} is not the one governance set; the alarm is put back as governance makes it"

    def _not_idle_now(self, alarm_name: str) -> str | None:
        """Why the alarm's own data does not put it in ALARM now, or None. Its state alone proves nothing:
        anyone allowed SetAlarmState can set it to ALARM, CloudWatch then runs its actions, and it stays in
        ALARM until its next evaluation. Its metric over its evaluation periods, judged by CloudWatch's
        rules (every period's highest utilization at or below the threshold; for a silence alarm, no
        datapoints), is what stops a job."""
        alarm = self.alarms.describe(alarm_name)
        if alarm is None:
            return "no such alarm in CloudWatch"
        evaluation = self.alarms.evaluate(alarm, self.clock())
        if evaluation.state == "ALARM":
            return None
        return f"the alarm's data does not show the host idle now ({evaluation.reason})"

    def _record(self, training_job_name: str, tags: Mapping[str, str], reason: str) -> None:
        """Mark the queue entry, if the job is its attempt (`Job.holds`), as stopping for idleness: the
        scheduler turns it into IDLE_STOPPED (never requeued) when SageMaker reports it Stopped."""
        for _ in range(3):
            job = self.store.find_job_by_training_job(training_job_name)
            if job is None or not job.holds(training_job_name, tags):
                return
            if job.state not in (JobState.STARTING, JobState.RUNNING, JobState.PREEMPTING):
                return
            was = job.state
            job.stop_reason = StopReason.IDLE
            job.transition(JobState.STOPPING, self.clock(), reason)
            try:
                self.store.save_job(job, was=was)
                return
            except StaleVersion:
                continue

    def _drop_alarms(self, training_job_name: str) -> None:
        names = self.alarms.names(alarm_prefix(training_job_name))
        if names:
            self.alarms.delete(names)


def _hosts_watched(alarm: Mapping[str, Any]) -> set[str]:
    """Every Host dimension value an alarm's metric (or its metric queries) names."""
    dimension_lists = [alarm.get("Dimensions") or []]
    for query in alarm.get("Metrics") or []:
        metric = ((query or {}).get("MetricStat") or {}).get("Metric") or {}
        dimension_lists.append(metric.get("Dimensions") or [])
    return {
        str(d.get("Value"))
        for dimensions in dimension_lists
        for d in dimensions
        if isinstance(d, Mapping) and d.get("Name") == HOST_DIMENSION
    }


def idle_stop_from(deps: Any) -> IdleStop:
    """The use case over a `runtime.Dependencies` (what the handler and the embedded stack use)."""
    return IdleStop(
        sagemaker=deps.sagemaker,
        alarms=alarms_of(deps),
        store=deps.store,
        publisher=deps.publisher,
        notifier=notifier_of(deps),
        policy=deps.settings.policy_rules,
        clock=deps.clock,
        idle=deps.settings.idle_rules,
        alarm_topic_arn=deps.settings.alarm_topic_arn,
        teams=deps.settings.named_teams,
    )
