"""The HTTP API through the real handler: validation (400 naming the field, nothing stored), conflicts,
authorization by the caller's IAM identity, listing, cancel, hold, priority and pools."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    ADMIN,
    OTHER_USER,
    ROLE,
    SUBMITTER,
    SUBMITTER_ROLE,
    TRN1,
    TRN2,
    LambdaContext,
    QueueWorld,
    make_world,
    training_request,
)


@pytest.fixture
def governed(moto_endpoint: str) -> Iterator[QueueWorld]:
    yield from make_world(
        moto_endpoint, settings={"required_tags": "team,project=^[a-z-]+$", "max_runtime_seconds": 7200}
    )


def test_policy_rules_refuse_a_submission_naming_each_rule(governed: QueueWorld) -> None:
    body = training_request("ungoverned", tags={"team": "research", "project": "Not Valid"})

    status, answer = governed.api("POST", "/jobs", body)

    assert status == 400
    assert "policy required_tags" in answer["message"]
    assert "'project'" in answer["message"]
    assert "policy max_runtime_seconds" in answer["message"]
    assert governed.api("GET", "/jobs/ungoverned")[0] == 404


def test_only_an_admin_may_submit_an_exempt_job(world: QueueWorld) -> None:
    body = training_request("exempt", tags={"sagequeue:exempt": "true"})
    assert world.api("POST", "/jobs", body)[0] == 403
    assert world.api("POST", "/jobs", body, caller=ADMIN)[0] == 201


def test_submission_answers_201_with_the_job_and_a_duplicate_is_409(world: QueueWorld) -> None:
    status, job = world.api("POST", "/add-job", training_request("twice", priority=7))
    assert status == 201
    assert job["name"] == "twice"
    assert job["priority"] == 7
    assert job["pool"] == TRN1
    assert job["owner"] == SUBMITTER_ROLE, "the owner is the caller's role, from the request context"
    assert job["instances"] == 1

    status, answer = world.api("POST", "/jobs", training_request("twice", priority=1))
    assert (status, answer["code"]) == (409, "Conflict")
    assert world.job("twice")["priority"] == 7


def test_a_request_without_a_caller_identity_is_forbidden(world: QueueWorld) -> None:
    status, answer = world.api("POST", "/jobs", training_request("anonymous"), caller=None)
    assert (status, answer["code"]) == (403, "Forbidden")


def test_priority_comes_from_the_tag_when_the_body_has_none(world: QueueWorld) -> None:
    world.submit("tagged", tags={"team": "research", "priority": "42"})
    assert world.job("tagged")["priority"] == 42


def test_only_the_owner_or_an_admin_may_cancel_or_change_a_job(world: QueueWorld) -> None:
    world.submit("blocker1", duration=3600)
    world.submit("blocker2", duration=3600)
    world.submit("mine", duration=60)
    assert world.state("mine") == "queued"

    assert world.api("DELETE", "/jobs/mine", caller=OTHER_USER)[0] == 403
    assert world.api("PATCH", "/jobs/mine", {"priority": 9}, caller=OTHER_USER)[0] == 403
    # another role's session is not the owner
    stranger = SUBMITTER.replace("/ResearchTeam/", "/OtherTeam/")
    assert world.api("PATCH", "/jobs/mine", {"priority": 9}, caller=stranger)[0] == 403
    # the same role's next session (tomorrow's credentials, another session name) still owns the job
    tomorrow = SUBMITTER.replace("/research-session", "/research-session-tomorrow")
    status, job = world.api("PATCH", "/jobs/mine", {"priority": 9}, caller=tomorrow)
    assert (status, job["priority"]) == (200, 9)
    assert "mine" in [j["name"] for j in world.api("GET", "/jobs", caller=tomorrow)[1]["jobs"]]
    status, job = world.api("DELETE", "/jobs/mine", caller=ADMIN)
    assert (status, job["state"]) == (200, "cancelled")
    assert world.api("DELETE", "/jobs/mine")[0] == 409


def test_cancelling_a_running_job_stops_its_attempt(world: QueueWorld) -> None:
    world.submit("running", duration=3600)
    world.run(300)
    assert world.state("running") == "running"

    status, job = world.api("DELETE", "/jobs/running")

    assert (status, job["state"]) == (200, "stopping")
    world.run(120)
    assert world.state("running") == "stopping", "SIGTERM, then SageMaker's 120 s grace, then the upload"
    world.run(60)
    assert world.state("running") == "cancelled"
    sagemaker = world.sagemaker()
    assert sagemaker.describe_training_job(TrainingJobName="running")["TrainingJobStatus"] == "Stopped"


def test_hold_and_release_take_a_job_out_of_the_queue_and_back(world: QueueWorld) -> None:
    world.submit("blocker1", duration=600)
    world.submit("blocker2", duration=600)
    world.submit("later", duration=60)

    status, job = world.api("PATCH", "/jobs/later", {"held": True})
    assert (status, job["state"]) == (200, "held")
    assert world.api("GET", "/pools")[1]["pools"][0]["queued"] == 0
    world.run_until(lambda: world.state("blocker1") == "completed")
    world.run(60)
    assert world.state("later") == "held", "a held job does not start"

    status, job = world.api("PATCH", "/jobs/later", {"held": False})
    assert (status, job["state"]) == (200, "queued")
    assert world.state("later") == "starting", "its JobChanged event ran a pass at once"
    assert world.api("PATCH", "/jobs/later", {"held": True})[0] == 409


def test_raising_a_priority_moves_the_job_ahead_in_its_pool(world: QueueWorld) -> None:
    world.submit("blocker1", duration=3600)
    world.submit("blocker2", duration=3600)
    world.submit("first", duration=60)
    world.submit("second", duration=60)
    assert (world.job("first")["position"], world.job("second")["position"]) == (1, 2)

    world.api("PATCH", "/jobs/second", {"priority": 10})

    assert (world.job("first")["position"], world.job("second")["position"]) == (2, 1)


def test_listing_filters_by_state_pool_and_owner_and_pages(world: QueueWorld) -> None:
    for name in ("a1", "a2", "a3"):
        world.submit(name, duration=3600)
    world.api("POST", "/jobs", training_request("b1", duration=3600), caller=OTHER_USER)

    status, page = world.api("GET", "/jobs", query={"state": "queued"})
    assert status == 200
    assert [j["name"] for j in page["jobs"]] == ["a3", "b1"]

    status, page = world.api("GET", "/jobs")  # no filter: the caller's own jobs
    assert [j["name"] for j in page["jobs"]] == ["a1", "a2", "a3"]

    status, page = world.api("GET", "/jobs", query={"owner": OTHER_USER})
    assert [j["name"] for j in page["jobs"]] == ["b1"]

    status, first = world.api("GET", "/jobs", query={"pool": TRN1, "limit": "2"})
    assert [j["name"] for j in first["jobs"]] == ["a1", "a2"]
    assert first["next_token"]
    status, second = world.api(
        "GET", "/jobs", query={"pool": TRN1, "limit": "2", "next_token": first["next_token"]}
    )
    assert [j["name"] for j in second["jobs"]] == ["a3", "b1"]

    status, answer = world.api("GET", "/jobs", query={"state": "sleeping"})
    assert status == 400
    assert "state" in answer["message"]


def test_pools_capacity_is_set_by_admins_and_frees_room_at_once(world: QueueWorld) -> None:
    for name in ("p1", "p2", "p3"):
        world.submit(name, duration=3600)
    assert world.state("p3") == "queued"

    assert world.api("PUT", f"/pools/{TRN1}", {"capacity": 3})[0] == 403
    status, pool = world.api("PUT", f"/pools/{TRN1}", {"capacity": 3}, caller=ADMIN)
    assert status == 200
    assert pool["capacity"] == 3
    assert world.state("p3") == "starting", "the JobChanged event runs a pass"

    status, pool = world.api("PUT", f"/pools/{TRN2}", {"capacity": 1}, caller=ADMIN)
    assert (status, pool) == (
        200,
        {
            "instance_type": TRN2,
            "capacity": 1,
            "used": 0,
            "queued": 0,
            "warm": 0,
            "free": 1,
            "quota": None,
            "warm_quota": None,
            "warning": None,
        },
    )
    assert world.api("PUT", f"/pools/{TRN2}", {"capacity": -1}, caller=ADMIN)[0] == 400


def test_whoami_names_the_caller_and_whether_it_is_an_admin(world: QueueWorld) -> None:
    assert world.api("GET", "/whoami") == (200, {"arn": SUBMITTER, "admin": False})
    assert world.api("GET", "/whoami", caller=ADMIN) == (200, {"arn": ADMIN, "admin": True})


def test_an_unknown_job_is_404(world: QueueWorld) -> None:
    status, answer = world.api("GET", "/jobs/nobody")
    assert (status, answer["code"]) == (404, "NotFound")
    assert "nobody" in answer["message"]
    assert ROLE  # the allowed role is the one the requests use


def test_a_real_shaped_api_gateway_event_is_served(world: QueueWorld) -> None:
    event = json.loads(
        (Path(__file__).resolve().parents[2] / "events" / "apigw-rest-post-jobs.json").read_text()
    )

    answer = world.api_module.handler(event, LambdaContext())

    assert answer["statusCode"] == 201
    job = json.loads(answer["body"])
    assert (job["name"], job["priority"], job["state"]) == ("llama-ft-0412", 50, "queued")
    assert job["owner"] == "arn:aws:iam::123456789012:role/ResearchTeam"


def test_a_submission_survives_eventbridge_refusing_its_trigger(world: QueueWorld) -> None:
    # GIVEN EventBridge refuses every PutEvents call
    from botocore.exceptions import ClientError

    events = world.deps.publisher.client.meta.events

    def refuse(**_: Any) -> None:
        raise ClientError({"Error": {"Code": "InternalFailure", "Message": "unavailable"}}, "PutEvents")

    events.register("before-call.events.PutEvents", refuse)
    try:
        status, job = world.api("POST", "/jobs", training_request("unannounced", duration=60))
    finally:
        events.unregister("before-call.events.PutEvents", refuse)

    # THEN the job is queued all the same (the client must not retry into a 409), and the timer starts it
    assert (status, job["state"]) == (201, "queued")
    assert world.state("unannounced") == "queued"
    world.timer()
    assert world.state("unannounced") == "starting"


def test_a_cancel_racing_the_schedulers_write_is_applied_not_refused(world: QueueWorld) -> None:
    world.submit("racing", duration=3600)
    world.run(300)
    store = world.deps.store
    raced: list[str] = []

    def scheduler_writes_first(**_: Any) -> None:
        if raced:
            return
        raced.append("once")
        # the scheduler records something about the job between the API's read and its write
        job = store.get_job("racing")
        job.reason = "Training"
        store.save_job(job, was=job.state)

    store.client.meta.events.register("before-call.dynamodb.PutItem", scheduler_writes_first)
    try:
        status, job = world.api("DELETE", "/jobs/racing")
    finally:
        store.client.meta.events.unregister("before-call.dynamodb.PutItem", scheduler_writes_first)

    assert raced == ["once"]
    assert (status, job["state"]) == (200, "stopping")


def test_an_unknown_instance_type_gets_no_pool_and_the_answer_lists_the_valid_ones(world: QueueWorld) -> None:
    status, answer = world.api("PUT", "/pools/ml.bogus.huge", {"capacity": 1}, caller=ADMIN)
    assert status == 400
    message = answer["message"]
    assert message.startswith("pool 'ml.bogus.huge' is not a SageMaker training instance type; valid: ")
    valid = message.split("valid: ", 1)[1].split(", ")
    assert TRN1 in valid
    assert "ml.trn2.48xlarge" in valid
    assert valid[0].startswith("ml.trn")  # Trainium first
    assert "ml.bogus.huge" not in [p["instance_type"] for p in world.api("GET", "/pools")[1]["pools"]]
    # a real type that is not a training type (an endpoint's) is refused too
    assert world.api("PUT", "/pools/ml.t2.medium", {"capacity": 1}, caller=ADMIN)[0] == 400


def test_releasing_a_job_that_is_not_held_is_a_conflict_that_says_why(world: QueueWorld) -> None:
    world.submit("runs", duration=3600)
    world.submit("runs-too", duration=3600)
    world.submit("waits", duration=60)
    assert world.state("runs") == "starting"
    status, answer = world.api("PATCH", "/jobs/runs", {"held": False})
    assert status == 409
    assert answer["message"] == "only a held job can be released; 'runs' is starting"
    status, answer = world.api("PATCH", "/jobs/waits", {"held": False})
    assert (status, answer["message"]) == (409, "only a held job can be released; 'waits' is queued")
    assert world.state("waits") == "queued"
    # holding twice stays harmless; releasing the held job works once
    assert world.api("PATCH", "/jobs/waits", {"held": True})[0] == 200
    assert world.api("PATCH", "/jobs/waits", {"held": True})[0] == 200
    assert world.api("PATCH", "/jobs/waits", {"held": False})[0] == 200
    assert world.api("PATCH", "/jobs/waits", {"held": False})[0] == 409


def test_a_non_admin_may_not_go_above_the_priority_ceiling(moto_endpoint: str) -> None:
    for world in make_world(moto_endpoint, settings={"max_priority_for_non_admins": 100}):
        # GIVEN MaxPriorityForNonAdmins = 100
        # WHEN a non-admin submits at 1000, THEN it is refused and nothing is stored
        status, answer = world.api("POST", "/jobs", training_request("greedy", priority=1000))
        assert (status, answer["code"]) == (403, "Forbidden")
        assert "100" in answer["message"]
        assert world.api("GET", "/jobs/greedy")[0] == 404
        # the same through the priority tag
        tagged = training_request("greedy", tags={"team": "research", "priority": "500"})
        assert world.api("POST", "/jobs", tagged)[0] == 403
        # at the ceiling it is queued, and raising it above later is refused too
        world.submit("modest", priority=100)
        assert world.api("PATCH", "/jobs/modest", {"priority": 101})[0] == 403
        assert world.job("modest")["priority"] == 100
        # an admin may use the whole range
        status, job = world.api("POST", "/jobs", training_request("urgent", priority=1000), caller=ADMIN)
        assert (status, job["priority"]) == (201, 1000)
        assert world.api("PATCH", "/jobs/modest", {"priority": 900}, caller=ADMIN)[0] == 200
