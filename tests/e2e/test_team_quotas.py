"""Team quotas end to end on the local stack's virtual clock: two teams with quotas of 2 on a pool of 4.

Quotas are set through `PUT /teams/{team}/quotas` as an admin, a job's team is its submitter's (identities
`a` and `b`, mapped to teams of those names by TeamRoles),
and every step of the clock checks SageMaker's side (instances held per pool never above capacity, no
queue entry with two live training jobs), as the other scheduling scenarios do.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_scheduling_scenarios import POOL, Scenario

from sagequeue_core.domain import parse_time

MIN_RUNTIME = 600
STOP_GRACE = 120  # the emulator's, as SageMaker documents it
PROVISIONING = 480


class TeamScenario(Scenario):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # the jobs of every team, not only the default identity's own
        everyone = self.queue.jobs
        self.queue.jobs = lambda **filters: everyone(**{"pool": POOL, **filters})  # type: ignore[method-assign]

    def submit_for(self, team: str, name: str, seconds: int, priority: int = 5, **kw: Any) -> None:
        body = self.request(name, seconds, **kw)
        body["Tags"] = [{"Key": "team", "Value": team}]
        self.stack.client(team).submit(body, priority=priority)
        self.stack.run_until_idle()
        self.stack.advance(1)

    def held_by_team(self) -> Counter[str]:
        """Instances SageMaker holds for each team's live training jobs (by the queue's record of teams)."""
        teams = {job.name: job.raw.get("team") for job in self.queue.jobs()}
        held: Counter[str] = Counter()
        sagemaker = self.stack.sagemaker
        for status in ("InProgress", "Stopping"):
            for page in sagemaker.get_paginator("list_training_jobs").paginate(StatusEquals=status):
                for summary in page["TrainingJobSummaries"]:
                    name = summary["TrainingJobName"]
                    described = sagemaker.describe_training_job(TrainingJobName=name)
                    held[teams.get(name.split("--", 1)[0]) or "none"] += described["ResourceConfig"][
                        "InstanceCount"
                    ]
        return held


@pytest.fixture
def teams() -> Iterator[Callable[..., TeamScenario]]:
    made: list[TeamScenario] = []

    def make(**quota: Any) -> TeamScenario:
        s = TeamScenario(
            4,
            teams={"a": "a", "b": "b"},
            default_keep_alive_seconds=0,
            min_runtime_before_preemption_seconds=MIN_RUNTIME,
        )
        made.append(s)
        admin = s.stack.client("admin")
        admin.set_team_quota("a", POOL, 2, **quota.get("a", {}))
        admin.set_team_quota("b", POOL, 2, **quota.get("b", {}))
        s.stack.run_until_idle()
        return s

    yield make
    for each in made:
        each.close()


@pytest.mark.slow
def test_team_a_alone_borrows_the_pool_and_team_b_reclaims_its_share(
    teams: Callable[..., TeamScenario],
) -> None:
    s = teams()
    # GIVEN team a alone, with four long jobs at a high priority
    for i in range(4):
        s.submit_for("a", f"a-{i}", 6 * 3600, priority=9)
    s.advance_until(lambda: s.held_by_team()["a"] == 4, limit=1200)
    # THEN it borrows all four instances, two beyond its quota
    (share,) = s.queue.team_quotas("a")
    assert (share["used"], share["borrowed"]) == (4, 2)
    assert s.queue.team_quotas("b")[0]["lent"] == 2
    assert {j.name: j.raw["team"] for j in s.queue.jobs()} == {f"a-{i}": "a" for i in range(4)}
    # WHEN team b submits two jobs at the lowest priority, after a's jobs have trained past the minimum
    s.advance_until(lambda: all(j.raw.get("training_started_at") for j in s.queue.jobs()), limit=1200)
    s.stack.advance(MIN_RUNTIME)
    s.submit_for("b", "b-0", 3600, priority=0)
    s.submit_for("b", "b-1", 3600, priority=0)
    # THEN two of a's jobs (the newest) are preempted, whatever their priority, and b's two start within
    # the stop grace and provisioning, and b holds its quota of two on SageMaker's side
    waited = s.advance_until(
        lambda: all(s.states()[n] in ("starting", "running") for n in ("b-0", "b-1")), limit=1800
    )
    assert waited <= STOP_GRACE + 120
    preempted = {j.name for j in s.queue.jobs() if j.preemptions}
    assert preempted == {"a-2", "a-3"}
    s.advance_until(lambda: s.held_by_team()["b"] == 2, limit=PROVISIONING + 120)
    assert s.held_by_team() == Counter({"a": 2, "b": 2})
    # AND a's preempted jobs wait with a reason naming the quota
    assert s.job("a-3").raw["reason"] == f"team a at its quota of 2 {POOL}; 0 borrowable, 0 free"


@pytest.mark.slow
def test_reclaim_waits_for_the_minimum_runtime_of_the_borrowers(teams: Callable[..., TeamScenario]) -> None:
    s = teams()
    for i in range(4):
        s.submit_for("a", f"a-{i}", 6 * 3600, priority=9)
    s.advance_until(lambda: s.states()["a-3"] == "running", limit=1200)
    # the first of a's jobs to reach Training is the first that reclaim may preempt
    first_trained = min(
        t for j in s.queue.jobs() if (t := parse_time(j.raw.get("training_started_at"))) is not None
    )
    # WHEN b's job arrives while a's jobs are still young
    s.submit_for("b", "b-0", 3600, priority=0)
    arrived = s.stack.now()
    # THEN it is not preempted for before they trained the minimum, and starts within one minimum runtime
    # plus the stop grace (a pass a minute) of its arrival
    s.advance_until(
        lambda: s.states()["b-0"] in ("starting", "running"), limit=MIN_RUNTIME + STOP_GRACE + 600
    )
    waited = (s.stack.now() - arrived).total_seconds()
    assert waited <= MIN_RUNTIME + STOP_GRACE + 120
    # (and not before: no borrower was preempted before it trained the minimum)
    assert (s.stack.now() - first_trained).total_seconds() >= MIN_RUNTIME + STOP_GRACE
    assert sum(j.preemptions for j in s.queue.jobs()) == 1


@pytest.mark.slow
def test_a_lending_limit_of_zero_keeps_b_share_idle_for_b(teams: Callable[..., TeamScenario]) -> None:
    s = teams(b={"lending_limit": 0})
    # GIVEN team b lends nothing
    for i in range(4):
        s.submit_for("a", f"a-{i}", 3600, priority=9)
    # THEN team a runs two jobs and the other two wait, naming the quota, while two instances stay free
    s.advance_until(lambda: s.held_by_team()["a"] == 2, limit=1200)
    for _ in range(5):
        s.stack.advance(60)
        s.check_sagemaker()
        assert s.held_by_team()["a"] == 2
    assert s.stack.emulator.instances_in_use().get(POOL, 0) == 2
    assert s.job("a-3").raw["reason"] == f"team a at its quota of 2 {POOL}; 0 borrowable, 2 free"
    # AND b's job starts at once on its idle share, without preempting anything
    s.submit_for("b", "b-0", 600, priority=0)
    s.advance_until(lambda: s.states()["b-0"] in ("starting", "running"), limit=120)
    assert not any(j.preemptions for j in s.queue.jobs())


def test_quota_input_errors_are_clear_and_only_admins_set_quotas(teams: Callable[..., TeamScenario]) -> None:
    from sagequeue.exceptions import SageQueueError

    s = teams()
    with pytest.raises(SageQueueError, match="only an admin may set a team's quota"):
        s.queue.set_team_quota("a", POOL, 4)
    admin = s.stack.client("admin")
    with pytest.raises(SageQueueError, match="not a pool sagequeue manages"):
        admin.set_team_quota("a", "ml.p5.48xlarge", 1)
    with pytest.raises(SageQueueError, match="nominal"):
        admin.set_team_quota("a", POOL, -1)
    # limits are instances as the nominal quota is: a number no pool could hold (and no table could store
    # beyond 38 digits) is refused, not stored
    for limit in ("borrowing_limit", "lending_limit"):
        with pytest.raises(SageQueueError, match=f"{limit}: Input should be less than or equal to 100000"):
            admin.set_team_quota("a", POOL, 2, **{limit: 10**40 + 1})
    assert s.queue.team_quotas("a")[0]["nominal"] == 2  # unchanged
    assert s.queue.team_quotas("a")[0]["borrowing_limit"] is None
    assert s.queue.team_quotas("a")[0]["lending_limit"] is None


def test_quotas_above_the_pools_capacity_are_stored_with_a_warning(
    teams: Callable[..., TeamScenario],
) -> None:
    s = teams()
    admin = s.stack.client("admin")
    above = f"the nominal quotas of all teams in {POOL} sum to 5, above its capacity of 4"
    # GIVEN a pool of 4 shared 2 + 2: a quota within it answers no warning
    assert admin.set_team_quota("a", POOL, 2, borrowing_limit=1)["warning"] is None
    # WHEN an admin gives a third team a quota of 1
    answer = admin.set_team_quota("c", POOL, 1)
    # THEN it is stored, and the answer says the quotas sum above the pool's capacity
    assert (answer["team"], answer["nominal"]) == ("c", 1)
    assert answer["warning"].startswith(above + ": not every team can hold its nominal quota at once")
    assert s.queue.team_quotas("c")[0]["nominal"] == 1
    # AND every team's row in the pool carries it, and a's quota is unchanged
    rows = {r["team"]: r for r in s.queue.teams()}
    assert {team: r["warning"] is not None for team, r in rows.items()} == {"a": True, "b": True, "c": True}
    assert (rows["a"]["nominal"], rows["a"]["borrowing_limit"]) == (2, 1)
    # WHEN the third quota is removed, the quotas fit again
    removed = admin.set_team_quota("c", POOL, None)
    assert (removed["removed"], removed["warning"]) == (True, None)
    assert all(r["warning"] is None for r in s.queue.teams())


def test_team_names_that_would_break_keys_paths_or_tables_are_refused(
    teams: Callable[..., TeamScenario],
) -> None:
    from sagequeue.exceptions import ValidationError

    s = teams()
    admin = s.stack.client("admin")
    # GIVEN names the rule refuses, sent as they are (the client checks names before sending)
    for team, rule in [
        ("none", "team name 'none' is reserved: 'none' stands for jobs without a team"),
        ("-x", "team name '-x' must start with a letter or a digit"),
        ("a+b", "team name 'a+b' may hold only ASCII letters, digits, '-', '_' and '.'"),
    ]:
        # THEN PUT refuses each with the rule it breaks, and stores nothing
        with pytest.raises(ValidationError, match="^" + re.escape(f"team: {rule}")):
            admin.request("PUT", f"/teams/{team}/quotas", body={"pool": POOL, "nominal": 1})
    assert {r["team"] for r in s.queue.teams()} == {"a", "b"}
    # AND the client refuses them before any request, dot segments included
    for team in (".", "..", "none", "a/b"):
        with pytest.raises(ValueError, match="team name"):
            admin.set_team_quota(team, POOL, 1)
        with pytest.raises(ValueError, match="team name"):
            s.queue.team_quotas(team)
    # WHEN jobs are submitted with team tags the rule refuses
    for value, rule in [
        ("none", "team name 'none' is reserved"),
        ("vision/nlp", "team name 'vision/nlp' may hold only ASCII letters"),
        ("x" * 65, "a team name is 1 to 64 characters"),
    ]:
        body = s.request(f"bad-{len(value)}", 600)
        body["Tags"] = [{"Key": "team", "Value": value}]
        # THEN each is refused with a message naming the tag and the rule, and nothing is queued
        with pytest.raises(ValidationError, match="^" + re.escape(f"tag 'team': {rule}")):
            s.queue.submit(body)
    assert s.queue.jobs() == []
    # AND a job without a team holding the governed pool is the team "none" in the answers
    s.queue.submit(s.request("untagged", 3600))
    s.advance_until(lambda: s.states()["untagged"] == "running", limit=1200)
    rows = {r["team"]: r for r in s.queue.teams()}
    assert (rows["none"]["nominal"], rows["none"]["used"], rows["none"]["borrowed"]) == (0, 1, 1)
