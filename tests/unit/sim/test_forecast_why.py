"""`why`: the jobs ahead with the rule that orders each, and what would start a job sooner."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from sagequeue.forecast import ForecastSettings, History, QueueState, Traits
from sagequeue.forecast.why import explain
from sagequeue_core.domain import Reservation, ReservationKind
from sagequeue_core.policy import QueuedJob, RunningAttempt
from sagequeue_core.quotas import TeamQuota

NOW = datetime(2026, 3, 4, 12, tzinfo=UTC)
POOL, OTHER = "ml.trn1.32xlarge", "ml.trn2.48xlarge"
SETTINGS = ForecastSettings(samples=8, arrivals=False)
HISTORY = History(completed=[(Traits(instances=1), 3600.0)] * 20)


def job(name: str, priority: int, instances: int = 1, minutes_ago: float = 10, **extra: object) -> QueuedJob:
    return QueuedJob(
        name=name,
        priority=priority,
        submitted_at=NOW - timedelta(minutes=minutes_ago),
        demand={POOL: instances},
        **extra,  # type: ignore[arg-type]
    )


def runs(name: str, priority: int, instances: int = 1, team: str | None = None) -> RunningAttempt:
    return RunningAttempt(
        training_job_name=f"{name}-1",
        demand={POOL: instances},
        priority=priority,
        started_at=NOW - timedelta(minutes=20),
        job_name=name,
        training_started_at=NOW - timedelta(minutes=14),
        team=team,
    )


def test_the_jobs_ahead_are_in_pass_order_with_the_rule_that_puts_each_there() -> None:
    held = Reservation(instances={POOL: 0}, since=NOW - timedelta(hours=1), kind=ReservationKind.DRAIN)
    state = QueueState(
        now=NOW,
        capacity={POOL: 2, OTHER: 1},
        queued=[
            job("me", 3, minutes_ago=30),
            job("urgent", 7, minutes_ago=1),
            job("promised", 3, minutes_ago=5, reservation=held),
            job("earlier", 3, minutes_ago=60),
            job("later", 3, minutes_ago=1),
            job("less", 1, minutes_ago=300),
        ],
        running=[runs("a", 9), runs("b", 9)],
    )
    told = explain(state, HISTORY, "me", SETTINGS)
    assert [(a.name, a.rule) for a in told.ahead] == [
        ("urgent", "higher priority (7 > 3)"),
        ("promised", "same priority, holds a reservation"),
        ("earlier", "same priority, submitted earlier"),
    ]
    assert {name for name, _, _ in told.running} == {"a", "b"}
    options = {o.change: o.p50 for o in told.options}
    # an empty pool of another type starts it at once; a higher priority puts it ahead of two jobs
    assert options[f"pool {OTHER}"] == 0.0
    assert options["priority 4"] < told.p50
    assert told.p10 <= told.p50 <= told.p90


def test_a_team_quota_raised_lets_a_job_its_quota_holds_back_start_sooner() -> None:
    # GIVEN team red uses its whole quota of 1 in a pool with room, and its next job waits on the quota
    state = QueueState(
        now=NOW,
        capacity={POOL: 4},
        queued=[job("mine", 3, team="red")],
        running=[runs("red-runs", 3, team="red")],
        team_quotas=(TeamQuota("red", POOL, nominal=1, borrowing_limit=0),),
    )
    told = explain(state, HISTORY, "mine", SETTINGS)
    options = {o.change: o.p50 for o in told.options}
    raised = options[f"team red's quota in {POOL} raised by 1"]
    assert raised == 0.0
    assert told.p50 > 0
    assert not math.isinf(told.p50)


def test_fewer_instances_are_offered_for_a_wide_job() -> None:
    state = QueueState(
        now=NOW, capacity={POOL: 4}, queued=[job("wide", 3, instances=4)], running=[runs("one", 9)]
    )
    told = explain(state, HISTORY, "wide", SETTINGS)
    options = {o.change: o.p50 for o in told.options}
    assert options["3 instances"] == 0.0  # three are free now
    assert options["2 instances"] == 0.0
    assert told.p50 > 0
