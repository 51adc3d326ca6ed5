"""Training plans: a plan's jobs share its reserved instances and wait in Pending beyond them."""

from __future__ import annotations

from typing import Any

from sagequeue.local import SageMakerEmulator, VirtualClock
from tests.functional.emulator.conftest import TIMINGS

PLAN = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/reserved-trn1"
RUN = 120 + 30 + 600 + 20


def status(sagemaker: Any, name: str) -> tuple[str, str]:
    job = sagemaker.describe_training_job(TrainingJobName=name)
    return job["TrainingJobStatus"], job["SecondaryStatus"]


def planned(make_request: Any, name: str, **stopping: int) -> dict[str, Any]:
    request = make_request(name, ResourceConfig={"TrainingPlanArn": PLAN})
    request["StoppingCondition"].update(stopping)
    return request


def test_a_job_beyond_the_plans_instances_waits_in_pending_then_starts(
    clock: VirtualClock, make_request: Any
) -> None:
    events: list[dict[str, Any]] = []
    with SageMakerEmulator(clock=clock, on_event=events.append, **TIMINGS) as emulator:
        emulator.add_training_plan(PLAN, instance_count=1)
        sagemaker = emulator.client()
        sagemaker.create_training_job(**planned(make_request, "on-plan"))
        sagemaker.create_training_job(**planned(make_request, "waits"))
        sagemaker.create_training_job(**make_request("off-plan"))
        assert status(sagemaker, "on-plan") == ("InProgress", "Starting")
        assert status(sagemaker, "waits") == ("InProgress", "Pending")
        assert status(sagemaker, "off-plan") == ("InProgress", "Starting"), (
            "the region's capacity is separate"
        )
        emulator.advance(RUN - 1)
        assert status(sagemaker, "waits") == ("InProgress", "Pending")
        emulator.advance(1 + 10)
        assert status(sagemaker, "waits") == ("InProgress", "Starting")
        emulator.advance(120)
        described = sagemaker.describe_training_job(TrainingJobName="waits")
        assert [t["Status"] for t in described["SecondaryStatusTransitions"]] == [
            "Pending",
            "Starting",
            "Downloading",
        ]
    seen = [e["detail"]["SecondaryStatus"] for e in events if e["detail"]["TrainingJobName"] == "waits"]
    assert {"Pending", "Starting", "Downloading"} <= set(seen)


def test_max_pending_time_stops_the_waiting_job_as_aws_documents(
    clock: VirtualClock, make_request: Any
) -> None:
    """StoppingCondition: "The maximum length of time ... that a training job can be pending before it is
    stopped." Stopped, not Failed: no FailureReason, never launched, never billed."""
    with SageMakerEmulator(clock=clock, **TIMINGS) as emulator:
        emulator.add_training_plan(PLAN, instance_count=0)
        sagemaker = emulator.client()
        sagemaker.create_training_job(**planned(make_request, "starved", MaxPendingTimeInSeconds=7200))
        emulator.advance(7199)
        assert status(sagemaker, "starved") == ("InProgress", "Pending")
        emulator.advance(1)
        assert status(sagemaker, "starved") == ("Stopping", "Stopping")
        emulator.advance(TIMINGS.get("stop_grace_seconds", 120))
        job = sagemaker.describe_training_job(TrainingJobName="starved")
        assert (job["TrainingJobStatus"], job["SecondaryStatus"]) == ("Stopped", "Stopped")
        assert "FailureReason" not in job
        assert "MaxPendingTimeInSeconds" in job["SecondaryStatusTransitions"][-1]["StatusMessage"]
        assert "TrainingStartTime" not in job
        assert [t["Status"] for t in job["SecondaryStatusTransitions"]] == ["Pending", "Stopping", "Stopped"]


def test_growing_the_plan_starts_the_waiting_job(clock: VirtualClock, make_request: Any) -> None:
    with SageMakerEmulator(clock=clock, **TIMINGS) as emulator:
        emulator.add_training_plan(PLAN, instance_count=0)
        sagemaker = emulator.client()
        sagemaker.create_training_job(**planned(make_request, "patient"))
        emulator.advance(600)
        emulator.add_training_plan(PLAN, instance_count=4)
        assert status(sagemaker, "patient") == ("InProgress", "Starting")
