"""One tenant cannot take another's quota, stop another's job, act as another's role or block another's
attempts (#27), on the local stack end to end.

GIVEN sagequeue's whole stack with two teams (`user` is vision, `other` is speech, both IAM users mapped by
TeamRoles) and a user no team claims (`loner`),
WHEN a tenant acts as a hostile one would (a team tag of another team, forged utilization datapoints or an
overwritten idle alarm, another team's execution role, training jobs created under another job's attempt
names, another account's training plan, a priority above its ceiling),
THEN the attack fails, and the legitimate path next to it still works.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sagequeue.client import ApiError, QueueClient
from sagequeue.local import LocalStack
from sagequeue.local.identities import user_identity

POOL = "ml.trn1.32xlarge"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/neuron-train:2.21"
FAST = {"provisioning_seconds": 60, "download_seconds": 10, "upload_seconds": 10, "stop_grace_seconds": 30}
TEAMS = {"user": "vision", "other": "speech"}


def unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:6]}"


def request(stack: LocalStack, name: str, seconds: int, *, outcome: str | None = None, **extra: Any) -> Any:
    environment = {"SAGEQUEUE_SIM_DURATION": str(seconds)}
    if outcome:
        environment["SAGEQUEUE_SIM_OUTCOME"] = outcome
    return {
        "TrainingJobName": name,
        "RoleArn": stack.training_role_arn,
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": "s3://sagequeue-e2e/output"},
        "ResourceConfig": {"InstanceType": POOL, "InstanceCount": 1, "VolumeSizeInGB": 64},
        "StoppingCondition": {"MaxRuntimeInSeconds": 7200},
        "Environment": environment,
        **extra,
    }


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    running = LocalStack(
        settings={
            "capacity": {POOL: 2},
            "min_runtime_before_preemption_seconds": 0,
            "idle_periods": 3,
            "idle_period_seconds": 300,
        },
        emulator=FAST,
        function_logs=False,
        teams=TEAMS,
    )
    running.identities.add(user_identity(running.account_id, "loner"))
    running.start()
    yield running
    running.stop()


def states(queue: QueueClient) -> dict[str, str]:
    return {job.name: job.state for job in queue.jobs()}


def until(stack: LocalStack, done: Any, limit: int, step: int = 30) -> None:
    waited = 0
    while not done():
        assert waited < limit, f"not done after {limit} s"
        stack.advance(step)
        waited += step


def cancel_all(stack: LocalStack) -> None:
    """Leave the shared stack's pool empty for the next test."""
    admin = stack.client("admin")
    for job in admin.jobs():
        if not job.terminal:
            admin.cancel(job.name)
    until(stack, lambda: all(job.terminal for job in admin.jobs()), limit=900)


def tagged(team: str) -> list[dict[str, str]]:
    return [{"Key": "team", "Value": team}]


# --- 1. a job's team is its submitter's, never a tag's --------------------------------------------------------


def test_1_a_team_tag_of_another_team_is_refused_and_the_mapped_team_is_kept(stack: LocalStack) -> None:
    vision, speech, loner = stack.client("user"), stack.client("other"), stack.client("loner")
    # WHEN a speech user tags a job with vision's team
    with pytest.raises(ApiError) as refused:
        speech.submit(request(stack, unique("steal"), 60, Tags=tagged("vision")), priority=0)
    # THEN it is refused, naming the team the caller really is
    assert refused.value.status == 403
    assert "'speech'" in str(refused.value)
    assert "'vision'" in str(refused.value)
    # AND a user mapped to no team may not claim one either (an IAM user is not every IAM user's team)
    with pytest.raises(ApiError) as unmapped:
        loner.submit(request(stack, unique("claim"), 60, Tags=tagged("speech")))
    assert unmapped.value.status == 403
    assert "mapped to no team" in str(unmapped.value)
    # AND the legitimate paths: the mapped team, with its own tag or without one; no team for the loner
    own = unique("own")
    vision.submit(request(stack, own, 3600, Tags=tagged("vision")), priority=1)
    untagged, nobody = unique("untagged"), unique("nobody")
    speech.submit(request(stack, untagged, 60))
    loner.submit(request(stack, nobody, 60))
    assert vision.job(own).raw["team"] == "vision"
    assert speech.job(untagged).raw["team"] == "speech"
    assert loner.job(nobody).raw["team"] is None
    # AND an admin may submit for a team
    admin = stack.client("admin")
    for_speech = unique("for-speech")
    admin.submit(request(stack, for_speech, 60, Tags=tagged("speech")))
    assert admin.job(for_speech).raw["team"] == "speech"
    # WHEN the vision job runs and someone retags it on SageMaker
    until(stack, lambda: states(vision)[own] == "running", limit=600)
    arn = stack.sagemaker.describe_training_job(TrainingJobName=own)["TrainingJobArn"]
    stack.sagemaker.add_tags(ResourceArn=arn, Tags=tagged("speech"))
    stack.advance(120)
    # THEN its team is unchanged
    assert vision.job(own).raw["team"] == "vision"
    cancel_all(stack)
