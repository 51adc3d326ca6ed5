"""Policy on event shapes, resume and spot decisions, clones, and what one state change calls for."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from sagequeue_core.defaults import SEAL_TAG
from sagequeue_core.domain import tags_to_dict
from sagequeue_core.governance import (
    CLONE_ATTEMPT_TAG,
    CLONE_OF_TAG,
    RESUMES_TAG,
    AlarmKind,
    DeleteAlarms,
    EnsureAlarms,
    GovernanceRules,
    IdleRules,
    Lineage,
    PolicyRules,
    RecoveryRules,
    ReplaceSpot,
    Resume,
    StopForPolicy,
    check_policy,
    clone_request,
    decide_resume,
    decide_spot,
    govern,
    lineage_of,
    owner_of,
    runtime_seconds,
    spot_interruptions,
)

EVENTS = Path(__file__).parent / "events"
SECRET = "0f" * 16  # a root's lineage secret, as governance keeps it in the table
NOW = datetime(2026, 11, 20, 10, 12, tzinfo=UTC)
RULES = PolicyRules(
    required_tags={"team": None, "project": r"[a-z-]+"},
    allowed_instance_types=frozenset({"ml.trn1.32xlarge", "ml.trn2.48xlarge"}),
    max_instances_per_job=4,
    max_runtime_seconds=172_800,
)


def detail(name: str) -> dict[str, Any]:
    return json.loads((EVENTS / name).read_text())["detail"]


def failed(reason: str, trained_seconds: float, **extra: Any) -> dict[str, Any]:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    return {
        "TrainingJobName": "run",
        "TrainingJobStatus": "Failed",
        "SecondaryStatus": "Failed",
        "FailureReason": reason,
        "ResourceConfig": {"InstanceType": "ml.trn1.32xlarge", "InstanceCount": 1},
        "CreationTime": int((start - timedelta(minutes=5)).timestamp() * 1000),
        "TrainingStartTime": int(start.timestamp() * 1000),
        "TrainingEndTime": int((start + timedelta(seconds=trained_seconds)).timestamp() * 1000),
        **extra,
    }


def spot_job(interruptions: int, status: str = "InProgress") -> dict[str, Any]:
    transitions: list[dict[str, Any]] = [{"Status": "Starting", "StartTime": 1}]
    for n in range(interruptions):
        transitions += [
            {"Status": "Training", "StartTime": 10 * n + 2},
            {"Status": "Interrupted", "StartTime": 10 * n + 3},
        ]
    return {
        "TrainingJobName": "spotty",
        "TrainingJobStatus": status,
        "SecondaryStatus": "Interrupted",
        "EnableManagedSpotTraining": True,
        "ResourceConfig": {"InstanceType": "ml.trn1.32xlarge", "InstanceCount": 1},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200},
        "SecondaryStatusTransitions": transitions,
    }


# --- policy on event shapes -----------------------------------------------------------------------------


def test_event_tags_as_a_dict_and_as_a_list_give_the_same_verdict() -> None:
    as_dict = detail("training-state-change-training.json")
    as_list = copy.deepcopy(as_dict)
    as_list["Tags"] = [{"Key": k, "Value": v} for k, v in as_dict["Tags"].items()]
    assert check_policy(as_dict, RULES) == check_policy(as_list, RULES) == []
    as_list["Tags"] = [t for t in as_list["Tags"] if t["Key"] != "team"]
    assert [v.rule for v in check_policy(as_list, RULES)] == ["required_tags"]


def test_the_adhoc_sample_breaks_each_rule_once_and_names_it() -> None:
    violations = check_policy(detail("training-state-change-starting-list-tags.json"), RULES)
    messages = {v.rule: v.message for v in violations}
    assert set(messages) == {"required_tags", "max_instances_per_job", "max_runtime_seconds"}
    assert "missing required tag 'team'" in [v.message for v in violations]
    assert "'Llama 3' does not match" in " ".join(v.message for v in violations)
    assert messages["max_instances_per_job"] == "8 instances requested; at most 4 per job"


def test_owner_is_the_submitter_then_an_owner_tag_then_the_role() -> None:
    training = detail("training-state-change-training.json")
    assert owner_of(training, tags_to_dict(training["Tags"])).endswith("assumed-role/ml/research-session")
    adhoc = detail("training-state-change-starting-list-tags.json")
    assert owner_of(adhoc, tags_to_dict(adhoc["Tags"])) == "vision-team"
    assert owner_of(adhoc, {}) == "arn:aws:iam::123456789012:role/SageMakerTraining"


# --- resume after failure ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reason",
    [
        "InternalServerError: We encountered an internal error. Please try again.",
        "CapacityError: Unable to provision requested ML compute capacity. Please retry using a different ML instance type.",
    ],
)
def test_a_transient_failure_after_the_minimum_runtime_is_resumed(reason: str) -> None:
    decision = decide_resume(failed(reason, 3600), RecoveryRules(), resumes_so_far=0)
    assert decision.resume
    assert decision.reason == f"resume 1 of 2 after {reason.split(':')[0]}"


def test_a_failure_of_the_jobs_own_making_is_not_resumed() -> None:
    decision = decide_resume(failed("AlgorithmError: ExecuteUserScriptError", 7200), RecoveryRules(), 0)
    assert not decision.resume
    assert "AlgorithmError" in decision.reason


def test_a_failure_before_the_minimum_runtime_is_not_resumed() -> None:
    rules = RecoveryRules(resume_after_failure_min_runtime_seconds=600)
    assert not decide_resume(failed("InternalServerError: x", 599), rules, 0).resume
    assert decide_resume(failed("InternalServerError: x", 600), rules, 0).resume


def test_runtime_counts_whole_seconds_across_days() -> None:
    # a naive timedelta.seconds would read 1 day + 10 s as 10 s
    assert runtime_seconds(failed("x", 86_410)) == 86_410


def test_a_capacity_failure_that_never_trained_counts_its_whole_life() -> None:
    job = failed("CapacityError: Unable to provision", 0)
    del job["TrainingStartTime"], job["TrainingEndTime"]
    job["LastModifiedTime"] = "2026-01-01T00:20:00Z"
    assert runtime_seconds(job) == 25 * 60
    assert decide_resume(job, RecoveryRules(), 0).resume


def test_resumes_stop_at_the_maximum() -> None:
    rules = RecoveryRules(max_resumes=2)
    job = failed("InternalServerError: x", 3600)
    assert decide_resume(job, rules, 1).resume
    decision = decide_resume(job, rules, 2)
    assert not decision.resume
    assert "already resumed 2 times (max 2)" in decision.reason
    assert not decide_resume(job, RecoveryRules(max_resumes=0), 0).resume


# --- spot -------------------------------------------------------------------------------------------------


def test_spot_is_abandoned_only_after_more_than_the_allowed_interruptions() -> None:
    rules = RecoveryRules(max_spot_interruptions=3)
    assert spot_interruptions(spot_job(4)) == 4
    assert not decide_spot(spot_job(3), rules).replace
    decision = decide_spot(spot_job(4), rules)
    assert decision.replace
    assert decision.interruptions == 4
    assert "more than 3" in decision.reason


def test_on_demand_and_ended_jobs_are_never_replaced() -> None:
    on_demand = spot_job(9) | {"EnableManagedSpotTraining": False}
    assert not decide_spot(on_demand, RecoveryRules()).replace
    assert not decide_spot(spot_job(9, status="Stopped"), RecoveryRules()).replace


# --- clones -----------------------------------------------------------------------------------------------


def test_a_clone_without_spot_keeps_checkpoints_and_drops_the_spot_wait() -> None:
    job = spot_job(4) | {
        "AlgorithmSpecification": {"TrainingImage": "img", "TrainingInputMode": "File"},
        "RoleArn": "arn:aws:iam::123456789012:role/r",
        "OutputDataConfig": {"S3OutputPath": "s3://b/o"},
        "CheckpointConfig": {"S3Uri": "s3://b/ckpt"},
        "TrainingJobArn": "arn:aws:sagemaker:us-east-1:123456789012:training-job/spotty",
        "ModelArtifacts": {"S3ModelArtifacts": "s3://b/o/model.tar.gz"},
    }
    tags = {
        "team": "nlp",
        "aws:cloudformation:stack-name": "x",
        "sagequeue:job": "q",
        "sagequeue:attempt": "1",
    }
    request = clone_request(
        job, lineage=lineage_of("spotty", tags), tags=tags, resumed=False, disable_spot=True
    )
    assert request["TrainingJobName"] == "spotty--2"
    assert request["EnableManagedSpotTraining"] is False
    assert request["StoppingCondition"] == {"MaxRuntimeInSeconds": 3600}
    assert request["CheckpointConfig"] == {"S3Uri": "s3://b/ckpt"}
    # read-only state of the old job is not sent
    assert not {"TrainingJobArn", "ModelArtifacts", "SecondaryStatusTransitions", "TrainingJobStatus"} & set(
        request
    )
    out = tags_to_dict(request["Tags"])
    assert out == {"team": "nlp", CLONE_OF_TAG: "spotty", CLONE_ATTEMPT_TAG: "2", RESUMES_TAG: "0"}
    # the original is left untouched
    assert job["StoppingCondition"]["MaxWaitTimeInSeconds"] == 7200


def test_lineage_counts_resumes_across_clones_and_names_them_from_the_root() -> None:
    first = lineage_of("run", {})
    assert first == Lineage(root="run", attempt=1, resumes=0)
    request = clone_request(
        failed("InternalServerError: x", 900), lineage=first, tags={}, resumed=True, secret=SECRET
    )
    second = lineage_of(request["TrainingJobName"], tags_to_dict(request["Tags"]), SECRET)
    assert second == Lineage(root="run", attempt=2, resumes=1)
    assert second.next_attempt_name == "run--3"


def test_clone_tags_count_only_with_a_seal_that_verifies_under_the_roots_secret() -> None:
    """GIVEN clone tags anyone allowed CreateTrainingJob or AddTags can write,
    WHEN they carry no seal, another root's seal, lowered counters, or a seal copied to another name,
    THEN the training job is its own root (an original), so it cannot take another job's clone names or
    reset the resumes its lineage used."""
    request = clone_request(
        failed("InternalServerError: x", 900),
        lineage=Lineage("run", 2, 1),
        tags={},
        resumed=True,
        secret=SECRET,
    )
    tags = tags_to_dict(request["Tags"])
    assert lineage_of("run--3", tags, SECRET) == Lineage("run", 3, 2)
    unsealed = {k: v for k, v in tags.items() if k != SEAL_TAG}
    assert lineage_of("run--3", unsealed, SECRET) == Lineage("run--3", 1, 0)
    assert lineage_of("run--3", tags, "another root's secret") == Lineage("run--3", 1, 0)
    assert lineage_of("run--3", tags) == Lineage("run--3", 1, 0)
    assert lineage_of("run--3", {**tags, RESUMES_TAG: "0"}, SECRET) == Lineage("run--3", 1, 0)
    assert lineage_of("run--4", tags, SECRET) == Lineage("run--4", 1, 0)
    assert lineage_of("run--3", {**tags, CLONE_ATTEMPT_TAG: "junk"}, SECRET) == Lineage("run--3", 1, 0)
    named = clone_request(
        failed("InternalServerError: x", 900),
        lineage=Lineage("run", 2, 1),
        tags={},
        resumed=True,
        name="run--3x0123456789ab",
        secret=SECRET,
    )
    assert named["TrainingJobName"] == "run--3x0123456789ab"
    assert lineage_of("run--3x0123456789ab", tags_to_dict(named["Tags"]), SECRET) == Lineage("run", 3, 2)


# --- govern: one state change -----------------------------------------------------------------------------

GOVERNANCE = GovernanceRules(policy=RULES, idle=IdleRules(), recovery=RecoveryRules())


def test_a_violating_job_is_stopped_at_its_first_in_progress_event() -> None:
    job = detail("training-state-change-starting-list-tags.json")
    actions = govern(job, tags_to_dict(job["Tags"]), GOVERNANCE, now=NOW)
    assert isinstance(actions[0], StopForPolicy)
    assert actions[0].reason.startswith("policy violation: missing required tag 'team'")
    assert actions[1:] == [DeleteAlarms("adhoc-run")]
    # a later phase of the same job is stopped too (its Starting event may have been lost)
    later = job | {"SecondaryStatus": "Training"}
    assert isinstance(govern(later, tags_to_dict(job["Tags"]), GOVERNANCE, now=NOW)[0], StopForPolicy)


def test_the_exempt_tag_spares_a_job_from_policy_and_idle_alarms() -> None:
    job = detail("training-state-change-starting-list-tags.json")
    tags = tags_to_dict(job["Tags"]) | {"sagequeue:exempt": "TRUE"}
    assert govern(job, tags, GOVERNANCE, now=NOW) == []
    assert govern(job | {"SecondaryStatus": "Training"}, tags, GOVERNANCE, now=NOW) == [
        DeleteAlarms("adhoc-run")
    ]


def test_a_compliant_job_gets_its_alarms_at_training() -> None:
    job = detail("training-state-change-training.json")
    (action,) = govern(job, tags_to_dict(job["Tags"]), GOVERNANCE, now=NOW)
    assert isinstance(action, EnsureAlarms)
    assert [s.name for s in action.specs] == [
        "sagequeue-idle-llama-sft/algo-1",
        "sagequeue-idle-llama-sft/algo-2",
    ]
    later = govern(job, tags_to_dict(job["Tags"]), GOVERNANCE, now=NOW + timedelta(hours=2))
    assert isinstance(later[0], EnsureAlarms)
    assert [s.kind for s in later[0].specs].count(AlarmKind.SILENCE) == 2


@pytest.mark.parametrize(
    ("status", "secondary"),
    [
        ("Completed", "Completed"),
        ("Stopped", "Stopped"),
        ("Stopping", "Stopping"),
        ("InProgress", "Interrupted"),
        ("InProgress", "Uploading"),
    ],
)
def test_alarms_go_when_a_job_ends_or_stops_working(status: str, secondary: str) -> None:
    job = detail("training-state-change-training.json") | {
        "TrainingJobStatus": status,
        "SecondaryStatus": secondary,
    }
    assert govern(job, tags_to_dict(job["Tags"]), GOVERNANCE, now=NOW) == [DeleteAlarms("llama-sft")]


def test_a_transient_failure_deletes_alarms_then_resumes_until_the_lineage_has_used_its_resumes() -> None:
    job = failed("InternalServerError: boom", 3600)
    actions = govern(job, {}, GOVERNANCE, now=NOW)
    assert actions == [DeleteAlarms("run"), Resume("resume 1 of 2 after InternalServerError")]
    exhausted = {RESUMES_TAG: "2", CLONE_OF_TAG: "run", CLONE_ATTEMPT_TAG: "3"}
    # unsealed clone tags count nothing: the job is an original with its resumes before it
    assert govern(job, exhausted, GOVERNANCE, now=NOW) == actions
    assert govern(job, {}, GOVERNANCE, now=NOW, resumes_so_far=2) == [DeleteAlarms("run")]


def test_a_spot_job_interrupted_too_often_is_replaced_and_its_alarms_go() -> None:
    tags = {"team": "nlp", "project": "spot"}
    actions = govern(spot_job(4), tags, GOVERNANCE, now=NOW)
    assert isinstance(actions[0], ReplaceSpot)
    assert actions[1] == DeleteAlarms("spotty")
    assert govern(spot_job(3), tags, GOVERNANCE, now=NOW) == [DeleteAlarms("spotty")]
    exempt = tags | {"sagequeue:exempt": "true"}
    assert govern(spot_job(4), exempt, GOVERNANCE, now=NOW) == [DeleteAlarms("spotty")]


def test_governing_the_same_event_twice_gives_the_same_actions() -> None:
    job = detail("training-state-change-training.json")
    tags = tags_to_dict(job["Tags"])
    assert govern(job, tags, GOVERNANCE, now=NOW) == govern(copy.deepcopy(job), tags, GOVERNANCE, now=NOW)


def test_settings_become_the_rules_including_the_silence_window() -> None:
    from sagequeue_core.config import Settings
    from sagequeue_core.service.govern import rules_from

    rules = rules_from(
        Settings.build(
            required_tags="team",
            idle_period_seconds="120",
            idle_periods="4",
            idle_silence_factor="3",
            max_resumes="5",
        )
    )
    assert rules.policy.required_tags == {"team": None}
    assert (rules.idle.idle_window_seconds, rules.idle.silence_window_seconds) == (480, 1440)
    assert rules.recovery.max_resumes == 5
