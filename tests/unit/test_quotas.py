"""Team quotas: the ledger's arithmetic (quotas.py) and the pass that consults it (policy.py).

The properties run the pass over a small model of SageMaker (an attempt trains from the moment it starts,
a stopped one gives its instances back after the stop grace), so that what they state, no team above its
ceiling, lent capacity back within min runtime + stop grace, every team's finite demand served, is stated
over time and not only for one pass.
"""

from __future__ import annotations

import re
from collections import Counter
from copy import deepcopy
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, example, given, settings
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
    STORED_TEAM_NAME_PATTERN,
    TEAM_NAME_PATTERN,
    QuotaError,
    TeamLedger,
    TeamQuota,
    UsageCounter,
    check_stored_team_name,
    check_team_name,
    decay,
    fair_share_factors,
    oversubscription,
    team_label,
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


def test_a_reason_says_what_is_left_of_a_quota_the_team_has_not_reached() -> None:
    # GIVEN team a using 1 of its quota of 2 and team b borrowing the rest of the pool
    ledger = TeamLedger(quotas(a=2, b=0), {POOL: 2}, [running("a1", "a"), running("b1", "b")])
    # THEN a job of a that needs 2 waits for its quota, and the reason does not claim a is at its quota
    assert ledger.reason("a", {POOL: 2}, {POOL: 0}) == (
        f"team a has 1 of its quota of 2 {POOL} left, needs 2; 0 borrowable, 0 free"
    )


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
    with pytest.raises(QuotaError, match="reserved"):
        TeamQuota("none", POOL, 1)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("", "a team name is 1 to 64 characters, got ''"),
        ("t" * 65, "a team name is 1 to 64 characters"),
        (".", "team name '.' must start with a letter or a digit"),
        ("..", "team name '..' must start with a letter or a digit"),
        ("-f", "team name '-f' must start with a letter or a digit"),
        ("_x", "team name '_x' must start with a letter or a digit"),
        ("none", "team name 'none' is reserved: 'none' stands for jobs without a team"),
        ("NONE", "team name 'NONE' is reserved"),
        ("a b", "team name 'a b' may hold only ASCII letters, digits, '-', '_' and '.'"),
        ("a#b", "may hold only"),  # the table's key separator
        ("a~usage", "may hold only"),
        ("a/b", "may hold only"),  # a URL path segment, the CLI's TEAM/TYPE
        ("a\tb", "may hold only"),  # a table's column
        ("équipe", "may hold only"),
        ("٣", "may hold only"),  # a digit, but not an ASCII one
        (None, "a team name is 1 to 64 characters, got None"),
    ],
)
def test_a_team_name_that_would_break_keys_paths_or_tables_is_refused_naming_the_rule(
    name: object, problem: str
) -> None:
    with pytest.raises(QuotaError) as refused:
        check_team_name(name)
    assert problem in str(refused.value)


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=70) | st.from_regex(TEAM_NAME_PATTERN))
def test_the_team_name_pattern_and_the_check_agree(name: str) -> None:
    # the pattern is what the API's path check and document use; the check is what everything else uses
    try:
        check_team_name(name)
        accepted = True
    except QuotaError:
        accepted = False
    assert accepted is (re.fullmatch(TEAM_NAME_PATTERN.removesuffix("$") + r"\Z", name) is not None)
    if accepted:
        assert team_label(name) == name
    assert team_label(None) == team_label("") == "none"


@given(
    st.text(alphabet=st.characters(codec="utf-8"), max_size=70)
    | st.from_regex(STORED_TEAM_NAME_PATTERN)
    | st.sampled_from(["none", "NONE", "-ops", "_infra", ".", "..", ".x"])
)
def test_a_name_a_quota_may_be_stored_under_is_what_the_stored_pattern_says_and_holds_every_rule_name(
    name: str,
) -> None:
    # the names earlier versions stored quotas under: removable, never set (check_team_name refuses some)
    try:
        check_stored_team_name(name)
        stored = True
    except QuotaError:
        stored = False
    assert stored is (re.fullmatch(STORED_TEAM_NAME_PATTERN.removesuffix("$") + r"\Z", name) is not None)
    try:
        check_team_name(name)
    except QuotaError:
        return
    assert stored  # every name the rule accepts may be stored


def test_quotas_above_the_pools_capacity_are_said_so() -> None:
    assert oversubscription(quotas(a=2, b=2), POOL, 4) is None
    assert oversubscription(quotas(a=3, b=2), POOL, 4) == (
        f"the nominal quotas of all teams in {POOL} sum to 5, above its capacity of 4: "
        "not every team can hold its nominal quota at once"
    )
    assert oversubscription(quotas(a=3, b=2), "ml.trn2.48xlarge", 0) is None  # another pool's quotas


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
    #: name -> job, started, the waiting job it runs on loan from (None: not a loan)
    running: dict[str, tuple[Job, int, str | None]] = field(default_factory=dict)
    stopping: dict[str, tuple[Job, int]] = field(default_factory=dict)  # name -> job, gone at
    done: dict[str, int] = field(default_factory=dict)
    started_at: dict[str, int] = field(default_factory=dict)
    preemptions: Counter[str] = field(default_factory=Counter)
    loans_taken_back: Counter[str] = field(default_factory=Counter)  # by their lenders, counted apart
    reservations: dict[str, object] = field(default_factory=dict)
    #: lender -> by when it must run: it took a loan back, so it starts within a stop and a pass
    lender_due: dict[str, int] = field(default_factory=dict)
    #: check that a lender starts within a stop of taking its loans back (does not hold across teams yet)
    check_lender: bool = False

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
                preemptions=self.preemptions[j.name],
                loans_taken_back=self.loans_taken_back[j.name],
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
                on_loan_for=lender,
            )
            for name, (job, start, lender) in self.running.items()
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
                job, start, lender = self.running.pop(action.job_name)
                budget = policy.max_preemptions_per_job
                if lender is None:
                    assert self.now - start >= policy.min_runtime_before_preemption_seconds, (
                        f"{action}: young"
                    )
                if lender is not None and action.for_job == lender:
                    self.lender_due.setdefault(lender, self.now + GRACE + STEP)
                # a loan ended for its lender or a more important job: counted apart, within a budget
                # checked when it borrowed
                assert not action.taken_back or lender is not None, f"{action}: not a loan"
                stops = self.loans_taken_back if action.taken_back else self.preemptions
                assert budget <= 0 or stops[action.job_name] < budget, f"{action}: beyond budget"
                stops[action.job_name] += 1
                self.stopping[action.job_name] = (job, self.now + GRACE)
            elif isinstance(action, Start):
                self.running[action.job_name] = (by_name[action.job_name], self.now, action.on_loan_for)
                self.lender_due.pop(action.job_name, None)
                self.started_at.setdefault(action.job_name, self.now)
        self.check()
        for lender, due in self.lender_due.items() if self.check_lender else ():
            assert self.now < due, f"{lender} took back its loans but did not start within a stop"
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


#: drains after five minutes at the head, so reservations lend their idle instances, and a small budget
LOANS = replace(SETTINGS, reserve_after_seconds=300, max_preemptions_per_job=2, lend_reserved_capacity=True)


# found by this property: team c's drain lent an instance to a job of team c, then lost its reservation to
# "team c at its quota" and waited for the loan's minimum runtime
LOAN_TO_OWN_TEAM = World(
    check_lender=True,
    capacity=2,
    quotas=[TeamQuota("c", POOL, 2)],
    jobs=[
        Job("j0", "a", 1, 0, 1080, 0),
        Job("j1", "c", 1, 1, 60, 0),
        *(Job(f"j{i}", "a", 1, 0, 60, 0) for i in range(2, 6)),
        Job("j6", "c", 1, 0, 660, 60),
        Job("j7", "c", 2, 1, 60, 0),
    ],
)


# found by this property: team a's drain took its loan back and, the loan requeued inside a's quota, was
# overtaken by it, when jobs inside their team's quota went first even within the team (test below)
OVERTAKEN_BY_ITS_LOAN = World(
    check_lender=True,
    capacity=3,
    quotas=[TeamQuota("a", POOL, 2), TeamQuota("c", POOL, 2)],
    jobs=[
        Job("j0", "a", 2, 0, 120, 300),
        Job("j1", "a", 1, 0, 300, 60),
        Job("j2", "a", 1, 0, 60, 0),
        Job("j3", "a", 1, 0, 60, 0),
        Job("j4", "a", 3, 0, 60, 0),
    ],
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(LOAN_TO_OWN_TEAM)
@given(worlds())
def test_with_loans_of_reserved_capacity_quotas_budgets_and_min_runtime_still_hold(world: World) -> None:
    world = deepcopy(world)  # the explicit example is one object: each run steps its own copy
    # GIVEN any quotas and a finite workload, with drains lending their idle instances
    # WHEN passes run every minute until the queue drains
    limit = sum(j.seconds for j in world.jobs) * 4 + 4 * 3600 + 3600
    while len(world.done) < len(world.jobs):
        assert world.now <= limit, f"not drained: {sorted({j.name for j in world.jobs} - set(world.done))}"
        world.step(LOANS)
    # THEN (checked every step) capacity and every team's ceiling held, nothing was preempted beyond its
    # budget or, but for a loan, before its minimum runtime, and a lender that took its loans back started
    # within a stop and a pass


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


@st.composite
def team_passes(draw: st.DrawFn) -> Snapshot:
    """One pass over a governed pool: random quotas, running work (some of it stopping or young) and a queue
    of several teams' jobs at several priorities, some backing off."""
    capacity = draw(st.integers(1, 8))
    quota_list = [
        TeamQuota(
            team,
            POOL,
            draw(st.integers(0, capacity)),
            draw(st.none() | st.integers(0, 4)),
            draw(st.none() | st.integers(0, 4)),
        )
        for team in ("a", "b", "c")
        if draw(st.booleans())
    ] or [TeamQuota("a", POOL, draw(st.integers(0, capacity)))]
    attempts, held = [], 0
    for i in range(draw(st.integers(0, 4))):
        n = draw(st.integers(1, capacity))
        if held + n > capacity:
            break
        held += n
        attempt = running(
            f"r{i}", draw(teams), n, minutes=draw(st.integers(1, 30)), priority=draw(st.integers(0, 3))
        )
        attempts.append(replace(attempt, stopping=draw(st.booleans())))
    jobs = [
        replace(
            queued(
                f"q{i}",
                draw(teams),
                draw(st.integers(1, capacity)),
                priority=draw(st.integers(0, 3)),
                minute=draw(st.integers(0, 20)),
            ),
            not_before=T0 + timedelta(minutes=1) if draw(st.integers(0, 5)) == 0 else None,
        )
        for i in range(draw(st.integers(1, 12)))
    ]
    usage = draw(st.dictionaries(teams, st.floats(0, 10)))
    return Snapshot(
        now=T0,
        capacity={POOL: capacity},
        team_quotas=quota_list,
        running=attempts,
        queued=jobs,
        team_usage=usage,
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(team_passes())
def test_within_a_team_no_job_starts_before_a_more_important_one_that_fits(snap: Snapshot) -> None:
    # GIVEN any pass over a governed pool
    result = plan(snap, SETTINGS)
    started = {s.job_name for s in result.starts}
    jobs = {j.name: j for j in snap.queued}
    starts = [jobs[name] for name in started]
    free = snap.capacity[POOL] - sum(a.demand[POOL] for a in snap.running)
    free -= sum(j.demand[POOL] for j in starts) + sum(h.get(POOL, 0) for h in result.held.values())
    # THEN no job of a team started while a more important eligible job of its team waits that would have
    # fit, the capacity and the team's quota and borrowing limit, had the less important one not started
    # (capacity and what a team may take only shrink through a pass, so it fit when its turn came)
    for low in starts:
        for high in snap.queued:
            if high.team != low.team or high.priority <= low.priority or high.name in started:
                continue
            if high.not_before is not None and high.not_before > snap.now:
                continue
            room = free + low.demand[POOL] + result.held.get(high.name, {}).get(POOL, 0)
            others = [
                running(j.name, j.team or "", j.demand[POOL], minutes=0, priority=j.priority)
                for j in starts
                if j is not low
            ]
            ledger = TeamLedger(snap.team_quotas, snap.capacity, [*snap.running, *others])
            fits = high.demand[POOL] <= room and not ledger.short(high.team, high.demand)
            assert not fits, f"{low.name} (priority {low.priority}) started before {high.name}: {result}"


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


def _own_team_loan(borrower_minutes: int) -> Snapshot:
    from sagequeue_core.policy import Reservation, ReservationKind

    # team c (quota 2 of a pool of 2) waits with a drain for its wide job; team a, which has no quota,
    # borrows one instance; the other runs, on loan, a small checkpointing job of team c itself
    lender = replace(
        queued("holder", "c", 2, priority=1),
        submitted_at=T0 - timedelta(minutes=20),
        reservation=Reservation(
            instances={POOL: 2}, since=T0 - timedelta(minutes=5), kind=ReservationKind.DRAIN
        ),
    )
    loan = replace(running("loan", "c", minutes=1, priority=0), on_loan_for="holder")
    borrower = replace(running("borrower", "a", minutes=borrower_minutes, priority=0), checkpointed=False)
    return Snapshot(
        now=T0,
        capacity={POOL: 2},
        team_quotas=[TeamQuota("c", POOL, 2)],
        running=[borrower, loan],
        queued=[lender],
    )


def test_a_loan_to_the_lenders_own_team_does_not_count_against_the_lender() -> None:
    # GIVEN the lender's own loan counted in its team's usage (found by a property over quotas and loans:
    # the lender lost its reservation to "team c at its quota" and its loan ran on to its minimum runtime)
    # WHEN team a's borrower has not trained its minimum yet
    young = plan(_own_team_loan(borrower_minutes=6), SETTINGS)
    # THEN the lender keeps its reservation and takes nothing back yet
    assert "holder" in young.reservations
    assert not young.preemptions
    assert "at its quota" not in young.waiting["holder"]
    # WHEN the borrower has trained its minimum
    ready = plan(_own_team_loan(borrower_minutes=11), SETTINGS)
    # THEN the lender takes back its loan and reclaims its quota from team a in the same pass
    assert sorted(p.job_name for p in ready.preemptions) == ["borrower", "loan"]
    assert {p.for_job for p in ready.preemptions} == {"holder"}


def test_a_lender_takes_back_its_own_teams_loan_when_the_quota_needs_it_though_the_pool_has_room() -> None:
    from sagequeue_core.policy import Reservation, ReservationKind

    # GIVEN team c (quota 2, no borrowing) waiting with a drain for 2 instances, one of them lent to a job of
    # team c itself, and the work that blocked the drain just ended: the pool has 2 free instances
    lender = replace(
        queued("holder", "c", 2, priority=1),
        submitted_at=T0 - timedelta(minutes=20),
        reservation=Reservation(
            instances={POOL: 2}, since=T0 - timedelta(minutes=5), kind=ReservationKind.DRAIN
        ),
    )
    loan = replace(running("loan", "c", minutes=1, priority=0), on_loan_for="holder")
    snap = Snapshot(
        now=T0,
        capacity={POOL: 3},
        team_quotas=[TeamQuota("c", POOL, 2, borrowing_limit=0)],
        running=[loan],
        queued=[lender],
    )
    result = plan(snap, SETTINGS)
    # THEN it does not start beside its loan (team c would hold 3, above its ceiling of 2): it takes the
    # loan back, whatever its runtime, and holds the free instances meanwhile
    assert not result.starts
    assert [(p.job_name, p.for_job) for p in result.preemptions] == [("loan", "holder")]
    assert result.reservations["holder"].instances == {POOL: 2}
    assert result.waiting["holder"] == "taking back its loans for its team's quota: loan"


def test_a_reservation_waiting_for_its_teams_stopping_jobs_is_kept() -> None:
    from sagequeue_core.policy import Reservation, ReservationKind

    # GIVEN team a's job holding a reservation for the whole pool of 3, whose loan of 2 (team a) is stopping
    # and counts for team a until its instances are back
    holder = replace(
        queued("holder", "a", 3, priority=0),
        submitted_at=T0 - timedelta(minutes=10),
        reservation=Reservation(
            instances={POOL: 3}, since=T0 - timedelta(minutes=5), kind=ReservationKind.PREEMPTED
        ),
    )
    stopping = replace(running("loan", "a", 2, minutes=1, priority=0), on_loan_for="holder", stopping=True)
    snap = Snapshot(
        now=T0,
        capacity={POOL: 3},
        team_quotas=[TeamQuota("a", POOL, 2), TeamQuota("c", POOL, 2)],
        running=[stopping],
        queued=[holder, queued("later", "a", 1, priority=0, minute=1)],
    )
    result = plan(snap, SETTINGS)
    # THEN it keeps its reservation and the free instance, and the later job of its team does not take it
    assert result.reservations["holder"].instances == {POOL: 1}
    assert result.held == {"holder": {POOL: 1}}
    assert not result.starts
    assert result.waiting["holder"].endswith("waiting for the team's stopping jobs")


def test_within_a_team_a_small_job_inside_the_quota_does_not_overtake_a_more_important_one() -> None:
    # GIVEN team a (quota 2 of a pool of 3, team c lending its idle 2) with an important job that must
    # borrow and a less important one that fits a's quota
    snap = Snapshot(
        now=T0,
        capacity={POOL: 3},
        team_quotas=[TeamQuota("a", POOL, 2), TeamQuota("c", POOL, 2)],
        queued=[queued("small", "a", 1, priority=1), queued("wide", "a", 3, priority=5, minute=1)],
    )
    result = plan(snap, SETTINGS)
    # THEN within the team priority decides: the important job starts, borrowing one of c's instances, and
    # the small one waits for capacity
    assert [s.job_name for s in result.starts] == ["wide"]
    assert result.waiting["small"] == f"waiting for capacity: needs 1 {POOL}, 0 free"


def test_across_teams_a_head_within_its_quota_goes_before_a_head_that_would_borrow() -> None:
    # GIVEN a pool of 4 shared 2 + 2, team a (more recent usage) with three jobs and team b with two, all of
    # one priority and a's submitted first; a's third job would borrow b's share
    snap = Snapshot(
        now=T0,
        capacity={POOL: 4},
        team_quotas=quotas(),
        team_usage={"a": 1.0},
        queued=[
            *(queued(f"a{i}", "a", minute=i) for i in range(3)),
            *(queued(f"b{i}", "b", minute=10 + i) for i in range(2)),
        ],
    )
    result = plan(snap, SETTINGS)
    # THEN each team's share goes to its own jobs first (b's heads within its quota go before a's third,
    # which would borrow), and a's jobs start in their submission order
    assert sorted(s.job_name for s in result.starts) == ["a0", "a1", "b0", "b1"]
    assert result.waiting["a2"] == f"team a at its quota of 2 {POOL}; 0 borrowable, 0 free"
    # AND among heads within their quotas fair share decides: b, which used nothing, first
    assert [s.job_name for s in result.starts][:2] == ["b0", "b1"]


def test_in_a_pool_without_quotas_priority_decides_whatever_the_teams_quotas_elsewhere() -> None:
    other = "ml.trn2.48xlarge"  # no quota: not governed
    # GIVEN team a's urgent job that would borrow in the governed pool, and in the other pool, with one
    # instance, a's important job and b's less important one, b's being the head of a team within its quota
    snap = Snapshot(
        now=T0,
        capacity={POOL: 4, other: 1},
        team_quotas=quotas(b_lend=0),
        running=[running("a-run", "a", 2, priority=9)],
        queued=[
            queued("a-urgent", "a", 1, priority=9),
            replace(queued("a-other", "a", priority=5, minute=1), demand={other: 1}),
            replace(queued("b-other", "b", priority=3), demand={other: 1}),
        ],
    )
    result = plan(snap, SETTINGS)
    # THEN in the ungoverned pool the more important job starts, as without teams
    assert [s.job_name for s in result.starts] == ["a-other"]
    assert result.waiting["b-other"] == f"waiting for capacity: needs 1 {other}, 0 free"


def test_the_team_queue_counts_only_jobs_that_may_start_in_this_pass() -> None:
    # GIVEN team a (quota 2) whose first job backs off after a failure and whose second can never fit
    backing_off = replace(queued("a-off", "a", 2, priority=9), not_before=T0 + timedelta(minutes=5))
    snap = Snapshot(
        now=T0,
        capacity={POOL: 4},
        team_quotas=quotas(),
        team_usage={"a": 1.0},
        queued=[backing_off, queued("a-huge", "a", 5, priority=8), queued("a0", "a"), queued("b0", "b", 3)],
    )
    result = plan(snap, SETTINGS)
    # THEN a's next job is still within a's quota, and goes before b's job that would borrow
    assert [s.job_name for s in result.starts] == ["a0", "b0"]


def test_a_lender_that_took_its_loan_back_starts_within_a_stop() -> None:
    world = deepcopy(OVERTAKEN_BY_ITS_LOAN)
    while len(world.done) < len(world.jobs):
        assert world.now <= 4 * 3600
        world.step(LOANS)
