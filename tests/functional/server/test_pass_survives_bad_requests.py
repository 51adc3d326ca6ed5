"""A request that SageMaker's model refuses at create time fails its own job, with the reason, and never
aborts the pass: every other job is still scheduled (#15, point 1)."""

from __future__ import annotations

import pytest
from conftest import SUBMITTER, QueueWorld, training_request

from sagequeue_core.domain import Job


@pytest.mark.parametrize(
    ("spoil", "named"),
    [
        pytest.param({"HyperParameters": {"epochs": 3}}, "HyperParameters.epochs", id="int-hyperparameter"),
        pytest.param({"NotAMember": True}, "NotAMember", id="unknown-member"),
        pytest.param({"StoppingCondition": {"MaxRuntimeInSeconds": 60.5}}, "MaxRuntimeInSeconds", id="float"),
    ],
)
def test_a_stored_request_botocore_refuses_fails_alone_and_the_pass_goes_on(
    world: QueueWorld, spoil: dict[str, object], named: str
) -> None:
    # GIVEN a queued job whose stored request botocore refuses (stored before the API validated it), ahead
    # of a valid job in the same pool
    request = training_request("stored-bad")
    request.pop("priority", None)
    request.update(spoil)
    world.deps.ensure_pools()
    world.deps.store.create_job(
        Job(name="stored-bad", request=request, priority=900, owner=SUBMITTER, submitted_at=world.clock.now())
    )
    world.submit("fine", priority=1)

    # WHEN the scheduler runs a pass
    world.timer()

    # THEN the bad job fails naming the member, the good one starts, and nothing reached SageMaker for the
    # bad one
    bad = world.job("stored-bad")
    assert bad["state"] == "failed"
    assert named in bad["reason"]
    assert any("stored-bad" in report["failed"] for report in world.reports)
    assert world.state("fine") == "starting"
    names = [s["TrainingJobName"] for s in world.sagemaker().list_training_jobs()["TrainingJobSummaries"]]
    assert names == ["fine"]
