"""Invariants of the scheduling pass on random snapshots (hypothesis).

Each property is stated from the outside: it reads only the snapshot and the plan, never the pass's
internals, so a change in how the pass decides cannot quietly change what it promises.
"""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sagequeue_core.domain import ResourceKey
from sagequeue_core.policy import (
    OVERRUN,
    PolicySettings,
    QueuedJob,
    ReleaseWarmPool,
    Reservation,
    ReservationKind,
    RunningAttempt,
    Snapshot,
    Start,
    WarmPool,
    covers,
    minimal_cover,
    pass_order,
    plan,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
POOLS = ("ml.trn1.32xlarge", "ml.trn2.48xlarge")
ROLES = ("arn:aws:iam::1:role/a", "arn:aws:iam::1:role/b")


def _key(pool: str, count: int, role: str) -> ResourceKey:
    return ResourceKey(role_arn=role, instance_type=pool, instance_count=count, volume_size_gb=100)


@st.composite
def snapshots(draw: st.DrawFn) -> tuple[Snapshot, PolicySettings]:
    capacity = {pool: draw(st.integers(0, 6)) for pool in POOLS}
    now = T0 + timedelta(hours=2)
    queued: list[QueuedJob] = []
    for i in range(draw(st.integers(0, 8))):
        pool = draw(st.sampled_from(POOLS))
        count = draw(st.integers(1, 3))
        if draw(st.integers(0, 9)) == 0:
            demand = {POOLS[0]: count, POOLS[1]: draw(st.integers(1, 2))}
            key = None
        else:
            demand = {pool: count}
            key = _key(pool, count, draw(st.sampled_from(ROLES)))
        queued.append(
            QueuedJob(
                name=f"job-{i}",
                priority=draw(st.integers(0, 5)),
                submitted_at=T0 + timedelta(minutes=draw(st.integers(0, 60))),
                demand=demand,
                resource_key=key,
                not_before=now + timedelta(minutes=5) if draw(st.integers(0, 9)) == 0 else None,
                reservation=Reservation(
                    instances={p: draw(st.integers(0, n)) for p, n in demand.items()},
                    since=now - timedelta(minutes=draw(st.integers(0, 60))),
                    kind=draw(st.sampled_from(list(ReservationKind))),
                )
                if draw(st.integers(0, 2)) == 0
                else None,
                queued_since=now - timedelta(minutes=draw(st.integers(0, 90))),
                preemptions=draw(st.integers(0, 4)),
                checkpointed=draw(st.booleans()),
                loans_taken_back=draw(st.integers(0, 4)),
                max_runtime_seconds=draw(st.sampled_from([None, 1800, 7200])),
            )
        )
    running: list[RunningAttempt] = []
    holders = [j for j in queued if j.reservation is not None]
    for i in range(draw(st.integers(0, 6))):
        pool = draw(st.sampled_from(POOLS))
        # some run on a waiting job's reserved capacity: a loan, mostly started after the reservation began
        lender = draw(st.sampled_from(holders)).name if holders and draw(st.integers(0, 2)) == 0 else None
        running.append(
            RunningAttempt(
                training_job_name=f"run-{i}",
                job_name=None if draw(st.integers(0, 9)) == 0 else f"run-{i}",
                priority=draw(st.integers(0, 5)),
                started_at=now - timedelta(minutes=draw(st.integers(0, 120))),
                demand={pool: draw(st.integers(1, 3))},
                stopping=draw(st.integers(0, 7)) == 0,
                training_started_at=None
                if draw(st.integers(0, 5)) == 0
                else now - timedelta(minutes=draw(st.integers(0, 100))),
                preemptions=draw(st.integers(0, 4)),
                checkpointed=draw(st.booleans()),
                on_loan_for=lender,
                loans_taken_back=draw(st.integers(0, 4)),
                max_runtime_seconds=draw(st.sampled_from([None, 3600, 86400])),
                # what it reported of its checkpoints (docs/adr/0023): some are due soon, some long ago
                last_checkpoint_at=None
                if draw(st.integers(0, 2)) == 0
                else now - timedelta(seconds=draw(st.sampled_from([30, 200, 280, 1500, 1750, 6000]))),
                checkpoint_interval_seconds=draw(st.sampled_from([None, 300.0, 1800.0])),
            )
        )
    warm: list[WarmPool] = []
    for i in range(draw(st.integers(0, 3))):
        pool = draw(st.sampled_from(POOLS))
        warm.append(WarmPool(f"warm-{i}", _key(pool, draw(st.integers(1, 2)), draw(st.sampled_from(ROLES)))))
    policy_settings = PolicySettings(
        min_runtime_before_preemption_seconds=draw(st.sampled_from([0, 600, 3600])),
        default_keep_alive_seconds=draw(st.sampled_from([0, 600])),
        max_preemptions_per_job=draw(st.sampled_from([0, 3])),
        reserve_after_seconds=draw(st.sampled_from([0, 1, 1800])),
        lend_reserved_capacity=draw(st.integers(0, 3)) > 0,
        top_priority=draw(st.sampled_from([0, 0, 4])),
        checkpoint_wait_seconds=draw(st.sampled_from([0, 300, 3600])),
    )
    return Snapshot(
        now=now, capacity=capacity, queued=queued, running=running, warm_pools=warm
    ), policy_settings


def _used(snapshot: Snapshot) -> Counter[str]:
    used: Counter[str] = Counter()
    for attempt in snapshot.running:
        used.update(attempt.demand)
    for warm in snapshot.warm_pools:
        used[warm.pool] += warm.instances
    return used


def _lender(snapshot: Snapshot, victim: RunningAttempt) -> QueuedJob | None:
    """The waiting job whose capacity `victim` runs on, as priorities stand: a loan stays its lender's
    whatever happened to the lender's reservation, and ends once the borrower outranks the lender."""
    lender = next((j for j in snapshot.queued if j.name == victim.on_loan_for), None)
    if lender is None or victim.priority > lender.priority:
        return None
    return lender


def _is_reclaim(snapshot: Snapshot, victim: RunningAttempt, for_job: str) -> bool:
    """A preemption that takes back a loan: the victim runs on capacity its lender lent."""
    lender = _lender(snapshot, victim)
    return lender is not None and lender.name == for_job


def _eligible(snapshot: Snapshot) -> list[QueuedJob]:
    return [j for j in snapshot.queued if j.not_before is None or j.not_before <= snapshot.now]


PROPERTY_SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(snapshots())
def test_capacity_is_never_exceeded(case: tuple[Snapshot, PolicySettings]) -> None:
    snapshot, policy_settings = case
    result = plan(snapshot, policy_settings)
    used = _used(snapshot)
    warm_by_name = {w.training_job_name: w for w in snapshot.warm_pools}
    jobs = {j.name: j for j in snapshot.queued}
    after = Counter(used)
    for action in result.actions:
        if isinstance(action, ReleaseWarmPool):
            after[warm_by_name[action.training_job_name].pool] -= warm_by_name[
                action.training_job_name
            ].instances
        elif isinstance(action, Start) and action.warm_pool is None:
            after.update(jobs[action.job_name].demand)
    for pool, count in after.items():
        # a pool already over capacity (capacity lowered, or jobs started by hand) must not grow
        assert count <= max(snapshot.capacity.get(pool, 0), used[pool]), (pool, count)
        if count > snapshot.capacity.get(pool, 0):
            assert count <= used[pool]


@PROPERTY_SETTINGS
@given(snapshots())
def test_a_pool_over_its_capacity_keeps_no_idle_warm_pool(case: tuple[Snapshot, PolicySettings]) -> None:
    snapshot, policy_settings = case
    result = plan(snapshot, policy_settings)
    used = _used(snapshot)
    gone = {a.training_job_name for a in result.releases} | {
        a.warm_pool for a in result.starts if a.warm_pool
    }
    for pool in POOLS:
        released = sum(
            w.instances for w in snapshot.warm_pools if w.pool == pool and w.training_job_name in gone
        )
        kept = [w for w in snapshot.warm_pools if w.pool == pool and w.training_job_name not in gone]
        # drained or shrunk below what it holds: its idle warm pools go until it is within its capacity
        assert used[pool] - released <= snapshot.capacity.get(pool, 0) or not kept, (pool, kept)


@PROPERTY_SETTINGS
@given(snapshots())
def test_actions_are_well_formed(case: tuple[Snapshot, PolicySettings]) -> None:
    snapshot, policy_settings = case
    result = plan(snapshot, policy_settings)
    eligible = {j.name for j in _eligible(snapshot)}
    started = [a.job_name for a in result.starts]
    assert len(started) == len(set(started)), "a job started twice"
    assert set(started) <= eligible, "started a job that was not eligible"
    reused = [a.warm_pool for a in result.starts if a.warm_pool]
    released = [a.training_job_name for a in result.releases]
    assert len(reused) == len(set(reused)), "a warm pool reused twice"
    assert not set(reused) & set(released), "a warm pool both reused and released"
    jobs = {j.name: j for j in snapshot.queued}
    warm = {w.training_job_name: w for w in snapshot.warm_pools}
    for start in result.starts:
        if start.warm_pool:
            assert jobs[start.job_name].resource_key == warm[start.warm_pool].resource_key
    # every eligible job either starts or says why it waits
    assert eligible == set(started) | (set(result.waiting) & eligible)


@PROPERTY_SETTINGS
@given(snapshots())
def test_preemption_only_for_strictly_higher_priority_and_only_ripe_victims(
    case: tuple[Snapshot, PolicySettings],
) -> None:
    snapshot, policy_settings = case
    result = plan(snapshot, policy_settings)
    attempts = {a.training_job_name: a for a in snapshot.running}
    jobs = {j.name: j for j in snapshot.queued}
    victims = [p.training_job_name for p in result.preemptions]
    assert len(victims) == len(set(victims)), "an attempt preempted twice"
    for preempt in result.preemptions:
        victim = attempts[preempt.training_job_name]
        assert victim.preemptible
        assert preempt.for_job not in {s.job_name for s in result.starts}
        if _is_reclaim(snapshot, victim, preempt.for_job):
            continue  # a loan is taken back whatever its priority and runtime
        assert victim.priority < jobs[preempt.for_job].priority
        lender = _lender(snapshot, victim)
        lent_by_less_important = lender is not None and lender.priority < jobs[preempt.for_job].priority
        if lent_by_less_important:
            continue  # it borrowed an instance a job this important could have taken from its lender
        if policy_settings.is_top(jobs[preempt.for_job].priority):
            continue  # the top priority does not wait out a victim's minimum runtime
        # the minimum runtime counts from the first Training status, not from CreateTrainingJob
        if victim.training_started_at is None:
            assert policy_settings.min_runtime_before_preemption_seconds == 0
        else:
            trained = (snapshot.now - victim.training_started_at).total_seconds()
            assert trained >= policy_settings.min_runtime_before_preemption_seconds


@PROPERTY_SETTINGS
@given(snapshots())
def test_no_job_is_preempted_beyond_its_budget(case: tuple[Snapshot, PolicySettings]) -> None:
    snapshot, policy_settings = case
    result = plan(snapshot, policy_settings)
    attempts = {a.training_job_name: a for a in snapshot.running}
    queued_priority = {j.name: j.priority for j in snapshot.queued}
    budget = policy_settings.max_preemptions_per_job
    for preempt in result.preemptions:
        attempt = attempts[preempt.training_job_name]
        # a loan ended for its lender or for a job more important than the lender is counted apart (the job
        # borrowed within that budget); anything else is a preemption, within the budget
        lender = _lender(snapshot, attempt)
        assert preempt.taken_back == (
            lender is not None
            and (lender.name == preempt.for_job or lender.priority < queued_priority[preempt.for_job])
        )
        if preempt.taken_back:
            continue
        if policy_settings.is_top(queued_priority[preempt.for_job]):
            # the top priority goes beyond the budget, while all the victim's stops stay under its factor
            # times it, with room for one more loan taken back while it may still borrow: no job is
            # stopped more than that in all
            factor = policy_settings.top_priority_budget_factor
            may_borrow = attempt.loans_taken_back < budget
            assert (
                budget == 0
                or attempt.preemptions < budget
                or attempt.preemptions + attempt.loans_taken_back + may_borrow < budget * factor
            )
            continue
        assert budget == 0 or attempt.preemptions < budget


@PROPERTY_SETTINGS
@given(snapshots())
def test_reserved_capacity_never_goes_to_a_job_of_lower_or_equal_priority(
    case: tuple[Snapshot, PolicySettings],
) -> None:
    snapshot, policy_settings = case
    result = plan(snapshot, policy_settings)
    jobs = {j.name: j for j in snapshot.queued}
    started = {s.job_name for s in result.starts}
    eligible = {j.name for j in _eligible(snapshot)}
    warm = {w.training_job_name: w for w in snapshot.warm_pools}
    for job in snapshot.queued:
        fits = all(0 < need <= snapshot.capacity.get(p, 0) for p, need in job.demand.items())
        if job.reservation is not None and job.name in eligible and job.name not in started and fits:
            # a promise outlives the pass: a reservation ends only when the job starts (or cannot fit)
            assert job.name in result.reservations, f"{job.name} lost its reservation"
    for name, reservation in result.reservations.items():
        holder = jobs[name]
        assert name not in started
        short = {p for p, need in holder.demand.items() if reservation.instances.get(p, 0) < need}
        for p, held in reservation.instances.items():
            assert 0 <= held <= holder.demand[p]
        for action in result.actions:
            if isinstance(action, Start) and action.on_loan_for is not None:
                continue  # lent, and taken back when the holder can start: test_loans_*
            if isinstance(action, Start) and action.ends_before is not None:
                continue  # EASY backfill, ends before the holder's projected start: test_backfill_*
            if isinstance(action, Start) and action.warm_pool is None:
                other = jobs[action.job_name]
            elif isinstance(action, ReleaseWarmPool) and action.for_job not in (name, OVERRUN):
                other = jobs[action.for_job]
                if warm[action.training_job_name].pool not in short:
                    continue
            else:
                continue
            if not set(other.demand) & short:
                continue
            outranks = pass_order(other) < pass_order(holder)
            assert outranks, f"{other.name} took capacity reserved for {name} ({reservation})"


@PROPERTY_SETTINGS
@given(snapshots())
def test_loans_come_from_idle_reserved_capacity_of_a_holder_at_least_as_important(
    case: tuple[Snapshot, PolicySettings],
) -> None:
    snapshot, policy_settings = case
    result = plan(snapshot, policy_settings)
    jobs = {j.name: j for j in snapshot.queued}
    lent: dict[str, Counter[str]] = {}
    budget = policy_settings.max_preemptions_per_job
    for start in result.starts:
        if start.on_loan_for is None:
            continue
        assert policy_settings.lend_reserved_capacity
        borrower, holder = jobs[start.job_name], jobs[start.on_loan_for]
        assert holder.name in result.reservations, "lent by a job that holds no reservation"
        assert holder.priority >= borrower.priority
        # only a job that resumes from checkpoints and has had fewer loans taken back than the budget borrows
        assert borrower.checkpointed
        assert budget == 0 or borrower.loans_taken_back < budget
        if start.warm_pool is None:  # a warm pool the holder claimed lends its own instances
            lent.setdefault(holder.name, Counter()).update(borrower.demand)
    for holder, instances in lent.items():
        # what a holder lends is what it holds of free capacity in this pass, never more
        held = result.held.get(holder, {})
        for pool, n in instances.items():
            assert n <= held.get(pool, 0), f"{holder} lent {n} {pool} but holds {held}"
        # and it lends only while its cover is incomplete: nothing is preempted for it in the same pass
        assert holder not in {p.for_job for p in result.preemptions}


@PROPERTY_SETTINGS
@given(snapshots())
def test_reserved_warm_pools_never_go_to_a_job_of_lower_or_equal_priority_except_as_a_loan(
    case: tuple[Snapshot, PolicySettings],
) -> None:
    snapshot, policy_settings = case
    result = plan(snapshot, policy_settings)
    jobs = {j.name: j for j in snapshot.queued}
    warm = {w.training_job_name: w for w in snapshot.warm_pools}
    for name, reservation in result.reservations.items():
        holder = jobs[name]
        for start in result.starts:
            if start.warm_pool is None or start.on_loan_for is not None:
                continue
            pool = warm[start.warm_pool].pool
            if pool not in holder.demand or pass_order(jobs[start.job_name]) < pass_order(holder):
                continue
            # an ordinary start on a warm pool after the holder: only what the holder does not need
            assert reservation.instances.get(pool, 0) >= holder.demand[pool], (
                f"{start.job_name} took warm pool {start.warm_pool} while {name} waits short of it"
            )


@PROPERTY_SETTINGS
@given(snapshots())
def test_backfill_without_checkpoints_ends_before_its_holder_can_start(
    case: tuple[Snapshot, PolicySettings],
) -> None:
    snapshot, policy_settings = case
    result = plan(snapshot, policy_settings)
    jobs = {j.name: j for j in snapshot.queued}
    for start in result.starts:
        if start.ends_before is None:
            continue
        job, holder = jobs[start.job_name], jobs[start.ends_before]
        # only a job without checkpoints, with an explicit bound on its run, of at most the holder's priority
        assert not job.checkpointed
        assert job.max_runtime_seconds is not None
        assert holder.priority >= job.priority
        assert holder.name in result.reservations
        assert start.on_loan_for is None
        ends = snapshot.now.timestamp() + policy_settings.provisioning_seconds + job.max_runtime_seconds
        # the holder cannot have all it needs before every attempt on its pools that it may need ended: the
        # backfill ends before the last of those that could end before it
        bounded = [
            (a.training_started_at or a.started_at).timestamp() + a.max_runtime_seconds
            for a in snapshot.running
            if a.max_runtime_seconds is not None and set(a.demand) & set(holder.demand) and not a.stopping
        ]
        assert bounded or any(a.stopping for a in snapshot.running)
        assert ends <= max(bounded, default=ends) + policy_settings.provisioning_seconds


@PROPERTY_SETTINGS
@given(snapshots())
def test_victims_are_a_minimal_cover(case: tuple[Snapshot, PolicySettings]) -> None:
    snapshot, policy_settings = case
    result = plan(snapshot, policy_settings)
    attempts = {a.training_job_name: a for a in snapshot.running}
    jobs = {j.name: j for j in snapshot.queued}
    by_job: dict[str, list[RunningAttempt]] = {}
    for preempt in result.preemptions:
        by_job.setdefault(preempt.for_job, []).append(attempts[preempt.training_job_name])
    # The deficit a job preempts for is at most its demand minus what the pass could have left free for
    # it: capacity, less what was running, started cold or held for other jobs (a pool over capacity
    # first pays back its overrun).
    left = Counter(dict(snapshot.capacity))
    left.subtract(_used(snapshot))
    for start in result.starts:
        if start.warm_pool is None:
            left.subtract(jobs[start.job_name].demand)
    for job_name, victims in by_job.items():
        others_held = Counter()
        for name, held in result.held.items():
            if name != job_name:
                others_held.update(held)
        bound = {
            pool: need - (left[pool] - others_held[pool]) for pool, need in jobs[job_name].demand.items()
        }
        # never more than the deficit: each victim is needed
        for victim in victims:
            rest = [v for v in victims if v is not victim]
            assert not covers(rest, bound), f"{victim.training_job_name} was preempted needlessly"


@PROPERTY_SETTINGS
@given(snapshots())
def test_no_job_is_passed_over_by_a_less_important_one_unless_it_cannot_fit(
    case: tuple[Snapshot, PolicySettings],
) -> None:
    snapshot, policy_settings = case
    result = plan(snapshot, policy_settings)
    jobs = {j.name: j for j in snapshot.queued}
    started = {s.job_name: s for s in result.starts}
    warm = {w.training_job_name: w for w in snapshot.warm_pools}
    # capacity left after the pass, as an outsider sees it
    free = Counter(dict(snapshot.capacity))
    free.subtract(_used(snapshot))
    for action in result.actions:
        if isinstance(action, ReleaseWarmPool):
            free[warm[action.training_job_name].pool] += warm[action.training_job_name].instances
        elif isinstance(action, Start) and action.warm_pool is None:
            free.subtract(jobs[action.job_name].demand)
    reused = {s.warm_pool for s in result.starts if s.warm_pool}
    released = {r.training_job_name for r in result.releases}
    remaining_warm = [w for name, w in warm.items() if name not in reused | released]

    def rank(job: QueuedJob) -> tuple[int, bool, datetime, str]:
        return pass_order(job)

    for higher in _eligible(snapshot):
        if higher.name in started:
            continue
        for lower_name in started:
            lower = jobs[lower_name]
            if lower.priority >= higher.priority or not set(lower.demand) & set(higher.demand):
                continue
            # What `higher` could have had: what is still free (capacity held for jobs ranked above it
            # excepted), what `lower` took, and warm pools no job at least as important wants.
            wanted = Counter(
                o.resource_key
                for o in _eligible(snapshot)
                if o.name != higher.name and o.name not in started and o.priority >= higher.priority
            )
            available = Counter(free)
            available.update(lower.demand)
            for name, held in result.held.items():
                if rank(jobs[name]) < rank(higher):
                    available.subtract(held)
            for w in remaining_warm:
                if wanted[w.resource_key] > 0:
                    wanted[w.resource_key] -= 1  # one pool kept for each job that would reuse it
                else:
                    available[w.pool] += w.instances
            fits = all(max(available[pool], 0) >= need for pool, need in higher.demand.items())
            assert not fits, f"{higher.name} (p{higher.priority}) could have run instead of {lower.name}"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(1, 3)), min_size=0, max_size=9),
    st.integers(1, 6),
)
def test_minimal_cover_has_the_fewest_victims(candidates: list[tuple[int, int]], deficit: int) -> None:
    attempts = [
        RunningAttempt(f"r{i}", {POOLS[0]: size}, priority, T0, job_name=f"r{i}")
        for i, (priority, size) in enumerate(candidates)
    ]
    victims = minimal_cover(attempts, {POOLS[0]: deficit})
    feasible = [
        size
        for size in range(1, len(attempts) + 1)
        if any(covers(c, {POOLS[0]: deficit}) for c in itertools.combinations(attempts, size))
    ]
    if not feasible:
        assert victims is None
        return
    assert victims is not None
    assert covers(victims, {POOLS[0]: deficit})
    assert len(victims) == feasible[0]


def test_generated_snapshots_exercise_every_action() -> None:
    """Guard against a strategy that never produces preemptions, releases or reuse."""
    seen: Counter[str] = Counter()

    @settings(max_examples=400, deadline=None, database=None)
    @given(snapshots())
    def collect(case: tuple[Snapshot, PolicySettings]) -> None:
        result = plan(*case)
        for action in result.actions:
            kind = type(action).__name__
            if isinstance(action, Start) and action.warm_pool:
                kind = "Reuse"
            if isinstance(action, Start) and action.on_loan_for:
                kind = "Loan"
            seen[kind] += 1
        attempts = {a.training_job_name: a for a in case[0].running}
        for preempt in result.preemptions:
            if _is_reclaim(case[0], attempts[preempt.training_job_name], preempt.for_job):
                seen["Reclaim"] += 1
        seen["Reservation"] += len(result.reservations)

    collect()
    # loans and reclaims are rarer here; tests/unit/test_policy_loans.py generates them on purpose
    for kind in ("Start", "Reuse", "Preempt", "ReleaseWarmPool", "Reservation"):
        assert seen[kind] > 0, f"no {kind} in 400 random snapshots: the strategy is too narrow"
