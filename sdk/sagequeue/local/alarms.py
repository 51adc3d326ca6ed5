"""Evaluate CloudWatch metric alarms on moto, which stores alarms and metric data but never evaluates them.

For each alarm: read its last `EvaluationPeriods` periods of data with GetMetricData (periods aligned to the
period length, ending at the last whole period before now), classify each period as breaching, not
breaching or missing, apply `DatapointsToAlarm` (M out of N) and `TreatMissingData`, and, when the state
changes, set it with SetAlarmState and notify the alarm's actions for the new state: an SNS-shaped
CloudWatch alarm message is published to each SNS topic among the actions, so moto delivers it to the
topic's subscribers and the functions subscribed to it run.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

# CloudWatch's rules live in the layer (idle stop re-checks an alarm's data with them); re-exported here.
from sagequeue_core.alarm_evaluation import (
    ALARM,
    INSUFFICIENT_DATA,
    OK,
    Evaluation,
    alarm_period,
    alarm_queries,
    evaluate,
    evaluate_expression,
    evaluation_range,
    metric_values,
)

__all__ = [
    "ALARM",
    "INSUFFICIENT_DATA",
    "OK",
    "AlarmEvaluator",
    "Evaluation",
    "Transition",
    "alarm_message",
    "evaluate",
    "evaluate_expression",
    "evaluation_range",
]

logger = logging.getLogger("sagequeue.local.alarms")

_REGION_NAMES = {
    "us-east-1": "US East (N. Virginia)",
    "us-east-2": "US East (Ohio)",
    "us-west-2": "US West (Oregon)",
    "eu-west-1": "EU (Ireland)",
    "eu-central-1": "EU (Frankfurt)",
    "ap-northeast-1": "Asia Pacific (Tokyo)",
}


@dataclass(frozen=True)
class Transition:
    alarm_name: str
    old_state: str
    new_state: str
    reason: str


class AlarmEvaluator:
    """Evaluates every metric alarm in moto's CloudWatch and acts on state changes."""

    def __init__(self, cloudwatch: Any, sns: Any, *, region: str, account_id: str) -> None:
        self.cloudwatch = cloudwatch
        self.sns = sns
        self.region = region
        self.account_id = account_id

    def alarms(self) -> Iterable[dict[str, Any]]:
        for page in self.cloudwatch.get_paginator("describe_alarms").paginate(AlarmTypes=["MetricAlarm"]):
            yield from page.get("MetricAlarms", [])

    def values(self, alarm: Mapping[str, Any], now: datetime) -> list[float | None]:
        """Per evaluation period, oldest first, the alarm's statistic, or None where there is no data."""
        return metric_values(self.cloudwatch, alarm, now)

    def batch_values(
        self, alarms: list[dict[str, Any]], now: datetime
    ) -> list[list[float | None] | BaseException]:
        """`values()` of many alarms with as few GetMetricData calls as their ranges allow: alarms on a
        single metric that share an evaluation range go in one call (each alarm's query renamed apart);
        metric-math alarms, whose expressions name their own query ids, get a call each."""
        out: list[list[float | None] | BaseException] = [[] for _ in alarms]
        groups: dict[tuple[datetime, datetime], list[int]] = {}
        for index, alarm in enumerate(alarms):
            if alarm.get("Metrics"):
                try:
                    out[index] = self.values(alarm, now)
                except (ValueError, KeyError, ClientError) as exc:
                    out[index] = exc
                continue
            periods = evaluation_range(alarm, now)
            groups.setdefault((periods[0][0], periods[-1][1]), []).append(index)
        for (start, end), members in groups.items():
            queries = []
            for index in members:
                try:
                    (query,), _ = alarm_queries(alarms[index])
                except (ValueError, KeyError) as exc:
                    out[index] = exc
                    continue
                queries.append({**query, "Id": f"a{index}"})
            found: dict[str, dict[datetime, float]] = {}
            for first in range(0, len(queries), 500):  # GetMetricData takes at most 500 queries
                answer = self.cloudwatch.get_metric_data(
                    MetricDataQueries=queries[first : first + 500], StartTime=start, EndTime=end
                )
                for result in answer.get("MetricDataResults", []):
                    found[str(result.get("Id"))] = {
                        stamp.astimezone(UTC): float(value)
                        for stamp, value in zip(
                            result.get("Timestamps", []), result.get("Values", []), strict=False
                        )
                    }
            for index in members:
                if isinstance(out[index], BaseException):
                    continue
                by_start = found.get(f"a{index}", {})
                out[index] = [by_start.get(p) for p, _ in evaluation_range(alarms[index], now)]
        return out

    def run(self, now: datetime) -> list[Transition]:
        """Evaluate every alarm once at `now`; returns the state changes made."""
        changes = []
        alarms = list(self.alarms())
        for alarm, values in zip(alarms, self.batch_values(alarms, now), strict=True):
            try:
                if isinstance(values, BaseException):
                    raise values
                outcome = evaluate(alarm, values)
            except (ValueError, KeyError) as exc:
                logger.warning("alarm %s is not evaluated locally: %s", alarm.get("AlarmName"), exc)
                continue
            old = str(alarm.get("StateValue") or INSUFFICIENT_DATA)
            if outcome.state == old:
                continue
            reason_data = {
                "version": "1.0",
                "queryDate": now.isoformat(),
                "recentDatapoints": [v for v in outcome.values if v is not None],
                "threshold": alarm.get("Threshold"),
            }
            self.cloudwatch.set_alarm_state(
                AlarmName=alarm["AlarmName"],
                StateValue=outcome.state,
                StateReason=outcome.reason[:1023],
                StateReasonData=json.dumps(reason_data),
            )
            changes.append(Transition(alarm["AlarmName"], old, outcome.state, outcome.reason))
            self._notify(alarm, old, outcome, now)
        return changes

    def _notify(self, alarm: Mapping[str, Any], old: str, outcome: Evaluation, now: datetime) -> None:
        if alarm.get("ActionsEnabled") is False:
            return
        actions = {
            ALARM: alarm.get("AlarmActions"),
            OK: alarm.get("OKActions"),
            INSUFFICIENT_DATA: alarm.get("InsufficientDataActions"),
        }[outcome.state] or []
        topics = [arn for arn in actions if str(arn).startswith("arn:") and ":sns:" in str(arn)]
        if not topics:
            return
        message = alarm_message(alarm, old, outcome, now, region=self.region, account_id=self.account_id)
        region_name = _REGION_NAMES.get(self.region, self.region)
        subject = f'{outcome.state}: "{alarm["AlarmName"]}" in {region_name}'[:100]
        for topic in topics:
            self.sns.publish(TopicArn=topic, Subject=subject, Message=json.dumps(message))


def alarm_message(
    alarm: Mapping[str, Any],
    old_state: str,
    outcome: Evaluation,
    now: datetime,
    *,
    region: str,
    account_id: str,
) -> dict[str, Any]:
    """The JSON CloudWatch publishes to an alarm's SNS actions."""
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}+0000"
    trigger: dict[str, Any] = {
        "Period": alarm_period(alarm),
        "EvaluationPeriods": int(alarm.get("EvaluationPeriods", 1)),
        "DatapointsToAlarm": int(alarm.get("DatapointsToAlarm") or alarm.get("EvaluationPeriods", 1)),
        "ComparisonOperator": alarm.get("ComparisonOperator"),
        "Threshold": float(alarm.get("Threshold", 0.0)),
        "TreatMissingData": alarm.get("TreatMissingData") or "missing",
        "EvaluateLowSampleCountPercentile": alarm.get("EvaluateLowSampleCountPercentile", ""),
    }
    if alarm.get("Metrics"):
        trigger["Metrics"] = alarm["Metrics"]
    else:
        trigger.update(
            {
                "MetricName": alarm.get("MetricName"),
                "Namespace": alarm.get("Namespace"),
                "StatisticType": "ExtendedStatistic" if alarm.get("ExtendedStatistic") else "Statistic",
                "Statistic": str(alarm.get("Statistic") or alarm.get("ExtendedStatistic") or "").upper(),
                "Unit": alarm.get("Unit"),
                "Dimensions": [
                    {"value": d["Value"], "name": d["Name"]} for d in alarm.get("Dimensions") or []
                ],
            }
        )
    configured = alarm.get("AlarmConfigurationUpdatedTimestamp")
    return {
        "AlarmName": alarm["AlarmName"],
        "AlarmDescription": alarm.get("AlarmDescription"),
        "AWSAccountId": account_id,
        "AlarmConfigurationUpdatedTimestamp": configured.isoformat()
        if isinstance(configured, datetime)
        else None,
        "NewStateValue": outcome.state,
        "NewStateReason": outcome.reason,
        "StateChangeTime": stamp,
        "Region": _REGION_NAMES.get(region, region),
        "AlarmArn": alarm.get("AlarmArn"),
        "OldStateValue": old_state,
        "OKActions": list(alarm.get("OKActions") or []),
        "AlarmActions": list(alarm.get("AlarmActions") or []),
        "InsufficientDataActions": list(alarm.get("InsufficientDataActions") or []),
        "Trigger": trigger,
    }
