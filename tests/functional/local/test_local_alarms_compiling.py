"""The idle alarm of a Neuron host counts a compiling host as busy: the real alarm spec (metric math), put
on moto, evaluated by the local evaluator over published NeuronCoreUtilization and NeuronCompiling."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sagequeue.local.alarms import ALARM, AlarmEvaluator, evaluate_expression
from sagequeue_core.defaults import (
    HOST_DIMENSION,
    NEURON_COMPILING_METRIC,
    NEURON_METRIC_NAMESPACE,
    NEURONCORE_UTILIZATION_METRIC,
)
from sagequeue_core.governance import COMPILING_AS_BUSY_EXPRESSION, AlarmKind, IdleRules, idle_alarm_specs

NOW = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
M = None


@pytest.mark.parametrize(
    ("utilization", "compiling", "expected"),
    [
        ([0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [100.0, 100.0, 100.0]),  # compiling at 0%: busy
        ([0.0, 0.0, 0.0], [M, M, M], [0.0, 0.0, 0.0]),  # no compile reported: the utilization
        ([M, M, M], [1.0, M, 0.0], [100.0, M, M]),  # no utilization: missing unless compiling
        ([40.0, 0.0, 2.0], [0.0, 1.0, 0.0], [40.0, 100.0, 2.0]),
    ],
)
def test_the_busy_expression(
    utilization: list[float | None], compiling: list[float | None], expected: list[float | None]
) -> None:
    series = {"utilization": utilization, "compiling": compiling}
    assert evaluate_expression(COMPILING_AS_BUSY_EXPRESSION, series, 3) == expected


def test_metric_math_arithmetic_and_errors() -> None:
    series = {"a": [1.0, 2.0, M], "b": [4.0, 0.0, 1.0]}
    assert evaluate_expression("(a + 1) * 2 - b / 2", series, 3) == [2.0, 6.0, M]
    assert evaluate_expression("a / b", series, 3) == [0.25, M, M]  # no division by zero
    assert evaluate_expression("-a >= -1", series, 3) == [1.0, 0.0, M]
    for bad, problem in (
        ("IF(a, b)", "wrong number"),
        ("a +", "expected more"),
        ("zz", "no query"),
        ("a b", "unexpected"),
    ):
        with pytest.raises(ValueError, match=problem):
            evaluate_expression(bad, series, 3)


def test_a_compiling_trainium_host_is_not_stopped_as_idle(
    aws: Callable[[str], Any], account_moto: tuple[str, str]
) -> None:
    _, account_id = account_moto
    topic = aws("sns").create_topic(Name=f"alarms-{uuid.uuid4().hex[:6]}")["TopicArn"]
    job_name = f"compiling-{uuid.uuid4().hex[:6]}"
    job = {
        "TrainingJobName": job_name,
        "ResourceConfig": {"InstanceType": "ml.trn1.32xlarge", "InstanceCount": 1},
        "TrainingStartTime": NOW - timedelta(hours=1),
    }
    # GIVEN the idle alarm sagequeue puts for a trn1 host (3 idle minutes), as the governance code builds it
    (spec,) = [
        s for s in idle_alarm_specs(job, IdleRules(period_seconds=60, periods=3)) if s.kind is AlarmKind.IDLE
    ]
    args = spec.put_metric_alarm_args([topic])
    assert "MetricName" not in args
    assert [q["Id"] for q in args["Metrics"]] == ["utilization", "compiling", "busy"]
    aws("cloudwatch").put_metric_alarm(**args)
    evaluator = AlarmEvaluator(aws("cloudwatch"), aws("sns"), region="us-east-1", account_id=account_id)

    def publish(metric: str, minute: int, value: float) -> None:
        aws("cloudwatch").put_metric_data(
            Namespace=NEURON_METRIC_NAMESPACE,
            MetricData=[
                {
                    "MetricName": metric,
                    "Dimensions": [{"Name": HOST_DIMENSION, "Value": spec.host}],
                    "Timestamp": NOW.replace(second=0) - timedelta(minutes=minute) + timedelta(seconds=10),
                    "Value": value,
                }
            ],
        )

    def state() -> str:
        return str(aws("cloudwatch").describe_alarms(AlarmNames=[spec.name])["MetricAlarms"][0]["StateValue"])

    # WHEN the host reads 0% NeuronCore utilization for three minutes while neuronx-cc runs
    for minute in (3, 2, 1):
        publish(NEURONCORE_UTILIZATION_METRIC, minute, 0.0)
        publish(NEURON_COMPILING_METRIC, minute, 1.0)
    alarm = aws("cloudwatch").describe_alarms(AlarmNames=[spec.name])["MetricAlarms"][0]
    assert evaluator.values(alarm, NOW) == [100.0, 100.0, 100.0]
    evaluator.run(NOW)
    # THEN the alarm does not fire
    assert state() != ALARM
    # WHEN the compile ends and the host then does nothing for three minutes
    for minute in (0, -1, -2):
        publish(NEURONCORE_UTILIZATION_METRIC, minute, 0.0)
        publish(NEURON_COMPILING_METRIC, minute, 0.0)
    changes = evaluator.run(NOW + timedelta(minutes=3))
    # THEN it fires
    assert [c.new_state for c in changes if c.alarm_name == spec.name] == [ALARM]
    assert state() == ALARM
