"""CloudWatch alarm adapter: put, delete and list sagequeue's idle alarms.

Every call goes through one injected client; ClientError codes become the named errors below, so callers
never look at botocore's exceptions or message text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from sagequeue_core.alarm_evaluation import Evaluation, evaluate, metric_values
from sagequeue_core.errors import SageQueueError
from sagequeue_core.governance import AlarmSpec

#: DeleteAlarms takes at most this many names per call.
DELETE_BATCH = 100


class AlarmError(SageQueueError):
    """A CloudWatch alarm call failed; the message names the alarm and the cause."""


class AlarmLimitExceeded(AlarmError):
    """The account's alarm quota is reached: the job runs unwatched until alarms are freed."""


class AlarmNotPermitted(AlarmError):
    """The function's role may not manage this alarm (IAM scopes it to the idle-alarm prefix)."""


class InvalidAlarm(AlarmError):
    """CloudWatch refused the alarm's definition."""


_ERRORS: dict[str, type[AlarmError]] = {
    "LimitExceeded": AlarmLimitExceeded,
    "LimitExceededFault": AlarmLimitExceeded,
    "AccessDenied": AlarmNotPermitted,
    "AccessDeniedException": AlarmNotPermitted,
    "InvalidParameterValue": InvalidAlarm,
    "InvalidParameterCombination": InvalidAlarm,
    "MissingParameter": InvalidAlarm,
    "ValidationError": InvalidAlarm,
}


def _translate(exc: ClientError, what: str) -> AlarmError:
    code = exc.response.get("Error", {}).get("Code", "")
    return _ERRORS.get(code, AlarmError)(
        f"{what}: {code or 'error'}: {exc.response.get('Error', {}).get('Message', '')}"
    )


class CloudWatchAlarms:
    def __init__(self, client: Any) -> None:
        self._client = client

    def put(self, spec: AlarmSpec, actions: Sequence[str]) -> None:
        """Create or replace one alarm (PutMetricAlarm overwrites an alarm of the same name)."""
        try:
            self._client.put_metric_alarm(**spec.put_metric_alarm_args(actions))
        except ClientError as exc:
            raise _translate(exc, f"cannot put alarm {spec.name}") from exc

    def delete(self, names: Iterable[str]) -> int:
        """Delete alarms by name; names that do not exist are ignored. Returns how many were asked for."""
        pending = sorted(set(names))
        for start in range(0, len(pending), DELETE_BATCH):
            batch = pending[start : start + DELETE_BATCH]
            try:
                self._client.delete_alarms(AlarmNames=batch)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "ResourceNotFound":
                    raise _translate(exc, f"cannot delete alarms {', '.join(batch)}") from exc
                # One name in the batch is gone (another delivery deleted it first), and CloudWatch then
                # deletes none of them: delete the ones that are left.
                left = self._existing(batch)
                if left:
                    try:
                        self._client.delete_alarms(AlarmNames=left)
                    except ClientError as again:
                        raise _translate(again, f"cannot delete alarms {', '.join(left)}") from again
        return len(pending)

    def _existing(self, names: Sequence[str]) -> list[str]:
        try:
            page = self._client.describe_alarms(
                AlarmNames=list(names), AlarmTypes=["MetricAlarm"], MaxRecords=100
            )
        except ClientError as exc:
            raise _translate(exc, f"cannot describe alarms {', '.join(names)}") from exc
        return [alarm["AlarmName"] for alarm in page.get("MetricAlarms", [])]

    def names(self, prefix: str) -> list[str]:
        """Names of every metric alarm whose name starts with `prefix`, across all pages."""
        return list(self.definitions(prefix))

    def definitions(self, prefix: str) -> dict[str, dict[str, Any]]:
        """Every metric alarm whose name starts with `prefix`, as DescribeAlarms shows it, by name."""
        found: dict[str, dict[str, Any]] = {}
        token: str | None = None
        try:
            while True:
                kwargs: dict[str, Any] = {
                    "AlarmNamePrefix": prefix,
                    "AlarmTypes": ["MetricAlarm"],
                    "MaxRecords": 100,
                }
                if token:
                    kwargs["NextToken"] = token
                page = self._client.describe_alarms(**kwargs)
                found.update((alarm["AlarmName"], dict(alarm)) for alarm in page.get("MetricAlarms", []))
                token = page.get("NextToken")
                if not token:
                    return found
        except ClientError as exc:
            raise _translate(exc, f"cannot list alarms starting with {prefix!r}") from exc

    def describe(self, name: str) -> dict[str, Any] | None:
        """The metric alarm as CloudWatch describes it now, or None when there is none of that name."""
        try:
            page = self._client.describe_alarms(AlarmNames=[name], AlarmTypes=["MetricAlarm"])
        except ClientError as exc:
            raise _translate(exc, f"cannot describe alarm {name}") from exc
        alarms = page.get("MetricAlarms", [])
        return dict(alarms[0]) if alarms else None

    def evaluate(self, alarm: Mapping[str, Any], now: datetime) -> Evaluation:
        """The state CloudWatch's rules give `alarm` (as DescribeAlarms shows it) over its metric data at
        `now`, read with GetMetricData: what the alarm's data says, whatever state anyone set it to."""
        try:
            values = metric_values(self._client, alarm, now)
        except ClientError as exc:
            raise _translate(exc, f"cannot read the data of alarm {alarm.get('AlarmName')}") from exc
        return evaluate(alarm, values)

    def state(self, name: str) -> str | None:
        """The alarm's state (OK, ALARM, INSUFFICIENT_DATA), or None when it does not exist."""
        try:
            page = self._client.describe_alarms(AlarmNames=[name], AlarmTypes=["MetricAlarm"])
        except ClientError as exc:
            raise _translate(exc, f"cannot describe alarm {name}") from exc
        alarms = page.get("MetricAlarms", [])
        return str(alarms[0]["StateValue"]) if alarms else None


def alarms_of(deps: Any) -> CloudWatchAlarms:
    """The alarm adapter of a `runtime.Dependencies`: the one installed, else one over its CloudWatch client."""
    if deps.alarms is None:
        deps.alarms = CloudWatchAlarms(deps.client("cloudwatch"))
    alarms: CloudWatchAlarms = deps.alarms
    return alarms
