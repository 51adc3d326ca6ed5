"""Preempting at the checkpoint (docs/adr/0023): victims chosen by the training they would lose, and a stop
timed to a victim's checkpoint that is due within `checkpoint_wait_seconds`."""

from __future__ import annotations

import dataclasses
import itertools
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sagequeue_core.domain import Reservation, ReservationKind
from sagequeue_core.policy import (
    STOP_GRACE_SECONDS,
    TOP_PRIORITY_WAIT_FACTOR,
    PolicySettings,
    QueuedJob,
    RunningAttempt,
    Snapshot,
    covers,
    plan,
    work_lost_seconds,
)
from sagequeue_core.quotas import TeamQuota

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POOL = "ml.trn1.32xlarge"
NOW = T0 + timedelta(hours=3)
NO_WAIT = PolicySettings(checkpoint_wait_seconds=0)


def ago(minutes: float) -> datetime:
    return NOW - timedelta(minutes=minutes)


def queued(name: str, priority: int, count: int = 1, **kw: object) -> QueuedJob:
    return QueuedJob(
        name=name,
        priority=priority,
        submitted_at=kw.pop("submitted_at", ago(1)),  # type: ignore[arg-type]
        demand={POOL: count},
        **kw,  # type: ignore[arg-type]
    )


def victim(
    name: str,
    priority: int = 1,
    *,
    trained_minutes: float = 120,
    checkpoint_minutes_ago: float | None = None,
    interval_minutes: float | None = 30,
    count: int = 1,
    **kw: object,
) -> RunningAttempt:
    return RunningAttempt(
        training_job_name=name,
        job_name=name,
        priority=priority,
        started_at=ago(trained_minutes + 6),
        demand={POOL: count},
        training_started_at=ago(trained_minutes),
        last_checkpoint_at=None if checkpoint_minutes_ago is None else ago(checkpoint_minutes_ago),
        checkpoint_interval_seconds=None if interval_minutes is None else interval_minutes * 60,
        **kw,  # type: ignore[arg-type]
    )


# --- victims by work lost -------------------------------------------------------------------------------------


def test_the_freshest_checkpoint_is_chosen_over_an_equal_priority_stale_one() -> None:
    # GIVEN two equal victims started together; victim_order alone would take "a-stale" (name order)
    stale = victim("a-stale", checkpoint_minutes_ago=29)
    fresh = victim("b-fresh", checkpoint_minutes_ago=1)
    result = plan(
        Snapshot(now=NOW, capacity={POOL: 2}, queued=[queued("urgent", 5)], running=[stale, fresh]), NO_WAIT
    )
    # THEN the one that checkpointed a minute ago is stopped, and the stop says what it loses
    assert [(p.training_job_name, p.work_lost_seconds) for p in result.preemptions] == [("b-fresh", 60.0)]


def test_a_job_without_checkpoints_loses_everything_it_trained_in_the_attempt() -> None:
    # GIVEN a job that does not resume from checkpoints (whatever it may claim to have written) and one
    # that checkpointed 20 minutes ago; both trained 50 minutes in this attempt
    restarts = victim("a-restarts", trained_minutes=50, checkpoint_minutes_ago=1, checkpointed=False)
    resumes = victim("b-resumes", trained_minutes=50, checkpoint_minutes_ago=20)
    assert work_lost_seconds(restarts, NOW) == 50 * 60
    result = plan(
        Snapshot(now=NOW, capacity={POOL: 2}, queued=[queued("urgent", 5)], running=[restarts, resumes]),
        NO_WAIT,
    )
    # THEN the one that resumes is stopped: it loses 20 minutes, the other would lose all 50
    assert [(p.training_job_name, p.work_lost_seconds) for p in result.preemptions] == [("b-resumes", 1200.0)]


def test_without_a_checkpoint_the_whole_attempt_is_lost_and_a_provisioning_one_loses_nothing() -> None:
    never = victim("a-never", trained_minutes=40, checkpoint_minutes_ago=None)
    from_before = victim("b-earlier", trained_minutes=40, checkpoint_minutes_ago=90)  # the attempt resumed it
    provisioning = RunningAttempt(
        "c-starting", {POOL: 1}, priority=1, started_at=ago(3), job_name="c-starting"
    )
    waiting = RunningAttempt(
        "d-waiting", {POOL: 1}, priority=1, started_at=ago(30), job_name="d", waiting_for_capacity=True
    )
    assert work_lost_seconds(never, NOW) == 40 * 60
    assert work_lost_seconds(from_before, NOW) == 40 * 60
    assert work_lost_seconds(provisioning, NOW) == 0
    assert work_lost_seconds(waiting, NOW) == 0
    result = plan(
        Snapshot(
            now=NOW,
            capacity={POOL: 3},
            queued=[queued("urgent", 5)],
            running=[never, from_before, provisioning],
        ),
        NO_WAIT,
    )
    assert [(p.training_job_name, p.work_lost_seconds) for p in result.preemptions] == [("c-starting", 0.0)]


def test_a_job_that_reports_nothing_still_goes_before_one_without_checkpoints() -> None:
    # GIVEN a job with a CheckpointConfig that has told nothing of its checkpoints (an image that does not
    # report) and one without checkpoints, both trained 40 minutes, the first a minute longer
    silent = victim("b-silent", trained_minutes=41, checkpoint_minutes_ago=None, interval_minutes=None)
    restarts = victim("a-restarts", trained_minutes=40, checkpoint_minutes_ago=None, checkpointed=False)
    result = plan(
        Snapshot(now=NOW, capacity={POOL: 2}, queued=[queued("urgent", 5)], running=[silent, restarts]),
        NO_WAIT,
    )
    # THEN the one that may resume is stopped, as the victim order had it; its stop is still said to lose
    # all it trained, for nothing tells it wrote a checkpoint
    assert [(p.training_job_name, p.work_lost_seconds) for p in result.preemptions] == [
        ("b-silent", 41 * 60.0)
    ]


@given(
    st.sampled_from(
        [
            {"checkpoint_minutes_ago": None, "interval_minutes": None},  # reports nothing
            {"checkpoint_minutes_ago": None},  # an interval, but no checkpoint in the attempt
            {"checkpoint_minutes_ago": 110},  # an old one
            {"checkpoint_minutes_ago": 1, "interval_minutes": 7 * 24 * 60},  # fresh, but a 7-day interval
        ]
    ),
    st.booleans(),
)
@settings(max_examples=8, deadline=None)
def test_other_teams_borrowing_work_is_reclaimed_before_its_own_whatever_either_loses(
    claim: dict[str, float | None], by_work_lost: bool
) -> None:
    # GIVEN a governed pool of 2: team a runs "a-low" (checkpointed a minute ago) within its quota of 2 and
    # team b borrows the other instance with "b-borrow", which claims it would lose much (or is due late)
    a_low = victim("a-low", 1, checkpoint_minutes_ago=1, team="a")
    b_borrow = victim("b-borrow", 5, team="b", **claim)  # type: ignore[arg-type]
    result = plan(
        Snapshot(
            now=NOW,
            capacity={POOL: 2},
            team_quotas=[TeamQuota("a", POOL, 2), TeamQuota("b", POOL, 0)],
            queued=[queued("a-high", 9, team="a")],
            running=[a_low, b_borrow],
        ),
        dataclasses.replace(NO_WAIT, victims_by_work_lost=by_work_lost),
    )
    # THEN team a takes its quota back from b (ADR 0011), with or without victims chosen by work lost;
    # what b's job says of its checkpoints does not put team a's own job in its place
    assert [p.training_job_name for p in result.preemptions] == ["b-borrow"]
    assert result.checkpoint_waits == {}


def test_a_less_important_victim_goes_first_whatever_it_claims_to_lose() -> None:
    # GIVEN a pool without quotas: team b's priority-1 job reports an old checkpoint (it would lose two
    # hours), team a's priority-5 job checkpointed a minute ago
    b_low = victim("b-low", 1, checkpoint_minutes_ago=150, interval_minutes=None, team="b")
    a_mid = victim("a-mid", 5, checkpoint_minutes_ago=1, team="a")
    result = plan(
        Snapshot(
            now=NOW,
            capacity={POOL: 2},
            queued=[queued("c-top", 9, team="c")],
            running=[a_mid, b_low],
        ),
        NO_WAIT,
    )
    # THEN the priority-1 job is stopped, as the victim order has it: work lost only breaks ties
    assert [(p.training_job_name, p.work_lost_seconds) for p in result.preemptions] == [("b-low", 7200.0)]


def test_fewer_victims_still_come_before_less_work_lost() -> None:
    # one two-instance victim that loses 10 minutes beats two one-instance victims that lose 1 minute each
    wide = victim("wide", count=2, checkpoint_minutes_ago=10)
    result = plan(
        Snapshot(
            now=NOW,
            capacity={POOL: 4},
            queued=[queued("urgent", 5, count=2)],
            running=[wide, victim("a", checkpoint_minutes_ago=1), victim("b", checkpoint_minutes_ago=1)],
        ),
        NO_WAIT,
    )
    assert [p.training_job_name for p in result.preemptions] == ["wide"]


# --- timing: waiting for a due checkpoint ---------------------------------------------------------------------


def test_a_checkpoint_due_within_the_bound_is_waited_for_then_the_victim_is_stopped() -> None:
    # GIVEN the only victim checkpoints every 30 minutes and wrote its last 28 minutes ago (due in 2)
    due = victim("victim", checkpoint_minutes_ago=28)
    snap = Snapshot(now=NOW, capacity={POOL: 1}, queued=[queued("urgent", 5)], running=[due])
    first = plan(snap, PolicySettings())
    # THEN it is not stopped yet: the pass waits until the checkpoint or the bound, and says why
    assert first.preemptions == []
    assert first.checkpoint_waits == {"victim": NOW + timedelta(seconds=300)}
    assert first.wake_at == NOW + timedelta(minutes=2)
    assert "checkpoint of victim" in first.waiting["urgent"]
    reservation = first.reservations["urgent"]
    assert reservation.kind is ReservationKind.PREEMPTED
    assert reservation.since == NOW

    # WHEN the checkpoint comes at its time, the next pass stops it: it loses the 30 s since
    later = NOW + timedelta(minutes=2, seconds=30)
    checkpointed = dataclasses.replace(due, last_checkpoint_at=NOW + timedelta(minutes=2))
    second = plan(
        Snapshot(
            now=later,
            capacity={POOL: 1},
            queued=[queued("urgent", 5, reservation=reservation)],
            running=[checkpointed],
        ),
        PolicySettings(),
    )
    assert [(p.training_job_name, p.work_lost_seconds) for p in second.preemptions] == [("victim", 30.0)]
    assert second.checkpoint_waits == {}


def test_a_checkpoint_that_does_not_come_holds_the_job_no_longer_than_the_bound() -> None:
    due = victim("victim", checkpoint_minutes_ago=28)
    first = plan(Snapshot(now=NOW, capacity={POOL: 1}, queued=[queued("urgent", 5)], running=[due]))
    reservation = first.reservations["urgent"]
    # WHEN the checkpoint is late: passes before the bound still wait, the one at the bound stops it
    for seconds, stopped in ((150, False), (299, False), (300, True)):
        later = plan(
            Snapshot(
                now=NOW + timedelta(seconds=seconds),
                capacity={POOL: 1},
                queued=[queued("urgent", 5, reservation=reservation)],
                running=[due],
            )
        )
        assert bool(later.preemptions) is stopped, seconds
        if stopped:
            assert later.preemptions[0].work_lost_seconds == 28 * 60 + 300


def test_a_checkpoint_due_beyond_the_bound_is_not_waited_for() -> None:
    # due in 6 minutes, the bound is 5: stopped now
    far = victim("victim", checkpoint_minutes_ago=24)
    result = plan(Snapshot(now=NOW, capacity={POOL: 1}, queued=[queued("urgent", 5)], running=[far]))
    assert [p.training_job_name for p in result.preemptions] == ["victim"]
    assert result.checkpoint_waits == {}
    assert result.wake_at is None
    # and with waiting turned off, a checkpoint due in a minute is not waited for either
    near = victim("victim", checkpoint_minutes_ago=29)
    off = plan(Snapshot(now=NOW, capacity={POOL: 1}, queued=[queued("urgent", 5)], running=[near]), NO_WAIT)
    assert [p.training_job_name for p in off.preemptions] == ["victim"]


def test_a_resumed_attempt_is_due_an_interval_into_its_training() -> None:
    # it wrote no checkpoint in this attempt yet (its last is from the attempt before), its interval is
    # known: the first of this attempt is due 30 minutes into its training, in 2 minutes
    resumed = victim("victim", trained_minutes=28, checkpoint_minutes_ago=90)
    result = plan(Snapshot(now=NOW, capacity={POOL: 1}, queued=[queued("urgent", 5)], running=[resumed]))
    assert result.checkpoint_waits == {"victim": NOW + timedelta(seconds=300)}
    assert result.wake_at == NOW + timedelta(minutes=2)
    # without an interval nothing is known to be due: stopped now, losing all it trained in the attempt
    unknown = dataclasses.replace(resumed, checkpoint_interval_seconds=None)
    now = plan(Snapshot(now=NOW, capacity={POOL: 1}, queued=[queued("urgent", 5)], running=[unknown]))
    assert [(p.training_job_name, p.work_lost_seconds) for p in now.preemptions] == [("victim", 28 * 60.0)]


def test_a_victim_early_in_its_interval_is_stopped_rather_than_waited_for() -> None:
    # a job checkpointing every 4 minutes wrote one a minute ago: waiting 3 minutes to save 1 is no gain,
    # and a job that checkpoints often cannot hold its preemptor checkpoint after checkpoint
    often = victim("victim", checkpoint_minutes_ago=1, interval_minutes=4)
    result = plan(Snapshot(now=NOW, capacity={POOL: 1}, queued=[queued("urgent", 5)], running=[often]))
    assert [(p.training_job_name, p.work_lost_seconds) for p in result.preemptions] == [("victim", 60.0)]


def test_the_held_capacity_goes_to_no_other_job_while_the_checkpoint_is_awaited() -> None:
    # GIVEN one free instance and a victim whose checkpoint is due; the preemptor needs both instances, and
    # jobs of equal and lower priority that need one wait behind it
    due = victim("victim", checkpoint_minutes_ago=28)
    others = [queued("same", 5, submitted_at=ago(0.5)), queued("lower", 3, submitted_at=ago(30))]
    first = plan(
        Snapshot(now=NOW, capacity={POOL: 2}, queued=[queued("urgent", 5, count=2), *others], running=[due])
    )
    assert first.actions == []
    assert "victim" in first.checkpoint_waits
    assert first.held == {"urgent": {POOL: 1}}
    reservation = first.reservations["urgent"]
    assert reservation.instances == {POOL: 2}
    # AND in the next pass, the reservation keeps it: still nobody starts on the free instance
    second = plan(
        Snapshot(
            now=NOW + timedelta(minutes=1),
            capacity={POOL: 2},
            queued=[queued("urgent", 5, count=2, reservation=reservation), *others],
            running=[due],
        )
    )
    assert second.starts == []
    assert "victim" in second.checkpoint_waits
    # AND the waited-for victim is no victim for another job in the same pass
    assert all(p.training_job_name != "victim" for p in second.preemptions)


def test_a_loan_is_taken_back_at_once_whatever_its_checkpoint() -> None:
    loan = victim("borrower", priority=5, checkpoint_minutes_ago=28, on_loan_for="wide")
    result = plan(
        Snapshot(
            now=NOW,
            capacity={POOL: 1},
            queued=[
                queued(
                    "wide",
                    5,
                    reservation=Reservation(instances={POOL: 1}, since=ago(60), kind=ReservationKind.DRAIN),
                )
            ],
            running=[loan],
        )
    )
    assert [(p.training_job_name, p.taken_back) for p in result.preemptions] == [("borrower", True)]


def test_top_priority_waits_only_within_its_targets_margin() -> None:
    top = PolicySettings(top_priority=9)
    margin = (TOP_PRIORITY_WAIT_FACTOR - 1) * (STOP_GRACE_SECONDS + top.provisioning_seconds)
    assert 0 < margin < top.checkpoint_wait_seconds
    # a checkpoint due in 2 minutes is within the bound but beyond the margin: the top job does not wait
    due = victim("victim", checkpoint_minutes_ago=28)
    result = plan(
        Snapshot(now=NOW, capacity={POOL: 1}, queued=[queued("urgent", 9, submitted_at=NOW)], running=[due]),
        top,
    )
    assert [p.training_job_name for p in result.preemptions] == ["victim"]
    # one due within the margin is waited for, never beyond the margin from when the job began to wait
    soon = victim("victim", checkpoint_minutes_ago=29.5)
    held = plan(
        Snapshot(now=NOW, capacity={POOL: 1}, queued=[queued("urgent", 9, submitted_at=NOW)], running=[soon]),
        top,
    )
    assert held.checkpoint_waits == {"victim": NOW + timedelta(seconds=margin)}
    # and a top job that already waited the margin does not wait at all
    late = plan(
        Snapshot(
            now=NOW,
            capacity={POOL: 1},
            queued=[queued("urgent", 9, submitted_at=ago(margin / 60))],
            running=[soon],
        ),
        top,
    )
    assert [p.training_job_name for p in late.preemptions] == ["victim"]


# --- properties -----------------------------------------------------------------------------------------------

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def candidates(draw: st.DrawFn) -> tuple[list[RunningAttempt], int, int]:
    attempts = []
    for i in range(draw(st.integers(1, 6))):
        trained = draw(st.integers(0, 180))
        checkpoint = draw(st.one_of(st.none(), st.integers(0, 200)))
        attempts.append(
            RunningAttempt(
                training_job_name=f"run-{i}",
                job_name=f"run-{i}",
                priority=draw(st.integers(0, 4)),
                started_at=ago(trained + draw(st.integers(0, 10))),
                demand={POOL: draw(st.integers(1, 3))},
                training_started_at=None if draw(st.integers(0, 6)) == 0 else ago(trained),
                checkpointed=draw(st.booleans()),
                last_checkpoint_at=None if checkpoint is None else ago(checkpoint),
                checkpoint_interval_seconds=draw(st.sampled_from([None, 600.0, 1800.0])),
            )
        )
    used = sum(a.demand[POOL] for a in attempts)
    free = draw(st.integers(0, 2))
    need = draw(st.integers(free + 1, used + free))
    return attempts, free, need


@PROPERTY
@given(candidates())
def test_the_victims_lose_the_least_work_among_the_fewest_that_cover_of_the_first_classes(
    case: tuple[list[RunningAttempt], int, int],
) -> None:
    attempts, free, need = case
    capacity = sum(a.demand[POOL] for a in attempts) + free
    result = plan(
        Snapshot(
            now=NOW, capacity={POOL: capacity}, queued=[queued("urgent", 5, count=need)], running=attempts
        ),
        NO_WAIT,
    )
    chosen = {p.training_job_name for p in result.preemptions}
    deficit = {POOL: need - free}

    def priced(attempt: RunningAttempt) -> float:
        # ADR 0023: a job that resumes from checkpoints and told nothing of them counts half its loss
        lost = work_lost_seconds(attempt, NOW)
        reported = attempt.checkpoint_interval_seconds or (
            attempt.last_checkpoint_at is not None
            and (
                attempt.training_started_at is None
                or attempt.last_checkpoint_at > attempt.training_started_at
            )
        )
        return lost / 2 if attempt.checkpointed and not reported else lost

    def lost(combo: tuple[RunningAttempt, ...]) -> float:
        return sum(priced(a) * a.demand[POOL] for a in combo)

    every = [
        combo
        for size in range(1, len(attempts) + 1)
        for combo in itertools.combinations(attempts, size)
        if covers(combo, deficit)
    ]

    def classes(combo: tuple[RunningAttempt, ...]) -> tuple[tuple[bool, int], ...]:
        # the victim order less its tie-breaks: those that resume from checkpoints, then the least important
        return tuple(sorted((not a.checkpointed, a.priority) for a in combo))

    fewest = min(len(c) for c in every)
    first = min(classes(c) for c in every if len(c) == fewest)
    cheapest = min(lost(c) for c in every if len(c) == fewest and classes(c) == first)
    picked = tuple(a for a in attempts if a.training_job_name in chosen)
    assert len(picked) == fewest
    # work lost chooses only among the covers the victim order cannot tell apart
    assert classes(picked) == first
    assert abs(lost(picked) - cheapest) < 1e-6
    by_name = {p.training_job_name: p.work_lost_seconds for p in result.preemptions}
    assert by_name == {a.training_job_name: work_lost_seconds(a, NOW) for a in picked}


@PROPERTY
@given(
    candidates(),
    st.sampled_from([0, 60, 300, 900]),
    st.integers(0, 9),
    st.one_of(st.none(), st.integers(0, 20)),
    st.integers(0, 15),
)
def test_no_job_waits_for_a_checkpoint_beyond_its_bound(
    case: tuple[list[RunningAttempt], int, int],
    bound: int,
    priority: int,
    reserved_minutes_ago: int | None,
    waited_minutes: int,
) -> None:
    attempts, free, need = case
    capacity = sum(a.demand[POOL] for a in attempts) + free
    policy = PolicySettings(checkpoint_wait_seconds=bound, top_priority=8)
    reservation = (
        None
        if reserved_minutes_ago is None
        else Reservation(instances={}, since=ago(reserved_minutes_ago), kind=ReservationKind.PREEMPTED)
    )
    job = queued("urgent", priority, count=need, submitted_at=ago(waited_minutes), reservation=reservation)
    result = plan(Snapshot(now=NOW, capacity={POOL: capacity}, queued=[job], running=attempts), policy)
    if bound == 0:
        assert result.checkpoint_waits == {}
    since = reservation.since if reservation is not None else NOW
    by_name = {a.training_job_name: a for a in attempts}
    for name, until in result.checkpoint_waits.items():
        # never past the bound from when its reservation began, nor a top job past its target's margin
        assert NOW < until <= since + timedelta(seconds=bound)
        if policy.is_top(priority):
            margin = (TOP_PRIORITY_WAIT_FACTOR - 1) * (STOP_GRACE_SECONDS + policy.provisioning_seconds)
            assert until <= job.waiting_since + timedelta(seconds=margin)
        awaited = by_name[name]
        assert awaited.checkpointed
        assert awaited.checkpoint_interval_seconds
        assert awaited.training_started_at is not None
        assert result.wake_at is not None
        assert NOW < result.wake_at <= until
    # every victim is either stopped or waited for, never both
    stopped = {p.training_job_name for p in result.preemptions}
    assert not stopped & set(result.checkpoint_waits)
