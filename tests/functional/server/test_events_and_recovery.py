"""Events arrive duplicated, out of order, late or never; the scheduler may crash between SageMaker and
DynamoDB. None of it may lose or double-start a job."""

from __future__ import annotations

import contextlib
import random
import re
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import TRN1, QueueWorld, make_world, training_request

from sagequeue.local.emulator.events import state_change_event
from sagequeue_core.defaults import INTENT_IN_FLIGHT_SECONDS, QUOTA_MEMORY_SECONDS
from sagequeue_core.domain import attempt_name


class Crash(BaseException):
    """The scheduler's process dying between two calls (not an error any code path could catch)."""


@contextlib.contextmanager
def crash_after(world: QueueWorld, operation: str, *, when: str = "after") -> Iterator[None]:
    """The process dies right after (or before) the next SageMaker `operation`: nothing that follows runs."""
    sagemaker = world.deps.sagemaker.client
    fired: dict[str, bool] = {}

    def crash(**_: Any) -> None:
        if not fired:
            fired["once"] = True
            raise Crash(f"the process died {when} {operation}")

    event = f"{when}-call.sagemaker.{operation}"
    sagemaker.meta.events.register(event, crash)
    try:
        yield
    finally:
        sagemaker.meta.events.unregister(event, crash)


def _status(event: dict[str, Any]) -> tuple[str, str]:
    return event["detail"]["TrainingJobStatus"], event["detail"]["SecondaryStatus"]


def test_duplicated_and_reordered_events_change_nothing_twice(world: QueueWorld) -> None:
    # GIVEN a job whose every SageMaker event was collected but not yet delivered
    world.submit("solo", duration=120)
    world.take_sagemaker_events()
    world.emulator.advance(600)
    events = world.take_sagemaker_events()
    assert _status(events[-1]) == ("Completed", "Completed")

    # WHEN they arrive shuffled, each twice
    shuffled = events + events
    random.Random(7).shuffle(shuffled)
    world.deliver(shuffled)

    # THEN the job completed exactly once and never went back
    job = world.job("solo")
    assert job["state"] == "completed"
    states = [h["state"] for h in job["history"]]
    assert states.count("completed") == 1
    assert states[-1] == "completed"
    assert len(world.sagemaker().list_training_jobs()["TrainingJobSummaries"]) == 1


def test_the_end_arriving_before_the_start_is_still_applied(world: QueueWorld) -> None:
    world.submit("quick", duration=60)
    world.take_sagemaker_events()
    world.emulator.advance(600)
    events = world.take_sagemaker_events()

    world.deliver(list(reversed(events)))

    job = world.job("quick")
    assert job["state"] == "completed"
    assert [h["state"] for h in job["history"]] == ["queued", "starting", "completed"]


def test_a_late_event_of_an_earlier_attempt_does_not_touch_the_current_one(world: QueueWorld) -> None:
    # GIVEN job1 was preempted (its first attempt Stopped) and resumed as job1-2
    world.submit("job1", priority=1, duration=1200)
    world.submit("job2", priority=1, duration=300)
    world.run(300)
    world.submit("job3", priority=5, duration=300)
    world.run(60)
    world.run_until(lambda: world.job("job1")["attempt"] == 2 and world.state("job1") == "running")
    attempt1 = world.sagemaker().describe_training_job(TrainingJobName="job1")
    assert attempt1["TrainingJobStatus"] == "Stopped"

    # WHEN the first attempt's Stopped event is delivered again, late and twice
    late = state_change_event(
        world.emulator.backend.describe("job1"),
        {"sagequeue:job": "job1", "sagequeue:attempt": "1"},
        world.clock.now(),
        region="us-east-1",
        account_id="123456789012",
    )
    world.deliver([late, late])

    # THEN the running second attempt is untouched
    job1 = world.job("job1")
    assert (job1["state"], job1["attempt"], job1["preemptions"]) == ("running", 2, 1)


def test_a_forged_failed_event_does_not_requeue_a_running_job(world: QueueWorld) -> None:
    # GIVEN a job running on SageMaker
    world.submit("steady", priority=1, duration=3600)
    world.run_until(lambda: world.state("steady") == "running")
    # WHEN an event claims its attempt failed with a retryable error (SageMaker says it still trains)
    forged = dict(world.emulator.backend.describe("steady"))
    forged.update(
        TrainingJobStatus="Failed",
        SecondaryStatus="Failed",
        FailureReason="InternalServerError: forged",
    )
    event = state_change_event(
        forged,
        {"sagequeue:job": "steady", "sagequeue:attempt": "1"},
        world.clock.now(),
        region="us-east-1",
        account_id="123456789012",
    )
    world.deliver([event])
    # THEN the scheduler asked SageMaker, which still runs it: one live attempt, the job still running
    job = world.job("steady")
    assert (job["state"], job["attempt"], job["retries"]) == ("running", 1, 0)
    live = world.sagemaker().list_training_jobs(StatusEquals="InProgress")["TrainingJobSummaries"]
    assert [s["TrainingJobName"] for s in live] == ["steady"]


def test_a_duplicated_stop_after_preemption_does_not_cancel_the_requeued_job(world: QueueWorld) -> None:
    # GIVEN job1 is preempted and its Stopped event is applied: the job is queued again
    world.submit("job1", priority=1, duration=1200)
    world.submit("job2", priority=1, duration=1200)
    world.run(300)
    world.submit("job3", priority=5, duration=300)
    world.emulator.advance(120 + 20 + 10)  # SageMaker's stop grace, the upload, the event's delay
    events = world.take_sagemaker_events()
    stopped = [e for e in events if _status(e)[0] == "Stopped"]
    assert {e["detail"]["TrainingJobName"] for e in stopped} == {"job1"}
    world.deliver(events)
    assert world.state("job1") == "queued"

    # WHEN the same Stopped event comes again
    world.deliver(stopped)

    # THEN job1 stays queued with one preemption (a stop nobody asked for would have cancelled it)
    job1 = world.job("job1")
    assert (job1["state"], job1["preemptions"]) == ("queued", 1)


def test_a_lost_event_only_delays_the_job(world: QueueWorld) -> None:
    # GIVEN every SageMaker event of a job is lost
    world.submit("lost", duration=120)
    world.emulator.advance(600)
    world.take_sagemaker_events()
    assert world.state("lost") == "starting"

    # WHEN the one-minute timer reconciles
    report = world.timer()

    # THEN DescribeTrainingJob's view is applied
    assert "lost: completed" in report["applied"]
    assert world.state("lost") == "completed"


def test_a_crash_after_create_leaves_a_live_entry_that_counts_the_instances(moto_endpoint: str) -> None:
    world_iter = make_world(moto_endpoint, capacity={TRN1: 1})
    world = next(world_iter)
    try:
        # GIVEN the scheduler dies right after CreateTrainingJob, with another job waiting for the instance
        with crash_after(world, "CreateTrainingJob"), pytest.raises(Crash):
            world.api("POST", "/jobs", training_request("fragile", duration=120))
        world.submit("next", duration=120)
        # THEN the intent written before the create counts the attempt: the next pass does not overbook
        job = world.job("fragile")
        assert (job["state"], job["attempt"], job["training_job_name"]) == ("starting", 1, "fragile")
        report = world.timer()
        assert report["started"] == []
        assert world.state("next") == "queued"
        assert world.emulator.instances_in_use().get(TRN1, 0) == 1
        world.run_until(lambda: world.state("next") == "completed")
        assert world.state("fragile") == "completed"
        assert len(world.sagemaker().list_training_jobs()["TrainingJobSummaries"]) == 2
    finally:
        next(world_iter, None)


def test_a_crash_between_the_intent_and_the_create_requeues_the_job(world: QueueWorld) -> None:
    # GIVEN the scheduler dies after recording the start and before CreateTrainingJob reached SageMaker
    with crash_after(world, "CreateTrainingJob", when="before"), pytest.raises(Crash):
        world.api("POST", "/jobs", training_request("fragile", duration=120))
    assert world.state("fragile") == "starting"
    assert world.sagemaker().list_training_jobs()["TrainingJobSummaries"] == []

    # WHEN the timer reconciles at once: the pass that wrote the intent may still be inside its create
    report = world.timer()
    assert "fragile: not created yet; its pass may be inside the create" in report["applied"]
    assert world.state("fragile") == "starting"
    # AND once no create can be in flight any more, SageMaker still has no such attempt
    world.emulator.advance(INTENT_IN_FLIGHT_SECONDS)
    report = world.timer()

    # THEN the job goes back to the queue and its next attempt starts under a new name
    assert "fragile: queued" in report["applied"]
    world.run_until(lambda: world.state("fragile") == "completed")
    names = [s["TrainingJobName"] for s in world.sagemaker().list_training_jobs()["TrainingJobSummaries"]]
    assert names == [attempt_name("fragile", 2)]


def test_a_training_job_of_the_same_name_not_started_by_the_queue_makes_the_attempt_choose_another(
    world: QueueWorld,
) -> None:
    # GIVEN someone created a training job by hand under the name the queue's first attempt will use
    request = training_request("taken", duration=60)
    request.pop("priority", None)
    world.sagemaker().create_training_job(**request)
    world.emulator.advance(600)
    world.take_sagemaker_events()

    # WHEN the job is submitted
    world.api("POST", "/jobs", training_request("taken", duration=60))

    # THEN its first attempt starts under a fallback name (a reserved form no submission can take, with a
    # random part nobody can create ahead) instead of failing or adopting the stranger's job, which is left
    # as it was; the stranger costs the job no attempt
    job = world.job("taken")
    assert job["state"] == "starting"
    assert re.fullmatch("taken--1x[0-9a-f]{12}", job["training_job_name"])
    assert job["attempt"] == 1
    tags = world.sagemaker().list_tags(
        ResourceArn=world.sagemaker().describe_training_job(TrainingJobName="taken")["TrainingJobArn"]
    )["Tags"]
    assert not [tag for tag in tags if tag["Key"].startswith("sagequeue:")]


def test_a_throttled_create_leaves_the_job_queued_and_it_starts_later(world: QueueWorld) -> None:
    world.emulator.fail_next("CreateTrainingJob", "ThrottlingException")
    world.submit("patient", duration=60)
    assert world.state("patient") == "queued"
    assert "ThrottlingException" in world.reports[-1]["waiting"]["patient"]

    world.timer()

    assert world.state("patient") == "starting"
    # the deferred create's attempt number stays used: had it gone through, its job is stopped, never adopted
    assert world.job("patient")["attempt"] == 2


def test_a_quota_refusal_is_learned_and_the_configured_capacity_tried_again_later(world: QueueWorld) -> None:
    # GIVEN SageMaker refuses a start for the account's quota while the queue holds nothing in the pool
    world.emulator.fail_next("CreateTrainingJob", "ResourceLimitExceeded")
    world.submit("patient", duration=60)
    assert "ResourceLimitExceeded" in world.reports[-1]["waiting"]["patient"]
    # THEN the pool shows the quota it met, and passes plan with it instead of asking SageMaker again
    pool = world.api("GET", "/pools")[1]["pools"][0]
    assert pool["quota"] == 0
    assert "ResourceLimitExceeded" in pool["warning"]
    world.timer()
    assert world.state("patient") == "queued"
    assert "the account's quota allows 0" in world.job("patient")["reason"]
    # AND once the quota is old news the configured capacity is tried again: this time SageMaker accepts
    world.run(QUOTA_MEMORY_SECONDS + 60, step=60)
    assert world.job("patient")["attempt"] == 2  # the refused attempt's number stays used
    assert world.api("GET", "/pools")[1]["pools"][0]["quota"] is None


def test_a_preemption_whose_stop_failed_is_stopped_by_the_timer(world: QueueWorld) -> None:
    # GIVEN the stop that preempts job1 fails on SageMaker's side
    world.submit("job1", priority=1, duration=1200)
    world.submit("job2", priority=1, duration=1200)
    world.run(300)
    world.emulator.fail_next("StopTrainingJob", "InternalFailure")
    world.submit("job3", priority=5, duration=300)
    assert world.state("job1") == "preempting"
    sagemaker = world.sagemaker()
    assert sagemaker.describe_training_job(TrainingJobName="job1")["TrainingJobStatus"] == "InProgress"

    # WHEN the timer reconciles
    report = world.timer()

    # THEN the stop is repeated, and the preemption completes
    assert "job1: stop repeated" in report["applied"]
    world.run(180)  # SageMaker's 120 s stop grace, then the upload
    assert world.state("job1") == "queued"
    assert world.state("job3") in ("starting", "running")
