"""A borrower whose preemption budget is spent: it may borrow since loans taken back count apart, and
then only its lender stops it. What that costs a job more important than the lender, which would have
taken the lender's idle instance at once had nobody borrowed it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

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
SETTINGS = PolicySettings(min_runtime_before_preemption_seconds=600, max_preemptions_per_job=BUDGET)


def _blocker(name: str) -> RunningAttempt:
    # more important than everyone below, trains for hours: the lender cannot start before it ends
    return RunningAttempt(
        training_job_name=name,
        job_name=name,
        demand={POOL: 1},
        priority=9,
        started_at=NOW - timedelta(hours=1),
        training_started_at=NOW - timedelta(hours=1),
    )


HOLDER = QueuedJob(
    name="holder",
    priority=5,
    submitted_at=NOW - timedelta(hours=2),
    demand={POOL: 4},
    reservation=Reservation(instances={POOL: 2}, since=SINCE, kind=ReservationKind.DRAIN),
)


def _borrower(preemptions: int) -> QueuedJob:
    return QueuedJob(
        name="borrower",
        priority=3,
        submitted_at=NOW - timedelta(minutes=10),
        demand={POOL: 2},  # all the lender holds
        preemptions=preemptions,
    )


def _urgent_after(borrower_preemptions: int) -> tuple[bool, list[str], list[str]]:
    """Pass 1: the holder lends (or not) to the borrower. Pass 2, five minutes on: a priority-7 job (more
    important than the priority-5 lender) arrives needing one instance. Whether the holder lent, and the
    second pass's starts and preemptions."""
    first = plan(
        Snapshot(
            now=NOW,
            capacity={POOL: 4},
            queued=[HOLDER, _borrower(borrower_preemptions)],
            running=[_blocker("a"), _blocker("b")],
        ),
        SETTINGS,
    )
    loans = [s for s in first.starts if s.job_name == "borrower"]
    later = NOW + timedelta(minutes=5)
    running = [_blocker("a"), _blocker("b")]
    queued = [HOLDER]
    for loan in loans:
        running.append(
            RunningAttempt(
                training_job_name="borrower-2",
                job_name="borrower",
                demand={POOL: 2},
                priority=3,
                started_at=later - timedelta(minutes=4),
                training_started_at=later - timedelta(minutes=3),
                preemptions=borrower_preemptions,
                on_loan_for=loan.on_loan_for,
            )
        )
    if not loans:
        queued.append(_borrower(borrower_preemptions))
    urgent = QueuedJob(name="urgent", priority=7, submitted_at=later, demand={POOL: 1})
    second = plan(
        Snapshot(now=later, capacity={POOL: 4}, queued=[*queued, urgent], running=running), SETTINGS
    )
    return bool(loans), [s.job_name for s in second.starts], [p.training_job_name for p in second.preemptions]


def test_a_job_more_important_than_the_lender_takes_a_borrowers_instance_when_the_borrower_has_budget() -> (
    None
):
    lent, starts, preempted = _urgent_after(borrower_preemptions=0)
    assert lent
    assert preempted == ["borrower-2"]  # at once, before the borrower's minimum runtime
    assert "urgent" not in starts  # it starts when the borrower's instances are back


def test_a_job_more_important_than_the_lender_never_waits_for_a_spared_borrower() -> None:
    lent, _, preempted = _urgent_after(borrower_preemptions=BUDGET)
    assert lent  # a spent preemption budget does not keep it from borrowing
    # THEN it is served as it would be on the lender's idle instance, or by stopping the loan
    assert preempted == ["borrower-2"]


def _old_loan_and_its_lender(preemptions: int) -> list[str]:
    """The holder's reservation began after it lent (a reservation restarts when the holder loses it for a
    pass, as a job does behind its team's quota): the loan is ordinary running work, below the holder's
    priority and past its minimum runtime. What the holder preempts to start."""
    since = NOW - timedelta(minutes=5)
    holder = QueuedJob(
        name="holder",
        priority=5,
        submitted_at=NOW - timedelta(hours=2),
        demand={POOL: 4},
        reservation=Reservation(instances={POOL: 2}, since=since, kind=ReservationKind.DRAIN),
    )
    old_loan = RunningAttempt(
        training_job_name="borrower-1",
        job_name="borrower",
        demand={POOL: 2},
        priority=3,
        started_at=since - timedelta(minutes=20),
        training_started_at=since - timedelta(minutes=19),
        preemptions=preemptions,
        on_loan_for="holder",
    )
    result = plan(Snapshot(now=NOW, capacity={POOL: 4}, queued=[holder], running=[old_loan]), SETTINGS)
    return [p.training_job_name for p in result.preemptions if p.for_job == "holder"]


@pytest.mark.parametrize("preemptions", [0, BUDGET])
def test_a_lender_may_stop_a_loan_it_made_before_its_reservation_whatever_the_borrowers_budget(
    preemptions: int,
) -> None:
    # "past it a job is not preempted again until it ends, except by the lender of a loan it runs on"
    # (docs/adr/0001): a borrower whose budget is spent is no exception to its own lender
    assert _old_loan_and_its_lender(preemptions) == ["borrower-1"]
