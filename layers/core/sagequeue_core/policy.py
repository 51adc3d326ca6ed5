"""The scheduling decision: a pure function from a snapshot of the queue and the pools to actions.

It knows nothing of AWS, DynamoDB or clocks: the scheduler service reads the snapshot, calls `plan`, and
carries the actions out. One pass, in named phases:

1. count   - the ledger of each pool: free instances (capacity minus live attempts minus Available warm
             pools, whose instances are retained and billed), instances returning from attempts being
             stopped, warm pools, and the running attempts that could be preempted.
2. order   - queued jobs by priority (high first); within a priority, jobs holding a reservation first;
             then submission time, then name. Jobs in backoff wait.
3. admit   - each job in order: start it on a matching warm pool (reuse); else in free capacity, with
             warm pools nobody at least as important wants released if that is all it lacks; else cover
             its deficit from the ledger, cheapest first: instances returning from stopping
             attempts, then warm pools nobody at least as important wants (released), then the fewest
             lower-priority attempts that have trained long enough and are within their preemption
             budget (preempted). The cover is minimal: each kind is used only for what the cheaper ones
             leave, and the victims are the fewest that cover the rest; of those, the ones that lose the
             least training since their last checkpoint (docs/adr/0023). A victim whose next checkpoint
             is due within `checkpoint_wait_seconds` is stopped once it wrote it, or at the bound; its
             instances are held for the job meanwhile.
4. reserve - a job that preempts or releases for itself, or that has waited at the head of its pool for
             `reserve_after_seconds`, holds a reservation. The plan returns it and the service stores it
             with the job, so it outlives the pass: in every later pass the job claims, before any job of
             lower or equal priority, every free, returning or releasable instance it still needs.
             Reserved capacity goes to no job of lower or equal priority; backfill uses what is left.
5. keep    - a started job whose resource key matches another queued job is kept warm when it ends.

Invariants (tested with hypothesis in tests/unit/test_policy_properties.py): capacity is never exceeded by
the actions; reserved capacity never goes to a job of lower or equal priority; nothing is preempted for
equal or lower priority, before its minimum training time or beyond its preemption budget; the victims are
a minimal cover of the deficit; every workload with finite arrivals drains. Of victims by work lost and waits
for a checkpoint: tests/unit/test_policy_checkpoints.py.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sagequeue_core.domain import Reservation, ReservationKind, ResourceKey, never_fits
from sagequeue_core.quotas import TeamLedger, TeamQuota, fair_share_factors, fair_share_key

#: Above this many preemption candidates in a pool, the exact fewest-victims search gives way to a
#: greedy cover that is then pruned to a minimal one (the search is combinatorial).
EXACT_VICTIM_SEARCH_LIMIT = 14
#: SageMaker's stop: SIGTERM, then up to this long before the instances are back.
STOP_GRACE_SECONDS = 120
#: The top priority's target (docs/simulator.md): its p95 wait within this factor of a stop grace plus a
#: provisioning. A top-priority preemptor waits for a victim's checkpoint only within the margin it leaves.
TOP_PRIORITY_WAIT_FACTOR = 1.1


# --- Snapshot ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueuedJob:
    name: str
    priority: int
    submitted_at: datetime
    demand: Mapping[str, int]  # instances per pool
    resource_key: ResourceKey | None = None  # None: cannot use a warm pool (spot, instance groups)
    not_before: datetime | None = None  # backoff after a transient failure
    reservation: Reservation | None = None  # what an earlier pass promised it
    queued_since: datetime | None = None  # when it last entered the queue; None: submitted_at
    preemptions: int = 0  # times it was preempted already
    checkpointed: bool = True  # it resumes from checkpoints (CheckpointConfig); else it restarts from zero
    team: str | None = None  # whose quota it draws on (quotas.py); None: no team
    #: times its lender stopped an attempt of it that ran on loan: counted apart from preemptions
    loans_taken_back: int = 0
    #: StoppingCondition.MaxRuntimeInSeconds as the submitter gave it (None: not given): a bound on its run
    max_runtime_seconds: int | None = None

    @property
    def waiting_since(self) -> datetime:
        return self.queued_since or self.submitted_at


@dataclass(frozen=True)
class RunningAttempt:
    """A live SageMaker training job holding instances: one of ours, or one started outside the queue."""

    training_job_name: str
    demand: Mapping[str, int]
    priority: int
    started_at: datetime
    job_name: str | None = None  # the queue entry; None for jobs started by hand
    stopping: bool = False  # already being stopped: its instances come back soon, nothing to decide
    #: when the attempt first reached the Training phase; None while it is still provisioning. The minimum
    #: runtime before preemption counts from here, not from CreateTrainingJob.
    training_started_at: datetime | None = None
    preemptions: int = 0  # times its queue entry was preempted already
    checkpointed: bool = True  # it resumes from checkpoints (CheckpointConfig); else it restarts from zero
    loans_taken_back: int = 0  # times its queue entry's loans were taken back already
    #: the waiting job whose reserved capacity it runs on, as a loan that job takes back when it can start
    on_loan_for: str | None = None
    team: str | None = None  # whose quota it draws on (quotas.py); None: no team
    #: how long SageMaker lets it train (its MaxRuntimeInSeconds, or SageMaker's default): it has ended by
    #: its training start (or creation plus provisioning) plus this; None: unknown, no bound
    max_runtime_seconds: int | None = None
    #: accepted by SageMaker but waiting for capacity it does not have (EC2's, or its training plan's):
    #: nothing launched, so stopping it loses no work (docs/adr/0017)
    waiting_for_capacity: bool = False
    #: when the attempt last wrote a checkpoint it can resume from (docs/adr/0023); None: none written yet,
    #: or not known
    last_checkpoint_at: datetime | None = None
    #: seconds between its checkpoints as observed so far; None: fewer than two seen
    checkpoint_interval_seconds: float | None = None

    @property
    def preemptible(self) -> bool:
        return self.job_name is not None and not self.stopping


def region_short(running: Sequence[RunningAttempt]) -> set[str]:
    """Pools where one of the attempts waits for capacity SageMaker does not have (docs/adr/0017). A
    launched attempt there is no victim: the instances it would free go back to EC2 (or the plan), where
    the attempt already waiting is ahead of the job it was preempted for, so the preemption would be
    wasted. The waiting attempts themselves stay victims: stopping them loses no work."""
    return {pool for attempt in running if attempt.waiting_for_capacity for pool in attempt.demand}


@dataclass(frozen=True)
class WarmPool:
    """A finished job's retained cluster, Available for a job with the same resource key."""

    training_job_name: str
    resource_key: ResourceKey
    #: left by an attempt that ran on loan from this waiting job: the pool is that job's capacity
    lent_by: str | None = None

    @property
    def pool(self) -> str:
        return self.resource_key.pool

    @property
    def instances(self) -> int:
        return self.resource_key.instance_count


@dataclass(frozen=True)
class Snapshot:
    now: datetime
    capacity: Mapping[str, int]
    #: what the account's quota lets SageMaker hold, where it is below the capacity (learned from a refusal)
    quota: Mapping[str, int] = field(default_factory=dict)
    queued: Sequence[QueuedJob] = ()
    running: Sequence[RunningAttempt] = ()
    warm_pools: Sequence[WarmPool] = ()
    #: team quotas per pool (quotas.py); none: pools are not divided among teams, as without teams
    team_quotas: Sequence[TeamQuota] = ()
    #: decayed instance-hours per team: fair share orders teams within a priority when quotas exist
    team_usage: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PolicySettings:
    min_runtime_before_preemption_seconds: int = 0
    default_keep_alive_seconds: int = 0
    #: past this many preemptions a job is not preempted again until it ends; 0: no limit
    max_preemptions_per_job: int = 3
    #: a job waiting at the head of its pool this long reserves what it needs (drain); 0: never
    reserve_after_seconds: int = 1800
    #: lend the idle part of a reservation that still waits for running work to end to smaller jobs that
    #: resume from checkpoints; the reservation takes it back (preempts them) when it can start
    lend_reserved_capacity: bool = True
    #: jobs at or above this priority may preempt a victim before its minimum runtime and beyond its
    #: preemption budget, up to `top_priority_budget_factor` times the budget; 0: no override
    top_priority: int = 0
    top_priority_budget_factor: int = 2
    #: creation to Training, as the pass estimates it when it projects when running work ends (EASY backfill)
    provisioning_seconds: int = 600
    #: the longest a preemptor waits for a victim's checkpoint that is due before stopping it (docs/adr/0023);
    #: 0: victims are stopped at once
    checkpoint_wait_seconds: int = 300
    #: choose victims by the training they would lose (docs/adr/0023); False: in victim_order alone, as
    #: before it (what the simulator compares with)
    victims_by_work_lost: bool = True
    #: execution roles whose warm pools may be kept (Settings.warm_pool_roles); None: any role
    warm_pool_roles: frozenset[str] | None = None

    def is_top(self, priority: int) -> bool:
        return 0 < self.top_priority <= priority

    def keeps_warm(self, role_arn: str | None) -> bool:
        """Whether a warm pool of a job running as `role_arn` may be kept: SageMaker gives it to the next
        job of the same role and resources, so only a role of one team keeps it within that team."""
        return self.warm_pool_roles is None or role_arn in self.warm_pool_roles


# --- Actions -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    job_name: str
    warm_pool: str | None = None  # training job whose Available warm pool this start reuses
    keep_alive_seconds: int | None = None  # set when a queued job would match next; None: as requested
    on_loan_for: str | None = None  # the reservation holder whose idle capacity it borrows
    #: EASY backfill: the reservation holder whose projected start this job, without checkpoints, ends
    #: before (its MaxRuntimeInSeconds plus provisioning): it runs on the holder's idle instances and is
    #: never taken back
    ends_before: str | None = None


@dataclass(frozen=True)
class Preempt:
    job_name: str
    training_job_name: str
    for_job: str
    #: the attempt runs on loan and ends for its lender, or for a job more important than its lender (which
    #: would have had the lender's idle instance had nobody borrowed it): counted as a loan taken back, not
    #: in the borrower's preemption budget
    taken_back: bool = False
    #: the training the stop throws away: seconds since the victim's last checkpoint (since its training
    #: start without one, all of it when it does not resume from checkpoints); None: unknown
    work_lost_seconds: float | None = None


@dataclass(frozen=True)
class ReleaseWarmPool:
    training_job_name: str
    #: the waiting job the instances are released for; OVERRUN when the pool holds more than its capacity
    for_job: str


#: `ReleaseWarmPool.for_job` of an idle warm pool released because its pool is over capacity (drained or
#: shrunk): nobody's, the instances are not the pool's any more.
OVERRUN = ""

Action = Start | Preempt | ReleaseWarmPool


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)  # job name -> why it did not start
    #: instances set aside in this pass for a waiting job (pool -> instances), so lower-priority jobs
    #: cannot take them
    held: dict[str, dict[str, int]] = field(default_factory=dict)
    #: the reservations waiting jobs hold after this pass; a queued job absent here holds none
    reservations: dict[str, Reservation] = field(default_factory=dict)
    #: victims whose due checkpoint this pass waits for (docs/adr/0023): training job name -> the time a pass
    #: stops it at the latest, checkpoint or not. Its instances are held for its preemptor meanwhile.
    checkpoint_waits: dict[str, datetime] = field(default_factory=dict)
    #: the earliest time a pass decides otherwise with nothing else changed (a checkpoint due, a wait's end);
    #: None: no such time. The service's timer passes come every minute; the simulator wakes for it.
    wake_at: datetime | None = None

    @property
    def starts(self) -> list[Start]:
        return [a for a in self.actions if isinstance(a, Start)]

    @property
    def preemptions(self) -> list[Preempt]:
        return [a for a in self.actions if isinstance(a, Preempt)]

    @property
    def releases(self) -> list[ReleaseWarmPool]:
        return [a for a in self.actions if isinstance(a, ReleaseWarmPool)]


# --- The pass ------------------------------------------------------------------------------------------------


def queue_order(job: QueuedJob) -> tuple[int, datetime, str]:
    """Priority first (high first), then submission order: the one ordering the queue has everywhere."""
    return (-job.priority, job.submitted_at, job.name)


def pass_order(job: QueuedJob) -> tuple[int, bool, datetime, str]:
    """The order a pass admits jobs in: the queue's, except that within a priority a job holding a
    reservation goes first, so nothing of equal priority takes what it was promised."""
    return (-job.priority, job.reservation is None, job.submitted_at, job.name)


def plan(snapshot: Snapshot, settings: PolicySettings | None = None) -> Plan:
    settings = settings or PolicySettings()
    return _Pass(snapshot, settings).run()


@dataclass
class _Cover:
    """How a waiting job's deficit is met from the ledger, cheapest first."""

    returning: Counter[str] = field(default_factory=Counter)
    releases: list[WarmPool] = field(default_factory=list)
    victims: list[RunningAttempt] = field(default_factory=list)
    short: dict[str, int] = field(default_factory=dict)  # what none of it covers

    @property
    def complete(self) -> bool:
        return not self.short


class _Pass:
    def __init__(self, snapshot: Snapshot, settings: PolicySettings) -> None:
        self.snapshot = snapshot
        self.settings = settings
        self.result = Plan()
        # 1. count
        used: Counter[str] = Counter()
        for attempt in snapshot.running:
            used.update(attempt.demand)
        for warm in snapshot.warm_pools:
            used[warm.pool] += warm.instances
        self.free: dict[str, int] = {
            pool: self._limit(pool) - used[pool] for pool in set(snapshot.capacity) | set(used)
        }
        # capacity that attempts already being stopped will return, not yet promised to anyone
        self.returning: Counter[str] = Counter()
        for attempt in snapshot.running:
            if attempt.stopping:
                self.returning.update(attempt.demand)
        self.warm: list[WarmPool] = sorted(snapshot.warm_pools, key=lambda w: w.training_job_name)
        self.victims: set[str] = set()
        self.preemptible_by_pool: dict[str, list[RunningAttempt]] = {}
        # least important first, so a scan for victims stops at the first attempt as important as the job
        short = region_short(snapshot.running)
        for attempt in sorted(snapshot.running, key=lambda a: (a.priority, a.training_job_name)):
            if attempt.preemptible and not (set(attempt.demand) & short and not attempt.waiting_for_capacity):
                for pool in attempt.demand:
                    self.preemptible_by_pool.setdefault(pool, []).append(attempt)
        # --- team quotas hook (quotas.py): a no-op without quotas ---
        self.teams = TeamLedger(
            snapshot.team_quotas, {pool: self._limit(pool) for pool in snapshot.capacity}, snapshot.running
        )
        factors = fair_share_factors(snapshot.team_usage, snapshot.team_quotas)
        # 2. order
        if self.teams.governed:
            # each team's jobs in pass order; across teams the heads: one within its team's nominal quota
            # before one that would borrow, then priority, reservation holders, fair share, submission
            self.order = self.teams.admission_order(
                snapshot.queued,
                key=lambda j: (*pass_order(j)[:2], fair_share_key(j.team, factors), *pass_order(j)[2:]),
                counted=lambda j: (
                    (j.not_before is None or j.not_before <= snapshot.now) and self._never_fits(j) is None
                ),
            )
        else:
            self.order = sorted(snapshot.queued, key=pass_order)
        self.eligible = [j for j in self.order if j.not_before is None or j.not_before <= snapshot.now]
        self.started: set[str] = set()
        self.blocked_pools: set[str] = set()  # pools where a job already waits in this pass
        # Resource keys of queued jobs, kept up to date as the pass walks the queue, so that asking "who
        # else would reuse this warm pool" costs the same for the first job and the ten-thousandth.
        self.open_keys: Counter[ResourceKey] = Counter(j.resource_key for j in self.order if j.resource_key)
        self.unadmitted_keys: Counter[ResourceKey] = Counter(
            j.resource_key for j in self.eligible if j.resource_key
        )
        self.unadmitted_by_priority: dict[int, Counter[ResourceKey]] = {}
        for j in self.eligible:
            if j.resource_key:
                self.unadmitted_by_priority.setdefault(j.priority, Counter())[j.resource_key] += 1
        self.waiting_keys: Counter[ResourceKey] = Counter()
        # the current priority of every queued job: a loan is its lender's only while the lender waits and
        # the borrower does not outrank it (`_lender`)
        self.queued_priority = {j.name: j.priority for j in snapshot.queued}
        # attempts running on a waiting job's reserved capacity, by the job they borrow from
        self.loans: dict[str, list[RunningAttempt]] = {}
        for attempt in snapshot.running:
            lender = self._lender(attempt)
            if lender is not None and attempt.preemptible:
                self.loans.setdefault(lender, []).append(attempt)
        # free instances held in this pass for reservations that still wait for running work: lendable
        self.lendable: dict[str, Counter[str]] = {}
        # warm pools a waiting reservation claimed in this pass: another job starts on one only as its loan
        self.reserved_warm: dict[str, list[WarmPool]] = {}

    def run(self) -> Plan:
        self._release_overrun()
        eligible = {j.name for j in self.eligible}
        for job in self.order:
            if job.name not in eligible:
                self.result.waiting[job.name] = f"backing off until {job.not_before:%Y-%m-%dT%H:%M:%SZ}"
        for job in self.eligible:
            if job.resource_key:
                self.unadmitted_keys[job.resource_key] -= 1
                self.unadmitted_by_priority[job.priority][job.resource_key] -= 1
            self._admit(job)
            if job.name not in self.started:
                self.blocked_pools.update(job.demand)
                if job.resource_key:
                    self.waiting_keys[job.resource_key] += 1
        if self.settings.lend_reserved_capacity and (self.lendable or self.reserved_warm):
            self._lend()
        self._release_unlent_warm_pools()
        return self.result

    # 3. admit
    def _admit(self, job: QueuedJob) -> None:
        never = self._never_fits(job)
        if never is not None:
            self.result.waiting[job.name] = never
            return
        if not self.teams.governed:
            self._place(job)
            return
        # team quotas hook: the loans of the job's own reserved capacity are its to take back, not usage of
        # the borrowers' teams that would keep it from its quota
        loans = self._loans_for(job)
        with self.teams.without(loans):
            if not self._team_admits(job):
                return
        owed = self._loans_owed_to_quota(job, loans)
        with self.teams.without(loans):
            self._place(job, owed)

    def _place(self, job: QueuedJob, owed: Sequence[RunningAttempt] = ()) -> None:
        """Start the job, or cover what it lacks. `owed`: loans of its reserved capacity its team's quota
        needs back before it may start (quotas.py), taken back even where the pool has room for it."""
        warm = self._matching_warm_pool(job)
        deficit = self._deficit(job.demand)
        if owed and (warm is not None or not deficit):
            self._take_back(job, owed)
            return
        if warm is not None:
            self.warm.remove(warm)  # its instances are counted as used already: they become the job's
            self._start(job, warm_pool=warm.training_job_name)
            return
        if not deficit:
            self._take(job.demand)
            self._start(job)
            return
        releasable = self._releasable_warm_pools(job)
        releases = _fewest(releasable, deficit)
        if _covered_by(releases, deficit) and owed:
            self._take_back(job, owed)
            return
        if _covered_by(releases, deficit):
            # released warm pools make room now: start rather than wait for anything to come back
            self._release(job, releases)
            self._take(job.demand)
            self._start(job)
            return
        cover = self._cover(job, deficit, releasable)
        if cover.complete:
            cover.victims += [loan for loan in owed if loan not in cover.victims]
            holds = self._commit(job, cover)
            kind = ReservationKind.PREEMPTED if cover.victims else ReservationKind.RELEASED
            if job.reservation is not None and not cover.victims:
                kind = job.reservation.kind
            self._reserve(job, kind, holds)
            self.result.waiting[job.name] = self._waiting_reason(job, cover)
            return
        if job.reservation is not None or self._drain_due(job) or self._loans_for(job):
            # Promised earlier, waited at the head long enough, or lent capacity that is still out (its
            # reservation was ended meanwhile: held and released, quota-blocked, backing off): hold whatever
            # it can get, so that capacity coming back accumulates for it instead of going to later work.
            partial = _Cover(returning=cover.returning, releases=cover.releases)
            holds = self._commit(job, partial)
            self.lendable[job.name] = Counter(self.result.held.get(job.name, {}))
            for warm in self._claim_warm_pools(job, holds):
                holds[warm.pool] = min(holds.get(warm.pool, 0) + warm.instances, job.demand[warm.pool])
            for loan in self._loans_for(job):
                for pool, instances in loan.demand.items():
                    if pool in holds:
                        holds[pool] = min(holds[pool] + instances, job.demand[pool])
            kind = job.reservation.kind if job.reservation is not None else ReservationKind.DRAIN
            self._reserve(job, kind, holds)
            self.result.waiting[job.name] = (
                self.result.reservations[job.name].describe(job.demand) + "; waiting for running jobs to end"
            )
            return
        if self._coverable_later(job, cover):
            # It will outrank enough running work once that work has trained its minimum time: hold the
            # free capacity for it rather than start lower-priority work that would be preempted right after.
            self._claim(job)
            self.result.waiting[job.name] = (
                "waiting for lower-priority jobs to reach the minimum runtime before preemption"
            )
            return
        self.result.waiting[job.name] = "waiting for capacity: " + ", ".join(
            f"needs {job.demand[pool]} {pool}, {max(self.free.get(pool, 0), 0)} free" + self._quota_note(pool)
            for pool in sorted(job.demand)
        )

    def _quota_note(self, pool: str) -> str:
        if pool not in self.snapshot.quota:
            return ""
        return f" (the account's quota allows {self.snapshot.quota[pool]} of the pool's {self.snapshot.capacity.get(pool, 0)})"

    def _limit(self, pool: str) -> int:
        capacity = self.snapshot.capacity.get(pool, 0)
        return min(capacity, self.snapshot.quota.get(pool, capacity))

    def _never_fits(self, job: QueuedJob) -> str | None:
        return never_fits(job.demand, self.snapshot.capacity)

    def _drain_due(self, job: QueuedJob) -> bool:
        after = self.settings.reserve_after_seconds
        if after <= 0 or any(pool in self.blocked_pools for pool in job.demand):
            return False
        return (self.snapshot.now - job.waiting_since).total_seconds() >= after

    def _start(
        self,
        job: QueuedJob,
        warm_pool: str | None = None,
        on_loan_for: str | None = None,
        ends_before: str | None = None,
    ) -> None:
        self.started.add(job.name)
        self.teams.take(job.team, job.demand)  # team quotas hook
        if job.resource_key:
            self.open_keys[job.resource_key] -= 1
        # a loan gets no keep-alive of the scheduler's: it usually ends by being taken back, and a pool it
        # left would only stand in its lender's way
        keep_alive = None if on_loan_for or ends_before else self._keep_alive_for(job)
        self.result.actions.append(
            Start(
                job.name,
                warm_pool=warm_pool,
                keep_alive_seconds=keep_alive,
                on_loan_for=on_loan_for,
                ends_before=ends_before,
            )
        )

    def _budget_spent(self, preemptions: int, for_job: QueuedJob | None = None, taken_back: int = 0) -> bool:
        """Stopped enough (`max_preemptions_per_job`, 0: no limit). Of preemptions: not preempted again
        until it ends, except to end a loan it runs on (`_takes_back`), or for a top-priority `for_job`,
        which may go on while all its stops (preemptions and loans taken back, `taken_back`) stay under
        `top_priority_budget_factor` times the budget, so no job is stopped more than that in all. Of loans
        taken back: it borrows no more."""
        budget = self.settings.max_preemptions_per_job
        if budget <= 0:
            return False
        if preemptions < budget:
            return False
        if for_job is not None and self.settings.is_top(for_job.priority):
            return preemptions + taken_back >= self._override_bound(taken_back)
        return True

    def _stop_cap(self) -> int:
        """The most stops (preemptions and loans taken back) of one job: twice the budget (each kind alone
        stays within the budget), or the top-priority override's bound if higher."""
        return self.settings.max_preemptions_per_job * max(self.settings.top_priority_budget_factor, 2)

    def _override_bound(self, taken_back: int) -> int:
        """The top-priority override stops a victim while its stops stay under this: its factor times the
        budget, less one while the victim may still borrow, so that a loan of it taken back later keeps it
        within `_stop_cap` (it borrows no more once there)."""
        budget = self.settings.max_preemptions_per_job
        bound = budget * max(self.settings.top_priority_budget_factor, 1)
        return bound - 1 if taken_back < budget else bound

    # the ledger
    def _cover(self, job: QueuedJob, deficit: Mapping[str, int], releasable: Sequence[WarmPool]) -> _Cover:
        """Meet `deficit` from the ledger, cheapest first: returning instances, releasable warm pools,
        then the fewest preemptible lower-priority attempts. `short` is what remains uncovered."""
        cover = _Cover()
        remaining = dict(deficit)
        for pool, need in list(remaining.items()):
            take = min(self.returning[pool], need)
            if take > 0:
                cover.returning[pool] = take
                remaining[pool] = need - take
        remaining = {pool: need for pool, need in remaining.items() if need > 0}
        if remaining:
            cover.releases = _fewest(releasable, remaining)
            for warm in cover.releases:
                remaining[warm.pool] = remaining.get(warm.pool, 0) - warm.instances
            remaining = {pool: need for pool, need in remaining.items() if need > 0}
        if remaining:
            # its own capacity lent out comes back first, whatever the borrowers' priority or runtime
            loans = self._loans_for(job)
            lent = {a.training_job_name for a in loans}
            ready = loans + [
                a
                for a in self._candidates(job, remaining)
                if self._ripe(a, job) and a.training_job_name not in lent
            ]
            victims = minimal_cover(
                ready,
                remaining,
                first=lent,
                key=self._reclaim_first(job),
                cost=self._stop_cost(job) if self.settings.victims_by_work_lost else None,
            )
            if victims is None:
                cover.short = remaining
            else:
                cover.victims = victims
        return cover

    def _candidates(self, job: QueuedJob, remaining: Mapping[str, int]) -> list[RunningAttempt]:
        candidates: dict[str, RunningAttempt] = {}
        for pool in remaining:
            for attempt in self.preemptible_by_pool.get(pool, ()):
                if attempt.priority >= job.priority:
                    break  # nothing is preempted for equal or lower priority; the rest are at least as important
                if attempt.training_job_name in self.victims:
                    continue
                if self._budget_spent(
                    attempt.preemptions, job, attempt.loans_taken_back
                ) and not self._takes_back(attempt, job):
                    # preempted enough: it runs to its end, unless it runs on a loan this job may end (its
                    # own, even from before its reservation, or one lent by a less important job)
                    continue
                if self.teams.same_team_only(job.team, attempt):
                    continue  # team quotas hook: other teams' work is reclaimed, not preempted by priority
                candidates[attempt.training_job_name] = attempt
        # team quotas hook: borrowing work of other teams, whatever its priority, for a team under its quota
        if not self.teams.governed:
            return list(candidates.values())
        for attempt in self.teams.reclaim_candidates(
            job.team,
            job.demand,
            itertools.chain.from_iterable(self.preemptible_by_pool.get(pool, ()) for pool in remaining),
            lambda a: (
                a.training_job_name not in self.victims
                and (
                    not self._budget_spent(a.preemptions, job, a.loans_taken_back) or self._takes_back(a, job)
                )
            ),
        ):
            candidates[attempt.training_job_name] = attempt
        return list(candidates.values())

    # --- team quotas hooks (the arithmetic is quotas.py's) ---
    def _team_admits(self, job: QueuedJob) -> bool:
        """Whether the job's team may take its demand (nominal quota, or borrowing). If not, the job waits
        with a reason naming the quota; within the team, a higher priority preempts its own team's
        lower-priority work to make room, as it would in the pool."""
        short = self.teams.short(job.team, job.demand)
        if not short:
            return True
        reason = self.teams.reason(job.team, job.demand, self.free)
        if not self.teams.short(job.team, job.demand, returning=True):
            self.result.waiting[job.name] = reason + "; waiting for the team's stopping jobs"
            if job.reservation is not None:
                # it fits once they are gone (its own loans or victims, being stopped): it keeps its
                # reservation and claims what is free, rather than drop it while they stop
                self._reserve(job, job.reservation.kind, self._claim(job))
            return False
        ready = [a for a in self._candidates(job, short) if self._ripe(a, job)]
        victims = minimal_cover(
            ready, short, cost=self._priced_loss if self.settings.victims_by_work_lost else None
        )
        if victims is not None:
            self._stop(victims, job)  # no claim on free capacity: that is other teams' while these stop
            self.result.waiting[job.name] = (
                reason
                + "; waiting for the team's preempted jobs to stop: "
                + (", ".join(v.training_job_name for v in victims))
            )
            return False
        self.result.waiting[job.name] = reason
        return False

    def _loans_owed_to_quota(self, job: QueuedJob, loans: Sequence[RunningAttempt]) -> list[RunningAttempt]:
        """The fewest of the job's loans that must stop before its team's quota lets it start: none when it
        fits with all of them running (a loan to its own team fills its quota; another team's loan may use
        what it would borrow)."""

        def fits_without(gone: Sequence[RunningAttempt]) -> bool:
            with self.teams.without(gone):
                return not self.teams.short(job.team, job.demand)

        if not loans or fits_without(()):
            return []
        owed: list[RunningAttempt] = []
        for loan in sorted(loans, key=victim_order):
            owed.append(loan)
            if fits_without(owed):
                break
        for loan in reversed(list(owed)):  # prune what the quota does not need
            rest = [a for a in owed if a is not loan]
            if fits_without(rest):
                owed = rest
        return owed

    def _take_back(self, job: QueuedJob, owed: Sequence[RunningAttempt]) -> None:
        """Preempt loans the job's team quota needs back, and hold what is free for the job meanwhile."""
        self._stop(owed, job)
        promised: Counter[str] = Counter(self._claim(job))
        for loan in owed:
            promised.update({pool: n for pool, n in loan.demand.items() if pool in job.demand})
        self._reserve(
            job,
            ReservationKind.PREEMPTED,
            {pool: min(promised[pool], need) for pool, need in job.demand.items()},
        )
        self.result.waiting[job.name] = "taking back its loans for its team's quota: " + ", ".join(
            loan.training_job_name for loan in owed
        )

    def _reclaim_first(self, job: QueuedJob) -> Callable[[RunningAttempt], tuple[Any, ...]] | None:
        """Victim order when other teams' borrowing work is among the candidates: that first, newest first
        (whatever its priority); then the rest in victim_order. Ends, as victim_order does, with start time and
        name (`minimal_cover`)."""
        if not self.teams.governed:
            return None

        def key(attempt: RunningAttempt) -> tuple[Any, ...]:
            if self.teams.same_team_only(job.team, attempt):
                return (0, -attempt.started_at.timestamp(), attempt.training_job_name)
            return (1, *victim_order(attempt))

        return key

    def _loans_for(self, job: QueuedJob) -> list[RunningAttempt]:
        """Attempts running on capacity this job lent them, whenever it lent it: a loan stays its lender's
        for as long as the borrower runs, whatever happened to the reservation since (held and released,
        quota-blocked, backing off). It takes them back (preempts them) as soon as that completes its
        cover."""
        return [a for a in self.loans.get(job.name, ()) if a.training_job_name not in self.victims]

    def _lender(self, attempt: RunningAttempt) -> str | None:
        """The waiting job whose capacity `attempt` runs on, as the priorities stand now: none when the
        lender no longer waits, or when the borrower outranks it (the loan has become an ordinary start)."""
        lender = attempt.on_loan_for
        if lender is None or lender not in self.queued_priority:
            return None
        return lender if attempt.priority <= self.queued_priority[lender] else None

    def _takes_back(self, attempt: RunningAttempt, job: QueuedJob) -> bool:
        """Stopping `attempt` for `job` ends a loan: `job` lent it, or is more important than its lender. That
        counts as a loan taken back (the borrower borrowed within that budget), never as a preemption."""
        lender = self._lender(attempt)
        if lender is None:
            return False
        return lender == job.name or self._lent_by_less_important(attempt, job)

    def _stop(self, victims: Iterable[RunningAttempt], job: QueuedJob) -> None:
        """Preempt `victims` for `job` (a loan among them is taken back, `_takes_back`)."""
        for victim in victims:
            assert victim.job_name is not None  # preemptible attempts belong to the queue
            self.victims.add(victim.training_job_name)
            self.result.actions.append(
                Preempt(
                    victim.job_name,
                    victim.training_job_name,
                    for_job=job.name,
                    taken_back=self._takes_back(victim, job),
                    work_lost_seconds=work_lost_seconds(victim, self.snapshot.now),
                )
            )

    def _ripe(self, attempt: RunningAttempt, job: QueuedJob) -> bool:
        """May be stopped for `job` now: it trained its minimum, or it is a loan `job` outranks the lender of."""
        return (
            self._ran_long_enough(attempt)
            or self._lent_by_less_important(attempt, job)
            or self.settings.is_top(job.priority)
        )

    def _lent_by_less_important(self, attempt: RunningAttempt, job: QueuedJob) -> bool:
        """A loan runs on an instance its lender would have held idle, which a job more important than
        the lender could have taken at once: for such a job the borrower has no minimum runtime."""
        lender = self._lender(attempt)
        return lender is not None and self.queued_priority[lender] < job.priority

    def _lend(self) -> None:
        """Backfill on loan: a reservation still waiting for running work to end holds free instances that
        would otherwise stay idle until then. Jobs that waited in this pass for want of capacity, resume from
        checkpoints and have not had loans taken back as often as the budget allows may run on them, lent by
        a reservation of at least their priority; the lender takes them back (stops them) the moment it can
        start, whatever their preemption budget (they lose at most the work since their last checkpoint), so
        the reservation is never delayed by more than a stop. A loan taken back counts apart from
        preemptions: a job whose preemption budget is spent still borrows, and its loan still ends for the
        lender or a job more important than the lender."""
        holders = [j for j in self.eligible if j.name in self.lendable or j.name in self.reserved_warm]
        for job in self.eligible:
            if job.name in self.started or self._holds_anything(job):
                continue
            if not job.checkpointed:
                self._backfill_before(job, holders)
                continue
            if self._budget_spent(job.loans_taken_back):
                continue
            if self.settings.max_preemptions_per_job > 0 and (
                job.preemptions + job.loans_taken_back >= self._stop_cap()
            ):
                continue  # stopped as often as any job may be: a loan taken back would go beyond
            if self._never_fits(job) is not None:
                continue
            if self.teams.short(job.team, job.demand):
                continue  # team quotas hook: a loan is no way around the team's quota
            for holder in holders:
                if holder.priority < job.priority:
                    continue
                warm = next(
                    (
                        w
                        for w in self.reserved_warm.get(holder.name, ())
                        if w.resource_key == job.resource_key
                    ),
                    None,
                )
                if warm is not None:
                    # the holder's warm pool, reused on loan: taken back like any loan of its capacity
                    self.reserved_warm[holder.name].remove(warm)
                    self._start_on_loan(job, holder, warm_pool=warm.training_job_name)
                    break
                spare = self.lendable.get(holder.name, Counter())
                if all(spare[pool] >= need for pool, need in job.demand.items()):
                    spare.subtract(job.demand)
                    self._start_on_loan(job, holder)
                    break

    def _holds_anything(self, job: QueuedJob) -> bool:
        """A reservation of the job's own that holds instances or warm pools: it waits for them rather
        than borrow. One that holds nothing yet (behind a more important drain) lends nothing, so the job
        may borrow like any other; it gives the empty reservation up when it starts."""
        reservation = self.result.reservations.get(job.name)
        held = self.result.held.get(job.name, {})
        return (
            any(held.values())
            or bool(self.reserved_warm.get(job.name))
            or (reservation is not None and any(reservation.instances.values()))
        )

    def _start_on_loan(self, job: QueuedJob, holder: QueuedJob, warm_pool: str | None = None) -> None:
        self.result.waiting.pop(job.name, None)
        self.result.reservations.pop(job.name, None)
        self.result.held.pop(job.name, None)
        self.lendable.pop(job.name, None)
        self._start(job, warm_pool=warm_pool, on_loan_for=holder.name)

    def _backfill_before(self, job: QueuedJob, holders: Sequence[QueuedJob]) -> None:
        """EASY backfill for a job without checkpoints (a loan taken back would restart it from zero): it
        may run on a holder's idle instances if its explicit MaxRuntimeInSeconds plus provisioning ends
        before the holder's projected start, so it cannot delay the holder by the projection. It is an
        ordinary start, never taken back (`Start.ends_before`)."""
        if job.max_runtime_seconds is None or self._never_fits(job) is not None:
            return
        if job.name in self.started or job.name in self.result.reservations or job.name in self.result.held:
            return
        if self.teams.short(job.team, job.demand):
            return
        ends = self.snapshot.now.timestamp() + self.settings.provisioning_seconds + job.max_runtime_seconds
        for holder in holders:
            if holder.priority < job.priority:
                continue
            spare = self.lendable.get(holder.name, Counter())
            if not all(spare[pool] >= need for pool, need in job.demand.items()):
                continue
            projected = self._projected_start(holder)
            if projected is None or ends > projected:
                continue
            spare.subtract(job.demand)
            self.result.waiting.pop(job.name, None)
            self._start(job, ends_before=holder.name)
            return

    def _projected_start(self, holder: QueuedJob) -> float | None:
        """When the holder has all it needs at the latest, as epoch seconds: what it holds now, then the
        instances of running attempts on its pools as each ends by its MaxRuntimeInSeconds counted from its
        training start (or creation plus provisioning); None if that never covers it (an attempt with no
        bound, or other work in the way)."""
        now = self.snapshot.now.timestamp()
        reservation = self.result.reservations.get(holder.name)
        held = dict(reservation.instances) if reservation is not None else {}
        lent = {a.training_job_name for a in self._loans_for(holder)}
        latest = now
        for pool, need in holder.demand.items():
            have = held.get(pool, 0)
            if have >= need:
                continue
            ends: list[tuple[float, int]] = []
            for attempt in self.snapshot.running:
                if pool not in attempt.demand or attempt.training_job_name in lent:
                    continue
                if attempt.stopping:
                    ends.append((now, attempt.demand[pool]))
                    continue
                if attempt.max_runtime_seconds is None:
                    continue
                began = (
                    attempt.training_started_at.timestamp()
                    if attempt.training_started_at is not None
                    else attempt.started_at.timestamp() + self.settings.provisioning_seconds
                )
                ends.append((began + attempt.max_runtime_seconds, attempt.demand[pool]))
            for end, instances in sorted(ends):
                have += instances
                latest = max(latest, end)
                if have >= need:
                    break
            if have < need:
                return None
        return latest

    def _claim_warm_pools(self, job: QueuedJob, holds: Mapping[str, int]) -> list[WarmPool]:
        """A reservation still waiting for running work claims the warm pools of its pools that it needs
        beyond what it holds: every job after it in the pass is of lower or equal priority and may start on
        one only as its loan (`_lend`); those nobody borrows are released for it (`_release_unlent_warm_pools`),
        so its instances accumulate instead of being walked around through warm pools."""
        needed = {
            pool: need - holds.get(pool, 0) for pool, need in job.demand.items() if need > holds.get(pool, 0)
        }
        for loan in self._loans_for(job):
            for pool, instances in loan.demand.items():
                if pool in needed:
                    needed[pool] -= instances
        needed = {pool: need for pool, need in needed.items() if need > 0}
        if not needed:
            return []
        # a more important job later in the pass (team quotas order teams first) keeps what it would reuse
        wanted_above: Counter[ResourceKey] = Counter()
        for priority, keys in self.unadmitted_by_priority.items():
            if priority > job.priority:
                wanted_above.update({key: n for key, n in keys.items() if n > 0})
        mine = sorted(
            (w for w in self.warm if w.pool in needed and not wanted_above[w.resource_key]),
            key=lambda w: (w.lent_by != job.name, -w.instances, w.training_job_name),
        )
        claimed = _fewest(mine, needed)
        for warm in claimed:
            self.warm.remove(warm)
        if claimed:
            self.reserved_warm[job.name] = list(claimed)
        return claimed

    def _release_overrun(self) -> None:
        """A pool drained or shrunk below what it holds releases idle warm pools beyond its capacity at
        once, those no queued job would reuse first: they are billed and are not the pool's any more."""
        for pool in sorted(p for p, free in self.free.items() if free < 0):
            ranked = sorted(
                (w for w in self.warm if w.pool == pool),
                key=lambda w: (self.open_keys[w.resource_key] > 0, -w.instances, w.training_job_name),
            )
            for warm in ranked:
                if self.free[pool] >= 0:
                    break
                self.warm.remove(warm)
                self.free[pool] += warm.instances
                self.result.actions.append(ReleaseWarmPool(warm.training_job_name, for_job=OVERRUN))

    def _release_unlent_warm_pools(self) -> None:
        """Warm pools a waiting reservation claimed and nobody borrowed: released, so the instances come
        back free and the reservation holds them from the next pass on."""
        for holder, pools in self.reserved_warm.items():
            for warm in pools:
                self.result.actions.append(ReleaseWarmPool(warm.training_job_name, for_job=holder))

    def _coverable_later(self, job: QueuedJob, cover: _Cover) -> bool:
        if not cover.short:
            return False
        return covers(self._candidates(job, cover.short), cover.short)

    def _commit(self, job: QueuedJob, cover: _Cover) -> dict[str, int]:
        """Carry out a cover for `job`: promise the returning instances, release the warm pools, preempt
        the victims (or, for a victim whose checkpoint is due, wait for it: `_checkpoint_wait`), and hold
        the free capacity, all for it. Returns what it now holds, per pool."""
        self.returning.subtract(cover.returning)
        self._release(job, cover.releases)
        waits = {v.training_job_name: self._checkpoint_wait(job, v) for v in cover.victims}
        self._stop([v for v in cover.victims if waits[v.training_job_name] is None], job)
        for victim in cover.victims:
            until = waits[victim.training_job_name]
            if until is not None:
                # not stopped in this pass; its instances are the job's as a victim's are
                self.victims.add(victim.training_job_name)
                self.result.checkpoint_waits[victim.training_job_name] = until
                due = self._checkpoint_due(victim)
                wake = due if due is not None and due > self.snapshot.now else until
                wake = min(wake, until)
                self.result.wake_at = wake if self.result.wake_at is None else min(self.result.wake_at, wake)
        held = self._claim(job)
        promised: Counter[str] = Counter(held)
        promised.update(cover.returning)
        for victim in cover.victims:
            promised.update({pool: n for pool, n in victim.demand.items() if pool in job.demand})
        return {pool: min(promised[pool], need) for pool, need in job.demand.items()}

    def _reserve(self, job: QueuedJob, kind: ReservationKind, holds: Mapping[str, int]) -> None:
        since = job.reservation.since if job.reservation is not None else self.snapshot.now
        self.result.reservations[job.name] = Reservation(instances=dict(holds), since=since, kind=kind)

    def _release(self, job: QueuedJob, warm_pools: Sequence[WarmPool]) -> None:
        for warm in warm_pools:
            self.warm.remove(warm)
            self.free[warm.pool] += warm.instances
            self.result.actions.append(ReleaseWarmPool(warm.training_job_name, for_job=job.name))

    def _waiting_reason(self, job: QueuedJob, cover: _Cover) -> str:
        waits = [v for v in cover.victims if v.training_job_name in self.result.checkpoint_waits]
        if waits:
            stopped = [v.training_job_name for v in cover.victims if v not in waits]
            return (
                "waiting for the checkpoint of "
                + ", ".join(
                    f"{v.training_job_name} (stopped by "
                    f"{self.result.checkpoint_waits[v.training_job_name]:%Y-%m-%dT%H:%M:%SZ})"
                    for v in waits
                )
                + (" and for preempted jobs to stop: " + ", ".join(stopped) if stopped else "")
            )
        if cover.victims:
            return "waiting for preempted jobs to stop: " + ", ".join(
                v.training_job_name for v in cover.victims
            )
        if cover.returning:
            return "waiting for stopping jobs to release their instances"
        return "waiting for released warm pools to end"

    # checkpoints (docs/adr/0023)
    def _lost(self, attempt: RunningAttempt) -> float:
        return work_lost_seconds(attempt, self.snapshot.now)

    def _priced_loss(self, attempt: RunningAttempt) -> float:
        """The loss the victim choice counts: `work_lost_seconds`, except for a job that resumes from
        checkpoints and has told nothing of them (no checkpoint in this attempt, no interval): an image
        that does not report, or none written yet, the pass cannot tell which. It is priced at half its
        training in the attempt, as if it had checkpointed halfway, so it still goes before a job without
        checkpoints that trained as long, as the victim order had it before checkpoints were reported."""
        lost = self._lost(attempt)
        if not attempt.checkpointed or attempt.checkpoint_interval_seconds:
            return lost
        started = attempt.training_started_at
        if attempt.last_checkpoint_at is not None and (
            started is None or attempt.last_checkpoint_at > started
        ):
            return lost
        return lost / 2

    def _checkpoint_due(self, attempt: RunningAttempt) -> datetime | None:
        """When the attempt's next checkpoint is due: its interval after its last checkpoint in this
        attempt, or after its training start when it wrote none yet (it resumed from its last); None: its
        interval is not known, or it does not train yet."""
        if not attempt.checkpoint_interval_seconds or attempt.training_started_at is None:
            return None
        last = attempt.last_checkpoint_at
        if last is None or last < attempt.training_started_at:
            last = attempt.training_started_at
        return last + timedelta(seconds=attempt.checkpoint_interval_seconds)

    def _checkpoint_wait(self, job: QueuedJob, victim: RunningAttempt) -> datetime | None:
        """The time until which the pass waits for `victim`'s due checkpoint before stopping it for `job`;
        None: stop it now.

        It waits when the checkpoint is due before the wait's end, the wait saves more training than it
        idles (the victim is past the middle of its interval), and the victim is no loan (a loan ends at
        once, its lender was promised that). The wait ends `checkpoint_wait_seconds` after the job's
        reservation began (this pass, for a job without one), so a checkpoint that does not come within the
        bound holds the job no longer, however many passes see it due; a top-priority job waits only within
        the margin its target leaves (`TOP_PRIORITY_WAIT_FACTOR`), counted from when it began to wait."""
        bound = self.settings.checkpoint_wait_seconds
        due = self._checkpoint_due(victim)
        if bound <= 0 or due is None or not victim.checkpointed or self._takes_back(victim, job):
            return None
        now = self.snapshot.now
        since = job.reservation.since if job.reservation is not None else now
        until = since + timedelta(seconds=bound)
        if self.settings.is_top(job.priority):
            margin = (TOP_PRIORITY_WAIT_FACTOR - 1) * (
                STOP_GRACE_SECONDS + self.settings.provisioning_seconds
            )
            until = min(until, job.waiting_since + timedelta(seconds=margin))
        if now >= until or due > until:
            return None
        if self._lost(victim) <= max((due - now).total_seconds(), 0.0):
            return None
        return until

    def _stop_cost(self, job: QueuedJob) -> Callable[[RunningAttempt], float]:
        """What stopping a candidate for `job` costs, per instance: the training it loses now, or, where the
        pass would wait for its due checkpoint, the wait (its instances idle that long for nothing)."""

        def cost(attempt: RunningAttempt) -> float:
            lost = self._priced_loss(attempt)
            if self._checkpoint_wait(job, attempt) is None:
                return lost
            due = self._checkpoint_due(attempt)
            assert due is not None  # a wait needs a due checkpoint
            return min(lost, max((due - self.snapshot.now).total_seconds(), 0.0))

        return cost

    def _ran_long_enough(self, attempt: RunningAttempt) -> bool:
        if attempt.waiting_for_capacity:
            return True  # it has not launched: there is no run to protect
        if attempt.training_started_at is None:
            return self.settings.min_runtime_before_preemption_seconds <= 0
        trained = (self.snapshot.now - attempt.training_started_at).total_seconds()
        return trained >= self.settings.min_runtime_before_preemption_seconds

    # 5. keep
    def _keep_alive_for(self, job: QueuedJob) -> int | None:
        if job.resource_key is None or self.settings.default_keep_alive_seconds <= 0:
            return None
        if not self.settings.keeps_warm(job.resource_key.role_arn):
            return None
        if self.open_keys[job.resource_key] > 0:
            return self.settings.default_keep_alive_seconds
        return None

    # capacity bookkeeping
    def _take(self, demand: Mapping[str, int]) -> None:
        for pool, need in demand.items():
            self.free[pool] = self.free.get(pool, 0) - need

    def _claim(self, job: QueuedJob) -> dict[str, int]:
        """Set aside the free capacity a waiting job will use, so lower-priority jobs cannot take it."""
        held: dict[str, int] = {}
        for pool, need in job.demand.items():
            take = min(max(self.free.get(pool, 0), 0), need)
            self.free[pool] = self.free.get(pool, 0) - take
            if take:
                held[pool] = take
        if held:
            self.result.held[job.name] = held
        return held

    def _deficit(self, demand: Mapping[str, int]) -> dict[str, int]:
        """Instances that must come back before `demand` fits. A pool over capacity (capacity lowered, jobs
        started by hand) first pays back its overrun, so free capacity is counted signed."""
        return {
            pool: need - self.free.get(pool, 0)
            for pool, need in demand.items()
            if need > self.free.get(pool, 0)
        }

    # warm pools
    def _matching_warm_pool(self, job: QueuedJob) -> WarmPool | None:
        if job.resource_key is None:
            return None
        return next((w for w in self.warm if w.resource_key == job.resource_key), None)

    def _releasable_warm_pools(self, job: QueuedJob) -> list[WarmPool]:
        """Warm pools in the job's pools that no queued job at least as important would reuse, the ones
        nobody queued would reuse first, then those only less important jobs match.

        Each such job reuses one pool, so of several pools with the same key only as many are kept as
        there are jobs wanting that key; the rest may be released.
        """
        mine = [w for w in self.warm if w.pool in job.demand]
        if not mine:
            return []
        # jobs admitted before this one are at least as important; of those still to come, only the ones
        # of the same priority are
        same = self.unadmitted_by_priority.get(job.priority, Counter())
        taken: Counter[ResourceKey] = Counter()
        releasable: list[WarmPool] = []
        for warm in self.warm:
            key = warm.resource_key
            if warm.lent_by == job.name and warm.pool in job.demand:
                releasable.append(warm)  # left by its own borrower: its capacity, whoever else wants it
            elif taken[key] < self.waiting_keys[key] + same[key]:
                taken[key] += 1
            elif warm.pool in job.demand:
                releasable.append(warm)
        return sorted(
            releasable,
            key=lambda w: (
                w.lent_by != job.name,
                self.waiting_keys[w.resource_key] > 0 or self.unadmitted_keys[w.resource_key] > 0,
                -w.instances,
                w.training_job_name,
            ),
        )


def _fewest(ranked: Sequence[WarmPool], deficit: Mapping[str, int]) -> list[WarmPool]:
    """The first warm pools of `ranked` that together cover `deficit` (as far as they can)."""
    remaining = dict(deficit)
    chosen: list[WarmPool] = []
    for warm in ranked:
        if not any(need > 0 for need in remaining.values()):
            break
        if remaining.get(warm.pool, 0) > 0:
            chosen.append(warm)
            remaining[warm.pool] -= warm.instances
    return chosen


def _covered_by(warm_pools: Sequence[WarmPool], deficit: Mapping[str, int]) -> bool:
    freed: Counter[str] = Counter()
    for warm in warm_pools:
        freed[warm.pool] += warm.instances
    return all(freed[pool] >= need for pool, need in deficit.items())


def victim_order(attempt: RunningAttempt) -> tuple[bool, int, float, str]:
    """Jobs that resume from checkpoints before those that would restart from zero; then the least
    important; among equals the most recently started, which loses the least work. The last two fields
    (start time, name) only break ties: `minimal_cover` lets the work lost come before them, and any other
    order it is given ends with the same two."""
    return (
        not attempt.checkpointed,
        attempt.priority,
        -attempt.started_at.timestamp(),
        attempt.training_job_name,
    )


def covers(attempts: Iterable[RunningAttempt], deficit: Mapping[str, int]) -> bool:
    remaining = dict(deficit)
    for attempt in attempts:
        for pool, instances in attempt.demand.items():
            if pool in remaining:
                remaining[pool] -= instances
    return all(need <= 0 for need in remaining.values())


def work_lost_seconds(attempt: RunningAttempt, now: datetime) -> float:
    """The training a stop at `now` throws away, in seconds (docs/adr/0023): since the attempt's last
    checkpoint; since its training start when it wrote none in this attempt, or when it does not resume
    from checkpoints; nothing while it is still provisioning or waiting for capacity."""
    if attempt.waiting_for_capacity or attempt.training_started_at is None:
        return 0.0
    since = attempt.training_started_at
    if attempt.checkpointed and attempt.last_checkpoint_at is not None and attempt.last_checkpoint_at > since:
        since = attempt.last_checkpoint_at
    return max((now - since).total_seconds(), 0.0)


def minimal_cover(
    candidates: Sequence[RunningAttempt],
    deficit: Mapping[str, int],
    first: Collection[str] = (),
    key: Callable[[RunningAttempt], tuple[Any, ...]] | None = None,
    cost: Callable[[RunningAttempt], float] | None = None,
) -> list[RunningAttempt] | None:
    """The fewest candidates that together free `deficit`, preferring the cheapest to stop; None if none do.

    Covers of the fewest victims are ranked by, in turn: the most of `first` (the names of attempts running
    on loan from the waiting job); the victims' classes, as `key` (victim_order by default) ranks them
    without its last two fields, the start time and name (so the reclaim order of ADR 0011, and whether
    victims resume from checkpoints and their priorities); then the least `cost`; then `key` in full.

    `cost`: what stopping one attempt costs, per instance (the work it loses, `work_lost_seconds`); a cover
    costs the sum over its victims of cost times instances. It only chooses among covers equal on all that
    comes before it: a victim's own claim of what it would lose never outranks a less important victim.

    The result is always minimal: dropping any victim leaves the deficit uncovered, so no job is stopped
    that the waiting job does not need.
    """
    order = key or victim_order

    def rank(attempt: RunningAttempt) -> tuple[Any, ...]:
        return (attempt.training_job_name not in first, order(attempt))

    def standing(attempt: RunningAttempt) -> tuple[Any, ...]:
        # what outranks the cost: lent first, then the victim's class (its order less start time and name)
        return (attempt.training_job_name not in first, order(attempt)[:-2])

    ordered = sorted(candidates, key=rank)
    if not covers(ordered, deficit):
        return None
    weight = {a.training_job_name: cost(a) * sum(a.demand.values()) for a in ordered} if cost else {}

    def expense(combo: Sequence[RunningAttempt]) -> tuple[int, tuple[Any, ...], float]:
        # a combination keeps the order of `ordered`: its standings compare as the first cover found would
        return (
            sum(a.training_job_name not in first for a in combo),
            tuple(standing(a) for a in combo),
            sum(weight.get(a.training_job_name, 0.0) for a in combo),
        )

    if len(ordered) <= EXACT_VICTIM_SEARCH_LIMIT:
        # Combinations come out in lexicographic order of `ordered`, so of the covers of the smallest size
        # equal in standing and cost, the first is also the one made of the jobs first in victim_order.
        for size in range(1, len(ordered) + 1):
            best: tuple[tuple[int, tuple[Any, ...], float], tuple[RunningAttempt, ...]] | None = None
            for combo in itertools.combinations(ordered, size):
                if covers(combo, deficit):
                    if not cost:
                        return list(combo)
                    spent = expense(combo)
                    if best is None or spent < best[0]:
                        best = (spent, combo)
            if best is not None:
                return list(best[1])

    def greedy(attempt: RunningAttempt) -> tuple[Any, ...]:
        # by standing, then cost per instance when there is one, then the order
        return (standing(attempt), cost(attempt) if cost else 0.0, order(attempt))

    ordered = sorted(ordered, key=greedy)
    chosen: list[RunningAttempt] = []
    for attempt in ordered:
        chosen.append(attempt)
        if covers(chosen, deficit):
            break
    # prune: drop the victims last in that ranking that the cover does not need
    for attempt in sorted(chosen, key=greedy, reverse=True):
        rest = [a for a in chosen if a is not attempt]
        if covers(rest, deficit):
            chosen = rest
    return chosen
