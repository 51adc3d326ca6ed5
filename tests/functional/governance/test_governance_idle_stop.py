"""The idle-stop use case: alarm notifications as SNS delivers them, on the emulator and moto."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from governance_world import TRN1, World, training_request, unique

from sagequeue_core.domain import Job, JobState, StopReason
from sagequeue_core.events import EventType
from sagequeue_core.service.exemptions import grant_exemption
from sagequeue_core.service.stop_idle import MalformedAlarmMessage

SAMPLE = Path(__file__).resolve().parents[2] / "unit" / "governance" / "events" / "idle-alarm-sns.json"


def alarm_event(alarm_name: str, state: str = "ALARM", deliveries: int = 1) -> dict[str, Any]:
    """The sample SNS event with its alarm renamed: the shape CloudWatch and SNS deliver."""
    event = json.loads(SAMPLE.read_text())
    record = event["Records"][0]
    message = json.loads(record["Sns"]["Message"])
    message["AlarmName"] = alarm_name
    message["NewStateValue"] = state
    host = alarm_name.removeprefix("sagequeue-idle-").removesuffix("/no-data")
    message["AlarmDescription"] = (
        f"sagequeue idle stop: NeuronCoreUtilization of {host} at or below 5% for 30 minutes"
    )
    record["Sns"]["Message"] = json.dumps(message)
    event["Records"] = [record] * deliveries
    return event


def in_alarm(world: World, *alarm_names: str) -> None:
    """CloudWatch's own state of the alarms becomes ALARM (what a real evaluation would do)."""
    for alarm_name in alarm_names:
        world.cloudwatch.set_alarm_state(
            AlarmName=alarm_name, StateValue="ALARM", StateReason="Threshold Crossed"
        )


def training(world: World, name: str, count: int = 2, *, idle: bool = False, **kwargs: Any) -> None:
    """A long job in Training with its alarms made; `idle`: its hosts then report no utilization for a
    whole idle window (after the compile, which counts as busy), so its alarms' data puts them in ALARM."""
    env = {"SAGEQUEUE_SIM_DURATION": "90000", **({"SAGEQUEUE_SIM_OUTCOME": "Idle"} if idle else {})}
    world.sagemaker.create_training_job(**training_request(name, count=count, env=env, **kwargs))
    world.advance(200)
    world.govern_pending(name)
    assert world.status(name) == ("InProgress", "Training")
    if idle:
        rules = world.deps.settings.idle_rules
        world.advance(rules.idle_window_seconds + 2 * rules.period_seconds)
        assert world.status(name) == ("InProgress", "Training")


def test_an_alarm_stops_the_job_once_drops_its_alarms_and_announces_it_once(world: World) -> None:
    name = unique("stalled")
    training(world, name, idle=True)
    assert len(world.alarm_names(f"sagequeue-idle-{name}/")) == 2

    # both hosts' alarms fire, and SNS delivers the first twice
    in_alarm(world, f"sagequeue-idle-{name}/algo-2", f"sagequeue-idle-{name}/algo-1")
    outcomes = world.idle_stop.on_sns(alarm_event(f"sagequeue-idle-{name}/algo-2", deliveries=2))
    outcomes += world.idle_stop.on_sns(alarm_event(f"sagequeue-idle-{name}/algo-1"))
    assert outcomes[0].stopped
    assert outcomes[0].detail.startswith(
        f"idle: NeuronCoreUtilization of {name}/algo-2 at or below 5% for 30 minutes (alarm sagequeue-idle-{name}/algo-2: Threshold Crossed"
    )
    assert world.status(name)[0] == "Stopping"
    assert world.alarm_names(f"sagequeue-idle-{name}/") == []
    (published,) = world.publisher.of_type(EventType.IDLE_STOPPED)
    assert (published["training_job_name"], published["host"]) == (name, f"{name}/algo-2")
    (note,) = world.notifications()
    assert note["Subject"] == f"sagequeue stopped idle training job {name}"
    assert "It is not requeued" in note["Message"]
    world.advance(150)  # SageMaker's 120 s stop grace, then the upload
    assert world.status(name) == ("Stopped", "Stopped")


def test_a_queued_job_is_recorded_as_stopping_for_idleness(world: World) -> None:
    name = unique("queued")
    training(world, name, count=1, idle=True)
    started = world.clock.now()
    job = Job(
        name=name,
        request=training_request(name),
        priority=5,
        owner="arn:aws:iam::123456789012:user/dana",
        submitted_at=started,
    )
    job.state, job.attempt, job.training_job_name, job.started_at = JobState.RUNNING, 1, name, started
    world.deps.store.create_job(job)

    in_alarm(world, f"sagequeue-idle-{name}/algo-1")
    world.idle_stop.on_sns(alarm_event(f"sagequeue-idle-{name}/algo-1"))
    stored = world.deps.store.get_job(name)
    assert stored.state is JobState.STOPPING
    assert stored.stop_reason is StopReason.IDLE
    assert stored.stop_reason.final_state is JobState.IDLE_STOPPED
    assert (stored.reason or "").startswith("idle: ")
    assert world.status(name)[0] == "Stopping"


@pytest.mark.parametrize("state", ["OK", "INSUFFICIENT_DATA"])
def test_other_transitions_change_nothing(world: World, state: str) -> None:
    name = unique("fine")
    training(world, name, count=1)
    (outcome,) = world.idle_stop.on_sns(alarm_event(f"sagequeue-idle-{name}/algo-1", state=state))
    assert not outcome.stopped
    assert world.status(name) == ("InProgress", "Training")
    assert world.alarm_names(f"sagequeue-idle-{name}/") == [f"sagequeue-idle-{name}/algo-1"]


def test_a_job_an_admin_exempted_after_its_alarm_was_made_is_spared(world: World) -> None:
    name = unique("spared")
    training(world, name, count=1, idle=True)
    arn = world.sagemaker.describe_training_job(TrainingJobName=name)["TrainingJobArn"]
    world.sagemaker.add_tags(ResourceArn=arn, Tags=[{"Key": "sagequeue:exempt", "Value": "true"}])
    grant_exemption(world.deps.store, name, "arn:aws:iam::123456789012:role/QueueAdmin", world.clock.now())
    in_alarm(world, f"sagequeue-idle-{name}/algo-1")
    (outcome,) = world.idle_stop.on_sns(alarm_event(f"sagequeue-idle-{name}/algo-1"))
    assert (outcome.stopped, outcome.detail) == (False, "the training job is exempt")
    assert world.status(name) == ("InProgress", "Training")
    assert world.alarm_names(f"sagequeue-idle-{name}/") == []


def test_an_exempt_tag_added_on_sagemaker_without_a_grant_does_not_spare_the_job(world: World) -> None:
    # GIVEN a user with sagemaker:AddTags on their idle job tags it exempt themselves
    name = unique("selfspared")
    training(world, name, count=1, idle=True)
    arn = world.sagemaker.describe_training_job(TrainingJobName=name)["TrainingJobArn"]
    world.sagemaker.add_tags(ResourceArn=arn, Tags=[{"Key": "sagequeue:exempt", "Value": "true"}])
    # WHEN its idle alarm fires
    in_alarm(world, f"sagequeue-idle-{name}/algo-1")
    (outcome,) = world.idle_stop.on_sns(alarm_event(f"sagequeue-idle-{name}/algo-1"))
    # THEN it is stopped anyway, and the ignored tag is reported
    assert outcome.stopped
    assert world.status(name)[0] == "Stopping"
    assert [e["training_job_name"] for e in world.publisher.of_type(EventType.POLICY_VIOLATION)] == [name]


def test_an_alarm_that_outlived_its_job_is_cleaned_up_without_a_stop(world: World) -> None:
    name = unique("done")
    world.sagemaker.create_training_job(**training_request(name, env={"SAGEQUEUE_SIM_DURATION": "60"}))
    world.advance(200)
    world.govern_pending(name)  # alarms made at Training; the end event is not governed yet
    world.advance(200)
    assert world.status(name)[0] == "Completed"
    in_alarm(world, f"sagequeue-idle-{name}/algo-1")
    (outcome,) = world.idle_stop.on_sns(alarm_event(f"sagequeue-idle-{name}/algo-1"))
    assert (outcome.stopped, outcome.detail) == (False, "the training job is already Completed")
    assert world.alarm_names(f"sagequeue-idle-{name}/") == []
    assert world.publisher.of_type(EventType.IDLE_STOPPED) == []


def test_an_alarm_set_to_alarm_by_hand_does_not_stop_a_busy_job(world: World) -> None:
    # GIVEN a busy job, a whole idle window into its training
    name = unique("busy")
    training(world, name, count=1)
    rules = world.deps.settings.idle_rules
    world.advance(rules.idle_window_seconds + 2 * rules.period_seconds)
    # WHEN someone allowed cloudwatch:SetAlarmState puts its own, unchanged alarm in ALARM, and CloudWatch
    # sends the notification
    alarm = f"sagequeue-idle-{name}/algo-1"
    in_alarm(world, alarm)
    (outcome,) = world.idle_stop.on_sns(alarm_event(alarm))
    # THEN it is not stopped: the alarm's data shows every period above the threshold
    assert not outcome.stopped
    assert outcome.detail.startswith("the alarm's data does not show the host idle now")
    assert world.status(name) == ("InProgress", "Training")
    assert world.alarm_names(f"sagequeue-idle-{name}/") == [alarm]
    assert world.publisher.of_type(EventType.IDLE_STOPPED) == []


def test_an_alarm_set_to_alarm_by_hand_before_the_idle_window_passed_stops_nothing(world: World) -> None:
    # GIVEN an idle job whose hosts have reported nothing above the threshold for less than the window
    name = unique("early")
    world.sagemaker.create_training_job(
        **training_request(
            name, count=1, env={"SAGEQUEUE_SIM_DURATION": "90000", "SAGEQUEUE_SIM_OUTCOME": "Idle"}
        )
    )
    world.advance(200)
    world.govern_pending(name)
    world.advance(world.deps.settings.idle_rules.period_seconds * 2)
    alarm = f"sagequeue-idle-{name}/algo-1"
    # WHEN its alarm is set to ALARM by hand
    in_alarm(world, alarm)
    (outcome,) = world.idle_stop.on_sns(alarm_event(alarm))
    # THEN it runs on; once a whole window of its data is idle, the same notice stops it
    assert not outcome.stopped
    assert world.status(name) == ("InProgress", "Training")
    world.advance(world.deps.settings.idle_rules.idle_window_seconds)
    (outcome,) = world.idle_stop.on_sns(alarm_event(alarm))
    assert outcome.stopped
    assert world.status(name)[0] == "Stopping"


def test_a_forged_alarm_message_stops_nothing(world: World) -> None:
    # GIVEN a training job whose idle alarms CloudWatch holds in OK, and another job
    name, other = unique("victim"), unique("other")
    training(world, name, count=1)
    training(world, other, count=1)
    alarm = f"sagequeue-idle-{name}/algo-1"
    assert world.cloudwatch.describe_alarms(AlarmNames=[alarm])["MetricAlarms"][0]["StateValue"] != "ALARM"

    # WHEN someone allowed to publish on the topic sends ALARM messages: for the real alarm (which is not in
    # ALARM), for an alarm that does not exist, and for an alarm of another job's that they renamed
    forged = world.idle_stop.on_sns(alarm_event(alarm))
    forged += world.idle_stop.on_sns(alarm_event(f"sagequeue-idle-{name}/algo-7"))
    in_alarm(world, f"sagequeue-idle-{other}/algo-1")
    spec = world.cloudwatch.describe_alarms(AlarmNames=[f"sagequeue-idle-{other}/algo-1"])["MetricAlarms"][0]
    # the same metrics (or metric math) as the other job's alarm: it watches the other job's host
    watched = (
        {"Metrics": spec["Metrics"]}
        if spec.get("Metrics")
        else {
            "Namespace": spec["Namespace"],
            "MetricName": spec["MetricName"],
            "Dimensions": spec["Dimensions"],
            "Statistic": "Average",
            "Period": 60,
        }
    )
    world.cloudwatch.put_metric_alarm(
        AlarmName=f"sagequeue-idle-{name}/algo-2",
        EvaluationPeriods=1,
        Threshold=5,
        ComparisonOperator="LessThanOrEqualToThreshold",
        **watched,
    )
    in_alarm(world, f"sagequeue-idle-{name}/algo-2")
    forged += world.idle_stop.on_sns(alarm_event(f"sagequeue-idle-{name}/algo-2"))

    # THEN nothing is stopped, each refusal says why, and nothing is announced
    assert [o.stopped for o in forged] == [False, False, False]
    assert "not ALARM" in forged[0].detail
    assert forged[1].detail == "no such alarm in CloudWatch"
    assert forged[2].detail == f"the alarm does not watch host {name}/algo-2"
    assert world.status(name) == ("InProgress", "Training")
    assert world.publisher.of_type(EventType.IDLE_STOPPED) == []


def test_foreign_alarms_and_non_alarm_messages(world: World) -> None:
    (outcome,) = world.idle_stop.on_sns(alarm_event("someone-elses-alarm"))
    assert (outcome.stopped, outcome.training_job_name) == (False, None)
    with pytest.raises(MalformedAlarmMessage, match="not JSON"):
        world.idle_stop.on_sns({"Records": [{"Sns": {"Message": "hello"}}]})
    with pytest.raises(MalformedAlarmMessage, match="no AlarmName"):
        world.idle_stop.on_sns({"Records": [{"Sns": {"Message": "{}"}}]})
    assert TRN1


def test_an_exemption_of_a_queue_entry_covers_its_later_attempt_not_a_job_created_under_its_name(
    world: World,
) -> None:
    # GIVEN a queue entry whose current attempt is its second (`<job>--2`), both hosts idle and tagged
    # exempt, and a training job someone else created under the entry's own name
    name = unique("entry")
    attempt = f"{name}--2"
    exempt_tags = {"team": "nlp", "sagequeue:exempt": "true"}
    training(world, attempt, count=1, idle=True, tags=exempt_tags)
    training(world, name, count=1, idle=True, tags=exempt_tags)
    job = Job(
        name=name,
        request=training_request(name),
        priority=5,
        owner="arn:aws:iam::123456789012:user/dana",
        submitted_at=world.clock.now(),
    )
    job.state, job.attempt, job.training_job_name, job.started_at = (
        JobState.RUNNING,
        2,
        attempt,
        world.clock.now(),
    )
    world.deps.store.create_job(job)
    # WHEN an admin exempts the entry by its name, and both jobs' idle alarms fire
    grant_exemption(world.deps.store, name, "arn:aws:iam::123456789012:role/QueueAdmin", world.clock.now())
    in_alarm(world, f"sagequeue-idle-{attempt}/algo-1", f"sagequeue-idle-{name}/algo-1")
    (kept,) = world.idle_stop.on_sns(alarm_event(f"sagequeue-idle-{attempt}/algo-1"))
    (squatter,) = world.idle_stop.on_sns(alarm_event(f"sagequeue-idle-{name}/algo-1"))
    # THEN the entry's attempt is spared, and the job created under the entry's name is not
    assert (kept.stopped, kept.detail) == (False, "the training job is exempt")
    assert world.status(attempt) == ("InProgress", "Training")
    assert squatter.stopped
    assert world.status(name)[0] == "Stopping"
