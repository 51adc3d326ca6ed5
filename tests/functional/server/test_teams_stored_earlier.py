"""Team quotas and jobs stored before the one rule for team names: names that rule now refuses ("none",
"-ops", a leading '_' or '.') were accepted by the API's path pattern before it, and a job's team tag could
hold any letters ("équipe"). What is in the table must keep working: the scheduler's pass, submissions,
`ls`, `sagequeue teams` (moto over HTTP, the table template.yaml declares, the SageMaker emulator)."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest
from conftest import ADMIN, SUBMITTER_ROLE, TRN1, QueueWorld, make_world, training_request

from sagequeue_core.domain import Job
from sagequeue_core.quotas import TeamQuota

#: Names the API's path pattern `^[A-Za-z0-9._-]{1,64}$` stored before the rule refused them.
EARLIER_NAMES = ("none", "-ops", "_infra")


@pytest.fixture
def world(moto_endpoint: str) -> Iterator[QueueWorld]:
    yield from make_world(moto_endpoint, capacity={TRN1: 4})


def _store_quota_as_before(world: QueueWorld, team: str, nominal: int) -> None:
    """The item PUT /teams/{team}/quotas wrote before the rule: the store's own layout, written raw
    because TeamQuota refuses the name now."""
    client = boto3.client("dynamodb", endpoint_url=world.deps.endpoints["dynamodb"], region_name="us-east-1")
    client.put_item(
        TableName=world.deps.settings.table_name,
        Item={
            "pk": {"S": "POOLS"},
            "sk": {"S": f"TEAM#{team}#{TRN1}"},
            "nominal": {"N": str(nominal)},
        },
    )


@pytest.mark.parametrize("team", EARLIER_NAMES)
def test_a_quota_stored_under_a_name_the_rule_now_refuses_keeps_the_queue_working(
    world: QueueWorld, team: str
) -> None:
    # GIVEN a quota stored before the rule, under a name it now refuses, beside one it accepts
    world.deps.store.set_team_quota(TeamQuota("vision", TRN1, 2))
    _store_quota_as_before(world, team, 2)
    # WHEN a job is submitted and the scheduler runs its pass
    world.submit("after-upgrade", tags={"team": "vision"}, caller=ADMIN)
    world.timer()
    # THEN the job starts, the pools still read, and `sagequeue teams` still answers
    assert world.state("after-upgrade") == "starting"
    status, body = world.api("GET", "/teams", caller=ADMIN)
    assert status == 200, body
    assert {row["team"] for row in body["quotas"]} >= {"vision", team}
    status, body = world.api("GET", "/pools")
    assert status == 200, body


def test_an_admin_can_remove_a_quota_stored_under_a_name_the_rule_now_refuses(world: QueueWorld) -> None:
    _store_quota_as_before(world, "-ops", 2)
    status, body = world.api("PUT", "/teams/-ops/quotas", {"pool": TRN1, "nominal": None}, caller=ADMIN)
    assert status == 200, body
    assert world.deps.store.team_quotas() == []


@pytest.mark.parametrize("team", ["équipe", "none", "-ops"])
def test_a_job_stored_with_a_team_the_rule_now_refuses_is_scheduled_listed_and_counted(
    world: QueueWorld, team: str
) -> None:
    # GIVEN quotas in the pool and a job whose team tag was accepted before the rule
    world.deps.store.set_team_quota(TeamQuota("vision", TRN1, 2))
    stored = Job(
        name="before-upgrade",
        request=training_request("before-upgrade", tags={"team": team}),
        priority=5,
        owner=SUBMITTER_ROLE,
        submitted_at=world.clock.now(),
        team=team,
    )
    world.deps.ensure_pools()
    world.deps.store.create_job(stored)
    # WHEN the scheduler runs its pass
    world.timer()
    # THEN the job starts on what its team may borrow, and `ls`, its page and `sagequeue teams` answer
    assert world.state("before-upgrade") == "starting"
    status, body = world.api("GET", "/jobs")
    assert status == 200, body
    assert [j["team"] for j in body["jobs"] if j["name"] == "before-upgrade"] == [team]
    status, body = world.api("GET", "/teams", caller=ADMIN)
    assert status == 200, body
    assert [(row["team"], row["used"]) for row in body["quotas"] if row["used"]] == [(team, 1)]


def test_the_team_none_counts_its_waiting_jobs(world: QueueWorld) -> None:
    # GIVEN a governed pool of 4 (vision's quota 2, lending none) and jobs without a team: one running
    # on the unassigned half, two more waiting as that half is full
    world.deps.store.set_team_quota(TeamQuota("vision", TRN1, 2, lending_limit=0))
    world.submit("loose-0", tags={"project": "x"}, count=2, duration=7200)
    world.submit("loose-1", tags={"project": "x"}, duration=7200)
    world.submit("loose-2", tags={"project": "x"}, duration=7200)
    assert [world.state(n) for n in ("loose-0", "loose-1", "loose-2")] == ["starting", "queued", "queued"]
    # THEN `sagequeue teams` shows the team none holding 2 with 2 waiting
    status, body = world.api("GET", "/teams", caller=ADMIN)
    assert status == 200, body
    assert [(r["used"], r["waiting"]) for r in body["quotas"] if r["team"] == "none"] == [(2, 2)]


#: What the rule says of each earlier name, as the API answers a quota set under it.
RULE = {
    "none": "team name 'none' is reserved: 'none' stands for jobs without a team",
    "-ops": "team name '-ops' must start with a letter or a digit",
    "_infra": "team name '_infra' must start with a letter or a digit",
}


@pytest.mark.parametrize("team", EARLIER_NAMES)
def test_a_quota_under_a_refused_name_is_removed_by_an_admin_and_never_set(
    world: QueueWorld, team: str
) -> None:
    # GIVEN a quota stored before the rule under a name it now refuses, beside one it accepts
    world.deps.store.set_team_quota(TeamQuota("vision", TRN1, 2))
    _store_quota_as_before(world, team, 2)
    path = f"/teams/{team}/quotas"
    # WHEN an admin tries to change it, THEN the rule refuses it in one line and the stored quota is kept
    status, body = world.api("PUT", path, {"pool": TRN1, "nominal": 3}, caller=ADMIN)
    assert (status, body) == (400, {"message": f"team: {RULE[team]}", "code": "ValidationError"})
    assert TeamQuota(team, TRN1, 2, check_name=False) in world.deps.store.team_quotas()
    # AND a user who is not an admin may not remove it
    status, body = world.api("PUT", path, {"pool": TRN1, "nominal": None})
    assert status == 403, body
    assert len(world.deps.store.team_quotas()) == 2
    # WHEN an admin removes it
    status, body = world.api("PUT", path, {"pool": TRN1, "nominal": None}, caller=ADMIN)
    # THEN that quota alone is gone, from the table and from `sagequeue teams`
    assert status == 200, body
    assert (body["team"], body["pool"], body["removed"]) == (team, TRN1, True)
    assert world.deps.store.team_quotas() == [TeamQuota("vision", TRN1, 2)]
    status, body = world.api("GET", "/teams", caller=ADMIN)
    assert [row["team"] for row in body["quotas"]] == ["vision"]
    # AND removing it again is refused: no quota is stored under it, and none can be set under it
    status, body = world.api("PUT", path, {"pool": TRN1, "nominal": None}, caller=ADMIN)
    assert (status, body) == (
        400,
        {
            "message": f"team: {RULE[team]}; no quota of team {team!r} in {TRN1} is stored to remove",
            "code": "ValidationError",
        },
    )
    # AND the queue goes on: a job of the team with a quota starts
    world.submit("after-removal", tags={"team": "vision"}, caller=ADMIN)
    assert world.state("after-removal") == "starting"


def test_a_name_no_quota_was_ever_stored_under_is_refused_whatever_the_request(world: QueueWorld) -> None:
    # names the earlier path pattern refused too: no quota can be stored under them, so none is looked up
    for team, rule in [
        ("a+b", "team name 'a+b' may hold only ASCII letters, digits, '-', '_' and '.'"),
        ("%C3%A9quipe", "team name 'équipe' may hold only ASCII letters, digits, '-', '_' and '.'"),
    ]:
        path = f"/teams/{team}/quotas".replace("%C3%A9", "é")
        status, body = world.api("PUT", path, {"pool": TRN1, "nominal": None}, caller=ADMIN)
        assert (status, body) == (400, {"message": f"team: {rule}", "code": "ValidationError"})
    # AND a name the rule accepts is removed as before, and removing it again answers that nothing was
    world.deps.store.set_team_quota(TeamQuota("vision", TRN1, 2))
    outcomes = []
    for _ in range(2):
        status, body = world.api("PUT", "/teams/vision/quotas", {"pool": TRN1, "nominal": None}, caller=ADMIN)
        outcomes.append((status, body["removed"]))
    assert outcomes == [(200, True), (200, False)]
    assert world.deps.store.team_quotas() == []


def test_a_removal_carrying_limits_is_refused_and_the_quota_kept(world: QueueWorld) -> None:
    world.deps.store.set_team_quota(TeamQuota("vision", TRN1, 2, borrowing_limit=1))
    status, body = world.api(
        "PUT", "/teams/vision/quotas", {"pool": TRN1, "nominal": None, "borrowing_limit": 5}, caller=ADMIN
    )
    assert (status, body["code"]) == (400, "ValidationError")
    assert (
        body["message"] == "nominal null removes the quota; borrowing_limit may only be given with a nominal"
    )
    assert world.deps.store.team_quotas() == [TeamQuota("vision", TRN1, 2, borrowing_limit=1)]


def test_jobs_without_a_team_that_only_wait_are_counted_beside_teams_without_a_quota(
    world: QueueWorld,
) -> None:
    # GIVEN a pool of 4 all vision's (lending none): nobody else may hold any of it
    world.deps.store.set_team_quota(TeamQuota("vision", TRN1, 4, lending_limit=0))
    # WHEN two jobs without a team and one of a team without a quota are submitted, and a third job without
    # a team is loaded in bulk (as a migration writes it)
    world.submit("loose-0", tags={"project": "x"})
    world.submit("loose-1", tags={"project": "x"})
    # (an admin submits for team speech: no principal is mapped to it here)
    status, body = world.api(
        "POST", "/jobs", training_request("speech-0", tags={"team": "speech"}), caller=ADMIN
    )
    assert status == 201, body
    world.deps.store.import_jobs(
        [
            Job(
                name="loose-bulk",
                request=training_request("loose-bulk", tags={"project": "x"}),
                priority=5,
                owner=SUBMITTER_ROLE,
                submitted_at=world.clock.now(),
            )
        ]
    )
    world.timer()
    # THEN none of them starts, and `sagequeue teams` shows each team that waits, holding nothing
    assert {world.state(n) for n in ("loose-0", "loose-1", "speech-0", "loose-bulk")} == {"queued"}
    status, body = world.api("GET", "/teams", caller=ADMIN)
    assert status == 200, body
    assert [(r["team"], r["nominal"], r["used"], r["waiting"]) for r in body["quotas"]] == [
        ("none", 0, 0, 3),
        ("speech", 0, 0, 1),
        ("vision", 4, 0, 0),
    ]
    # AND the team's own page shows what the listing shows of it
    status, body = world.api("GET", "/teams/speech/quotas")
    assert status == 200, body
    assert [(r["team"], r["nominal"], r["used"], r["waiting"]) for r in body["quotas"]] == [
        ("speech", 0, 0, 1)
    ]
    # AND a job that leaves the queue leaves the count
    status, body = world.api("DELETE", "/jobs/loose-0")
    assert status == 200, body
    status, body = world.api("GET", "/teams", caller=ADMIN)
    assert [(r["team"], r["waiting"]) for r in body["quotas"]] == [("none", 2), ("speech", 1), ("vision", 0)]


def test_listing_teams_reads_one_query_per_governed_pool_however_many_teams_wait(moto_endpoint: str) -> None:
    from test_pass_cost import ReadMeter, metered

    def listing_reads(world: QueueWorld) -> ReadMeter:
        with metered(world) as meter:
            status, body = world.api("GET", "/teams", caller=ADMIN)
        assert status == 200, body
        return meter

    for world in make_world(moto_endpoint, capacity={TRN1: 1}):
        # GIVEN a governed pool, a job holding it and one team waiting
        world.deps.store.set_team_quota(TeamQuota("vision", TRN1, 1))
        world.submit("vision-0", tags={"team": "vision"}, caller=ADMIN, duration=7200)
        world.submit("team-0", tags={"team": "team-0"}, caller=ADMIN)
        one = listing_reads(world)
        # WHEN eight more teams and jobs without a team wait there
        for i in range(1, 9):
            world.submit(f"team-{i}", tags={"team": f"team-{i}"}, caller=ADMIN)
            world.submit(f"loose-{i}", tags={"project": "x"})
        many = listing_reads(world)
        # THEN the listing still reads the pools and teams, the live jobs, and the pool's queue: 3 Queries
        assert one.requests["Query"] == many.requests["Query"] == 3
        assert one.requests["Scan"] == many.requests["Scan"] == 0
        _, body = world.api("GET", "/teams", caller=ADMIN)
        waiting = {r["team"]: r["waiting"] for r in body["quotas"]}
        assert waiting == {"none": 8, "vision": 0, **{f"team-{i}": 1 for i in range(9)}}
