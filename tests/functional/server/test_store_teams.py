"""Team quotas, the fair-share counter and each team's queue window in the table (moto over HTTP, the
table template.yaml declares)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta

import boto3
import pytest
from conftest import ADMIN, START, SUBMITTER, TRN1, TRN2, make_world, training_request
from support.cfn_template import create_table

from sagequeue_core.domain import Job, JobState
from sagequeue_core.quotas import TeamQuota, UsageCounter
from sagequeue_core.store import Repository


@pytest.fixture
def store(moto_endpoint: str) -> Iterator[Repository]:
    client = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")
    table = create_table(client, f"teams-{uuid.uuid4().hex[:8]}")
    repository = Repository(table, host=moto_endpoint, region="us-east-1")
    repository.seed_pools({TRN1: 4, TRN2: 1})
    yield repository
    client.delete_table(TableName=table)


def job(name: str, team: str | None, minutes: int, priority: int = 5) -> Job:
    return Job(
        name=name,
        request=training_request(name, instance_type=TRN1),
        priority=priority,
        owner=SUBMITTER,
        submitted_at=START + timedelta(minutes=minutes),
        team=team,
    )


def test_quotas_are_stored_replaced_and_removed(store: Repository) -> None:
    store.set_team_quota(TeamQuota("vision", TRN1, 2, borrowing_limit=1))
    store.set_team_quota(TeamQuota("speech", TRN1, 2, lending_limit=0))
    store.set_team_quota(TeamQuota("vision", "plan:my-plan", 3))
    store.set_team_quota(TeamQuota("vision", TRN1, 3))  # replaces, limits back to unlimited
    assert sorted(store.team_quotas(), key=lambda q: (q.team, q.pool)) == [
        TeamQuota("speech", TRN1, 2, lending_limit=0),
        TeamQuota("vision", TRN1, 3),
        TeamQuota("vision", "plan:my-plan", 3),
    ]
    assert store.remove_team_quota("vision", "plan:my-plan") is True
    assert store.remove_team_quota("vision", "plan:my-plan") is False
    assert len(store.team_quotas()) == 2
    # the pools are untouched by quota items in the same table
    assert {s.pool.instance_type: s.pool.capacity for s in store.pools()} == {TRN1: 4, TRN2: 1}


def test_the_usage_counter_is_advanced_by_one_pass_of_two_racing(store: Repository) -> None:
    first = UsageCounter(as_of=START, hours={"vision": 2.0})
    assert store.save_usage_counter(first, was=None) is True
    assert store.save_usage_counter(first, was=None) is False  # a second creator loses
    _, read = store.teams()
    assert read == first
    one = first.advance(START + timedelta(minutes=1), {"vision": 4}, 3600)
    other = first.advance(START + timedelta(minutes=1, seconds=5), {"vision": 4}, 3600)
    assert store.save_usage_counter(one, was=read) is True
    assert store.save_usage_counter(other, was=read) is False  # read before the first wrote
    assert store.teams()[1] == one


def test_each_team_has_a_queue_window_of_its_own(store: Repository) -> None:
    for i in range(5):
        store.create_job(job(f"a-{i}", "a", i))
    store.create_job(job("b-0", "b", 10))
    store.create_job(job("none-0", None, 11))
    assert [j.name for j in store.queued_jobs(TRN1, 3)] == ["a-0", "a-1", "a-2"]
    assert [j.name for j in store.queued_jobs(TRN1, 3, team="b")] == ["b-0"]
    assert [j.name for j in store.queued_jobs(TRN1, 2, team="a")] == ["a-0", "a-1"]
    assert store.get_job("b-0").team == "b"
    # a job that leaves the queue leaves its team's window
    started = store.get_job("b-0")
    started.transition(JobState.STARTING, START + timedelta(minutes=20))
    store.save_job(replace(started), was=JobState.QUEUED)
    assert store.queued_jobs(TRN1, 3, team="b") == []


def test_the_jobs_waiting_in_a_pool_are_counted_per_team_those_without_one_too(store: Repository) -> None:
    # GIVEN jobs of two teams and without a team queued in one pool, one of them in another pool
    for i in range(3):
        store.create_job(job(f"a-{i}", "a", i))
    store.create_job(job("b-0", "b", 5))
    for i in range(2):
        store.create_job(job(f"none-{i}", None, 10 + i))
    elsewhere = job("none-trn2", None, 20)
    elsewhere.request["ResourceConfig"]["InstanceType"] = TRN2
    store.create_job(elsewhere)
    # THEN each pool counts its own, "" for jobs without a team, as the teams' windows count theirs
    assert store.queued_by_team(TRN1) == {"a": 3, "b": 1, "": 2}
    assert store.queued_by_team(TRN2) == {"": 1}
    assert store.queued_count(TRN1, "a") == 3
    # WHEN one job without a team starts and another is held
    started = store.get_job("none-0")
    started.transition(JobState.STARTING, START + timedelta(minutes=30))
    store.save_job(started, was=JobState.QUEUED)
    held = store.get_job("none-1")
    held.transition(JobState.HELD, START + timedelta(minutes=30))
    store.save_job(held, was=JobState.QUEUED)
    # THEN neither waits in the queue any more, and the pool's counter agrees
    assert store.queued_by_team(TRN1) == {"a": 3, "b": 1}
    assert sum(store.queued_by_team(TRN1).values()) == store.get_pool(TRN1).queued


def test_a_pass_with_quotas_reads_one_more_window_per_team_and_nothing_else(moto_endpoint: str) -> None:
    from test_pass_cost import measure_pass

    for world in make_world(moto_endpoint, capacity={TRN1: 2, TRN2: 1}, settings={"queue_lookahead": 20}):
        # GIVEN two teams with quotas in one pool of two
        world.deps.store.set_team_quota(TeamQuota("a", TRN1, 1))
        world.deps.store.set_team_quota(TeamQuota("b", TRN1, 1))
        meter = measure_pass(world)
        # THEN the pools, quotas and counter come in the one Query on the pools' partition: the pass reads
        # what it read without teams (6 Queries) plus each team's window in the pool (2)
        assert meter.requests["Query"] == 6 + 2
        assert meter.requests["Scan"] == 0
        assert meter.requests["GetItem"] == 0


def test_borrow_and_reclaim_are_announced_and_measured_per_team_and_pool(
    moto_endpoint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    settings = {"min_runtime_before_preemption_seconds": 0, "default_keep_alive_seconds": 0}
    for world in make_world(moto_endpoint, capacity={TRN1: 2}, settings=settings):
        world.deps.store.set_team_quota(TeamQuota("a", TRN1, 1))
        world.deps.store.set_team_quota(TeamQuota("b", TRN1, 1))
        # GIVEN team a alone: its second job borrows b's instance
        world.submit("a-1", tags={"team": "a"}, duration=7200, caller=ADMIN)
        world.clock.advance(60)
        world.submit("a-2", tags={"team": "a"}, duration=7200, caller=ADMIN)
        assert world.state("a-2") == "starting"
        # WHEN b's job arrives
        capsys.readouterr()
        world.submit("b-1", tags={"team": "b"}, duration=600, priority=0, caller=ADMIN)
        # THEN a's newest job is reclaimed for it, and both moves are events
        assert world.state("a-2") == "preempting"
        assert world.state("a-1") == "starting"
        published = world.audit()
        assert ("QuotaBorrowed", {"name": "a-2", "team": "a", "pool": TRN1, "borrowed": 1}) in published
        assert (
            "QuotaReclaimed",
            {"name": "a-2", "team": "a", "for_job": "b-1", "for_team": "b", "pool": TRN1},
        ) in published
        # AND each pass measures what every team holds and borrows in the pool
        documents = [
            json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith('{"_aws"')
        ]
        gauges = {
            (d["_aws"]["CloudWatchMetrics"][0]["Metrics"][0]["Name"], d["Team"], d["Pool"]): d
            for d in documents
            if d.get("Team")
        }
        assert gauges[("TeamInstancesUsed", "a", TRN1)]["TeamInstancesUsed"] == [2.0]
        assert gauges[("TeamInstancesBorrowed", "a", TRN1)]["TeamInstancesBorrowed"] == [1.0]
        assert gauges[("TeamInstancesUsed", "a", TRN1)]["_aws"]["CloudWatchMetrics"][0]["Dimensions"] == [
            ["Team", "Pool"]
        ]
