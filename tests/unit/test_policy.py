"""The scheduling pass on hand-made snapshots: each test names the situation and the decision expected."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sagequeue_core.domain import ResourceKey
from sagequeue_core.policy import (
    PolicySettings,
    Preempt,
    QueuedJob,
    ReleaseWarmPool,
    RunningAttempt,
    Snapshot,
    Start,
    WarmPool,
    minimal_cover,
    plan,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TRN1 = "ml.trn1.32xlarge"
TRN2 = "ml.trn2.48xlarge"


def key(count: int = 1, instance_type: str = TRN1, role: str = "arn:aws:iam::1:role/train") -> ResourceKey:
    return ResourceKey(role_arn=role, instance_type=instance_type, instance_count=count, volume_size_gb=100)


def queued(
    name: str, priority: int, minute: int, count: int = 1, pool: str = TRN1, **kw: object
) -> QueuedJob:
    return QueuedJob(
        name=name,
        priority=priority,
        submitted_at=T0 + timedelta(minutes=minute),
        demand={pool: count},
        resource_key=kw.pop("resource_key", key(count, pool)),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def running(
    name: str, priority: int, started_minute: int = 0, count: int = 1, pool: str = TRN1, **kw: object
):
    return RunningAttempt(
        training_job_name=name,
        job_name=kw.pop("job_name", name),  # type: ignore[arg-type]
        priority=priority,
        started_at=T0 + timedelta(minutes=started_minute),
        demand={pool: count},
        # min runtime counts from the first Training status; these attempts train from their start
        training_started_at=kw.pop("training_started_at", T0 + timedelta(minutes=started_minute)),  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    )


def at(minute: int) -> datetime:
    return T0 + timedelta(minutes=minute)


def test_article_scenario_step_by_step() -> None:
    # GIVEN capacity 2 and job1 (p1), job2 (p2), job3 (p1) submitted in that order
    capacity = {TRN1: 2}
    first = plan(
        Snapshot(
            now=at(3),
            capacity=capacity,
            queued=[queued("job1", 1, 0), queued("job2", 2, 1), queued("job3", 1, 2)],
        )
    )
    # THEN the two most important start, job3 waits
    assert {s.job_name for s in first.starts} == {"job1", "job2"}
    assert "job3" in first.waiting

    # WHEN job4 (p3) arrives while job1 and job2 run
    second = plan(
        Snapshot(
            now=at(10),
            capacity=capacity,
            queued=[queued("job3", 1, 2), queued("job4", 3, 9)],
            running=[running("job1", 1, 3), running("job2", 2, 3)],
        )
    )
    # THEN the least important running job is preempted for it, and nothing starts yet
    assert second.actions == [Preempt("job1", "job1", for_job="job4", work_lost_seconds=7 * 60)]

    # WHEN job1 has stopped and is queued again (keeping its submission time)
    third = plan(
        Snapshot(
            now=at(12),
            capacity=capacity,
            queued=[queued("job1", 1, 0), queued("job3", 1, 2), queued("job4", 3, 9)],
            running=[running("job2", 2, 3)],
        )
    )
    assert [s.job_name for s in third.starts] == ["job4"]

    # WHEN job2 finishes: job1 resumes before job3, which was submitted later at the same priority
    fourth = plan(
        Snapshot(
            now=at(30),
            capacity=capacity,
            queued=[queued("job1", 1, 0), queued("job3", 1, 2)],
            running=[running("job4", 3, 12)],
        )
    )
    assert [s.job_name for s in fourth.starts] == ["job1"]
    assert "job3" in fourth.waiting


def test_no_preemption_for_equal_priority() -> None:
    result = plan(
        Snapshot(now=at(60), capacity={TRN1: 1}, queued=[queued("b", 5, 1)], running=[running("a", 5)]),
        PolicySettings(reserve_after_seconds=0),
    )
    assert result.actions == []
    assert result.waiting["b"].startswith("waiting for capacity")


def test_min_runtime_protects_young_jobs_and_holds_capacity() -> None:
    # GIVEN a young low-priority job and one free instance, and a high-priority job needing two
    settings = PolicySettings(min_runtime_before_preemption_seconds=600)
    snap = Snapshot(
        now=at(5),
        capacity={TRN1: 2},
        queued=[queued("big", 9, 1, count=2), queued("small", 1, 2)],
        running=[running("young", 1, started_minute=0)],
    )
    result = plan(snap, settings)
    # THEN nothing is preempted yet, and the free instance is held for "big" rather than given to "small"
    assert result.actions == []
    assert "minimum runtime" in result.waiting["big"]
    assert "small" in result.waiting

    # AND once the young job has run ten minutes, it is preempted
    later = plan(
        Snapshot(now=at(11), capacity=snap.capacity, queued=snap.queued, running=snap.running), settings
    )
    assert later.preemptions == [Preempt("young", "young", for_job="big", work_lost_seconds=11 * 60)]


def test_lower_priority_job_backfills_when_the_head_can_never_fit() -> None:
    # the head needs 3 of 2 instances: it cannot fit however long it waits, so it must not block others
    result = plan(
        Snapshot(now=at(1), capacity={TRN1: 2}, queued=[queued("huge", 9, 0, count=3), queued("small", 1, 1)])
    )
    assert [s.job_name for s in result.starts] == ["small"]
    assert "huge" in result.waiting


def test_fewest_victims_then_least_important() -> None:
    # a job needing 2 instances: one 2-instance victim beats two 1-instance victims of lower priority
    result = plan(
        Snapshot(
            now=at(60),
            capacity={TRN1: 4},
            queued=[queued("urgent", 9, 50, count=2)],
            running=[
                running("a", 1, count=1),
                running("b", 1, count=1),
                running("wide", 3, count=2),
            ],
        )
    )
    assert result.preemptions == [Preempt("wide", "wide", for_job="urgent", work_lost_seconds=3600)]


def test_victims_never_exceed_the_deficit() -> None:
    # one instance free, job needs two: a single one-instance victim is enough
    result = plan(
        Snapshot(
            now=at(60),
            capacity={TRN1: 3},
            queued=[queued("urgent", 9, 50, count=2)],
            running=[running("a", 1), running("b", 2)],
        )
    )
    assert result.preemptions == [Preempt("a", "a", for_job="urgent", work_lost_seconds=3600)]


def test_stopping_capacity_is_promised_once() -> None:
    # a job already being preempted frees one instance: the first waiting job gets it, the second preempts anew
    result = plan(
        Snapshot(
            now=at(60),
            capacity={TRN1: 2},
            queued=[queued("first", 9, 1), queued("second", 8, 2)],
            running=[running("victim", 1, stopping=True), running("other", 2)],
        )
    )
    assert result.preemptions == [Preempt("other", "other", for_job="second", work_lost_seconds=3600)]
    assert "stopping" in result.waiting["first"]


def test_outside_jobs_count_but_are_never_preempted() -> None:
    outside = running("by-hand", 0, job_name=None)
    result = plan(Snapshot(now=at(60), capacity={TRN1: 1}, queued=[queued("q", 9, 1)], running=[outside]))
    assert result.actions == []


def test_warm_pool_reuse_is_chosen_over_a_cold_start() -> None:
    warm = WarmPool("done-job", key(1))
    result = plan(Snapshot(now=at(5), capacity={TRN1: 2}, queued=[queued("next", 1, 1)], warm_pools=[warm]))
    assert result.starts == [Start("next", warm_pool="done-job")]


def test_warm_pool_counts_as_used_capacity() -> None:
    warm = WarmPool("done-job", key(1, role="arn:aws:iam::1:role/other"))
    result = plan(Snapshot(now=at(5), capacity={TRN1: 1}, queued=[queued("next", 1, 1)], warm_pools=[warm]))
    # the retained instance is the only one: the unmatched pool is released so the queued job can start
    assert result.actions == [ReleaseWarmPool("done-job", for_job="next"), Start("next")]


def test_warm_pool_wanted_by_a_more_important_job_is_not_released() -> None:
    wanted = key(1, role="arn:aws:iam::1:role/other")
    warm = WarmPool("done-job", wanted)
    result = plan(
        Snapshot(
            now=at(5),
            capacity={TRN1: 1},
            queued=[queued("low", 1, 1), queued("high", 5, 2, resource_key=wanted)],
            warm_pools=[warm],
        )
    )
    assert result.starts == [Start("high", warm_pool="done-job")]
    assert "low" in result.waiting


def test_keep_alive_set_when_a_queued_job_would_match_next() -> None:
    settings = PolicySettings(default_keep_alive_seconds=900)
    result = plan(
        Snapshot(now=at(5), capacity={TRN1: 1}, queued=[queued("a", 5, 1), queued("b", 1, 2)]),
        settings,
    )
    assert result.starts == [Start("a", keep_alive_seconds=900)]
    unmatched = plan(
        Snapshot(
            now=at(5),
            capacity={TRN1: 1},
            queued=[queued("a", 5, 1), queued("b", 1, 2, resource_key=key(1, role="arn:aws:iam::1:role/x"))],
        ),
        settings,
    )
    assert unmatched.starts == [Start("a", keep_alive_seconds=None)]


def test_backoff_jobs_wait_without_blocking() -> None:
    result = plan(
        Snapshot(
            now=at(5),
            capacity={TRN1: 1},
            queued=[queued("retrying", 9, 1, not_before=at(10)), queued("next", 1, 2)],
        )
    )
    assert result.starts == [Start("next")]
    assert result.waiting["retrying"].startswith("backing off")


def test_multi_pool_job_needs_every_pool() -> None:
    hetero = QueuedJob("hetero", 5, at(0), demand={TRN1: 1, TRN2: 1}, resource_key=None)
    blocked = plan(Snapshot(now=at(1), capacity={TRN1: 1, TRN2: 0}, queued=[hetero]))
    assert blocked.starts == []
    fits = plan(Snapshot(now=at(1), capacity={TRN1: 1, TRN2: 1}, queued=[hetero]))
    assert fits.starts == [Start("hetero")]


def test_lowered_capacity_starts_nothing_and_preempts_nothing_by_itself() -> None:
    result = plan(Snapshot(now=at(60), capacity={TRN1: 1}, running=[running("a", 1), running("b", 1)]))
    assert result.actions == []


def test_unknown_pool_never_starts() -> None:
    result = plan(Snapshot(now=at(1), capacity={TRN1: 4}, queued=[queued("x", 1, 0, pool=TRN2)]))
    assert result.starts == []


@pytest.mark.parametrize("n", [3, 20])
def test_minimal_cover_is_irreducible(n: int) -> None:
    attempts = [running(f"r{i}", i % 3, count=1 + i % 2) for i in range(n)]
    victims = minimal_cover(attempts, {TRN1: 4})
    assert victims is not None
    assert sum(v.demand[TRN1] for v in victims) >= 4
    for v in victims:
        assert sum(o.demand[TRN1] for o in victims if o is not v) < 4


def test_spare_warm_pool_of_a_wanted_key_is_released_for_a_more_important_job() -> None:
    # GIVEN two warm pools of one key that a single queued job wants, and a big job that needs three instances
    shared = key(1)
    snap = Snapshot(
        now=at(5),
        capacity={TRN1: 4},
        queued=[queued("big", 4, 0, count=3), queued("one", 4, 1, resource_key=shared), queued("low", 0, 2)],
        warm_pools=[WarmPool("warm-a", shared), WarmPool("warm-b", shared)],
    )
    result = plan(snap)
    # THEN one pool is kept for "one", the spare is released so "big" starts, and "low" waits
    assert (
        ReleaseWarmPool("warm-a", for_job="big") in result.actions
        or ReleaseWarmPool("warm-b", for_job="big") in result.actions
    )
    assert {s.job_name for s in result.starts} == {"big", "one"}
    assert "low" in result.waiting


def test_instances_returning_to_an_over_capacity_pool_first_pay_back_the_overrun() -> None:
    # GIVEN a pool lowered to capacity 0 while two attempts still stop in it
    snap = Snapshot(
        now=at(5),
        capacity={TRN1: 4, TRN2: 0},
        queued=[
            QueuedJob("wide", 1, at(0), demand={TRN1: 3, TRN2: 1}),
            queued("narrow", 1, 1, count=2),
        ],
        running=[running("s1", 0, pool=TRN2, stopping=True), running("s2", 0, pool=TRN2, stopping=True)],
    )
    result = plan(snap)
    # THEN "wide" cannot be promised the returning instances and holds nothing; "narrow" starts
    assert result.starts == [Start("narrow")]
    assert result.waiting["wide"] == f"pool drained: {TRN2} has capacity 0"
    assert "wide" not in result.held
