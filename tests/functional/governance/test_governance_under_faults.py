"""Governance when EventBridge loses SageMaker's events and SageMaker answers 5xx (the AWS profile's
faults, made certain here): an untagged job is still stopped, and an idle job still gets the alarms that
stop it, within two runs of the reconcile timer (rate(5 minutes), docs/guardrails.md): the first run may
meet the 5xx, the second governs."""

from __future__ import annotations

import pytest
from botocore.config import Config
from governance_world import World, training_request, unique

from sagequeue_core.events import EventType

RECONCILE_SECONDS = 300  # GovernanceReconcileSchedule, rate(5 minutes)


@pytest.fixture(autouse=True)
def one_try(world: World) -> None:
    """botocore's retries sleep in real time: governance gets one try per call, so one 5xx stands for a
    call whose every retry failed."""
    world.deps.sagemaker.client = world.emulator.client(config=Config(retries={"total_max_attempts": 1}))


def test_lost_events_and_a_5xx_delay_the_stop_of_an_untagged_job_by_one_reconcile_at_most(
    world: World,
) -> None:
    untagged, tagged = unique("untagged"), unique("tagged")
    world.sagemaker.create_training_job(
        **training_request(untagged, tags={}, env={"SAGEQUEUE_SIM_DURATION": "90000"})
    )
    world.sagemaker.create_training_job(**training_request(tagged, env={"SAGEQUEUE_SIM_DURATION": "90000"}))
    # GIVEN every event of both jobs is lost on its way to governance
    world.advance(RECONCILE_SECONDS)
    world.take_events()
    assert world.status(untagged)[0] == "InProgress"
    # WHEN the first reconcile meets SageMaker answering 500 to DescribeTrainingJob, every retry included
    world.emulator.fail_next("DescribeTrainingJob", code="InternalFailure", times=1)
    first = world.governance.reconcile()
    # THEN the job it could not describe is left for the next run, and the others are governed
    assert len(first.skipped) == 1
    governed = {o.training_job_name: o for o in first.outcomes}
    assert set(governed) | set(first.skipped) == {untagged, tagged}
    # AND the next reconcile, one period later, stops the untagged job and gives the tagged one its alarms
    world.advance(RECONCILE_SECONDS)
    world.take_events()
    world.governance.reconcile()
    assert world.status(untagged)[0] == "Stopping"
    assert world.deps.store.get_claim("governance-policy-stop", untagged) is not None
    assert world.status(tagged)[0] == "InProgress"
    assert world.alarm_names(f"sagequeue-idle-{tagged}/") == [f"sagequeue-idle-{tagged}/algo-1"]
    (violation,) = [
        d for d in world.publisher.of_type(EventType.POLICY_VIOLATION) if d["training_job_name"] == untagged
    ]
    assert violation["rules"] == ["required_tags"]


def test_the_alarms_of_a_job_whose_describe_fails_are_not_taken_for_orphans(world: World) -> None:
    name = unique("training")
    world.sagemaker.create_training_job(**training_request(name, env={"SAGEQUEUE_SIM_DURATION": "90000"}))
    world.advance(RECONCILE_SECONDS)
    world.take_events()
    world.governance.reconcile()
    alarms = world.alarm_names(f"sagequeue-idle-{name}/")
    assert alarms == [f"sagequeue-idle-{name}/algo-1"]
    # WHEN SageMaker cannot describe the job during a reconcile
    world.emulator.fail_next("DescribeTrainingJob", code="ServiceUnavailable", times=1)
    report = world.governance.reconcile()
    # THEN its idle alarms stay: the job still trains, and only they can stop it when it idles
    assert report.skipped == [name]
    assert report.orphans_deleted == []
    assert world.alarm_names(f"sagequeue-idle-{name}/") == alarms
