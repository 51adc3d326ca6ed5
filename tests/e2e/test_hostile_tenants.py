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

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from test_hostile_users import raw

from sagequeue.client import ApiError, QueueClient
from sagequeue.local import LocalStack
from sagequeue.local.alarms import Evaluation, alarm_message
from sagequeue.local.identities import user_identity
from sagequeue_core.defaults import (
    HOST_DIMENSION,
    NEURONCORE_UTILIZATION_METRIC,
    host_dimension_value,
    team_metric_namespace,
)

POOL = "ml.trn1.32xlarge"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/neuron-train:2.21"
FAST = {"provisioning_seconds": 60, "download_seconds": 10, "upload_seconds": 10}
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
            "capacity": {POOL: 2, "plan:shared": 1},
            "min_runtime_before_preemption_seconds": 0,
            "idle_periods": 3,
            "idle_period_seconds": 300,
        },
        emulator=FAST,
        function_logs=False,
        teams=TEAMS,
    )
    running.identities.add(user_identity(running.account_id, "loner"))
    vision_data = vision_data_role(running)
    running.requested_settings["allowed_role_arns"] = [running.training_role_arn, vision_data]
    running.requested_settings["team_execution_roles"] = f"vision={vision_data}"
    loner = running.identity("loner").arn
    running.requested_settings["priority_ceilings"] = f"speech=300,{loner}=50"
    running.start()
    yield running
    running.stop()


def vision_data_role(stack: LocalStack) -> str:
    """An execution role that reads vision's data: only vision may pass it (TeamExecutionRoles)."""
    return f"arn:aws:iam::{stack.account_id}:role/vision-data-access"


def states(queue: QueueClient) -> dict[str, str]:
    return {job.name: job.state for job in queue.jobs()}


def until(stack: LocalStack, done: Any, limit: int, step: int = 30) -> None:
    waited = 0
    while not done():
        assert waited < limit, f"not done after {limit} s"
        stack.advance(step)
        waited += step


def cancel_all(stack: LocalStack) -> None:
    """Leave the shared stack's pools empty for the next test."""
    admin = stack.client("admin")
    for pool in (POOL, "plan:shared"):
        for job in admin.jobs(pool=pool):
            if not job.terminal:
                admin.cancel(job.name)
    until(stack, lambda: all(job.terminal for p in (POOL, "plan:shared") for job in admin.jobs(pool=p)), 900)


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


# --- 2. an idle signal no tenant can forge for another's job ----------------------------------------------


def idle_alarm(stack: LocalStack, training_job_name: str) -> dict[str, Any]:
    name = f"sagequeue-idle-{training_job_name}/algo-1"
    found = stack.aws_client("cloudwatch").describe_alarms(AlarmNames=[name])["MetricAlarms"]
    return dict(found[0]) if found else {}


def forge_zeros(stack: LocalStack, training_job_name: str, team: str, count: int = 50) -> None:
    """What a principal allowed cloudwatch:PutMetricData in `team`'s namespace (a job role of that team,
    sharing the victim's team) can publish for any host of it."""
    stack.aws_client("cloudwatch").put_metric_data(
        Namespace=team_metric_namespace(team),
        MetricData=[
            {
                "MetricName": NEURONCORE_UTILIZATION_METRIC,
                "Dimensions": [{"Name": HOST_DIMENSION, "Value": host_dimension_value(training_job_name, 1)}],
                "Timestamp": stack.now(),
                "Value": 0.0,
                "Unit": "Percent",
            }
        ]
        * count,
    )


def training_since(stack: LocalStack, training_job_name: str) -> Any:
    described = stack.sagemaker.describe_training_job(TrainingJobName=training_job_name)
    starts = [t["StartTime"] for t in described["SecondaryStatusTransitions"] if t["Status"] == "Training"]
    return max(starts) if starts else None


def test_2_forged_zeros_do_not_stop_a_busy_job_and_a_truly_idle_one_stops_within_window_and_a_period(
    stack: LocalStack,
) -> None:
    vision, speech = stack.client("user"), stack.client("other")
    busy, idle = unique("busy"), unique("idle")
    vision.submit(request(stack, busy, 7200), priority=1)
    speech.submit(request(stack, idle, 7200, outcome="Idle"), priority=1)
    until(stack, lambda: states(vision)[busy] == states(speech)[idle] == "running", limit=600)
    until(stack, lambda: training_since(stack, busy) is not None, limit=600, step=10)
    until(stack, lambda: training_since(stack, idle) is not None, limit=600, step=10)
    began = training_since(stack, idle)
    # WHEN a job role of its own team publishes zeros for the busy job's host in the namespace its alarm reads,
    # fifty a minute, for twice the window
    window = 3 * 300
    stopped_at = None
    for _ in range(2 * window // 60):
        forge_zeros(stack, busy, "vision")
        stack.advance(60)
        if stopped_at is None and states(speech)[idle] in ("stopping", "idle_stopped"):
            stopped_at = stack.now()
    # THEN the busy job still runs
    assert states(vision)[busy] == "running"
    # AND the idle job was stopped within the idle window and one period of its training's start
    assert stopped_at is not None
    assert (stopped_at - began).total_seconds() <= window + 300
    until(stack, lambda: states(speech)[idle] == "idle_stopped", limit=600)
    cancel_all(stack)


def test_2_an_idle_alarm_overwritten_under_its_name_stops_nothing_and_is_put_back(stack: LocalStack) -> None:
    vision = stack.client("user")
    busy = unique("busy")
    vision.submit(request(stack, busy, 7200), priority=1)
    until(stack, lambda: states(vision)[busy] == "running", limit=600)
    until(stack, lambda: bool(idle_alarm(stack, busy)), limit=600)
    real = idle_alarm(stack, busy)
    # WHEN someone allowed PutMetricAlarm replaces it with one that fires on any utilization
    members = ("AlarmName", "AlarmActions", "EvaluationPeriods", "ComparisonOperator", "Metrics")
    stack.aws_client("cloudwatch").put_metric_alarm(**{m: real[m] for m in members}, Threshold=100.0)
    stack.advance(300)
    # THEN the job still runs, and the alarm is governance's again
    assert states(vision)[busy] == "running"
    assert stack.sagemaker.describe_training_job(TrainingJobName=busy)["TrainingJobStatus"] == "InProgress"
    assert idle_alarm(stack, busy)["Threshold"] == real["Threshold"]
    cancel_all(stack)


def test_2_an_idle_jobs_alarm_overwritten_never_to_fire_is_put_back_and_the_job_still_stops(
    stack: LocalStack,
) -> None:
    speech = stack.client("other")
    idle = unique("idle")
    speech.submit(request(stack, idle, 7200, outcome="Idle"), priority=1)
    until(stack, lambda: bool(idle_alarm(stack, idle)), limit=900)
    real = idle_alarm(stack, idle)
    # WHEN someone replaces its alarm with one that never fires, and sends nowhere
    members = ("AlarmName", "EvaluationPeriods", "ComparisonOperator", "Metrics")
    stack.aws_client("cloudwatch").put_metric_alarm(**{m: real[m] for m in members}, Threshold=-1.0)
    # THEN governance's reconcile puts it back, and the idle job is stopped all the same
    until(stack, lambda: states(speech)[idle] == "idle_stopped", limit=3 * 300 + 2 * 300 + 600, step=60)
    cancel_all(stack)


def test_2_an_idle_alarm_set_to_alarm_by_hand_stops_no_busy_job(stack: LocalStack) -> None:
    vision = stack.client("user")
    busy = unique("busy")
    vision.submit(request(stack, busy, 7200), priority=1)
    until(stack, lambda: states(vision)[busy] == "running", limit=600)
    until(stack, lambda: bool(idle_alarm(stack, busy)), limit=600)
    stack.advance(3 * 300 + 300)  # a whole idle window of busy data
    real = idle_alarm(stack, busy)
    assert real["StateValue"] == "OK"
    # WHEN someone allowed cloudwatch:SetAlarmState puts governance's own alarm in ALARM, and CloudWatch
    # runs its action: the notification it sends goes to the alarm topic
    cloudwatch = stack.aws_client("cloudwatch")
    cloudwatch.set_alarm_state(AlarmName=real["AlarmName"], StateValue="ALARM", StateReason="set by hand")
    message = alarm_message(
        {**real, "StateValue": "ALARM"},
        "OK",
        Evaluation("ALARM", "set by hand", ()),
        stack.now(),
        region=stack.region,
        account_id=stack.account_id,
    )
    for topic in real["AlarmActions"]:
        stack.aws_client("sns").publish(TopicArn=topic, Subject="ALARM", Message=json.dumps(message))
    stack.run_until_idle()
    # THEN the busy job still runs, its data showing it busy, and its alarm (in ALARM as set) is kept
    assert states(vision)[busy] == "running"
    assert stack.sagemaker.describe_training_job(TrainingJobName=busy)["TrainingJobStatus"] == "InProgress"
    (alarm,) = cloudwatch.describe_alarms(AlarmNames=[real["AlarmName"]])["MetricAlarms"]
    assert alarm["StateValue"] == "ALARM"
    cancel_all(stack)


# --- 3. an execution role of one team is not another's ----------------------------------------------------


def test_3_a_teams_execution_role_is_refused_to_other_teams_and_passed_for_its_own(stack: LocalStack) -> None:
    vision, speech, loner, admin = (stack.client(n) for n in ("user", "other", "loner", "admin"))
    role = vision_data_role(stack)
    # WHEN speech, and a user of no team, submit jobs that run as vision's data-access role
    for caller, yours in ((speech, "your team is 'speech'"), (loner, "mapped to no team")):
        with pytest.raises(ApiError) as refused:
            caller.submit(request(stack, unique("borrowed-role"), 60, RoleArn=role))
        # THEN each is refused, naming the team whose role it is
        assert refused.value.status == 403
        assert "execution role of team 'vision'" in str(refused.value)
        assert yours in str(refused.value)
    # AND vision passes it, an admin passes it, and the shared role stays open to everyone
    own, admins, shared = unique("own-role"), unique("admin-role"), unique("shared-role")
    vision.submit(request(stack, own, 60, RoleArn=role))
    admin.submit(request(stack, admins, 60, RoleArn=role))
    speech.submit(request(stack, shared, 60))
    until(
        stack, lambda: states(admin).get(admins) == "completed" and states(vision)[own] == "completed", 1200
    )
    roles = {n: stack.sagemaker.describe_training_job(TrainingJobName=n)["RoleArn"] for n in (own, admins)}
    assert roles == {own: role, admins: role}
    cancel_all(stack)


# --- 4. attempt names nobody outside can block ---------------------------------------------------------------


def test_4_training_jobs_created_under_a_jobs_attempt_names_cost_it_no_attempt_and_never_fail_it(
    stack: LocalStack,
) -> None:
    vision, admin = stack.client("user"), stack.client("admin")
    victim, early = unique("exp"), unique("early")
    # GIVEN someone with sagemaker:CreateTrainingJob takes every name the docs ever promised the victim's
    # attempts: <job>--2 ... <job>--6, and the fixed fallbacks <job>--2c1 ... <job>--2c4
    taken = [f"{victim}--{n}" for n in range(2, 7)] + [f"{victim}--2c{c}" for c in range(1, 5)]
    for name in taken:
        stack.sagemaker.create_training_job(**request(stack, name, 60))
    vision.submit(request(stack, victim, 1800), priority=1)
    # AND a queued job's own name is taken on SageMaker before it first starts
    vision.submit(request(stack, early, 600), priority=5)
    stack.sagemaker.create_training_job(**request(stack, early, 60))
    # (the squatters' jobs take the region's instances first: the region holds what the pools hold)
    until(stack, lambda: states(vision)[victim] == "running", limit=2400)
    # WHEN the victim is preempted and resumes
    admin.submit(request(stack, unique("urgent"), 120), priority=900)
    until(stack, lambda: vision.job(victim).attempt == 2 and vision.job(victim).live, limit=1800)
    # THEN its second attempt runs under a fallback name nobody could create ahead, as attempt 2
    job = vision.job(victim)
    assert re.fullmatch(re.escape(victim) + "--2x[0-9a-f]{12}", job.training_job_name or "")
    assert job.training_job_name not in taken
    tags = stack.sagemaker.list_tags(
        ResourceArn=stack.sagemaker.describe_training_job(TrainingJobName=job.training_job_name)[
            "TrainingJobArn"
        ]
    )["Tags"]
    assert {"Key": "sagequeue:job", "Value": victim} in tags
    # AND the job whose first name was taken starts under its first attempt's fallback name
    summaries = stack.sagemaker.list_training_jobs(NameContains=early, MaxResults=100)["TrainingJobSummaries"]
    ran = sorted(summary["TrainingJobName"] for summary in summaries)
    assert [n for n in ran if re.fullmatch(re.escape(early) + "--1x[0-9a-f]{12}", n)], ran
    assert vision.job(early).state != "failed"
    cancel_all(stack)


# --- 8. a body SageMaker would refuse at create time is refused at submit ----------------------------------


def test_8_instance_type_beside_instance_groups_is_a_400_naming_both(stack: LocalStack) -> None:
    vision = stack.client("user")
    groups = [{"InstanceGroupName": "g", "InstanceType": POOL, "InstanceCount": 1}]
    body = request(stack, unique("both"), 60)
    body["ResourceConfig"] = {**body["ResourceConfig"], "InstanceGroups": groups}
    with pytest.raises(ApiError) as refused:
        vision.submit(body)
    assert refused.value.status == 400
    assert "ResourceConfig.InstanceType and ResourceConfig.InstanceGroups" in str(refused.value)
    # AND the groups alone are a job
    alone = unique("groups")
    body = request(stack, alone, 60)
    body["ResourceConfig"] = {"InstanceGroups": groups, "VolumeSizeInGB": 64}
    vision.submit(body)
    assert vision.job(alone).state in ("queued", "starting")
    cancel_all(stack)


# --- 6. priority ceilings per team and per principal -----------------------------------------------------


def test_6_priorities_above_a_callers_ceiling_are_refused_naming_it_at_submit_and_change(
    stack: LocalStack,
) -> None:
    vision, speech, loner, admin = (stack.client(n) for n in ("user", "other", "loner", "admin"))
    cases = [
        (speech, 301, "above 300, the ceiling of team 'speech'"),
        (loner, 51, "above 50, the ceiling of arn:aws:iam::"),
        (vision, 901, "above 900, the ceiling of non-admins (MaxPriorityForNonAdmins)"),
    ]
    for caller, priority, named in cases:
        # WHEN a caller submits above its ceiling THEN it is refused, naming the ceiling and whose it is
        with pytest.raises(ApiError) as refused:
            caller.submit(request(stack, unique("greedy"), 60), priority=priority)
        assert refused.value.status == 403
        assert named in str(refused.value)
        # AND at its ceiling it is queued
        modest = unique("modest")
        caller.submit(request(stack, modest, 600), priority=priority - 1)
        # AND raising that job above the ceiling later is refused too
        with pytest.raises(ApiError) as raised:
            caller.set_priority(modest, 1000)
        assert raised.value.status == 403
        assert named.replace(f"above {priority - 1}", "") in str(raised.value)
        assert caller.job(modest).priority == priority - 1
    # AND an admin may use the top
    top = unique("top")
    admin.submit(request(stack, top, 60), priority=1000)
    assert admin.job(top).priority == 1000
    cancel_all(stack)


# --- 5. training plans of others ------------------------------------------------------------------------------


def test_5_a_plan_of_another_account_region_or_partition_is_no_pool_of_the_stack(stack: LocalStack) -> None:
    vision = stack.client("user")
    ours = f"arn:aws:sagemaker:{stack.region}:{stack.account_id}:training-plan/shared"
    others = [
        (ours.replace(stack.account_id, "999999999999"), "account 999999999999"),
        (ours.replace(stack.region, "eu-west-3"), "region eu-west-3"),
        (ours.replace("arn:aws:", "arn:aws-cn:"), "partition aws-cn"),
    ]
    for arn, named in others:
        body = request(stack, unique("plan"), 60)
        body["ResourceConfig"] = {**body["ResourceConfig"], "TrainingPlanArn": arn}
        with pytest.raises(ApiError) as refused:
            vision.submit(body)
        assert refused.value.status == 400
        assert f"ResourceConfig.TrainingPlanArn: the plan is in {named}" in str(refused.value)
    # AND the stack's own plan of that name is its pool
    own = unique("own-plan")
    body = request(stack, own, 60)
    body["ResourceConfig"] = {**body["ResourceConfig"], "TrainingPlanArn": ours}
    vision.submit(body)
    assert vision.job(own).pool == "plan:shared"
    cancel_all(stack)


# --- exemptions by training job name ----------------------------------------------------------------------------


def test_9_an_exemption_by_name_covers_the_job_that_had_the_name_not_one_created_under_it_later(
    stack: LocalStack,
) -> None:
    """GIVEN a job started outside the queue, exempted by an admin through the API while it runs,
    WHEN it ends, is deleted (which frees its name), and another tenant creates a job under that name,
    tagged exempt,
    THEN the exemption was the first job's: the second gets its idle alarms like any job."""
    name = unique("exempted")
    exempt_tag = [{"Key": "sagequeue:exempt", "Value": "true"}]
    stack.sagemaker.create_training_job(**request(stack, name, 900, Tags=exempt_tag))
    until(stack, lambda: training_started(stack, name), limit=600, step=10)
    status, granted = raw(stack, "admin", "PUT", f"/exemptions/{name}")
    assert (status, granted["training_job_name"]) == (200, name)
    stack.advance(360)  # governance's reconcile drops the alarms it made before the grant
    assert idle_alarm(stack, name) == {}  # exempt: not watched
    until(stack, lambda: status_of(stack, name) == "Completed", limit=900)
    stack.sagemaker.delete_training_job(TrainingJobName=name)
    again = request(stack, name, 7200, Tags=exempt_tag)
    stack.sagemaker.create_training_job(**again)
    until(stack, lambda: bool(idle_alarm(stack, name)), limit=900)
    stack.sagemaker.stop_training_job(TrainingJobName=name)
    until(stack, lambda: status_of(stack, name) == "Stopped", limit=600)


def training_started(stack: LocalStack, training_job_name: str) -> bool:
    described = stack.sagemaker.describe_training_job(TrainingJobName=training_job_name)
    return described.get("SecondaryStatus") == "Training"


def status_of(stack: LocalStack, training_job_name: str) -> str:
    return str(stack.sagemaker.describe_training_job(TrainingJobName=training_job_name)["TrainingJobStatus"])
