"""CloudWatch's rules for a metric alarm's state, over the data GetMetricData returns: one source of truth
for the local stack's alarm evaluator and for idle stop, which re-checks an idle alarm's data before it stops
a job (anyone allowed SetAlarmState can put an alarm in ALARM by hand, and CloudWatch then runs its actions).

For each alarm: its last `EvaluationPeriods` periods (aligned to the period length, ending at the last whole
period before now), each classified as breaching, not breaching or missing, then `DatapointsToAlarm` (M out
of N) and `TreatMissingData` applied. Metric-math alarms: the metric queries go to GetMetricData and the
expressions (the part the idle alarms use) are evaluated here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

OK = "OK"
ALARM = "ALARM"
INSUFFICIENT_DATA = "INSUFFICIENT_DATA"

_COMPARISONS = {
    "GreaterThanOrEqualToThreshold": lambda value, threshold: value >= threshold,
    "GreaterThanThreshold": lambda value, threshold: value > threshold,
    "LessThanThreshold": lambda value, threshold: value < threshold,
    "LessThanOrEqualToThreshold": lambda value, threshold: value <= threshold,
}


@dataclass(frozen=True)
class Evaluation:
    """The outcome of evaluating one alarm: its new state and why."""

    state: str
    reason: str
    #: Values of the evaluated periods, oldest first; None where data is missing.
    values: tuple[float | None, ...]


def evaluate(alarm: Mapping[str, Any], values: list[float | None]) -> Evaluation:
    """The state `alarm` should be in, given the values of its evaluation range (oldest first; None for
    a period without data). Pure: this is where CloudWatch's rules live.

    - notBreaching: a missing period counts as good; breaching: as bad.
    - missing (default): if every period is missing, INSUFFICIENT_DATA; otherwise only periods with data
      count, and when fewer than M have data, all of them must breach.
    - ignore: as missing, but with no data at all the alarm keeps its state.
    """
    threshold = float(alarm.get("Threshold", 0.0))
    operator = str(alarm.get("ComparisonOperator", "GreaterThanThreshold"))
    compare = _COMPARISONS.get(operator)
    if compare is None:
        raise ValueError(f"alarm {alarm.get('AlarmName')}: comparison {operator} is not evaluated locally")
    periods = int(alarm.get("EvaluationPeriods", 1))
    needed = int(alarm.get("DatapointsToAlarm") or periods)
    treat = str(alarm.get("TreatMissingData") or "missing")
    window = list(values)[-periods:]
    present = [value for value in window if value is not None]
    breaching = sum(1 for value in present if compare(value, threshold))
    missing = len(window) - len(present)
    shown = tuple(window)
    describe = ", ".join("missing" if v is None else f"{v:g}" for v in window)
    if treat == "notBreaching":
        alarmed = breaching >= needed
    elif treat == "breaching":
        alarmed = breaching + missing >= needed
    elif not present:
        if treat == "ignore":
            current = str(alarm.get("StateValue") or INSUFFICIENT_DATA)
            return Evaluation(current, "no data in the evaluation range; state kept (ignore)", shown)
        return Evaluation(
            INSUFFICIENT_DATA, f"Insufficient Data: no datapoints in the last {periods} periods", shown
        )
    elif len(present) >= needed:
        alarmed = breaching >= needed
    else:
        alarmed = breaching == len(present)
    if alarmed:
        reason = (
            f"Threshold Crossed: {breaching} out of the last {len(window)} datapoints [{describe}] "
            f"were {_operator_text(operator)} the threshold ({threshold:g}) (minimum {needed} datapoints "
            f"for OK -> ALARM transition)."
        )
        return Evaluation(ALARM, reason, shown)
    reason = (
        f"Threshold Crossed: {len(window) - breaching} out of the last {len(window)} datapoints [{describe}] "
        f"were not {_operator_text(operator)} the threshold ({threshold:g}) (minimum 1 datapoint for "
        "ALARM -> OK transition)."
    )
    return Evaluation(OK, reason, shown)


def _operator_text(operator: str) -> str:
    return {
        "GreaterThanOrEqualToThreshold": "greater than or equal to",
        "GreaterThanThreshold": "greater than",
        "LessThanThreshold": "less than",
        "LessThanOrEqualToThreshold": "less than or equal to",
    }[operator]


def evaluation_range(alarm: Mapping[str, Any], now: datetime) -> list[tuple[datetime, datetime]]:
    """The alarm's evaluation periods, oldest first: whole periods aligned to the period length, the last
    one ending at or before `now` (the period in progress is not evaluated)."""
    period = alarm_period(alarm)
    periods = int(alarm.get("EvaluationPeriods", 1))
    epoch = int(now.timestamp())
    end = datetime.fromtimestamp(epoch - epoch % period, tz=UTC)
    return [
        (end - timedelta(seconds=period * (index + 1)), end - timedelta(seconds=period * index))
        for index in reversed(range(periods))
    ]


def alarm_period(alarm: Mapping[str, Any]) -> int:
    if alarm.get("Period"):
        return int(alarm["Period"])
    for query in alarm.get("Metrics") or []:
        stat = query.get("MetricStat")
        if stat and stat.get("Period"):
            return int(stat["Period"])
        if query.get("Period"):
            return int(query["Period"])
    return 60


def alarm_queries(alarm: Mapping[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """GetMetricData queries for the alarm, and the id of the query whose values are evaluated."""
    if alarm.get("Metrics"):
        queries = [dict(query) for query in alarm["Metrics"]]
        chosen = next((q["Id"] for q in queries if q.get("ReturnData", True)), queries[-1]["Id"])
        for query in queries:
            query["ReturnData"] = query["Id"] == chosen
        return queries, str(chosen)
    statistic = alarm.get("Statistic") or alarm.get("ExtendedStatistic") or "Average"
    stat: dict[str, Any] = {
        "Metric": {
            "Namespace": alarm["Namespace"],
            "MetricName": alarm["MetricName"],
            "Dimensions": [{"Name": d["Name"], "Value": d["Value"]} for d in alarm.get("Dimensions") or []],
        },
        "Period": int(alarm.get("Period", 60)),
        "Stat": statistic,
    }
    if alarm.get("Unit"):
        stat["Unit"] = alarm["Unit"]
    return [{"Id": "m0", "MetricStat": stat, "ReturnData": True}], "m0"


# --- metric math, the part the idle alarms use ----------------------------------------------------------------
#
# Numbers, query ids, + - * /, comparisons (> >= < <= == !=, 1 or 0 per period), parentheses, IF(c, a, b)
# and FILL(series, value). A period missing in an input is missing in the result, except through FILL.

Series = list[float | None]
_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d*)?)|([A-Za-z_][A-Za-z0-9_]*)|(>=|<=|==|!=|[-+*/(),<>]))")


def _names(text: str) -> set[str]:
    return {m.group(2) for m in _TOKEN.finditer(text) if m.group(2)} - {"IF", "FILL"}


def _tokens(text: str) -> list[str]:
    out, position = [], 0
    text = text.strip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise ValueError(f"cannot read metric math {text!r} at {text[position:]!r}")
        out.append(match.group(0).strip())
        position = match.end()
    return out


def _lift(op: Any, *args: Series) -> Series:
    return [
        None if any(a[i] is None for a in args) else op(*(a[i] for a in args)) for i in range(len(args[0]))
    ]


_BINARY: dict[str, Any] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b if b else None,
    ">": lambda a, b: float(a > b),
    ">=": lambda a, b: float(a >= b),
    "<": lambda a, b: float(a < b),
    "<=": lambda a, b: float(a <= b),
    "==": lambda a, b: float(a == b),
    "!=": lambda a, b: float(a != b),
}


def evaluate_expression(text: str, series: Mapping[str, Series], length: int) -> Series:
    """The per-period values of one metric-math expression over the given input series."""
    tokens = _tokens(text)
    position = 0

    def peek() -> str | None:
        return tokens[position] if position < len(tokens) else None

    def take(expected: str | None = None) -> str:
        nonlocal position
        word = peek()
        if word is None or (expected is not None and word != expected):
            raise ValueError(f"metric math {text!r}: expected {expected or 'more'}, got {word!r}")
        position += 1
        return word

    def binary(level: int) -> Series:
        operators = [(">", ">=", "<", "<=", "==", "!="), ("+", "-"), ("*", "/")]
        if level == len(operators):
            return primary()
        left = binary(level + 1)
        while peek() in operators[level]:
            operator = _BINARY[take()]
            right = binary(level + 1)
            left = _lift(operator, left, right)
        return left

    def primary() -> Series:
        word = take()
        if word == "(":
            value = binary(0)
            take(")")
            return value
        if word == "-":
            return _lift(lambda a: -a, primary())
        if word[0].isdigit():
            return [float(word)] * length
        if word in ("IF", "FILL"):
            take("(")
            args = [binary(0)]
            while peek() == ",":
                take(",")
                args.append(binary(0))
            take(")")
            if word == "FILL" and len(args) == 2:
                return [v if v is not None else f for v, f in zip(args[0], args[1], strict=True)]
            if word == "IF" and len(args) == 3:
                return [
                    None if c is None else (a if c else b)
                    for c, a, b in zip(args[0], args[1], args[2], strict=True)
                ]
            raise ValueError(f"metric math {text!r}: wrong number of arguments to {word}")
        if word not in series:
            raise ValueError(f"metric math {text!r}: no query with id {word!r}")
        return list(series[word])

    result = binary(0)
    if position != len(tokens):
        raise ValueError(f"metric math {text!r}: unexpected {tokens[position]!r}")
    return result


def metric_values(cloudwatch: Any, alarm: Mapping[str, Any], now: datetime) -> list[float | None]:
    """Per evaluation period of `alarm` at `now`, oldest first, the value it evaluates, or None where there
    is no data: one GetMetricData call over `cloudwatch` (a boto3 client)."""
    periods = evaluation_range(alarm, now)
    queries, chosen = alarm_queries(alarm)
    expressions = {str(q["Id"]): str(q["Expression"]) for q in queries if q.get("Expression")}
    stats = [{**q, "ReturnData": True} for q in queries if not q.get("Expression")]
    if not expressions:
        stats = queries
    answer = cloudwatch.get_metric_data(
        MetricDataQueries=stats, StartTime=periods[0][0], EndTime=periods[-1][1]
    )
    series: dict[str, list[float | None]] = {}
    for result in answer.get("MetricDataResults", []):
        by_start: dict[datetime, float] = {}
        for stamp, value in zip(result.get("Timestamps", []), result.get("Values", []), strict=False):
            by_start[stamp.astimezone(UTC)] = float(value)
        series[str(result.get("Id"))] = [by_start.get(start) for start, _ in periods]
    empty: list[float | None] = [None] * len(periods)
    for query_id in expressions:
        series.setdefault(query_id, empty)
    pending = dict(expressions)
    while pending:
        # an expression may name another one: evaluate those whose inputs are known first
        ready = [i for i, text in pending.items() if not (_names(text) & set(pending))]
        if not ready:
            raise ValueError(f"alarm {alarm.get('AlarmName')}: expressions refer to each other in a cycle")
        for query_id in ready:
            series[query_id] = evaluate_expression(pending.pop(query_id), series, len(periods))
    return series.get(chosen, empty)
