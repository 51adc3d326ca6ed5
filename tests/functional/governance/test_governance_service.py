"""The governance use case on the emulator and moto: policy stops, alarms, resumes, spot, reconcile."""

from __future__ import annotations

from typing import Any

from governance_world import TRN1, World, training_request, unique

from sagequeue_core.defaults import ATTEMPT_TAG, EXEMPTION_WINDOW_SECONDS, JOB_TAG, SEAL_TAG
from sagequeue_core.domain import Job, JobState, StopReason, tags_to_dict
from sagequeue_core.events import EventType
from sagequeue_core.governance import CLONE_ATTEMPT_TAG, CLONE_OF_TAG, RESUMES_TAG
from sagequeue_core.service.exemptions import grant_exemption
from sagequeue_core.service.jobs import exempt


def start(world: World, name: str, **kwargs: Any) -> None:
    world.sagemaker.create_training_job(**training_request(name, **kwargs))


def tags_of(world: World, name: str) -> dict[str, str]:
    arn = world.sagemaker.describe_training_job(TrainingJobName=name)["TrainingJobArn"]
    return tags_to_dict(world.sagemaker.list_tags(ResourceArn=arn)["Tags"])


def names(world: World) -> list[str]:
    return sorted(
        s["TrainingJobName"]
        for s in world.sagemaker.list_training_jobs(MaxResults=100)["TrainingJobSummaries"]
    )


# --- policy -------------------------------------------------------------------------------------------------


def test_a_job_without_the_required_tag_is_stopped_at_its_first_event_and_announced_once(
    world: World,
) -> None:
    name = unique("untagged")
    start(world, name, tags={"project": "x"})
    (event,) = world.take_events(name)  # Starting
    assert event["detail"]["SecondaryStatus"] == "Starting"

    outcome = world.governance.on_event(event)
    assert outcome.stopped == "policy violation: missing required tag 'team'"
    assert world.status(name)[0] == "Stopping"
    # the same event again: still stopped, not announced twice
    world.governance.on_event(event)
    (violation,) = world.publisher.of_type(EventType.POLICY_VIOLATION)
    assert violation["training_job_name"] == name
    assert violation["rules"] == ["required_tags"]
    assert violation["owner"] == "arn:aws:iam::123456789012:role/SageMakerTraining"
    (note,) = world.notifications()
    assert note["Subject"] == f"sagequeue stopped {name}: policy violation"
    assert "missing required tag 'team'" in note["Message"]
    assert world.deps.store.get_claim("governance-policy-stop", name)["reason"] == outcome.stopped
    world.advance(150)  # SageMaker's 120 s stop grace, then the upload
    assert world.status(name) == ("Stopped", "Stopped")


def test_tags_as_a_list_in_the_event_are_read_like_a_dict(world: World) -> None:
    name = unique("listtags")
    start(world, name, tags={"team": "nlp"})
    (event,) = world.take_events(name)
    event["detail"]["Tags"] = [{"Key": k, "Value": v} for k, v in event["detail"]["Tags"].items()]
    assert world.governance.on_event(event).stopped is None
    assert world.status(name)[0] == "InProgress"


def test_an_exempt_job_breaking_the_rules_keeps_running(world: World) -> None:
    name = unique("exempt")
    grant_exemption(world.deps.store, name, "arn:aws:iam::123456789012:role/QueueAdmin", world.clock.now())
    start(world, name, tags={"sagequeue:exempt": "true"})
    world.advance(200)
    outcomes = world.govern_pending(name)
    assert all(o.stopped is None and not o.alarms_created for o in outcomes)
    assert world.status(name) == ("InProgress", "Training")
    assert world.alarm_names(f"sagequeue-idle-{name}/") == []


ADMIN = "arn:aws:iam::123456789012:role/QueueAdmin"


def test_an_exemption_of_a_name_ahead_of_its_job_does_not_cover_a_job_created_after_its_window(
    world: World,
) -> None:
    """GIVEN an admin exempts a training job name no job has yet,
    WHEN nobody creates it within the window and, later, someone creates a job of that name breaking the
    rules, tagged exempt,
    THEN the exemption does not carry over to that job: it is stopped."""
    name = unique("late-exempt")
    grant_exemption(world.deps.store, name, ADMIN, world.clock.now())
    world.advance(EXEMPTION_WINDOW_SECONDS + 60)
    start(world, name, tags={"sagequeue:exempt": "true"})
    world.advance(200)
    outcomes = world.govern_pending(name)
    assert any(o.stopped for o in outcomes)
    assert world.status(name)[0] in ("Stopping", "Stopped")


def test_an_exemption_by_name_covers_one_job_not_the_next_created_under_its_freed_name(
    world: World,
) -> None:
    """GIVEN an admin exempted the training job of a name, and governance honoured it,
    WHEN that job ends, is deleted (which frees its name), and someone creates another job under the name
    within the window, breaking the rules and tagged exempt,
    THEN the exemption was consumed by the first job: the second is stopped."""
    name = unique("reused")
    grant_exemption(world.deps.store, name, ADMIN, world.clock.now())
    start(world, name, tags={"sagequeue:exempt": "true"}, env={"SAGEQUEUE_SIM_DURATION": "120"})
    world.advance(200)
    assert all(o.stopped is None for o in world.govern_pending(name))
    world.advance(600)
    world.govern_pending(name)
    assert world.status(name)[0] == "Completed"
    world.sagemaker.delete_training_job(TrainingJobName=name)
    start(world, name, tags={"sagequeue:exempt": "true"}, env={"SAGEQUEUE_SIM_DURATION": "90000"})
    world.advance(200)
    outcomes = world.govern_pending(name)
    assert any(o.stopped for o in outcomes)
    assert world.status(name)[0] in ("Stopping", "Stopped")


def test_an_exemption_of_a_running_job_is_bound_to_it_when_granted(world_factory: Any) -> None:
    """GIVEN a running job that breaks the rules, exempted through the API by an admin (the grant records
    the job's CreationTime),
    THEN that job keeps running, and no other job created under its name after a delete is covered, even
    one created within the window."""
    world = world_factory(admin_role_arns=(ADMIN,))
    name = unique("running-exempt")
    start(world, name, tags={"sagequeue:exempt": "true"}, env={"SAGEQUEUE_SIM_DURATION": "300"})
    world.advance(30)
    exempt(world.deps, name, ADMIN)
    world.advance(200)
    assert all(o.stopped is None for o in world.govern_pending(name))
    assert world.status(name)[0] == "InProgress"
    world.advance(600)
    world.govern_pending(name)
    world.sagemaker.delete_training_job(TrainingJobName=name)
    start(world, name, tags={"sagequeue:exempt": "true"}, env={"SAGEQUEUE_SIM_DURATION": "90000"})
    world.advance(200)
    assert any(o.stopped for o in world.govern_pending(name))


def test_a_self_granted_exempt_tag_is_ignored_and_reported(world: World) -> None:
    # GIVEN a job outside the queue that breaks the rules and tags itself exempt; no admin granted it
    name = unique("selfexempt")
    start(world, name, tags={"sagequeue:exempt": "true"})
    world.advance(200)
    # WHEN governance judges it
    outcomes = world.govern_pending(name)
    # THEN it is governed as if the tag were not there, and the ignored tag is reported once
    assert any(o.stopped for o in outcomes)
    assert world.status(name)[0] in ("Stopping", "Stopped")
    reports = [
        e for e in world.publisher.of_type(EventType.POLICY_VIOLATION) if e.get("rules") == ["exemption"]
    ]
    assert [r["training_job_name"] for r in reports] == [name]


def test_a_forged_event_with_forged_tags_stops_nothing(world: World) -> None:
    # GIVEN a compliant job that trains
    name = unique("honest")
    start(world, name, tags={"team": "nlp"}, env={"SAGEQUEUE_SIM_DURATION": "90000"})
    world.advance(200)
    world.govern_pending(name)
    assert world.status(name) == ("InProgress", "Training")
    # WHEN a forged InProgress event says it lost its tags, and a forged Failed event says it failed for a
    # transient reason (which would make governance clone it)
    template = {
        "version": "0",
        "source": "aws.sagemaker",
        "detail-type": "SageMaker Training Job State Change",
        "account": "123456789012",
        "region": "us-east-1",
        "detail": {
            "TrainingJobName": name,
            "TrainingJobStatus": "InProgress",
            "SecondaryStatus": "Training",
            "Tags": {"project": "x"},
        },
    }
    forged_failed = {
        **template,
        "detail": {
            **template["detail"],
            "TrainingJobStatus": "Failed",
            "SecondaryStatus": "Failed",
            "FailureReason": "InternalServerError: We encountered an internal error.",
        },
    }
    outcomes = [world.governance.on_event(template), world.governance.on_event(forged_failed)]
    # THEN governance judged the job by what SageMaker says: not stopped, not cloned, nothing announced
    assert [o.stopped for o in outcomes] == [None, None]
    assert [o.clone for o in outcomes] == [None, None]
    assert world.status(name) == ("InProgress", "Training")
    assert names(world) == [name]
    assert world.publisher.of_type(EventType.POLICY_VIOLATION) == []


# --- alarms -------------------------------------------------------------------------------------------------


def test_training_creates_one_alarm_per_host_once_and_the_end_deletes_them(world: World) -> None:
    name = unique("busy")
    start(world, name, count=3, env={"SAGEQUEUE_SIM_DURATION": "600"})
    world.advance(200)  # Starting, Downloading, Training
    events = world.take_events(name)
    assert [e["detail"]["SecondaryStatus"] for e in events][-1] == "Training"
    for event in events + events:  # every event delivered twice
        world.governance.on_event(event)
    expected = [f"sagequeue-idle-{name}/algo-{n}" for n in (1, 2, 3)]
    assert world.alarm_names(f"sagequeue-idle-{name}/") == expected
    alarm = world.cloudwatch.describe_alarms(AlarmNames=[expected[0]])["MetricAlarms"][0]
    assert alarm["Metrics"][0]["MetricStat"]["Metric"]["MetricName"] == "NeuronCoreUtilization"
    assert alarm["AlarmActions"] == [world.deps.settings.alarm_topic_arn]

    world.advance(700)
    world.govern_pending(name)
    assert world.status(name) == ("Completed", "Completed")
    assert world.alarm_names(f"sagequeue-idle-{name}/") == []


def test_a_stale_training_event_after_the_job_ended_creates_no_alarm(world: World) -> None:
    name = unique("late")
    start(world, name, env={"SAGEQUEUE_SIM_DURATION": "60"})
    world.advance(400)
    events = world.take_events(name)
    training = next(e for e in events if e["detail"]["SecondaryStatus"] == "Training")
    assert world.status(name)[0] == "Completed"
    world.governance.on_event(training)
    assert world.alarm_names(f"sagequeue-idle-{name}/") == []


# --- resume -------------------------------------------------------------------------------------------------


def fail_after(
    seconds: int, reason: str = "InternalServerError: We encountered an internal error."
) -> dict[str, str]:
    return {"SAGEQUEUE_SIM_DURATION": str(seconds), "SAGEQUEUE_SIM_OUTCOME": f"Failed:{reason}"}


def test_a_transient_failure_is_resumed_as_a_clone_at_most_max_resumes_times(world_factory: Any) -> None:
    world = world_factory(max_resumes=2, resume_after_failure_min_runtime_seconds=600)
    root = unique("flaky")
    start(world, root, env=fail_after(900), tags={"team": "nlp", "owner": "ml-platform"})
    lineage = [root]
    for _ in range(4):
        world.advance(1200)
        for event in world.take_events():
            world.governance.on_event(event)
            world.governance.on_event(event)  # duplicated delivery
        clones = [n for n in names(world) if n.startswith(root) and n not in lineage]
        assert len(clones) <= 1
        lineage += clones
    assert lineage == [root, f"{root}--2", f"{root}--3"]
    assert all(world.status(n)[0] == "Failed" for n in lineage)
    last = tags_of(world, f"{root}--3")
    assert (last[CLONE_OF_TAG], last[CLONE_ATTEMPT_TAG], last[RESUMES_TAG]) == (root, "3", "2")
    assert last["owner"] == "ml-platform"
    clone = world.sagemaker.describe_training_job(TrainingJobName=f"{root}--2")
    assert clone["CheckpointConfig"] == {"S3Uri": f"s3://bucket/checkpoints/{root}"}
    assert len(world.publisher.of_type(EventType.JOB_RESUMED)) == 2


def test_a_short_or_own_failure_is_not_resumed(world: World) -> None:
    quick, broken = unique("quick"), unique("broken")
    start(world, quick, env=fail_after(60))
    start(world, broken, env=fail_after(3600, "AlgorithmError: ExecuteUserScriptError"))
    world.advance(4000)
    world.govern_pending()
    assert sorted(n for n in names(world) if n.startswith((quick, broken))) == sorted([quick, broken])


def fail_all(world: World, *roots: str, seconds: int = 1200) -> None:
    world.advance(seconds)
    for event in world.take_events():
        world.governance.on_event(event)
        world.governance.on_event(event)  # duplicated delivery


def test_a_clone_name_created_ahead_by_someone_else_neither_poses_as_the_clone_nor_blocks_the_resume(
    world_factory: Any,
) -> None:
    """GIVEN a job started outside the queue that will fail on SageMaker's side, and a stranger allowed
    CreateTrainingJob who created `<job>--2` ahead, tagged as governance tags its clones,
    WHEN the job fails,
    THEN governance does not take the stranger's job for its clone: the resume runs under a random fallback
    name, sealed, and the next resume counts from it (the stranger's tags count nothing)."""
    world = world_factory(max_resumes=2, resume_after_failure_min_runtime_seconds=600)
    root = unique("flaky")
    start(world, root, env=fail_after(900))
    squatter = f"{root}--2"
    start(
        world,
        squatter,
        env={"SAGEQUEUE_SIM_DURATION": "90000"},
        tags={
            "team": "nlp",
            CLONE_OF_TAG: root,
            CLONE_ATTEMPT_TAG: "2",
            RESUMES_TAG: "1",
            SEAL_TAG: "0" * 32,
        },
    )
    fail_all(world, root)
    clones = [n for n in names(world) if n.startswith(f"{root}--2x")]
    assert len(clones) == 1, names(world)
    (clone,) = clones
    assert world.status(clone)[0] == "InProgress"
    tags = tags_of(world, clone)
    assert (tags[CLONE_OF_TAG], tags[CLONE_ATTEMPT_TAG], tags[RESUMES_TAG]) == (root, "2", "1")
    assert tags[SEAL_TAG] != "0" * 32
    (resumed,) = world.publisher.of_type(EventType.JOB_RESUMED)
    assert resumed["clone"] == clone
    # the clone fails in turn: its resume is `<root>--3`, counted from the sealed lineage
    fail_all(world, root)
    assert f"{root}--3" in names(world)
    assert tags_of(world, f"{root}--3")[RESUMES_TAG] == "2"
    assert world.status(squatter)[0] == "InProgress"  # the stranger's job is left alone


def test_a_job_tagged_as_anothers_clone_is_resumed_as_its_own_root(world_factory: Any) -> None:
    """GIVEN a stranger's job tagged `sagequeue:clone-of=<victim>` (no seal that verifies),
    WHEN it fails on SageMaker's side,
    THEN its resume is named after itself, not `<victim>--2`, so the victim's own resume keeps its name."""
    world = world_factory(max_resumes=2, resume_after_failure_min_runtime_seconds=600)
    victim, poser = unique("victim"), unique("poser")
    start(world, victim, env={"SAGEQUEUE_SIM_DURATION": "90000"})
    start(
        world, poser, env=fail_after(900), tags={"team": "nlp", CLONE_OF_TAG: victim, CLONE_ATTEMPT_TAG: "1"}
    )
    fail_all(world, poser)
    assert f"{victim}--2" not in names(world)
    assert f"{poser}--2" in names(world)
    assert tags_of(world, f"{poser}--2")[CLONE_OF_TAG] == poser


# --- spot ---------------------------------------------------------------------------------------------------


def test_a_spot_job_interrupted_too_often_is_stopped_and_cloned_without_spot(world_factory: Any) -> None:
    world = world_factory(max_spot_interruptions=2)
    name = unique("spotty")
    start(
        world,
        name,
        env={"SAGEQUEUE_SIM_DURATION": "3000", "SAGEQUEUE_SIM_OUTCOME": "Interrupted:5"},
        EnableManagedSpotTraining=True,
        StoppingCondition={"MaxRuntimeInSeconds": 86400, "MaxWaitTimeInSeconds": 172800},
    )
    replaced = None
    for _ in range(40):
        world.advance(120)
        for event in world.take_events(name):
            outcome = world.governance.on_event(event)
            world.governance.on_event(event)
            replaced = replaced or outcome.clone
        if replaced:
            break
    assert replaced == f"{name}--2"
    described = world.sagemaker.describe_training_job(TrainingJobName=name)
    interruptions = [t for t in described["SecondaryStatusTransitions"] if t["Status"] == "Interrupted"]
    assert len(interruptions) == 3
    assert described["TrainingJobStatus"] in ("Stopping", "Stopped")
    clone = world.sagemaker.describe_training_job(TrainingJobName=replaced)
    assert clone.get("EnableManagedSpotTraining") is False
    assert "MaxWaitTimeInSeconds" not in clone["StoppingCondition"]
    assert [n for n in names(world) if n.startswith(name)] == [name, replaced]
    assert tags_of(world, replaced)[RESUMES_TAG] == "0"


# --- reconcile ----------------------------------------------------------------------------------------------


def test_the_timer_deletes_orphan_alarms_and_creates_missing_ones(world: World) -> None:
    lost, ended = unique("lost"), unique("ended")
    start(world, lost, env={"SAGEQUEUE_SIM_DURATION": "90000"})
    start(world, ended, env={"SAGEQUEUE_SIM_DURATION": "60"})
    world.advance(200)
    for event in world.take_events(ended):
        world.governance.on_event(event)
    assert world.alarm_names(f"sagequeue-idle-{ended}/") == [f"sagequeue-idle-{ended}/algo-1"]
    world.take_events()  # the lost job's events, and the end of the other, never reach governance
    world.advance(200)
    world.take_events()
    assert world.status(ended)[0] == "Completed"

    report = world.governance.reconcile()
    assert f"sagequeue-idle-{ended}/algo-1" in report.orphans_deleted
    assert world.alarm_names(f"sagequeue-idle-{ended}/") == []
    assert world.alarm_names(f"sagequeue-idle-{lost}/") == [f"sagequeue-idle-{lost}/algo-1"]

    # an hour into training (two idle windows) the silence alarm joins; a second run changes nothing
    world.advance(3600)
    world.take_events()
    world.governance.reconcile()
    again = world.governance.reconcile()
    assert world.alarm_names(f"sagequeue-idle-{lost}/") == [
        f"sagequeue-idle-{lost}/algo-1",
        f"sagequeue-idle-{lost}/algo-1/no-data",
    ]
    assert all(not o.alarms_created for o in again.outcomes)
    assert again.orphans_deleted == []
    assert TRN1  # the pool the jobs ran in


def test_a_queued_spot_job_interrupted_too_often_goes_back_to_the_queue_on_demand(world_factory: Any) -> None:
    world = world_factory(max_spot_interruptions=1)
    name = unique("queued-spot")
    spot = {
        "EnableManagedSpotTraining": True,
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400, "MaxWaitTimeInSeconds": 172800},
    }
    request = training_request(
        name, env={"SAGEQUEUE_SIM_DURATION": "3000", "SAGEQUEUE_SIM_OUTCOME": "Interrupted:4"}, **spot
    )
    world.sagemaker.create_training_job(**request)
    job = Job(
        name=name,
        request=request,
        priority=1,
        owner="arn:aws:iam::123456789012:user/erin",
        submitted_at=world.clock.now(),
    )
    job.state, job.attempt, job.training_job_name, job.started_at = (
        JobState.RUNNING,
        1,
        name,
        world.clock.now(),
    )
    world.deps.store.create_job(job)

    outcomes = []
    for _ in range(30):
        world.advance(120)
        outcomes += world.govern_pending(name)
        if any(o.requeued for o in outcomes):
            break
    stored = world.deps.store.get_job(name)
    assert stored.state is JobState.PREEMPTING
    assert stored.stop_reason is StopReason.PREEMPTED
    assert stored.request["EnableManagedSpotTraining"] is False
    assert "MaxWaitTimeInSeconds" not in stored.request["StoppingCondition"]
    assert (stored.reason or "").endswith("restarted without spot")
    assert world.status(name)[0] == "Stopping"
    # the queue starts its next attempt: governance clones nothing around it
    assert [n for n in names(world) if n.startswith(name)] == [name]
    assert all(o.clone is None for o in outcomes)


def test_a_former_attempt_of_a_queue_entry_is_left_to_the_queue(world: World) -> None:
    # GIVEN a queue entry, and an attempt the scheduler started (tagged with its entry and sealed) that is
    # no longer the entry's current one
    name = unique("attempt")
    entry = Job(
        name=name,
        request=training_request(name),
        priority=1,
        owner="arn:aws:iam::123456789012:user/erin",
        submitted_at=world.clock.now(),
        attempt_secret="entry-secret",
    )
    world.deps.store.seed_pools({TRN1: 4})
    world.deps.store.create_job(entry)
    former = f"{name}--1x0123456789ab"
    seal = entry.seal(former)
    assert seal is not None
    tags = {"team": "nlp", JOB_TAG: name, ATTEMPT_TAG: "1", SEAL_TAG: seal}
    start(world, former, env=fail_after(900), tags=tags)
    world.advance(1500)
    assert world.status(former)[0] == "Failed"
    # WHEN its transient failure reaches governance
    outcomes = world.govern_pending(former)
    # THEN nothing is cloned into the names the queue's next attempts will take
    assert all(o.clone is None for o in outcomes)
    assert [n for n in names(world) if n.startswith(name)] == [former]


def test_a_job_merely_tagged_as_a_queue_entrys_attempt_is_resumed_as_started_outside_the_queue(
    world: World,
) -> None:
    # GIVEN a queue entry, and a job started outside the queue that someone tagged as an attempt of it
    # (anyone allowed AddTags can), without the attempt's seal
    name = unique("entry")
    world.deps.store.seed_pools({TRN1: 4})
    world.deps.store.create_job(
        Job(
            name=name,
            request=training_request(name),
            priority=1,
            owner="arn:aws:iam::123456789012:user/erin",
            submitted_at=world.clock.now(),
            attempt_secret="entry-secret",
        )
    )
    outside = unique("byhand")
    tags = {"team": "nlp", JOB_TAG: name, ATTEMPT_TAG: "1", SEAL_TAG: "forged"}
    start(world, outside, env=fail_after(900), tags=tags)
    world.advance(1500)
    assert world.status(outside)[0] == "Failed"
    # WHEN its transient failure reaches governance
    outcomes = world.govern_pending(outside)
    # THEN the tag does not make it the queue's: it is resumed as any job started outside the queue
    assert any(o.clone for o in outcomes)
