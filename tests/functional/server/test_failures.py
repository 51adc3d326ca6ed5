"""SageMaker's failures, each handled the way it deserves, and jobs started outside the queue."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import QueueWorld, make_world, training_request


@pytest.fixture
def two_attempts(moto_endpoint: str) -> Iterator[QueueWorld]:
    yield from make_world(moto_endpoint, settings={"max_attempts": 2, "retry_backoff_seconds": 300})


def test_capacity_failures_requeue_with_backoff_and_never_count_as_failures(two_attempts: QueueWorld) -> None:
    world = two_attempts
    world.submit("scarce", duration=60, outcome="CapacityError")

    # WHEN the first attempt fails for lack of EC2 capacity
    world.run_until(lambda: world.job("scarce")["capacity_requeues"] == 1)

    # THEN the job is queued again and waits out its backoff instead of retrying at once
    job = world.job("scarce")
    assert job["state"] == "queued"
    assert job["history"][-1]["reason"].startswith("requeued: SageMaker ran out of capacity: CapacityError")
    world.run(120)
    job = world.job("scarce")
    assert job["state"] == "queued"
    assert job["reason"].startswith("backing off until ")

    # WHEN capacity keeps failing past max_attempts (2), the job still waits its turn: scarcity is not a
    # fault of the job, so it backs off longer each time but never fails for it
    world.run_until(lambda: world.job("scarce")["capacity_requeues"] == 3, limit=12 * 3600)
    job = world.job("scarce")
    assert job["state"] in ("queued", "starting")
    assert job["retries"] == 0
    assert job["attempts"][:3] == ["scarce", "scarce--2", "scarce--3"]
    backoffs = [h for h in job["history"] if h["state"] == "queued" and h["reason"].startswith("requeued")]
    assert len(backoffs) == 3


def test_a_job_that_fails_on_its_own_is_not_retried(world: QueueWorld) -> None:
    world.submit(
        "buggy", duration=60, outcome="Failed:AlgorithmError: ModuleNotFoundError: No module named 'trn'"
    )
    world.run_until(lambda: world.state("buggy") == "failed")
    job = world.job("buggy")
    assert job["reason"].startswith("AlgorithmError")
    assert (job["attempt"], job["retries"]) == (1, 0)


def test_a_request_sagemaker_refuses_fails_the_job_with_sagemakers_message(world: QueueWorld) -> None:
    world.emulator.fail_next(
        "CreateTrainingJob", "ValidationException", message="The image is not in an allowed repository."
    )
    world.submit("refused", duration=60)
    job = world.job("refused")
    assert job["state"] == "failed"
    assert job["reason"] == "SageMaker refused the job: The image is not in an allowed repository."


def test_a_job_out_of_max_runtime_is_stopped_not_requeued(world: QueueWorld) -> None:
    body = training_request("overrun", duration=3600)
    body["StoppingCondition"] = {"MaxRuntimeInSeconds": 300}
    status, _ = world.api("POST", "/jobs", body)
    assert status == 201
    world.run_until(lambda: world.job("overrun")["ended_at"] is not None)
    job = world.job("overrun")
    assert job["state"] == "failed"
    assert job["reason"] == "stopped by SageMaker: MaxRuntimeExceeded"
    assert job["attempt"] == 1


def test_a_job_started_by_hand_on_a_managed_pool_counts_against_it(world: QueueWorld) -> None:
    # GIVEN someone starts a training job on the pool's instance type outside the queue
    manual = training_request("by-hand", duration=600)
    manual.pop("priority", None)
    world.sagemaker().create_training_job(**manual)
    world.deliver()
    status, pools = world.api("GET", "/pools")
    assert status == 200
    assert pools["pools"][0]["used"] == 1

    # WHEN two jobs are queued on that two-instance pool, only one fits
    world.submit("q1", duration=600)
    world.submit("q2", duration=600)
    assert (world.state("q1"), world.state("q2")) == ("starting", "queued")

    # THEN the second starts once the hand-started job has ended and no longer holds its instance
    world.run_until(lambda: world.state("q2") in ("starting", "running"), limit=3600)
    assert (
        world.sagemaker().describe_training_job(TrainingJobName="by-hand")["TrainingJobStatus"] == "Completed"
    )
