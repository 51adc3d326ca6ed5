"""Properties of the governance rules over generated jobs (hypothesis)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sagequeue_core.defaults import host_dimension_value
from sagequeue_core.governance import (
    AlarmKind,
    EnsureAlarms,
    GovernanceRules,
    IdleRules,
    PolicyRules,
    RecoveryRules,
    ReplaceSpot,
    Resume,
    StopForPolicy,
    alarm_name,
    alarm_prefix,
    check_policy,
    decide_resume,
    govern,
    parse_alarm_name,
)

NOW = datetime(2026, 6, 1, tzinfo=UTC)
names = st.from_regex(r"[a-zA-Z0-9](-?[a-zA-Z0-9]){0,40}", fullmatch=True)
statuses = st.sampled_from(["InProgress", "Completed", "Failed", "Stopping", "Stopped"])
secondaries = st.sampled_from(
    [
        "Starting",
        "Pending",
        "Downloading",
        "Training",
        "Interrupted",
        "Uploading",
        "Restarting",
        "Completed",
        "Failed",
        "Stopped",
    ]
)
instance_types = st.sampled_from(
    ["ml.trn1.32xlarge", "ml.trn2.48xlarge", "ml.p5.48xlarge", "ml.g5.xlarge", "ml.m5.xlarge"]
)


@st.composite
def jobs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, str]]:
    started = NOW - timedelta(seconds=draw(st.integers(0, 3 * 86_400)))
    interruptions = draw(st.integers(0, 6))
    transitions = [{"Status": "Training", "StartTime": started.isoformat()}]
    transitions += [{"Status": "Interrupted", "StartTime": started.isoformat()}] * interruptions
    job = {
        "TrainingJobName": draw(names),
        "TrainingJobStatus": draw(statuses),
        "SecondaryStatus": draw(secondaries),
        "FailureReason": draw(
            st.sampled_from(["InternalServerError: x", "CapacityError: y", "AlgorithmError: z", None])
        ),
        "ResourceConfig": {"InstanceType": draw(instance_types), "InstanceCount": draw(st.integers(1, 16))},
        "StoppingCondition": {"MaxRuntimeInSeconds": draw(st.integers(60, 2_419_200))},
        "EnableManagedSpotTraining": draw(st.booleans()),
        "CreationTime": (started - timedelta(minutes=5)).isoformat(),
        "TrainingStartTime": started.isoformat(),
        "TrainingEndTime": (started + timedelta(seconds=draw(st.integers(0, 86_400)))).isoformat(),
        "SecondaryStatusTransitions": transitions,
    }
    tags = draw(
        st.dictionaries(
            st.sampled_from(["team", "project", "owner", "sagequeue:exempt", "sagequeue:resumes"]),
            st.sampled_from(["", "nlp", "true", "TRUE", "1", "2", "x y"]),
        )
    )
    return job, tags


RULES = GovernanceRules(
    policy=PolicyRules(
        required_tags={"team": None},
        allowed_instance_types=frozenset({"ml.trn1.32xlarge", "ml.trn2.48xlarge"}),
        max_instances_per_job=8,
        max_runtime_seconds=86_400,
    ),
    idle=IdleRules(period_seconds=60, periods=5),
    recovery=RecoveryRules(max_resumes=2, max_spot_interruptions=3),
)


@given(names, st.integers(1, 128), st.sampled_from(list(AlarmKind)))
def test_alarm_names_round_trip_and_stay_under_their_jobs_prefix(
    job: str, host: int, kind: AlarmKind
) -> None:
    name = alarm_name(host_dimension_value(job, host), kind)
    ref = parse_alarm_name(name)
    assert ref is not None
    assert (ref.training_job_name, ref.kind) == (job, kind)
    assert name.startswith(alarm_prefix(job))
    assert len(name) <= 255  # CloudWatch's limit on alarm names


@settings(max_examples=100)
@given(jobs())
def test_exempt_jobs_are_never_stopped_nor_watched(drawn: tuple[dict[str, Any], dict[str, str]]) -> None:
    job, tags = drawn
    tags = tags | {"sagequeue:exempt": "true"}
    actions = govern(job, tags, RULES, now=NOW)
    assert not any(isinstance(a, StopForPolicy | ReplaceSpot | EnsureAlarms) for a in actions)


@settings(max_examples=100)
@given(jobs())
def test_a_policy_stop_happens_exactly_for_in_progress_jobs_that_break_a_rule(
    drawn: tuple[dict[str, Any], dict[str, str]],
) -> None:
    job, tags = drawn
    actions = govern(job, tags, RULES, now=NOW)
    breaks = bool(check_policy(job, RULES.policy, tags))
    stopped = any(isinstance(a, StopForPolicy) for a in actions)
    assert stopped == (job["TrainingJobStatus"] == "InProgress" and breaks)
    if stopped:
        assert not any(isinstance(a, EnsureAlarms | Resume) for a in actions)


@settings(max_examples=100)
@given(jobs())
def test_alarms_are_only_made_for_jobs_in_training_and_resumes_only_follow_failures(
    drawn: tuple[dict[str, Any], dict[str, str]],
) -> None:
    job, tags = drawn
    actions = govern(job, tags, RULES, now=NOW)
    for action in actions:
        if isinstance(action, EnsureAlarms):
            assert (job["TrainingJobStatus"], job["SecondaryStatus"]) == ("InProgress", "Training")
            assert len(action.specs) in (
                job["ResourceConfig"]["InstanceCount"],
                2 * job["ResourceConfig"]["InstanceCount"],
            )
        if isinstance(action, Resume):
            assert job["TrainingJobStatus"] == "Failed"


@given(jobs(), st.integers(0, 10), st.integers(0, 10))
def test_resumes_never_exceed_the_maximum(
    drawn: tuple[dict[str, Any], dict[str, str]], used: int, maximum: int
) -> None:
    job, _ = drawn
    decision = decide_resume(job, RecoveryRules(max_resumes=maximum), used)
    if used >= maximum:
        assert not decision.resume
