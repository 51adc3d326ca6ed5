"""Training plans are pools of their own: reserved capacity is counted apart from on-demand capacity."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import ACCOUNT, ADMIN, TRN1, QueueWorld, make_world, training_request

PLAN_A = f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:training-plan/research-a"
PLAN_B = f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:training-plan/research-b"


@pytest.fixture
def planned(moto_endpoint: str) -> Iterator[QueueWorld]:
    # GIVEN one on-demand trn1 instance and two training plans of the same type, of 2 and 1 instances
    yield from make_world(moto_endpoint, capacity={TRN1: 1, "plan:research-a": 2, "plan:research-b": 1})


def plan_request(name: str, plan: str, **kwargs: object) -> dict[str, object]:
    body = training_request(name, duration=3600, **kwargs)  # type: ignore[arg-type]
    body["ResourceConfig"]["TrainingPlanArn"] = plan  # type: ignore[index]
    return body


def test_jobs_on_two_plans_of_one_type_and_on_demand_are_counted_apart(planned: QueueWorld) -> None:
    for name, plan in (("a1", PLAN_A), ("a2", PLAN_A), ("a3", PLAN_A), ("b1", PLAN_B), ("b2", PLAN_B)):
        status, body = planned.api("POST", "/jobs", plan_request(name, plan))
        assert status == 201, body
        assert body["pool"] == "plan:" + plan.rsplit("/", 1)[1]
    planned.submit("od1", duration=3600)
    planned.submit("od2", duration=3600)
    # THEN each plan starts as many as it holds, and on-demand capacity is not used by plan jobs
    states = {name: planned.state(name) for name in ("a1", "a2", "a3", "b1", "b2", "od1", "od2")}
    assert states == {
        "a1": "starting",
        "a2": "starting",
        "a3": "queued",
        "b1": "starting",
        "b2": "queued",
        "od1": "starting",
        "od2": "queued",
    }
    pools = {p["instance_type"]: p for p in planned.api("GET", "/pools")[1]["pools"]}
    assert (pools["plan:research-a"]["used"], pools["plan:research-b"]["used"], pools[TRN1]["used"]) == (
        2,
        1,
        1,
    )


def test_a_plan_job_for_a_plan_without_a_pool_is_refused_by_name(planned: QueueWorld) -> None:
    other = f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:training-plan/someone-else"
    status, body = planned.api("POST", "/jobs", plan_request("stray", other))
    assert status == 400
    assert "TrainingPlanArn: plan:someone-else is not a pool" in body["message"]
    status, body = planned.api("POST", "/jobs", plan_request("bad", "arn:aws:sagemaker:nope"))
    assert status == 400
    assert "TrainingPlanArn" in body["message"]


def test_plan_pools_are_set_like_any_pool(planned: QueueWorld) -> None:
    status, pool = planned.api("PUT", "/pools/plan:research-b", {"capacity": 3}, caller=ADMIN)
    assert status == 200
    assert pool["capacity"] == 3
    assert planned.api("PUT", "/pools/plan:bad name", {"capacity": 3}, caller=ADMIN)[0] in (400, 404)
