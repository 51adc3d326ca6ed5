"""Governance on the local stack: the template's rules, schedules and alarm topic route SageMaker's events
and the idle alarms (evaluated each simulated minute) to the very handlers Lambda runs.

GIVEN a stack requiring the tag `team`, idle alarms of 5 one-minute periods (silence after 10), at most 2
resumes and 2 spot interruptions, on a virtual clock,
WHEN jobs are started directly on the SageMaker emulator or submitted to the queue,
THEN rule breakers are stopped at their first event, idle jobs after the window, busy jobs never; alarms
are gone when jobs end; transient failures are resumed up to the limit; spot jobs interrupted too often
continue on demand; duplicated events change nothing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sagequeue.local import LocalStack
from sagequeue_core.domain import tags_to_dict

TRN1 = "ml.trn1.32xlarge"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/sagequeue-job:2.21"
IDLE_WINDOW = 5 * 60
SILENCE_WINDOW = 2 * IDLE_WINDOW


@pytest.fixture(scope="module")
def stack() -> Iterator[Any]:
    settings = {
        "capacity": {TRN1: 16},
        "required_tags": "team",
        "idle_period_seconds": 60,
        "idle_periods": 5,
        "max_resumes": 2,
        "resume_after_failure_min_runtime_seconds": 600,
        "max_spot_interruptions": 2,
    }
    # the region launches what the pool holds and a few of the instance type the rules refuse
    with LocalStack(settings=settings, emulator={"capacity": {TRN1: 16, "ml.c5.xlarge": 4}}) as running:
        yield running


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def request(
    stack: Any,
    name: str,
    *,
    env: dict[str, str] | None = None,
    tags: dict[str, str] | None = None,
    hosts: int = 1,
    **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "TrainingJobName": name,
        "RoleArn": stack.training_role_arn,
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": "s3://sagequeue-e2e/output"},
        "ResourceConfig": {"InstanceType": TRN1, "InstanceCount": hosts, "VolumeSizeInGB": 64},
        "CheckpointConfig": {"S3Uri": f"s3://sagequeue-e2e/checkpoints/{name}"},
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
        "Environment": {"SAGEQUEUE_SIM_DURATION": "1800", **(env or {})},
        "Tags": [{"Key": k, "Value": v} for k, v in (tags if tags is not None else {"team": "nlp"}).items()],
    }
    body.update(extra)
    return body


def status(stack: Any, name: str) -> tuple[str, str]:
    job = stack.sagemaker.describe_training_job(TrainingJobName=name)
    return job["TrainingJobStatus"], job["SecondaryStatus"]


def alarms(stack: Any, name: str) -> list[str]:
    cloudwatch = stack.aws_client("cloudwatch")
    pages = cloudwatch.get_paginator("describe_alarms").paginate(AlarmNamePrefix=f"sagequeue-idle-{name}/")
    return sorted(a["AlarmName"] for page in pages for a in page["MetricAlarms"])


def lineage(stack: Any, root: str) -> list[str]:
    pages = stack.sagemaker.get_paginator("list_training_jobs").paginate(NameContains=root)
    return sorted(s["TrainingJobName"] for page in pages for s in page["TrainingJobSummaries"])


def advance_until(stack: Any, done: Callable[[], bool], *, step: float = 60, limit: float = 7200) -> float:
    """Advance until `done()`; returns the simulated seconds it took."""
    stack.run_until_idle()
    waited = 0.0
    while not done():
        if waited >= limit:
            raise AssertionError(f"condition not reached after {limit:g} simulated seconds")
        stack.advance(step)
        waited += step
    return waited


def replay(stack: Any, name: str) -> None:
    """Send the job's current state again as SageMaker would on a duplicated delivery."""
    detail = stack.sagemaker.describe_training_job(TrainingJobName=name)
    detail.pop("ResponseMetadata", None)
    tags = stack.sagemaker.list_tags(ResourceArn=detail["TrainingJobArn"])["Tags"]
    detail["Tags"] = tags_to_dict(tags)
    stack.aws_client("events").put_events(
        Entries=[
            {
                "Source": "aws.sagemaker",
                "DetailType": "SageMaker Training Job State Change",
                "Resources": [detail["TrainingJobArn"]],
                "Detail": json.dumps(detail, default=str),
            }
        ]
    )
    stack.run_until_idle()


def test_a_job_started_without_the_required_tag_is_stopped_within_one_event(stack: Any) -> None:
    name = unique("untagged")
    stack.sagemaker.create_training_job(**request(stack, name, tags={"project": "llama"}))
    assert status(stack, name) == ("InProgress", "Starting")

    stack.advance(10)  # the Starting event, which EventBridge delivers within seconds, and nothing else

    assert status(stack, name)[0] == "Stopping"
    stack.advance(120)
    assert status(stack, name) == ("Stopped", "Stopped")
    assert alarms(stack, name) == []


def test_a_job_at_zero_neuroncore_utilization_is_stopped_after_the_window_and_shows_idle_stopped(
    stack: Any,
) -> None:
    queue = stack.client()
    name = unique("stalled")
    queue.submit(request(stack, name, env={"SAGEQUEUE_SIM_OUTCOME": "Idle"}, hosts=2))
    advance_until(stack, lambda: status(stack, name) == ("InProgress", "Training"), step=10)
    stack.advance(10)  # the Training event arrives seconds after the change, as EventBridge delivers it
    assert alarms(stack, name) == [f"sagequeue-idle-{name}/algo-1", f"sagequeue-idle-{name}/algo-2"]

    # not before the idle window has passed
    stack.advance(IDLE_WINDOW - 60)
    assert status(stack, name) == ("InProgress", "Training")

    took = advance_until(stack, lambda: status(stack, name)[0] != "InProgress", limit=3 * 60)
    assert took <= 3 * 60
    advance_until(stack, lambda: queue.job(name).state == "idle_stopped", limit=300)

    job = queue.job(name)
    assert job.reason is not None
    assert "NeuronCoreUtilization" in job.reason
    assert "at or below 5%" in job.reason
    assert any(
        entry.state == "stopping" and "Threshold Crossed" in (entry.reason or "") for entry in job.history
    )
    assert status(stack, name) == ("Stopped", "Stopped")
    assert alarms(stack, name) == []


def test_a_busy_job_is_never_stopped_and_its_alarms_are_gone_when_it_ends(stack: Any) -> None:
    name = unique("busy")
    stack.sagemaker.create_training_job(
        **request(stack, name, env={"SAGEQUEUE_SIM_DURATION": str(SILENCE_WINDOW + 10 * 60)})
    )
    advance_until(stack, lambda: status(stack, name) == ("InProgress", "Training"), step=10)
    # long enough for the reconcile timer to add the silence alarm, which must stay quiet too
    stack.advance(SILENCE_WINDOW + 6 * 60)
    assert status(stack, name) == ("InProgress", "Training")
    assert alarms(stack, name) == [f"sagequeue-idle-{name}/algo-1", f"sagequeue-idle-{name}/algo-1/no-data"]
    states = stack.aws_client("cloudwatch").describe_alarms(AlarmNamePrefix=f"sagequeue-idle-{name}/")[
        "MetricAlarms"
    ]
    assert {a["StateValue"] for a in states} <= {"OK", "INSUFFICIENT_DATA"}

    advance_until(stack, lambda: status(stack, name)[0] != "InProgress", limit=4 * SILENCE_WINDOW)
    assert status(stack, name) == ("Completed", "Completed")
    stack.run_until_idle()
    assert alarms(stack, name) == []


def test_a_spot_job_interrupted_too_often_is_cloned_without_spot(stack: Any) -> None:
    name = unique("spotty")
    stack.sagemaker.create_training_job(
        **request(
            stack,
            name,
            env={"SAGEQUEUE_SIM_DURATION": "1200", "SAGEQUEUE_SIM_OUTCOME": "Interrupted:6"},
            EnableManagedSpotTraining=True,
            StoppingCondition={"MaxRuntimeInSeconds": 86400, "MaxWaitTimeInSeconds": 172800},
        )
    )
    advance_until(stack, lambda: len(lineage(stack, name)) == 2, limit=7200)
    clone = f"{name}--2"
    original = stack.sagemaker.describe_training_job(TrainingJobName=name)
    assert [t["Status"] for t in original["SecondaryStatusTransitions"]].count("Interrupted") == 3
    assert original["TrainingJobStatus"] in ("Stopping", "Stopped")
    described = stack.sagemaker.describe_training_job(TrainingJobName=clone)
    assert described["EnableManagedSpotTraining"] is False
    assert "MaxWaitTimeInSeconds" not in described["StoppingCondition"]
    replay(stack, name)
    assert lineage(stack, name) == [name, clone]
    stack.sagemaker.stop_training_job(TrainingJobName=clone)


def test_duplicated_events_create_no_duplicate_alarms(stack: Any) -> None:
    name = unique("twice")
    stack.sagemaker.create_training_job(**request(stack, name, hosts=3))
    advance_until(stack, lambda: status(stack, name) == ("InProgress", "Training"), step=10)
    stack.advance(10)  # the Training event arrives seconds after the change
    before = alarms(stack, name)
    replay(stack, name)
    replay(stack, name)
    assert alarms(stack, name) == before
    assert len(before) == 3
    stack.sagemaker.stop_training_job(TrainingJobName=name)
    stack.advance(120 + 20 + 10)  # SageMaker's 120 s grace, the upload, then the Stopped event's delivery
    assert alarms(stack, name) == []


def test_a_job_whose_metrics_never_arrive_is_stopped_after_the_longer_silence_window(stack: Any) -> None:
    # GIVEN a CPU job: its idle signal is SageMaker's CPUUtilization, which the emulator never publishes,
    # just as a dead publisher or a Trainium job without the sagequeue image would send nothing
    name = unique("silent")
    body = request(stack, name)
    body["ResourceConfig"]["InstanceType"] = "ml.c5.xlarge"
    stack.sagemaker.create_training_job(**body)
    advance_until(stack, lambda: status(stack, name) == ("InProgress", "Training"), step=10)
    stack.advance(10)  # the Training event arrives seconds after the change, as EventBridge delivers it
    assert alarms(stack, name) == [f"sagequeue-idle-{name}/algo-1"]

    # THEN missing data never trips the idle alarm: the job outlives the idle window twice over
    stack.advance(2 * IDLE_WINDOW - 60)
    assert status(stack, name) == ("InProgress", "Training")

    # AND the silence alarm, added by the reconcile timer once due, stops it soon after its window
    took = advance_until(stack, lambda: status(stack, name)[0] != "InProgress", limit=15 * 60)
    assert 2 * IDLE_WINDOW - 60 + took <= SILENCE_WINDOW + 10 * 60
    stack.advance(120 + 20 + 10)  # SageMaker's 120 s grace, the upload, then the Stopped event's delivery
    assert status(stack, name) == ("Stopped", "Stopped")
    assert alarms(stack, name) == []
