"""The pass over teams whose names the one team-name rule postdates: a job's team tag stored when any
letters were accepted ("équipe"), or a name the API's path took before ("none", "-ops"). The rule governs
names coming in; a pass over what is already queued or running must not refuse to plan."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sagequeue_core.policy import PolicySettings, QueuedJob, RunningAttempt, Snapshot, plan
from sagequeue_core.quotas import TeamLedger, TeamQuota

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POOL = "ml.trn1.32xlarge"
EARLIER = ("équipe", "none", "NONE", "-ops", "_infra", ".hidden")


@pytest.mark.parametrize("team", EARLIER)
def test_a_pass_plans_queued_and_running_jobs_of_a_team_named_before_the_rule(team: str) -> None:
    # GIVEN a governed pool of 4, one of it held by a running job of that team, one of its jobs waiting
    snapshot = Snapshot(
        now=T0,
        capacity={POOL: 4},
        queued=[QueuedJob(name="waiting", priority=5, submitted_at=T0, demand={POOL: 1}, team=team)],
        running=[
            RunningAttempt(
                training_job_name="running-1",
                job_name="running",
                demand={POOL: 1},
                priority=5,
                started_at=T0 - timedelta(hours=1),
                team=team,
            )
        ],
        team_quotas=[TeamQuota("vision", POOL, 2)],
    )
    # WHEN the pass plans
    result = plan(snapshot, PolicySettings())
    # THEN the waiting job borrows what vision does not use, as any team without a quota there would
    assert [s.job_name for s in result.starts] == ["waiting"]


@pytest.mark.parametrize("team", EARLIER)
def test_a_quota_read_back_under_a_name_the_rule_postdates_is_counted(team: str) -> None:
    # GIVEN the quota as the table holds it (the rule applies to names coming in, not to what is stored)
    stored = TeamQuota(team, POOL, 2, check_name=False)
    ledger = TeamLedger([stored], {POOL: 4})
    # THEN its team is governed by it like any other
    assert ledger.quota(team, POOL) == stored
    assert ledger.headroom(team, POOL) == 2
