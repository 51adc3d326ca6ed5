"""The local stack end to end, driven only through the public client (signed HTTP) and the SageMaker API.

GIVEN sagequeue's whole stack on the virtual clock (API, scheduler, governance and idle stop running the very
handlers Lambda runs, against moto and the SageMaker emulator),
WHEN jobs are submitted, changed and cancelled as users would,
THEN the queue goes through the source article's state tables step by step, reuses warm instances, stops an
idle job, and never loses a job or exceeds its capacity.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import urllib3

from sagequeue.client import Forbidden, QueueClient
from sagequeue.local import LocalStack

POOL = "ml.trn1.32xlarge"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/neuron-train:2.21"
FAST = {"provisioning_seconds": 60, "download_seconds": 10, "upload_seconds": 10}
LIVE = {"starting", "running", "preempting", "stopping"}


def start_stack(warm_pool_quota: int = 0, **settings: Any) -> LocalStack:
    """`warm_pool_quota`: what the account raised its warm-pool quota to (AWS's default is 0)."""
    values = {"capacity": {POOL: 2}, "min_runtime_before_preemption_seconds": 0, **settings}
    emulator = {**FAST, "warm_pool_limits": {POOL: warm_pool_quota}}
    return LocalStack(settings=values, emulator=emulator, function_logs=False).start()


@pytest.fixture
def stack() -> Iterator[LocalStack]:
    running = start_stack()
    yield running
    running.stop()


def request(
    stack: LocalStack, name: str, seconds: int, *, keep_alive: int = 0, outcome: str | None = None
) -> dict[str, Any]:
    environment = {"SAGEQUEUE_SIM_DURATION": str(seconds)}
    if outcome:
        environment["SAGEQUEUE_SIM_OUTCOME"] = outcome
    resources: dict[str, Any] = {"InstanceType": POOL, "InstanceCount": 1, "VolumeSizeInGB": 64}
    if keep_alive:
        resources["KeepAlivePeriodInSeconds"] = keep_alive
    return {
        "TrainingJobName": name,
        "RoleArn": stack.training_role_arn,
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": "s3://sagequeue-e2e/output"},
        "ResourceConfig": resources,
        "CheckpointConfig": {"S3Uri": f"s3://sagequeue-e2e/checkpoints/{name}"},
        "StoppingCondition": {"MaxRuntimeInSeconds": 7200},
        "Environment": environment,
    }


def table(queue: QueueClient) -> dict[str, str]:
    return {job.name: job.state for job in queue.jobs()}


def advance_until(
    stack: LocalStack,
    queue: QueueClient,
    done: Callable[[], bool],
    *,
    limit: int,
    step: int = 30,
    capacity: int = 2,
) -> None:
    """Advance the clock in steps until `done()`, checking at every step that the pool is never over capacity."""
    waited = 0
    while not done():
        assert waited < limit, f"not done after {limit} s; the queue: {table(queue)}"
        stack.advance(step)
        waited += step
        live = [job.name for job in queue.jobs() if job.state in LIVE]
        assert len(live) <= capacity, f"{len(live)} live jobs on {capacity} instances: {live}"


@pytest.mark.slow
def test_the_article_scenario_step_by_step(stack: LocalStack) -> None:
    queue = stack.client()
    # GIVEN capacity 2: job1 (priority 1), job2 (2), job3 (1) are submitted
    for name, priority, seconds in (("job1", 1, 600), ("job2", 2, 300), ("job3", 1, 120)):
        queue.submit(request(stack, name, seconds), priority=priority)
        stack.run_until_idle()
    advance_until(
        stack,
        queue,
        lambda: table(queue)["job1"] == "running" and table(queue)["job2"] == "running",
        limit=300,
    )
    # THEN the article's first table: job2 and job1 run, job3 waits
    assert table(queue) == {"job1": "running", "job2": "running", "job3": "queued"}
    assert queue.job("job3").position == 1

    # WHEN job4 (priority 3) arrives, job1 (the lowest) is preempted for it
    queue.submit(request(stack, "job4", 480), priority=3)
    stack.run_until_idle()
    assert table(queue)["job1"] == "preempting"
    advance_until(stack, queue, lambda: table(queue)["job4"] == "running", limit=300)
    # THEN the second table: job4 and job2 run, job1 is back in the queue (preempted), job3 waits
    assert table(queue) == {"job1": "queued", "job2": "running", "job3": "queued", "job4": "running"}
    job1 = queue.job("job1")
    assert job1.preemptions == 1
    assert job1.position == 1  # it keeps its place: submitted before job3, same priority

    # WHEN job2 finishes, THEN job1 resumes as a new attempt: the third table
    advance_until(stack, queue, lambda: table(queue)["job2"] == "completed", limit=600)
    advance_until(stack, queue, lambda: table(queue)["job1"] == "running", limit=300)
    assert table(queue) == {"job1": "running", "job2": "completed", "job3": "queued", "job4": "running"}
    job1 = queue.job("job1")
    assert job1.attempt == 2
    assert job1.attempts == ("job1", "job1--2")

    # WHEN job4 finishes, THEN job3 runs at last
    advance_until(stack, queue, lambda: table(queue)["job4"] == "completed", limit=900)
    advance_until(stack, queue, lambda: table(queue)["job3"] == "running", limit=300)
    assert table(queue) == {"job1": "running", "job2": "completed", "job3": "running", "job4": "completed"}

    # AND every job completes: nothing is lost
    advance_until(stack, queue, lambda: all(job.terminal for job in queue.jobs()), limit=1800)
    assert table(queue) == dict.fromkeys(("job1", "job2", "job3", "job4"), "completed")
    statuses = {
        summary["TrainingJobName"]: summary["TrainingJobStatus"]
        for summary in stack.sagemaker.list_training_jobs(MaxResults=100)["TrainingJobSummaries"]
    }
    assert statuses == {
        "job1": "Stopped",
        "job1--2": "Completed",
        "job2": "Completed",
        "job3": "Completed",
        "job4": "Completed",
    }
    assert stack.failures == []


def test_a_queued_job_reuses_warm_instances() -> None:
    stack = start_stack(capacity={POOL: 1}, warm_pool_quota=1)
    try:
        queue = stack.client()
        first, second = f"warm-a-{uuid.uuid4().hex[:4]}", f"warm-b-{uuid.uuid4().hex[:4]}"
        # GIVEN a running job that keeps its instances warm, and a queued job with the same resources
        queue.submit(request(stack, first, 120, keep_alive=600), priority=1)
        stack.run_until_idle()
        queue.submit(request(stack, second, 120), priority=1)
        stack.run_until_idle()
        assert table(queue) == {first: "starting", second: "queued"}
        # WHEN the first completes
        advance_until(stack, queue, lambda: table(queue)[first] == "completed", limit=600, capacity=1)
        advance_until(stack, queue, lambda: table(queue)[second] == "running", limit=300, capacity=1)
        # THEN the second starts on the first's warm instances
        previous = stack.sagemaker.describe_training_job(TrainingJobName=first)["WarmPoolStatus"]
        assert previous["Status"] == "Reused"
        assert previous["ReusedByJob"] == second
        assert (
            stack.sagemaker.describe_training_job(TrainingJobName=second)["WarmPoolStatus"]["Status"]
            == "InUse"
        )
        advance_until(stack, queue, lambda: table(queue)[second] == "completed", limit=600, capacity=1)
        assert stack.failures == []
    finally:
        stack.stop()


def test_an_idle_job_is_stopped_and_a_busy_one_is_not() -> None:
    stack = start_stack(idle_period_seconds=60, idle_periods=3)
    try:
        queue = stack.client()
        idle, busy = f"idle-{uuid.uuid4().hex[:4]}", f"busy-{uuid.uuid4().hex[:4]}"
        # GIVEN a job whose NeuronCores sit at 0% and one that trains
        queue.submit(request(stack, idle, 3600, outcome="Idle"), priority=1)
        queue.submit(request(stack, busy, 3600), priority=1)
        stack.run_until_idle()
        # WHEN the idle alarm's window passes
        advance_until(stack, queue, lambda: table(queue)[idle] == "idle_stopped", limit=1200)
        # THEN the idle job is stopped with the alarm's reason; the busy one keeps training
        stopped = queue.job(idle)
        assert stopped.reason is not None
        assert "idle" in stopped.reason
        assert table(queue)[busy] == "running"
        assert stack.sagemaker.describe_training_job(TrainingJobName=idle)["TrainingJobStatus"] == "Stopped"
        assert stack.invocations["IdleStopFunction"] >= 1
        assert stack.failures == []
    finally:
        stack.stop()


def test_cancelling_queued_and_running_jobs(stack: LocalStack) -> None:
    queue = stack.client()
    running_a, running_b, waiting = "cancel-run-a", "cancel-run-b", "cancel-wait"
    for name in (running_a, running_b, waiting):
        queue.submit(request(stack, name, 1800), priority=1)
        stack.run_until_idle()
    advance_until(stack, queue, lambda: table(queue)[running_a] == "running", limit=300)
    # WHEN a queued job is cancelled, THEN it leaves the queue at once and never runs
    assert queue.cancel(waiting).state == "cancelled"
    # WHEN a running job is cancelled, THEN its attempt is stopped, then the job is cancelled
    assert queue.cancel(running_a).state == "stopping"
    advance_until(stack, queue, lambda: table(queue)[running_a] == "cancelled", limit=300)
    assert stack.sagemaker.describe_training_job(TrainingJobName=running_a)["TrainingJobStatus"] == "Stopped"
    stack.advance(300)
    assert table(queue) == {running_a: "cancelled", running_b: "running", waiting: "cancelled"}
    names = {s["TrainingJobName"] for s in stack.sagemaker.list_training_jobs()["TrainingJobSummaries"]}
    assert waiting not in names


def test_raising_the_priority_of_a_queued_job_moves_it_ahead() -> None:
    # No preemption here: the change must reorder the queue, not stop running work.
    stack = start_stack(capacity={POOL: 1}, min_runtime_before_preemption_seconds=3600)
    try:
        queue = stack.client()
        for name in ("prio-running", "prio-first", "prio-second"):
            queue.submit(request(stack, name, 300), priority=1)
            stack.run_until_idle()
        assert [queue.job(n).position for n in ("prio-first", "prio-second")] == [1, 2]
        # WHEN the later job's priority is raised
        assert queue.set_priority("prio-second", 5).priority == 5
        stack.run_until_idle()
        # THEN it is first in line, and it is the one that starts when the instance frees up
        assert [queue.job(n).position for n in ("prio-second", "prio-first")] == [1, 2]
        assert table(queue)["prio-running"] in ("starting", "running")
        advance_until(
            stack, queue, lambda: table(queue)["prio-running"] == "completed", limit=900, capacity=1
        )
        stack.run_until_idle()
        assert table(queue)["prio-second"] in ("starting", "running")
        assert table(queue)["prio-first"] == "queued"
    finally:
        stack.stop()


def test_only_the_owner_or_an_admin_may_change_a_job(stack: LocalStack) -> None:
    owner, other, admin = stack.client(), stack.client("other"), stack.client("admin")
    job = owner.submit(request(stack, "owned", 600), priority=1)
    assert job.owner == stack.identity("user").arn
    with pytest.raises(Forbidden):
        other.cancel("owned")
    with pytest.raises(Forbidden):
        other.set_capacity(POOL, 5)
    assert admin.whoami().admin is True
    assert other.whoami().admin is False
    assert admin.set_priority("owned", 7).priority == 7
    assert admin.set_capacity(POOL, 3).capacity == 3


def test_the_api_refuses_unsigned_requests(stack: LocalStack) -> None:
    answer = urllib3.PoolManager().request("GET", stack.endpoint + "/jobs")
    assert answer.status == 403
    assert b"Missing Authentication Token" in answer.data
