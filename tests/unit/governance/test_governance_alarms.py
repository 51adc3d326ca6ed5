"""Idle-alarm specs: the metric per instance family, one pair of alarms per host, names that round-trip."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sagequeue_core.defaults import IDLE_ALARM_PREFIX, NEURON_METRIC_NAMESPACE, SAGEMAKER_METRIC_NAMESPACE
from sagequeue_core.domain import DomainError
from sagequeue_core.governance import (
    AlarmKind,
    IdleRules,
    IdleSignal,
    alarm_definition_difference,
    alarm_name,
    alarm_prefix,
    hosts_of,
    idle_alarm_specs,
    idle_signal,
    parse_alarm_name,
    published_team,
    training_phase_start,
)

EVENTS = Path(__file__).parent / "events"


def detail(name: str) -> dict[str, Any]:
    return json.loads((EVENTS / name).read_text())["detail"]


def job(instance_type: str, count: int = 1, **extra: Any) -> dict[str, Any]:
    return {
        "TrainingJobName": "j",
        "ResourceConfig": {"InstanceType": instance_type, "InstanceCount": count},
        "TrainingStartTime": datetime(2026, 1, 1, tzinfo=UTC),
        **extra,
    }


@pytest.mark.parametrize(
    ("instance_type", "signal", "namespace", "metric"),
    [
        ("ml.trn1.32xlarge", IdleSignal.NEURON, NEURON_METRIC_NAMESPACE, "NeuronCoreUtilization"),
        ("ml.trn1n.32xlarge", IdleSignal.NEURON, NEURON_METRIC_NAMESPACE, "NeuronCoreUtilization"),
        ("ml.trn2.48xlarge", IdleSignal.NEURON, NEURON_METRIC_NAMESPACE, "NeuronCoreUtilization"),
        ("ml.inf2.xlarge", IdleSignal.NEURON, NEURON_METRIC_NAMESPACE, "NeuronCoreUtilization"),
        ("ml.p4d.24xlarge", IdleSignal.GPU, SAGEMAKER_METRIC_NAMESPACE, "GPUUtilization"),
        ("ml.g5.xlarge", IdleSignal.GPU, SAGEMAKER_METRIC_NAMESPACE, "GPUUtilization"),
        ("ml.m5.xlarge", IdleSignal.CPU, SAGEMAKER_METRIC_NAMESPACE, "CPUUtilization"),
        ("ml.c5.2xlarge", IdleSignal.CPU, SAGEMAKER_METRIC_NAMESPACE, "CPUUtilization"),
    ],
)
def test_the_idle_metric_follows_the_instance_family(
    instance_type: str, signal: IdleSignal, namespace: str, metric: str
) -> None:
    assert idle_signal(instance_type) is signal
    (spec,) = idle_alarm_specs(job(instance_type), IdleRules())
    assert (spec.namespace, spec.metric_name) == (namespace, metric)
    args = spec.put_metric_alarm_args(["arn:topic"])
    if signal is IdleSignal.NEURON:
        # metric math: utilization, but a compiling host counts as busy
        watched = [q["MetricStat"]["Metric"] for q in args["Metrics"] if "MetricStat" in q]
        assert [(m["Namespace"], m["MetricName"]) for m in watched] == [
            (namespace, metric),
            (namespace, "NeuronCompiling"),
        ]
        assert [q["Id"] for q in args["Metrics"] if q["ReturnData"]] == ["busy"]
    else:
        assert args["MetricName"] == metric


def test_a_trainium_job_is_never_watched_through_gpu_utilization() -> None:
    # GIVEN the sample event of a two-host trn1 job in Training
    specs = idle_alarm_specs(detail("training-state-change-training.json"), IdleRules())
    # THEN no alarm waits for a metric Trainium never reports
    assert specs
    assert all(s.metric_name == "NeuronCoreUtilization" for s in specs)


def test_one_idle_alarm_per_host_named_after_the_host_dimension() -> None:
    specs = idle_alarm_specs(job("ml.trn1.32xlarge", 3), IdleRules())
    assert [s.name for s in specs] == [f"{IDLE_ALARM_PREFIX}j/algo-{n}" for n in (1, 2, 3)]
    for n, spec in enumerate(specs, start=1):
        args = spec.put_metric_alarm_args(["arn:aws:sns:us-east-1:123456789012:idle"])
        for query in args["Metrics"][:2]:
            assert query["MetricStat"]["Metric"]["Dimensions"] == [{"Name": "Host", "Value": f"j/algo-{n}"}]
        assert args["AlarmActions"] == ["arn:aws:sns:us-east-1:123456789012:idle"]


def test_threshold_period_and_periods_come_from_the_rules() -> None:
    rules = IdleRules(threshold_percent=2.5, period_seconds=120, periods=4)
    (spec,) = idle_alarm_specs(job("ml.trn2.48xlarge"), rules)
    args = spec.put_metric_alarm_args([])
    assert args["Threshold"] == 2.5
    assert [q["MetricStat"]["Period"] for q in args["Metrics"][:2]] == [120, 120]
    assert args["EvaluationPeriods"] == args["DatapointsToAlarm"] == 4
    assert [q["MetricStat"]["Stat"] for q in args["Metrics"][:2]] == ["Maximum", "Maximum"]
    assert args["ComparisonOperator"] == "LessThanOrEqualToThreshold"
    # a gap in the data never counts towards an idle stop; the silence alarm judges gaps
    assert args["TreatMissingData"] == "notBreaching"


def test_silence_alarms_join_once_the_host_has_trained_for_the_silence_window() -> None:
    rules = IdleRules(period_seconds=300, periods=6, silence_factor=2)  # idle 30 min, silence 60 min
    start = datetime(2026, 1, 1, tzinfo=UTC)
    j = job("ml.trn1.32xlarge", 2)
    too_early = idle_alarm_specs(j, rules, now=start + timedelta(minutes=59))
    assert {s.kind for s in too_early} == {AlarmKind.IDLE}
    due = idle_alarm_specs(j, rules, now=start + timedelta(minutes=60))
    silence = [s for s in due if s.kind is AlarmKind.SILENCE]
    assert [s.name for s in silence] == [
        f"{IDLE_ALARM_PREFIX}j/algo-1/no-data",
        f"{IDLE_ALARM_PREFIX}j/algo-2/no-data",
    ]
    args = silence[0].put_metric_alarm_args([])
    # missing data breaches; any datapoint (SampleCount >= 1) does not
    assert args["TreatMissingData"] == "breaching"
    assert (args["Statistic"], args["ComparisonOperator"], args["Threshold"]) == (
        "SampleCount",
        "LessThanThreshold",
        1.0,
    )
    assert args["Period"] * args["EvaluationPeriods"] == rules.silence_window_seconds == 3600
    assert rules.silence_window_seconds > rules.idle_window_seconds


def test_the_silence_window_restarts_with_each_training_phase() -> None:
    # GIVEN a spot job that trained, was interrupted, and trains again since 10:00
    j = job(
        "ml.trn1.2xlarge",
        SecondaryStatusTransitions=[
            {"Status": "Training", "StartTime": "2026-01-01T08:00:00Z"},
            {"Status": "Interrupted", "StartTime": "2026-01-01T08:30:00Z"},
            {"Status": "Training", "StartTime": "2026-01-01T10:00:00Z"},
        ],
    )
    assert training_phase_start(j) == datetime(2026, 1, 1, 10, tzinfo=UTC)
    now = datetime(2026, 1, 1, 10, 30, tzinfo=UTC)
    assert {s.kind for s in idle_alarm_specs(j, IdleRules(), now=now)} == {AlarmKind.IDLE}


def test_training_phase_start_reads_epoch_milliseconds_of_real_events() -> None:
    assert training_phase_start(detail("training-state-change-training.json")) == datetime(
        2026, 11, 20, 9, 57, tzinfo=UTC
    )


def test_heterogeneous_hosts_are_numbered_across_groups_in_order() -> None:
    j = {
        "TrainingJobName": "het",
        "ResourceConfig": {
            "InstanceGroups": [
                {"InstanceGroupName": "a", "InstanceType": "ml.trn1.32xlarge", "InstanceCount": 2},
                {"InstanceGroupName": "b", "InstanceType": "ml.c5.xlarge", "InstanceCount": 1},
            ]
        },
    }
    assert hosts_of(j) == [
        ("het/algo-1", "ml.trn1.32xlarge"),
        ("het/algo-2", "ml.trn1.32xlarge"),
        ("het/algo-3", "ml.c5.xlarge"),
    ]
    signals = [s.signal for s in idle_alarm_specs(j, IdleRules())]
    assert signals == [IdleSignal.NEURON, IdleSignal.NEURON, IdleSignal.CPU]


def test_alarm_names_round_trip_and_foreign_names_are_refused() -> None:
    for kind in AlarmKind:
        name = alarm_name("my-job-2/algo-7", kind)
        ref = parse_alarm_name(name)
        assert ref is not None
        assert (ref.training_job_name, ref.host, ref.kind) == ("my-job-2", "my-job-2/algo-7", kind)
    assert parse_alarm_name("my-job-2GPUUtil") is None
    assert parse_alarm_name(f"{IDLE_ALARM_PREFIX}my-job/algo-x") is None


def test_a_jobs_prefix_does_not_cover_a_job_whose_name_extends_it() -> None:
    assert alarm_name("a-2/algo-1", AlarmKind.IDLE).startswith(alarm_prefix("a-2"))
    assert not alarm_name("a-2/algo-1", AlarmKind.IDLE).startswith(alarm_prefix("a"))


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"threshold_percent": 101}, "percentage"),
        ({"period_seconds": 90}, "multiple of 60"),
        ({"periods": 0}, "at least 1"),
        ({"period_seconds": 3000, "periods": 20}, "one-day"),
    ],
)
def test_idle_rules_refuse_what_cloudwatch_would(kwargs: dict[str, Any], problem: str) -> None:
    with pytest.raises(DomainError, match=problem):
        IdleRules(**kwargs)


def test_a_job_without_resource_config_is_refused_by_name() -> None:
    with pytest.raises(DomainError, match="training job x: ResourceConfig"):
        hosts_of({"TrainingJobName": "x"})


def test_a_teams_neuron_alarms_read_its_teams_namespace_and_another_namespace_is_another_definition() -> None:
    now = datetime(2026, 1, 2, tzinfo=UTC)
    # GIVEN a Trainium job of team vision, training long enough for its silence alarm too
    specs = idle_alarm_specs(job("ml.trn1.32xlarge"), IdleRules(), now=now, team="vision")
    assert {s.kind for s in specs} == {AlarmKind.IDLE, AlarmKind.SILENCE}
    for spec in specs:
        args = spec.put_metric_alarm_args([])
        namespaces = {
            q["MetricStat"]["Metric"]["Namespace"] for q in args.get("Metrics", []) if "MetricStat" in q
        }
        assert namespaces | ({args["Namespace"]} if "Namespace" in args else set()) == {
            "SageQueue/TrainingJobs/vision"
        }
        # THEN the same alarm on the default namespace, or another team's, is not governance's
        for other in (None, "speech"):
            (twin,) = [
                t
                for t in idle_alarm_specs(job("ml.trn1.32xlarge"), IdleRules(), now=now, team=other)
                if t.name == spec.name
            ]
            assert alarm_definition_difference(twin.put_metric_alarm_args([]), spec) in (
                "Namespace",
                "Metrics",
            )
    # AND SageMaker's own metrics stay in SageMaker's namespace, whatever the team
    (gpu,) = idle_alarm_specs(job("ml.g5.xlarge"), IdleRules(), team="vision")
    assert gpu.namespace == SAGEMAKER_METRIC_NAMESPACE


@pytest.mark.parametrize(
    ("named", "team"),
    [
        ("SageQueue/TrainingJobs/vision", "vision"),
        (" SageQueue/TrainingJobs/vision ", "vision"),  # the job image strips it
        ("SageQueue/TrainingJobs", None),
        ("SageQueue/TrainingJobs/nobody", None),  # a team neither the settings nor a quota know
        ("SageQueue/TrainingJobs/vision/x", None),
        ("SageQueue/TrainingJobsX/vision", None),
        ("AWS/SageMaker", None),
        (None, None),
    ],
)
def test_a_job_the_table_places_in_no_team_is_judged_in_the_known_team_namespace_its_environment_names(
    named: str | None, team: str | None
) -> None:
    environment = {} if named is None else {"SAGEQUEUE_METRIC_NAMESPACE": named}
    job = {"TrainingJobName": "j", "Environment": environment}
    assert published_team(job, lambda t: t == "vision") == team
