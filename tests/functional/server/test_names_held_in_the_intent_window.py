"""A training job someone else created under the name of a job's next attempt, met in the moment between the
scheduler's intent (which records that name as the job's attempt) and its refused CreateTrainingJob: what
governance does about the stranger's job must not land on the queued job, while what the job's owner does
about the job (a cancel) still does."""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import boto3
from conftest import SUBMITTER, LambdaContext, QueueWorld, load_handler, make_world, training_request

from sagequeue_core.alarms import CloudWatchAlarms


@contextlib.contextmanager
def during_the_first_create(world: QueueWorld, act: Callable[[], None]) -> Iterator[list[str]]:
    """Run `act` once, to its end, right before the scheduler's first CreateTrainingJob reaches SageMaker
    (its intent is written): another function's invocation, or a user's request, landing in that moment. It
    runs on a thread of its own, as another invocation would (so its calls are judged as its own)."""
    ran: list[str] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            act()
        except BaseException as exc:
            failed.append(exc)

    def hook(params: dict[str, Any], **_: Any) -> None:
        if not ran:
            ran.append(str(params["TrainingJobName"]))
            other = threading.Thread(target=run)
            other.start()
            other.join()

    client = world.deps.sagemaker.client
    client.meta.events.register("before-parameter-build.sagemaker.CreateTrainingJob", hook)
    try:
        yield ran
        if failed:
            raise failed[0]
    finally:
        client.meta.events.unregister("before-parameter-build.sagemaker.CreateTrainingJob", hook)


def _world(moto_endpoint: str) -> Iterator[QueueWorld]:
    # Governance stops any training job that may run longer than two hours (the stack's MaxRuntimeSeconds).
    for world in make_world(moto_endpoint, settings={"max_runtime_seconds": 7200}):
        world.deps.alarms = CloudWatchAlarms(
            boto3.client("cloudwatch", endpoint_url=moto_endpoint, region_name="us-east-1")
        )
        yield world


def _stranger_training(world: QueueWorld, name: str) -> dict[str, Any]:
    """Someone creates a training job by hand under `name`, breaking the runtime rule; its InProgress event
    is late (governance has not seen it yet). Returns that event."""
    request = training_request(name, duration=3600)
    request.pop("priority", None)
    world.sagemaker().create_training_job(**request)
    world.emulator.advance(60)
    events = [
        e
        for e in world.take_sagemaker_events()
        if e["detail"]["TrainingJobName"] == name and e["detail"]["TrainingJobStatus"] == "InProgress"
    ]
    assert events, "the stranger's job sent no InProgress event"
    return events[-1]


def _ours(name: str) -> dict[str, Any]:
    request = training_request(name, duration=600)
    request["StoppingCondition"] = {"MaxRuntimeInSeconds": 3600}  # within the rule
    return request


def test_a_policy_stop_of_the_stranger_holding_the_name_does_not_fail_the_queued_job(
    moto_endpoint: str,
) -> None:
    worlds = _world(moto_endpoint)
    world = next(worlds)
    try:
        # GIVEN a stranger's rule-breaking training job holds the name of a job's first attempt
        event = _stranger_training(world, "held")
        governance = load_handler("governance")
        stopped: list[Any] = []

        # WHEN governance handles the stranger's late event in the moment the scheduler has recorded the
        # attempt under that name and its create is on its way (to be refused: the name is taken)
        def govern() -> None:
            stopped.append(governance.handler(event, LambdaContext())["stopped"])

        with during_the_first_create(world, govern) as ran:
            status, _ = world.api("POST", "/jobs", _ours("held"))
        assert status in (200, 201, 202)
        assert ran == ["held"]

        # THEN governance stopped the stranger's job for its own breach
        assert stopped
        assert stopped[0] is not None
        assert "policy violation" in stopped[0]
        assert world.sagemaker().describe_training_job(TrainingJobName="held")["TrainingJobStatus"] in (
            "Stopping",
            "Stopped",
        )
        # AND the queued job, which broke no rule, is not stopped for it: its attempt took a fallback name,
        # costing it no attempt, and nothing in its history speaks of a policy stop
        job = world.job("held")
        assert job["state"] == "starting", job
        assert re.fullmatch("held--1x[0-9a-f]{12}", job["training_job_name"])
        assert job["attempt"] == 1
        assert not [h for h in job["history"] if "policy" in str(h.get("reason"))], job["history"]
        # AND it runs to its end once the stranger's stop has gone through (its events change nothing)
        world.run_until(lambda: world.state("held") == "completed")
        assert world.job("held")["attempt"] == 1
    finally:
        next(worlds, None)


def test_a_cancel_in_that_moment_still_cancels_the_job(moto_endpoint: str) -> None:
    worlds = _world(moto_endpoint)
    world = next(worlds)
    try:
        # GIVEN a stranger's training job holds the name of a job's first attempt
        _stranger_training(world, "quit")

        # WHEN the job's owner cancels it while its intent is written and the create on its way
        def cancel() -> None:
            assert world.api("DELETE", "/jobs/quit", caller=SUBMITTER)[0] == 200

        with during_the_first_create(world, cancel) as ran:
            world.api("POST", "/jobs", _ours("quit"))
        assert ran == ["quit"]

        # THEN the job ends cancelled, and no attempt of it was created under any name
        assert world.state("quit") == "cancelled"
        world.run(600)
        assert world.state("quit") == "cancelled"
        names = [s["TrainingJobName"] for s in world.sagemaker().list_training_jobs()["TrainingJobSummaries"]]
        assert names == ["quit"]
    finally:
        next(worlds, None)
