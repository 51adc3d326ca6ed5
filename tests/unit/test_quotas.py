"""Team quotas: the ledger's arithmetic (quotas.py) and the pass that consults it (policy.py).

The properties run the pass over a small model of SageMaker (an attempt trains from the moment it starts,
a stopped one gives its instances back after the stop grace), so that what they state, no team above its
ceiling, lent capacity back within min runtime + stop grace, every team's finite demand served, is stated
over time and not only for one pass.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sagequeue_core.policy import (
    PolicySettings,
    Preempt,
    QueuedJob,
    RunningAttempt,
    Snapshot,
    Start,
    plan,
)
from sagequeue_core.quotas import (
    QuotaError,
    TeamLedger,
    TeamQuota,
    UsageCounter,
    decay,
    fair_share_factors,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POOL = "ml.trn1.32xlarge"
MIN_RUNTIME = 600
GRACE = 120
STEP = 60


def running(name: str, team: str, n: int = 1, *, minutes: int = 60, priority: int = 5) -> RunningAttempt:
    at = T0 - timedelta(minutes=minutes)
    return RunningAttempt(
        training_job_name=name,
        job_name=name,
        demand={POOL: n},
        priority=priority,
        started_at=at,
        training_started_at=at,
        team=team,
    )


def queued(name: str, team: str, n: int = 1, *, priority: int = 5, minute: int = 0) -> QueuedJob:
    return QueuedJob(
        name=name, priority=priority, submitted_at=T0 + timedelta(minutes=minute), demand={POOL: n}, team=team
    )


def quotas(a: int = 2, b: int = 2, **limits: int | None) -> list[TeamQuota]:
    return [
        TeamQuota("a", POOL, a, limits.get("a_borrow"), limits.get("a_lend")),
        TeamQuota("b", POOL, b, limits.get("b_borrow"), limits.get("b_lend")),
    ]


SETTINGS = PolicySettings(min_runtime_before_preemption_seconds=MIN_RUNTIME, reserve_after_seconds=0)


# --- the ledger --------------------------------------------------------------------------------------------------


def test_a_team_borrows_what_others_lend_and_no_more() -> None:
    ledger = TeamLedger(quotas(b_lend=1), {POOL: 4}, [running("a1", "a", 2)])
    assert ledger.headroom("a", POOL) == 0
    assert ledger.borrowable("a", POOL) == 1  # b lends one of its two
    assert ledger.short("a", {POOL: 1}) == {}
    assert ledger.short("a", {POOL: 2}) == {POOL: 1}
    ledger.take("a", {POOL: 1})
    assert ledger.borrowable("a", POOL) == 0
    assert ledger.share("b", POOL).lent == 1
    assert ledger.share("a", POOL).borrowed == 1


def test_the_borrowing_limit_caps_a_team_even_when_more_is_lent() -> None:
    ledger = TeamLedger(quotas(a_borrow=1), {POOL: 4}, [running("a1", "a", 2)])
    assert ledger.borrowable("a", POOL) == 1
    assert ledger.reason("a", {POOL: 2}, {POOL: 2}) == (
        f"team a at its quota of 2 {POOL}; 1 borrowable, 2 free"
    )


def test_capacity_no_nominal_quota_covers_is_lent_to_all() -> None:
    ledger = TeamLedger([TeamQuota("a", POOL, 2, lending_limit=0)], {POOL: 5}, [])
    assert ledger.unassigned(POOL) == 3
    assert ledger.borrowable("b", POOL) == 3  # b has no quota: nominal 0, borrowing unlimited
    assert ledger.short("b", {POOL: 4}) == {POOL: 1}


def test_reclaim_takes_only_what_each_borrowing_team_borrows_newest_first() -> None:
    attempts = [running("a-old", "a", minutes=90), running("a-mid", "a", minutes=60)]
    attempts += [running("a-new", "a", minutes=30), running("c-1", "c", minutes=120)]
    ledger = TeamLedger(quotas(), {POOL: 4}, attempts)
    # a holds 3 of nominal 2 (borrows 1), c holds 1 of nominal 0 (borrows 1)
    chosen = ledger.reclaim_candidates("b", {POOL: 2}, attempts, lambda a: True)
    assert [a.training_job_name for a in chosen] == ["a-new", "c-1"]
    # beyond its nominal quota a team reclaims nothing
    assert ledger.reclaim_candidates("b", {POOL: 3}, attempts, lambda a: True) == []
    # what is not ready (minimum runtime, budget) is passed over
    assert [
        a.training_job_name
        for a in ledger.reclaim_candidates("b", {POOL: 1}, attempts, lambda a: a.training_job_name != "a-new")
    ] == ["a-mid", "c-1"]


def test_quota_input_is_checked() -> None:
    with pytest.raises(QuotaError, match="nominal quota"):
        TeamQuota("a", POOL, -1)
    with pytest.raises(QuotaError, match="borrowing limit"):
        TeamQuota("a", POOL, 1, borrowing_limit=-2)
    with pytest.raises(QuotaError, match="team name"):
        TeamQuota("a b", POOL, 1)


def test_usage_decays_with_the_half_life_and_fair_share_favours_the_lighter_team() -> None:
    assert decay(8.0, 3600, 3600) == pytest.approx(4.0)
    counter = UsageCounter(as_of=T0).advance(T0 + timedelta(hours=1), {"a": 4}, 24 * 3600)
    assert counter.hours["a"] == pytest.approx(4 * 0.5 ** (0.5 / 24))
    later = counter.advance(T0 + timedelta(hours=25), {}, 24 * 3600)
    assert later.hours["a"] == pytest.approx(counter.hours["a"] / 2)
    factors = fair_share_factors({"a": 10.0, "b": 0.0}, quotas())
    assert factors["b"] == 1.0
    assert factors["a"] == pytest.approx(0.25)
    assert fair_share_factors({"a": 1.0}, []) == {}


# --- the pass with quotas -----------------------------------------------------------------------------------------


def test_a_team_alone_borrows_the_whole_pool() -> None:
    snap = Snapshot(
        now=T0,
        capacity={POOL: 4},
        team_quotas=quotas(),
        queued=[queued(f"a{i}", "a", minute=i) for i in range(5)],
    )
    result = plan(snap, SETTINGS)
    assert [s.job_name for s in result.starts] == ["a0", "a1", "a2", "a3"]
    assert result.waiting["a4"] == f"team a at its quota of 2 {POOL}; 0 borrowable, 0 free"


def test_a_team_under_its_quota_reclaims_whatever_the_borrowers_priority() -> None:
    attempts = [running(f"a{i}", "a", minutes=60 - i, priority=9) for i in range(4)]
    snap = Snapshot(
        now=T0,
        capacity={POOL: 4},
        team_quotas=quotas(),
        running=attempts,
        queued=[queued("b0", "b", priority=1)],
    )
    result = plan(snap, SETTINGS)
    assert [(p.job_name, p.for_job) for p in result.preemptions] == [("a3", "b0")]  # the newest
    assert result.reservations["b0"].instances == {POOL: 1}


def test_borrowers_that_have_not_trained_the_minimum_are_waited_for_not_preempted() -> None:
    attempts = [running(f"a{i}", "a", minutes=5) for i in range(4)]
    snap = Snapshot(
        now=T0, capacity={POOL: 4}, team_quotas=quotas(), running=attempts, queued=[queued("b0", "b")]
    )
    result = plan(snap, SETTINGS)
    assert result.preemptions == []
    assert "minimum runtime" in result.waiting["b0"]


def test_priority_does_not_preempt_across_teams_within_their_quota() -> None:
    attempts = [running("a0", "a", 2, priority=1), running("b0", "b", 2, priority=1)]
    snap = Snapshot(
        now=T0,
        capacity={POOL: 4},
        team_quotas=quotas(),
        running=attempts,
        queued=[queued("a-hi", "a", priority=9)],
    )
    result = plan(snap, SETTINGS)
    # team a is at its quota and b lends nothing free: a's own lower-priority job makes room
    assert [p.job_name for p in result.preemptions] == ["a0"]
    assert "team a at its quota" in result.waiting["a-hi"]


def test_a_lending_limit_of_zero_keeps_the_share_idle_for_its_team() -> None:
    snap = Snapshot(
        now=T0,
        capacity={POOL: 4},
        team_quotas=quotas(b_lend=0),
        queued=[queued(f"a{i}", "a", minute=i) for i in range(4)],
    )
    result = plan(snap, SETTINGS)
    assert [s.job_name for s in result.starts] == ["a0", "a1"]
    assert result.waiting["a2"] == f"team a at its quota of 2 {POOL}; 0 borrowable, 2 free"
    assert result.held == {}  # the idle share is claimed by nobody


def test_a_team_at_its_quota_preempts_its_own_work_rather_than_borrow_what_is_not_lent() -> None:
    # GIVEN team a at its quota of 2 with low-priority work, team b lending nothing, 2 instances free
    snap = Snapshot(
        now=T0,
        capacity={POOL: 4},
        team_quotas=quotas(b_lend=0),
        running=[running("a-low", "a", 2, priority=1)],
        queued=[queued("a-hi", "a", priority=9), queued("b0", "b", priority=0, minute=1)],
    )
    result = plan(snap, SETTINGS)
    # THEN b's job, within its quota, goes first and starts on b's idle share, whatever its priority; a's
    # urgent job stops a's own job rather than take b's other idle instance
    assert [s.job_name for s in result.starts] == ["b0"]
    assert [(p.job_name, p.for_job) for p in result.preemptions] == [("a-low", "a-hi")]
    assert result.waiting["a-hi"].startswith(f"team a at its quota of 2 {POOL}; 0 borrowable, 1 free")
    # AND in the next pass, while a-low stops, nothing more is preempted for it
    stopping = replace(snap.running[0], stopping=True)
    again = plan(replace(snap, running=[stopping], queued=[snap.queued[0]]), SETTINGS)
    assert again.preemptions == []
    assert again.waiting["a-hi"].endswith("waiting for the team's stopping jobs")


def test_equal_priority_teams_are_ordered_by_fair_share() -> None:
    jobs = [queued("a0", "a", minute=0), queued("b0", "b", minute=1)]
    snap = Snapshot(
        now=T0,
        capacity={POOL: 1},
        team_quotas=[TeamQuota("a", POOL, 0), TeamQuota("b", POOL, 0)],
        team_usage={"a": 5.0, "b": 1.0},
        queued=jobs,
    )
    assert [s.job_name for s in plan(snap, SETTINGS).starts] == ["b0"]
    # a higher priority still goes first, whatever its team used
    hi = replace(jobs[0], priority=6)
    assert [s.job_name for s in plan(replace(snap, queued=[hi, jobs[1]]), SETTINGS).starts] == ["a0"]


# --- properties over time ----------------------------------------------------------------------------------------


@dataclass
class Job:
    name: str
    team: str
    instances: int
    priority: int
    seconds: int
    submit: int


@dataclass
class World:
    """A pool, its quotas and a queue, stepped a minute at a time through passes of the real policy."""

    capacity: int
    quotas: list[TeamQuota]
    jobs: list[Job]
    now: int = 0
    running: dict[str, tuple[Job, int, int]] = field(
        default_factory=dict
    )  # name -> job, started, preemptions
    stopping: dict[str, tuple[Job, int]] = field(default_factory=dict)  # name -> job, gone at
    done: dict[str, int] = field(default_factory=dict)
    started_at: dict[str, int] = field(default_factory=dict)
    preemptions: Counter[str] = field(default_factory=Counter)
    reservations: dict[str, object] = field(default_factory=dict)

    def at(self, seconds: int) -> datetime:
        return T0 + timedelta(seconds=seconds)

    def snapshot(self) -> Snapshot:
        waiting = [
            QueuedJob(
                name=j.name,
                priority=j.priority,
                submitted_at=self.at(j.submit),
                demand={POOL: j.instances},
                team=j.team,
                reservation=self.reservations.get(j.name),  # type: ignore[arg-type]
            )
            for j in self.jobs
            if j.submit <= self.now
            and j.name not in self.running
            and j.name not in self.stopping
            and j.name not in self.done
        ]
        attempts = [
            RunningAttempt(
                training_job_name=name,
                job_name=name,
                demand={POOL: job.instances},
                priority=job.priority,
                started_at=self.at(start),
                training_started_at=self.at(start),
                preemptions=self.preemptions[name],
                team=job.team,
            )
            for name, (job, start, _) in self.running.items()
        ] + [
            RunningAttempt(
                training_job_name=name,
                job_name=name,
                demand={POOL: job.instances},
                priority=job.priority,
                started_at=self.at(0),
                stopping=True,
                team=job.team,
            )
            for name, (job, _) in self.stopping.items()
        ]
        return Snapshot(
            now=self.at(self.now),
            capacity={POOL: self.capacity},
            team_quotas=self.quotas,
            queued=waiting,
            running=attempts,
        )

    def step(self, policy: PolicySettings) -> None:
        for name, (job, start, _) in list(self.running.items()):
            if self.now - start >= job.seconds:
                del self.running[name]
                self.done[name] = self.now
        for name, (_job, gone) in list(self.stopping.items()):
            if self.now >= gone:
                del self.stopping[name]
        result = plan(self.snapshot(), policy)
        self.reservations = dict(result.reservations)
        by_name = {j.name: j for j in self.jobs}
        for action in result.actions:
            if isinstance(action, Preempt):
                job, _, _ = self.running.pop(action.job_name)
                self.preemptions[action.job_name] += 1
                self.stopping[action.job_name] = (job, self.now + GRACE)
            elif isinstance(action, Start):
                self.running[action.job_name] = (by_name[action.job_name], self.now, 0)
                self.started_at.setdefault(action.job_name, self.now)
        self.check()
        self.now += STEP

    def check(self) -> None:
        held: Counter[str] = Counter()
        for job, _, _ in self.running.values():
            held[job.team] += job.instances
        for job, _ in self.stopping.values():
            held[job.team] += job.instances
        assert sum(held.values()) <= self.capacity
        for quota in self.quotas:
            assert held[quota.team] <= quota.ceiling, f"team {quota.team} holds {held[quota.team]}: {quota}"


teams = st.sampled_from(["a", "b", "c"])


@st.composite
def worlds(draw: st.DrawFn) -> World:
    capacity = draw(st.integers(1, 6))
    quota_list = []
    for team in ("a", "b", "c"):
        if draw(st.booleans()):
            quota_list.append(
                TeamQuota(
                    team,
                    POOL,
                    draw(st.integers(0, capacity)),
                    draw(st.none() | st.integers(0, 3)),
                    draw(st.none() | st.integers(0, 3)),
                )
            )
    jobs = [
        Job(
            name=f"j{i}",
            team=draw(teams),
            instances=draw(st.integers(1, capacity)),
            priority=draw(st.integers(0, 3)),
            seconds=draw(st.integers(1, 90)) * 60,
            submit=draw(st.integers(0, 60)) * 60,
        )
        for i in range(draw(st.integers(1, 10)))
    ]
    # a job wider than its team could ever hold waits for good, with a reason that says so
    ledger = TeamLedger(quota_list, {POOL: capacity})
    for job in jobs:
        if job.instances > ledger.most(job.team, POOL):
            assert ledger.reason(job.team, {POOL: job.instances}, {}).startswith("can never fit")
    fitting = [j for j in jobs if j.instances <= ledger.most(j.team, POOL)]
    return World(capacity, quota_list, fitting)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_no_team_exceeds_its_nominal_quota_plus_borrowing_limit_and_every_team_is_served(
    world: World,
) -> None:
    # GIVEN any quotas (some teams without any) and a finite workload
    # WHEN passes run every minute until the queue drains
    limit = sum(j.seconds for j in world.jobs) * 4 + 4 * 3600 + 3600
    while len(world.done) < len(world.jobs):
        assert world.now <= limit, f"not drained: {sorted({j.name for j in world.jobs} - set(world.done))}"
        world.step(SETTINGS)
    # THEN (checked every step) no team held more than its ceiling, and every job of every team ran
    # to its end: no team with finite demand starves, quota-blocked jobs included


@st.composite
def borrowed_pools(draw: st.DrawFn) -> tuple[World, Job]:
    capacity = draw(st.integers(2, 6))
    nominal_b = draw(st.integers(1, capacity))
    quota_list = [TeamQuota("a", POOL, capacity - nominal_b), TeamQuota("b", POOL, nominal_b)]
    # team a fills the pool with long jobs of random sizes, borrowing b's share
    jobs, used = [], 0
    while used < capacity:
        n = draw(st.integers(1, capacity - used))
        jobs.append(Job(f"a{len(jobs)}", "a", n, draw(st.integers(0, 9)), 24 * 3600, 0))
        used += n
    arrival = draw(st.integers(0, 30)) * 60
    b_job = Job("b-job", "b", draw(st.integers(1, nominal_b)), 0, 3600, arrival)
    return World(capacity, quota_list, [*jobs, b_job]), b_job


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(borrowed_pools())
def test_lent_capacity_comes_back_within_min_runtime_plus_stop_grace(case: tuple[World, Job]) -> None:
    world, b_job = case
    # GIVEN team a holding the whole pool on b's unused quota, at any priority
    # WHEN team b's job, within its nominal quota and of the lowest priority, arrives
    while "b-job" not in world.started_at:
        world.step(SETTINGS)
        assert world.now <= b_job.submit + 4 * 3600
    # THEN it starts within one minimum runtime plus the stop grace (and a pass's period) of its arrival,
    # having preempted only a's jobs
    assert world.started_at["b-job"] - b_job.submit <= MIN_RUNTIME + GRACE + STEP
    assert set(world.preemptions) <= {j.name for j in world.jobs if j.team == "a"}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", None]), st.integers(1, 3), st.integers(0, 5), st.booleans()),
        min_size=1,
        max_size=12,
    ),
    st.integers(1, 6),
)
def test_without_quotas_teams_change_nothing(
    jobs: list[tuple[str | None, int, int, bool]], capacity: int
) -> None:
    # GIVEN the same snapshot with and without teams on its jobs and attempts, no quotas configured
    queued_jobs = [
        QueuedJob(name=f"q{i}", priority=p, submitted_at=T0 + timedelta(seconds=i), demand={POOL: n}, team=t)
        for i, (t, n, p, is_running) in enumerate(jobs)
        if not is_running
    ]
    attempts = [
        running(f"r{i}", t or "", n, minutes=30, priority=p)
        for i, (t, n, p, is_running) in enumerate(jobs)
        if is_running
    ]
    with_teams = Snapshot(
        now=T0, capacity={POOL: capacity}, queued=queued_jobs, running=attempts, team_usage={"a": 9.0}
    )
    without = Snapshot(
        now=T0,
        capacity={POOL: capacity},
        queued=[replace(j, team=None) for j in queued_jobs],
        running=[replace(a, team=None) for a in attempts],
    )
    # THEN the plans are the same
    assert plan(with_teams, SETTINGS) == plan(without, SETTINGS)


def test_a_loan_of_reserved_capacity_is_no_way_around_a_teams_quota() -> None:
    from sagequeue_core.policy import Reservation, ReservationKind

    # GIVEN team b's wide job holding a reservation in its own share, blocked by two young jobs of team ops
    # (borrowing, not yet trained the minimum), and two small jobs that could run on loan meanwhile: one
    # of team a, which may not borrow at all, one of team c, which may
    blockers = [running(f"ops-{i}", "ops", minutes=2, priority=9) for i in range(2)]
    holder = replace(
        queued("holder", "b", 4, priority=5),
        submitted_at=T0 - timedelta(hours=2),
        reservation=Reservation(
            instances={POOL: 2}, since=T0 - timedelta(minutes=30), kind=ReservationKind.DRAIN
        ),
    )
    snap = Snapshot(
        now=T0,
        capacity={POOL: 4},
        team_quotas=[TeamQuota("b", POOL, 4), TeamQuota("a", POOL, 0, borrowing_limit=0)],
        running=blockers,
        queued=[
            holder,
            queued("small-a", "a", priority=1, minute=1),
            queued("small-c", "c", priority=1, minute=2),
        ],
    )
    result = plan(snap, SETTINGS)
    # THEN only c's job runs on the loan, and a's waits saying its team may hold none of the pool
    assert [(s.job_name, s.on_loan_for) for s in result.starts] == [("small-c", "holder")]
    assert result.waiting["small-a"] == (
        f"can never fit: needs 1 {POOL}; team a may hold at most 0 (quota 0 and what others may lend it)"
    )
    assert "holder" in result.reservations
