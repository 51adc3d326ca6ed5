"""The queue's vocabulary: names, priorities, tags, demand, warm-pool keys and the state machine."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sagequeue_core.defaults import (
    JOB_TAG,
    SEAL_TAG,
    TRAINING_JOB_NAME_PATTERN,
    host_dimension_value,
    instance_family,
)
from sagequeue_core.domain import (
    LIVE_STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    DomainError,
    InvalidTransition,
    Job,
    JobState,
    ResourceKey,
    StopReason,
    attempt_name,
    demand_of,
    is_attempt_name,
    parse_priority,
    priority_of,
    tags_to_dict,
    validate_job_name,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)

REQUEST = {
    "TrainingJobName": "llama-ft",
    "RoleArn": "arn:aws:iam::123456789012:role/train",
    "AlgorithmSpecification": {"TrainingImage": "img", "TrainingInputMode": "File"},
    "ResourceConfig": {"InstanceType": "ml.trn1.32xlarge", "InstanceCount": 2, "VolumeSizeInGB": 512},
    "OutputDataConfig": {"S3OutputPath": "s3://bucket/out"},
    "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    "Tags": [{"Key": "priority", "Value": "7"}, {"Key": "team", "Value": "nlp"}],
}

names = st.from_regex(TRAINING_JOB_NAME_PATTERN, fullmatch=True)


@given(names, st.integers(1, 10_000))
def test_attempt_names_are_valid_deterministic_and_distinct(name: str, attempt: int) -> None:
    first = attempt_name(name, attempt)
    assert first == attempt_name(name, attempt)
    assert re.fullmatch(TRAINING_JOB_NAME_PATTERN, first), first
    if attempt > 1:
        assert first != attempt_name(name, attempt - 1)


def test_first_attempt_keeps_the_users_name_and_long_names_are_shortened_uniquely() -> None:
    assert attempt_name("job", 1) == "job"
    assert attempt_name("job", 2) == "job--2"
    long_a, long_b = "a" * 62 + "b", "a" * 62 + "c"
    assert len(attempt_name(long_a, 12)) <= 63
    assert attempt_name(long_a, 12) != attempt_name(long_b, 12)
    with pytest.raises(ValueError, match="count from 1"):
        attempt_name("job", 0)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "required"),
        ("-lead", "must match"),
        ("a" * 64, "64 characters"),
        ("under_score", "must match"),
        (7, "required"),
    ],
)
def test_bad_job_names_are_named_in_the_error(name: object, message: str) -> None:
    with pytest.raises(DomainError, match=message):
        validate_job_name(name)


@pytest.mark.parametrize(("value", "expected"), [(3, 3), ("12", 12), (" 5 ", 5), (0, 0), (1000, 1000)])
def test_priorities_accept_integers_and_integer_strings(value: object, expected: int) -> None:
    assert parse_priority(value) == expected


@pytest.mark.parametrize("value", [True, 1.5, "high", "", -1, 1001, None, "3.0"])
def test_bad_priorities_are_refused(value: object) -> None:
    with pytest.raises(DomainError, match="priority"):
        parse_priority(value)


def test_priority_comes_from_argument_then_tag_then_default() -> None:
    assert priority_of(REQUEST, explicit=9) == 9
    assert priority_of(REQUEST) == 7
    assert priority_of({**REQUEST, "Tags": []}) == 0
    with pytest.raises(DomainError, match="tag 'priority'"):
        priority_of({**REQUEST, "Tags": [{"Key": "priority", "Value": "urgent"}]})


def test_tags_in_both_shapes() -> None:
    assert tags_to_dict([{"Key": "a", "Value": "1"}]) == {"a": "1"}
    assert tags_to_dict({"a": "1", "b": None}) == {"a": "1", "b": ""}
    assert tags_to_dict(None) == {}
    with pytest.raises(DomainError, match="Key and Value"):
        tags_to_dict([{"Value": "x"}])
    with pytest.raises(DomainError, match="Tags must be"):
        tags_to_dict("a=1")


def test_demand_counts_instances_per_pool() -> None:
    assert demand_of(REQUEST) == {"ml.trn1.32xlarge": 2}
    groups = {
        "ResourceConfig": {
            "InstanceGroups": [
                {"InstanceType": "ml.trn1.32xlarge", "InstanceCount": 2, "InstanceGroupName": "a"},
                {"InstanceType": "ml.c5.xlarge", "InstanceCount": 1, "InstanceGroupName": "b"},
                {"InstanceType": "ml.trn1.32xlarge", "InstanceCount": 1, "InstanceGroupName": "c"},
            ]
        }
    }
    assert demand_of(groups) == {"ml.trn1.32xlarge": 3, "ml.c5.xlarge": 1}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (None, "ResourceConfig is required"),
        ({"InstanceType": "trn1", "InstanceCount": 1}, "InstanceType"),
        ({"InstanceType": "ml.trn1.32xlarge", "InstanceCount": 0}, "InstanceCount"),
        ({"InstanceType": "ml.trn1.32xlarge", "InstanceCount": True}, "InstanceCount"),
        ({"InstanceGroups": [{"InstanceType": "ml.trn1.32xlarge"}]}, r"InstanceGroups\[0\].InstanceCount"),
    ],
)
def test_bad_resource_configs_are_named(config: object, message: str) -> None:
    with pytest.raises(DomainError, match=message):
        demand_of({"ResourceConfig": config} if config is not None else {})


def test_resource_key_ignores_what_sagemaker_ignores_and_sees_what_it_matches() -> None:
    key = ResourceKey.from_request(REQUEST)
    assert key is not None
    other_image = {**REQUEST, "AlgorithmSpecification": {"TrainingImage": "other"}, "Tags": []}
    assert ResourceKey.from_request(other_image) == key
    vpc_a = {**REQUEST, "VpcConfig": {"Subnets": ["s-1", "s-2"], "SecurityGroupIds": ["sg-1"]}}
    vpc_b = {**REQUEST, "VpcConfig": {"Subnets": ["s-2", "s-1"], "SecurityGroupIds": ["sg-1"]}}
    assert ResourceKey.from_request(vpc_a) == ResourceKey.from_request(vpc_b) != key
    assert ResourceKey.from_request({**REQUEST, "EnableNetworkIsolation": True}) != key
    assert ResourceKey.from_request({**REQUEST, "EnableManagedSpotTraining": True}) is None
    assert ResourceKey.from_dict(key.to_dict()) == key


def test_every_state_has_its_moves_and_terminal_states_have_none() -> None:
    assert set(TRANSITIONS) == set(JobState)
    for state in TERMINAL_STATES:
        assert TRANSITIONS[state] == frozenset()
    for state in LIVE_STATES:
        assert TRANSITIONS[state], state
    assert {reason.final_state for reason in StopReason} == {
        JobState.QUEUED,
        JobState.CANCELLED,
        JobState.IDLE_STOPPED,
        JobState.FAILED,
    }


def test_job_transitions_record_history_and_refuse_impossible_moves() -> None:
    job = Job(name="llama-ft", request=REQUEST, priority=7, owner="arn:aws:iam::1:user/a", submitted_at=NOW)
    job.transition(JobState.STARTING, NOW)
    job.transition(JobState.RUNNING, NOW)
    job.transition(JobState.COMPLETED, NOW, reason="done")
    assert job.ended_at == NOW
    assert [h["state"] for h in job.history] == ["starting", "running", "completed"]
    with pytest.raises(InvalidTransition, match="a completed job cannot become queued"):
        job.transition(JobState.QUEUED, NOW)
    api = job.to_api()
    assert (api["state"], api["pool"], api["instances"]) == ("completed", "ml.trn1.32xlarge", 2)


def test_host_dimension_and_instance_family() -> None:
    assert host_dimension_value("job", 2) == "job/algo-2"
    assert instance_family("ml.trn2.48xlarge") == "trn2"
    with pytest.raises(ValueError, match="counts from 1"):
        host_dimension_value("job", 0)
    with pytest.raises(ValueError, match="not a SageMaker instance type"):
        instance_family("trn1.32xlarge")


def test_an_ended_attempt_is_counted_once_whatever_arrives_twice() -> None:
    job = Job(name="llama-ft", request=REQUEST, priority=7, owner="arn:aws:iam::1:user/a", submitted_at=NOW)
    job.attempt = 1
    assert job.count_ended_attempt(600.4)
    # the same attempt's end again (a duplicated or late event): nothing changes
    assert not job.count_ended_attempt(600.4)
    job.attempt = 3  # attempt 2 never ran (its create failed); attempt 3 ended without training
    assert job.count_ended_attempt(None)
    assert (job.attempts_ended, job.seconds_trained, job.counted_attempt) == (2, 600, 3)
    api = job.to_api()
    assert (api["attempts_ended"], api["seconds_trained"]) == (2, 600)


def test_a_loan_taken_back_counts_apart_from_preemptions() -> None:
    job = Job(name="llama-ft", request=REQUEST, priority=3, owner="arn:aws:iam::1:user/a", submitted_at=NOW)
    for reason in (StopReason.TAKEN_BACK, StopReason.PREEMPTED, StopReason.TAKEN_BACK):
        job.stop_reason = reason
        job.count_requeue()
    assert (job.loans_taken_back, job.preemptions) == (2, 1)
    assert job.to_api()["loans_taken_back"] == 2
    # both requeue; cancel, idle and policy stops do not
    assert {r for r in StopReason if r.requeues} == {StopReason.PREEMPTED, StopReason.TAKEN_BACK}
    assert StopReason.TAKEN_BACK.final_state is JobState.QUEUED


def test_a_starting_job_holds_its_attempts_name_only_with_its_seal() -> None:
    job = Job(name="llama-ft", request=REQUEST, priority=3, owner="arn:aws:iam::1:user/a", submitted_at=NOW)
    job.attempt_secret = "00" * 16
    job.attempt, job.training_job_name = 1, "llama-ft"
    job.transition(JobState.STARTING, NOW)
    sealed = {JOB_TAG: "llama-ft", SEAL_TAG: str(job.seal("llama-ft"))}
    forged = {JOB_TAG: "llama-ft", SEAL_TAG: str(job.seal("llama-ft--2"))}
    # between its intent and its create, the name the table records may be a stranger's training job
    assert job.holds("llama-ft", sealed)
    assert job.started("llama-ft", sealed)
    assert not job.holds("llama-ft", forged)
    assert not job.started("llama-ft", forged)
    assert not job.holds("llama-ft", {JOB_TAG: "llama-ft"})
    assert not job.started("llama-ft", {})
    assert not job.holds("other", sealed)
    # once created (running, stopping), and for a job entered before seals, the table's record is enough
    job.transition(JobState.RUNNING, NOW)
    assert job.holds("llama-ft", {})
    job.state, job.attempt_secret = JobState.STARTING, None
    assert job.holds("llama-ft", {})


@given(names, st.integers(1, 10_000), st.text("0123456789abcdef", min_size=12, max_size=12))
def test_fallback_attempt_names_are_valid_and_recognised_only_for_their_attempt(
    name: str, attempt: int, token: str
) -> None:
    fallback = attempt_name(name, attempt, token)
    assert re.fullmatch(TRAINING_JOB_NAME_PATTERN, fallback), fallback
    assert len(fallback) <= 63
    assert fallback != attempt_name(name, attempt)
    assert is_attempt_name(fallback, name, attempt)
    assert is_attempt_name(attempt_name(name, attempt), name, attempt)
    assert not is_attempt_name(fallback, name, attempt + 1)
    with pytest.raises(ValueError, match="lowercase hex"):
        attempt_name(name, attempt, "guessable")
