"""When the region, not the pool, is short (docs/adr/0017-when-sagemaker-has-no-capacity.md): an attempt
SageMaker accepted but cannot launch says what it waits for, keeps its place in its pool, is the first
victim when a more important job needs the place, and is requeued, not failed, when SageMaker gives up."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from conftest import ACCOUNT, TRN1, QueueWorld, make_world, training_request

PLAN = f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:training-plan/research-a"


@pytest.fixture
def short(moto_endpoint: str) -> Iterator[QueueWorld]:
    # GIVEN a pool of 2 trn1 instances in a region that can launch only 1 of them for the account
    yield from make_world(moto_endpoint, capacity={TRN1: 2}, region_capacity={TRN1: 1})


def on_sagemaker(world: QueueWorld, name: str) -> tuple[str, str]:
    described = world.sagemaker().describe_training_job(TrainingJobName=name)
    return described["TrainingJobStatus"], described["SecondaryStatus"]


def test_a_job_waiting_for_ec2_capacity_says_so_and_keeps_its_place_in_the_pool(short: QueueWorld) -> None:
    world = short
    world.submit("first", duration=3600)
    world.submit("second", duration=3600)
    world.run(60)
    # THEN both are starting: SageMaker accepted both, but only one has instances
    assert on_sagemaker(world, "second") == ("InProgress", "Starting")
    job = world.job("second")
    assert job["state"] == "starting"
    assert job["reason"] == "waiting for EC2 capacity since 2026-03-02T09:00:00Z"
    assert job["capacity_wait"]["kind"] == "ec2"
    # AND it counts against its pool: the moment EC2 has the instance, it launches without a new decision
    pools = {p["instance_type"]: p for p in world.api("GET", "/pools")[1]["pools"]}
    assert pools[TRN1]["used"] == 2
    world.submit("third", duration=60)
    world.run(60)
    assert world.state("third") == "queued"
    # WHEN the first ends, the waiting one launches and no longer says it waits
    world.run_until(lambda: world.state("second") == "running", limit=3 * 3600)
    job = world.job("second")
    assert job["capacity_wait"] is None
    assert "EC2" not in (job["reason"] or "")


def test_a_lost_event_does_not_hide_the_wait(short: QueueWorld) -> None:
    world = short
    world.mangle = lambda events: [
        e for e in events if e["detail"].get("SecondaryStatus") != "Starting"
    ]  # EventBridge loses every Starting event
    world.submit("first", duration=3600)
    world.submit("second", duration=3600)
    world.run(120)  # the reconcile (once a minute) describes what is starting
    assert world.job("second")["reason"] == "waiting for EC2 capacity since 2026-03-02T09:00:00Z"


def test_a_more_important_job_takes_the_place_of_the_waiting_attempt_not_of_a_running_one(
    short: QueueWorld,
) -> None:
    world = short
    world.submit("a-running", duration=3600, priority=1)
    world.submit("b-waiting", duration=3600, priority=1)
    world.run(300)
    assert on_sagemaker(world, "a-running") == ("InProgress", "Training")
    assert world.job("b-waiting")["capacity_wait"] is not None
    # WHEN a more important job arrives
    world.submit("urgent", duration=600, priority=9)
    world.run(30)
    # THEN the attempt waiting for EC2 gives up its place (nothing launched, nothing lost); the running
    # one is left alone: its instances would go back to EC2, where the waiting attempt is ahead of urgent
    assert world.state("a-running") == "running"
    assert world.state("b-waiting") in ("preempting", "queued")
    world.run_until(lambda: world.state("urgent") in ("starting", "running"))
    assert world.state("a-running") == "running"
    # AND urgent runs as soon as EC2 has the instance back, before the job it displaced
    world.run_until(lambda: world.state("urgent") == "running", limit=3 * 3600)
    assert world.state("b-waiting") in ("queued", "starting"), "it has not launched before urgent"
    world.run_until(lambda: world.state("b-waiting") == "completed", limit=6 * 3600)
    assert world.job("b-waiting")["preemptions"] == 1


@pytest.fixture
def plan_short(moto_endpoint: str) -> Iterator[QueueWorld]:
    # GIVEN a plan pool of 2 whose plan, on SageMaker's side, has only 1 instance left
    for world in make_world(moto_endpoint, capacity={TRN1: 1, "plan:research-a": 2}):
        world.emulator.add_training_plan(PLAN, 1)
        yield world


def test_a_plan_job_waits_in_pending_with_its_reason_and_is_requeued_when_max_pending_ends(
    plan_short: QueueWorld,
) -> None:
    world = plan_short
    if True:

        def planned(name: str, duration: int) -> dict[str, Any]:
            body = training_request(name, duration=duration)
            body["ResourceConfig"]["TrainingPlanArn"] = PLAN
            body["StoppingCondition"]["MaxPendingTimeInSeconds"] = 7200
            return body

        for name, duration in (("holder", 10 * 3600), ("pending", 600)):
            status, body = world.api("POST", "/jobs", planned(name, duration))
            assert status == 201, body
        world.run(60)
        assert on_sagemaker(world, "pending") == ("InProgress", "Pending")
        job = world.job("pending")
        assert (job["state"], job["reason"]) == (
            "starting",
            "waiting for capacity in its training plan since 2026-03-02T09:00:00Z",
        )
        # WHEN MaxPendingTimeInSeconds runs out, SageMaker stops it (not a failure, not a cancel)
        world.run_until(lambda: world.job("pending")["capacity_requeues"] == 1, limit=3 * 3600)
        job = world.job("pending")
        assert job["state"] == "queued"
        assert job["history"][-1]["reason"] == (
            "requeued: its training plan had no capacity for it within MaxPendingTimeInSeconds"
        )
        assert job["retries"] == 0
