"""Backfill on loan: the idle part of a reservation that still waits for running work is lent to smaller
jobs that resume from checkpoints, and taken back the moment the reservation can start.

Hypothesis generates drains on purpose (a wide job holding part of a pool, blockers it cannot preempt yet,
loans already running, small jobs waiting), so every property below is exercised on every example.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from sagequeue_core.policy import (
    PolicySettings,
    QueuedJob,
    Reservation,
    ReservationKind,
    RunningAttempt,
    Snapshot,
    plan,
)

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
POOL = "ml.trn1.32xlarge"
SINCE = NOW - timedelta(minutes=30)
BUDGET = 3
MIN_RUNTIME = 600


@st.composite
def drains(draw: st.DrawFn) -> tuple[Snapshot, PolicySettings]:
    capacity = draw(st.integers(2, 8))
    holder_priority = draw(st.integers(2, 6))
    # what blocks the holder: work it cannot preempt (more important, or not trained long enough)
    blocked = draw(st.integers(1, capacity - 1))
    running = []
    for i in range(blocked):
        more_important = draw(st.booleans())
        running.append(
            RunningAttempt(
                training_job_name=f"blocker-{i}",
                job_name=f"blocker-{i}",
                demand={POOL: 1},
                priority=holder_priority + 1 if more_important else holder_priority - 1,
                started_at=NOW - timedelta(minutes=5),
                training_started_at=NOW - timedelta(minutes=draw(st.integers(0, 9))),
            )
        )
    # loans already running on the holder's capacity; some of them barely started
    loans = draw(st.integers(0, capacity - blocked))
    for i in range(loans):
        running.append(
            RunningAttempt(
                training_job_name=f"loan-{i}",
                job_name=f"loan-{i}",
                demand={POOL: 1},
                priority=draw(st.integers(0, holder_priority)),
                started_at=SINCE + timedelta(minutes=draw(st.integers(0, 29))),
                training_started_at=None if draw(st.booleans()) else NOW - timedelta(seconds=30),
                # a spent preemption budget keeps no lender from its loan: any count
                preemptions=draw(st.integers(0, BUDGET + 1)),
                on_loan_for="holder",
            )
        )
    # sometimes a blocker has just ended: the holder's cover completes with its loans
    if running and draw(st.booleans()):
        ended = draw(st.sampled_from([a for a in running if a.training_job_name.startswith("blocker")]))
        running.remove(ended)
    holder = QueuedJob(
        name="holder",
        priority=holder_priority,
        submitted_at=NOW - timedelta(hours=2),
        demand={POOL: capacity},
        reservation=Reservation(instances={POOL: 0}, since=SINCE, kind=ReservationKind.DRAIN),
    )
    waiting = [
        QueuedJob(
            name=f"small-{i}",
            priority=draw(st.integers(0, holder_priority)),
            submitted_at=NOW - timedelta(minutes=draw(st.integers(1, 60))),
            demand={POOL: draw(st.integers(1, 2))},
            preemptions=draw(st.integers(0, BUDGET)),
            loans_taken_back=draw(st.integers(0, BUDGET)),
            checkpointed=draw(st.booleans()),
        )
        for i in range(draw(st.integers(0, 6)))
    ]
    snapshot = Snapshot(now=NOW, capacity={POOL: capacity}, queued=[holder, *waiting], running=running)
    return snapshot, PolicySettings(
        min_runtime_before_preemption_seconds=MIN_RUNTIME,
        max_preemptions_per_job=BUDGET,
        reserve_after_seconds=1800,
        lend_reserved_capacity=True,
    )


def _free(snapshot: Snapshot) -> int:
    return snapshot.capacity[POOL] - sum(a.demand[POOL] for a in snapshot.running)


def _loans(snapshot: Snapshot) -> list[RunningAttempt]:
    return [a for a in snapshot.running if a.on_loan_for == "holder"]


def _can_borrow(job: QueuedJob, holder: QueuedJob) -> bool:
    return job.checkpointed and job.loans_taken_back < BUDGET and job.priority <= holder.priority


SEEN: Counter[str] = Counter()


@settings(max_examples=300, deadline=None)
@given(drains())
def test_a_drain_lends_what_it_holds_and_takes_it_back_only_when_it_can_start(
    case: tuple[Snapshot, PolicySettings],
) -> None:
    snapshot, policy_settings = case
    result = plan(snapshot, policy_settings)
    holder = snapshot.queued[0]
    free = _free(snapshot)
    loans = _loans(snapshot)
    coverable_now = free + sum(a.demand[POOL] for a in loans) >= holder.demand[POOL]
    reclaimed = {p.training_job_name for p in result.preemptions if p.for_job == "holder"}
    lent = [s for s in result.starts if s.on_loan_for == "holder"]
    if coverable_now:
        SEEN["reclaim"] += bool(reclaimed)
        # it takes back exactly what it lacks, from its loans only (whatever their runtime or priority)
        assert reclaimed <= {a.training_job_name for a in loans}
        assert len(reclaimed) == max(holder.demand[POOL] - free, 0)
        assert not lent, "lent capacity it is about to start on"
    else:
        SEEN["lend"] += bool(lent)
        assert not reclaimed, "took back a loan although it still cannot start"
        # everything it holds and does not lend is idle only because no waiting job could borrow it
        started = {s.job_name for s in result.starts}
        assert started == {s.job_name for s in lent}, "a smaller job took reserved capacity without a loan"
        spare = free - sum(q.demand[POOL] for q in snapshot.queued if q.name in started)
        for job in snapshot.queued[1:]:
            if job.name in started:
                continue
            if _can_borrow(job, holder) and job.demand[POOL] <= spare:
                raise AssertionError(f"{job.name} could borrow {spare} idle reserved instances")
        for start in lent:
            assert _can_borrow(next(q for q in snapshot.queued if q.name == start.job_name), holder)
        # the reservation counts what it lent as its own
        held = result.reservations["holder"].instances[POOL]
        assert held == min(free + sum(a.demand[POOL] for a in loans), holder.demand[POOL])


def test_the_drain_strategy_exercises_both_branches() -> None:
    SEEN.clear()
    test_a_drain_lends_what_it_holds_and_takes_it_back_only_when_it_can_start()
    assert SEEN["lend"] > 0, SEEN
    assert SEEN["reclaim"] > 0, SEEN


def _snapshot(*running: RunningAttempt, waiting: tuple[QueuedJob, ...] = (), capacity: int = 4) -> Snapshot:
    holder = QueuedJob(
        name="holder",
        priority=5,
        submitted_at=NOW - timedelta(hours=2),
        demand={POOL: 4},
        reservation=Reservation(instances={POOL: 2}, since=SINCE, kind=ReservationKind.DRAIN),
    )
    return Snapshot(now=NOW, capacity={POOL: capacity}, queued=[holder, *waiting], running=list(running))


def _attempt(name: str, priority: int, **fields: object) -> RunningAttempt:
    values: dict[str, object] = {
        "training_job_name": name,
        "job_name": name,
        "demand": {POOL: 1},
        "priority": priority,
        "started_at": NOW - timedelta(minutes=5),
        "training_started_at": NOW - timedelta(minutes=4),
    }
    values.update(fields)
    return RunningAttempt(**values)  # type: ignore[arg-type]


def _small(name: str, **fields: object) -> QueuedJob:
    values: dict[str, object] = {
        "name": name,
        "priority": 3,
        "submitted_at": NOW - timedelta(minutes=10),
        "demand": {POOL: 1},
    }
    values.update(fields)
    return QueuedJob(**values)  # type: ignore[arg-type]


def test_only_checkpointing_jobs_with_loans_left_borrow_and_never_when_lending_is_off() -> None:
    blockers = (_attempt("a", 9), _attempt("b", 9))
    waiting = (
        _small("restarts-from-zero", checkpointed=False, submitted_at=NOW - timedelta(minutes=50)),
        _small("taken-back-enough", loans_taken_back=BUDGET, submitted_at=NOW - timedelta(minutes=45)),
        # a spent preemption budget does not keep a job from borrowing: only its lender stops it then
        _small("preempted-enough", preemptions=BUDGET, submitted_at=NOW - timedelta(minutes=40)),
        _small("resumes", submitted_at=NOW - timedelta(minutes=30)),
        _small("no-room-left", submitted_at=NOW - timedelta(minutes=10)),
    )
    settings_on = PolicySettings(max_preemptions_per_job=BUDGET, min_runtime_before_preemption_seconds=600)
    result = plan(_snapshot(*blockers, waiting=waiting), settings_on)
    assert [(s.job_name, s.on_loan_for) for s in result.starts] == [
        ("preempted-enough", "holder"),
        ("resumes", "holder"),
    ]
    off = PolicySettings(
        max_preemptions_per_job=BUDGET,
        min_runtime_before_preemption_seconds=600,
        lend_reserved_capacity=False,
    )
    assert plan(_snapshot(*blockers, waiting=waiting), off).starts == []


def test_a_loan_is_taken_back_before_its_minimum_runtime_and_before_lower_priority_victims() -> None:
    # the blocker ended: two free, two loans (one barely provisioned) and a ripe priority-1 job
    running = (
        _attempt(
            "loan-1",
            5,
            started_at=SINCE + timedelta(minutes=1),
            training_started_at=None,
            on_loan_for="holder",
        ),
        _attempt("loan-2", 4, started_at=SINCE + timedelta(minutes=2), on_loan_for="holder"),
        _attempt("ripe", 1, training_started_at=NOW - timedelta(hours=3)),
    )
    result = plan(_snapshot(*running, capacity=5), PolicySettings(min_runtime_before_preemption_seconds=600))
    assert sorted(p.training_job_name for p in result.preemptions) == ["loan-1", "loan-2"]
    assert result.reservations["holder"].instances == {POOL: 4}  # two free, two coming back


def test_a_loan_from_before_the_reservation_is_ordinary_running_work() -> None:
    # started on loan from an earlier reservation of the same job: not taken back by this one
    running = (
        _attempt("old-loan", 5, started_at=SINCE - timedelta(minutes=1), on_loan_for="holder"),
        _attempt("blocker", 9),
    )
    result = plan(_snapshot(*running), PolicySettings(min_runtime_before_preemption_seconds=600))
    assert result.preemptions == []


def test_a_job_more_important_than_the_lender_preempts_a_borrower_before_its_minimum_runtime() -> None:
    # the instance a priority-5 holder lent would have been free for a priority-9 job: it does not wait
    # for the borrower's minimum runtime (a lower-priority job that trained long enough is left alone)
    running = (
        _attempt("blocker-a", 9),
        _attempt("blocker-b", 9),
        _attempt("loan", 3, started_at=SINCE + timedelta(minutes=20), on_loan_for="holder"),
        _attempt("other", 1, started_at=SINCE, training_started_at=NOW - timedelta(minutes=5)),
    )
    urgent = QueuedJob(name="urgent", priority=9, submitted_at=NOW, demand={POOL: 1})
    result = plan(
        _snapshot(*running, waiting=(urgent,)), PolicySettings(min_runtime_before_preemption_seconds=600)
    )
    # as a loan taken back: the instance was the lender's, which the urgent job outranks
    assert [(p.training_job_name, p.for_job, p.taken_back) for p in result.preemptions] == [
        ("loan", "urgent", True)
    ]
    # so a borrower whose preemption budget is spent is no obstacle either
    spent = tuple(replace(a, preemptions=BUDGET) if a.on_loan_for else a for a in running)
    result = plan(
        _snapshot(*spent, waiting=(urgent,)),
        PolicySettings(min_runtime_before_preemption_seconds=600, max_preemptions_per_job=BUDGET),
    )
    assert [(p.training_job_name, p.taken_back) for p in result.preemptions] == [("loan", True)]
    # while "other", an ordinary victim too young to preempt, is left alone
    # one no more important than the lender waits for the minimum runtime as for any other victim
    peer = QueuedJob(name="peer", priority=5, submitted_at=NOW, demand={POOL: 1})
    result = plan(
        _snapshot(*running, waiting=(peer,)), PolicySettings(min_runtime_before_preemption_seconds=600)
    )
    assert result.preemptions == []
