"""Nobody can stall, stop, exempt or break another user's work (#15), on the local stack end to end.

GIVEN sagequeue's whole stack (the very handlers Lambda runs, moto, the SageMaker emulator, signed HTTP),
WHEN a user of the same account acts as a hostile one would (bodies SageMaker refuses, forged alarm
messages and SageMaker events, a self-granted exemption, a name that an attempt would take),
THEN each case has the fixed outcome: refused with a 4xx naming the problem, or ignored, and every other
user's job goes on.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from sagequeue.client import ApiError, QueueClient
from sagequeue.local import LocalStack
from sagequeue_core.domain import attempt_name

POOL = "ml.trn1.32xlarge"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/neuron-train:2.21"
FAST = {"provisioning_seconds": 60, "download_seconds": 10, "upload_seconds": 10}


def unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:6]}"


def request(stack: LocalStack, name: str, seconds: int, *, outcome: str | None = None) -> dict[str, Any]:
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
    }


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    running = LocalStack(
        settings={"capacity": {POOL: 2}, "min_runtime_before_preemption_seconds": 0, "idle_periods": 3},
        # the region launches the pool and the training job test 5 creates outside the queue
        emulator={**FAST, "capacity": {POOL: 3}},
        function_logs=False,
    ).start()
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


def cancel_all(stack: LocalStack, queue: QueueClient) -> None:
    """Leave the shared stack's pool empty for the next test."""
    for job in queue.jobs():
        if not job.terminal:
            queue.cancel(job.name)
    until(stack, lambda: all(job.terminal for job in queue.jobs()), limit=600)


# --- 1. a submission SageMaker would refuse cannot stall the scheduler ------------------------------------


@pytest.mark.parametrize(
    ("spoil", "named"),
    [
        ({"HyperParameters": {"epochs": 3}}, "HyperParameters.epochs"),
        ({"NotAMember": 1}, "NotAMember"),
        ({"StoppingCondition": {"MaxRuntimeInSeconds": 7200.5}}, "MaxRuntimeInSeconds"),
        ({"Tags": [{"Key": ["team"], "Value": "x"}]}, "Tags[0].Key"),
        ({"TrainingJobName": "trailing\n"}, "TrainingJobName"),
        (
            {"ResourceConfig": {"InstanceType": "ml.trn9.huge", "InstanceCount": 1, "VolumeSizeInGB": 64}},
            "ml.trn1",
        ),
    ],
)
def test_1_a_body_sagemaker_refuses_is_a_400_naming_the_member(
    stack: LocalStack, spoil: dict[str, Any], named: str
) -> None:
    queue = stack.client()
    body = {**request(stack, unique("refused"), 60), **spoil}
    with pytest.raises(ApiError) as refused:
        queue.submit(body)
    assert refused.value.status == 400
    assert named in str(refused.value)
    assert stack.failures == []


# --- 2. a forged idle-alarm message stops nothing -----------------------------------------------------------


def test_2_a_forged_idle_alarm_message_does_not_stop_a_running_job(stack: LocalStack) -> None:
    queue = stack.client()
    name = unique("busy")
    queue.submit(request(stack, name, 3600), priority=1)
    until(stack, lambda: states(queue)[name] == "running", limit=600)
    until(stack, lambda: bool(alarms_of(stack, name)), limit=600)
    # WHEN someone publishes an ALARM message for the job's real alarm (CloudWatch holds it OK)
    sns = stack.aws_client("sns")
    topic = next(t["TopicArn"] for t in sns.list_topics()["Topics"] if t["TopicArn"].endswith("-idle-alarms"))
    alarm = alarms_of(stack, name)[0]
    message = {
        "AlarmName": alarm,
        "NewStateValue": "ALARM",
        "OldStateValue": "OK",
        "NewStateReason": "forged",
        "AlarmDescription": "sagequeue idle stop: forged",
        "StateChangeTime": "2026-03-02T09:00:00.000+0000",
    }
    sns.publish(TopicArn=topic, Message=json.dumps(message))
    stack.run_until_idle()
    # THEN the idle-stop function ran and the job still runs
    assert stack.invocations["IdleStopFunction"] >= 1
    assert states(queue)[name] == "running"
    assert stack.sagemaker.describe_training_job(TrainingJobName=name)["TrainingJobStatus"] == "InProgress"
    cancel_all(stack, queue)


def alarms_of(stack: LocalStack, training_job_name: str) -> list[str]:
    cloudwatch = stack.aws_client("cloudwatch")
    found = cloudwatch.describe_alarms(AlarmNamePrefix=f"sagequeue-idle-{training_job_name}/")["MetricAlarms"]
    return [alarm["AlarmName"] for alarm in found if not alarm["AlarmName"].endswith("/no-data")]


# --- 3. a forged SageMaker event drives nothing --------------------------------------------------------------


def test_3_a_forged_sagemaker_event_with_forged_tags_changes_nothing(stack: LocalStack) -> None:
    queue = stack.client()
    name = unique("honest")
    queue.submit(request(stack, name, 3600), priority=1)
    until(stack, lambda: states(queue)[name] == "running", limit=600)
    until(stack, lambda: bool(alarms_of(stack, name)), limit=600)
    watching = alarms_of(stack, name)
    before = stack.invocations.get("GovernanceFunction", 0)
    # WHEN someone puts a SageMaker-looking event whose tags say the job is exempt (governance would then
    # drop its idle alarms and spare it)
    detail = {
        "TrainingJobName": name,
        "TrainingJobStatus": "InProgress",
        "SecondaryStatus": "Training",
        "Tags": {"sagequeue:exempt": "true"},
    }
    stack.aws_client("events").put_events(
        Entries=[
            {
                "Source": "aws.sagemaker",
                "DetailType": "SageMaker Training Job State Change",
                "Detail": json.dumps(detail),
            }
        ]
    )
    stack.run_until_idle()
    # THEN governance ran, judged the job by SageMaker's own tags, and kept watching it
    assert stack.invocations.get("GovernanceFunction", 0) > before
    assert alarms_of(stack, name) == watching
    assert states(queue)[name] == "running"
    cancel_all(stack, queue)


# --- 4. an exemption nobody granted is ignored ---------------------------------------------------------------


def test_4_an_exempt_tag_added_on_sagemaker_does_not_spare_an_idle_job(stack: LocalStack) -> None:
    queue = stack.client()
    name = unique("lazy")
    queue.submit(request(stack, name, 7200, outcome="Idle"), priority=1)
    until(stack, lambda: states(queue)[name] == "running", limit=600)
    # WHEN its owner tags the attempt exempt directly on SageMaker
    arn = stack.sagemaker.describe_training_job(TrainingJobName=name)["TrainingJobArn"]
    stack.sagemaker.add_tags(ResourceArn=arn, Tags=[{"Key": "sagequeue:exempt", "Value": "true"}])
    # THEN the idle stop still happens
    until(stack, lambda: states(queue)[name] == "idle_stopped", limit=3600, step=60)
    cancel_all(stack, queue)


def test_4_an_exemption_an_admin_granted_is_honoured(stack: LocalStack) -> None:
    queue, admin = stack.client(), stack.client("admin")
    name = unique("spared")
    # a non-admin may neither grant an exemption nor submit with the exempt tag
    with pytest.raises(ApiError) as refused:
        queue.submit({**request(stack, name, 60), "Tags": [{"Key": "sagequeue:exempt", "Value": "true"}]})
    assert refused.value.status == 403
    queue.submit(request(stack, name, 7200, outcome="Idle"), priority=1)
    until(stack, lambda: states(queue)[name] == "running", limit=600)
    status, _ = raw(stack, "user", "PUT", f"/exemptions/{name}")
    assert status == 403
    status, granted = raw(stack, "admin", "PUT", f"/exemptions/{name}")
    assert (status, granted["training_job_name"]) == (200, name)
    arn = stack.sagemaker.describe_training_job(TrainingJobName=name)["TrainingJobArn"]
    stack.sagemaker.add_tags(ResourceArn=arn, Tags=[{"Key": "sagequeue:exempt", "Value": "true"}])
    stack.advance(3600)
    assert states(queue)[name] == "running"
    del admin
    cancel_all(stack, queue)


def raw(stack: LocalStack, identity: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """A signed request as any HTTP client would send it."""
    import urllib3
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    who = stack.identity(identity)
    data = json.dumps(body).encode() if body is not None else b""
    signed = AWSRequest(
        method=method, url=stack.endpoint + path, data=data, headers={"Content-Type": "application/json"}
    )
    SigV4Auth(Credentials(who.access_key_id, who.secret_access_key), "execute-api", stack.region).add_auth(
        signed
    )
    prepared = signed.prepare()
    answer = urllib3.PoolManager().request(method, prepared.url, body=data, headers=dict(prepared.headers))
    return answer.status, json.loads(answer.data) if answer.data else None


# --- 5. nobody can take an attempt's name -----------------------------------------------------------------


def test_5_a_name_an_attempt_would_take_is_refused_and_a_foreign_holder_is_stepped_around(
    stack: LocalStack,
) -> None:
    queue, other, admin = stack.client(), stack.client("other"), stack.client("admin")
    victim = unique("exp")
    # a user cannot submit the victim's second attempt's name
    with pytest.raises(ApiError) as refused:
        other.submit(request(stack, attempt_name(victim, 2), 60))
    assert (refused.value.status, "reserved" in str(refused.value)) == (400, True)
    # someone creates a training job of that name directly on SageMaker
    stack.sagemaker.create_training_job(**request(stack, attempt_name(victim, 2), 60))
    # the victim runs, is preempted, and resumes: its next attempt steps around the taken name to a fallback
    # name nobody could create ahead, and the foreign job costs it no attempt
    queue.submit(request(stack, victim, 1200), priority=1)
    filler = unique("fill")
    queue.submit(request(stack, filler, 1200), priority=1)
    until(stack, lambda: states(queue)[victim] == "running", limit=600)
    admin.submit(request(stack, unique("urgent"), 120), priority=900)
    until(stack, lambda: queue.job(victim).attempt == 2 and queue.job(victim).live, limit=1200)
    job = queue.job(victim)
    assert job.state != "failed"
    assert re.fullmatch(re.escape(attempt_name(victim, 2)) + "x[0-9a-f]{12}", job.training_job_name or "")
    cancel_all(stack, queue)
    cancel_all(stack, admin)
