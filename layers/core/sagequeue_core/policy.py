"""The scheduling decision: a pure function from a snapshot of the queue and the pools to actions.

It knows nothing of AWS, DynamoDB or clocks: the scheduler service reads the snapshot, calls `plan`, and
carries the actions out. One pass, in named phases:

1. count   - used capacity per pool: live attempts (stopping ones too, until SageMaker lets go) plus the
             Available warm pools, whose instances are retained and billed.
2. order   - queued jobs by priority (high first), then submission time, then name; jobs in backoff wait.
3. admit   - each job in order: start it on a matching warm pool (reuse); else start it in free capacity;
             else free capacity held by warm pools nobody more important needs; else preempt.
4. preempt - for a job that outranks running work: the fewest, lowest-priority attempts that have run
             long enough and together cover the deficit, no more. The job claims the capacity they free.
5. keep    - a started job whose resource key matches another queued job is kept warm when it ends.

Invariants (tested with hypothesis in tests/unit/test_policy_properties.py): capacity is never exceeded by
the actions; a queued job is never passed over for a lower-priority one in the same pool unless it cannot
fit; nothing is preempted for equal or lower priority; the victims are a minimal cover of the deficit.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sagequeue_core.domain import ResourceKey

#: Above this many preemption candidates in a pool, the exact fewest-victims search gives way to a
#: greedy cover that is then pruned to a minimal one (the search is combinatorial).
EXACT_VICTIM_SEARCH_LIMIT = 14


# --- Snapshot ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueuedJob:
    name: str
    priority: int
    submitted_at: datetime
    demand: Mapping[str, int]  # instances per pool
    resource_key: ResourceKey | None = None  # None: cannot use a warm pool (spot, instance groups)
    not_before: datetime | None = None  # backoff after a transient failure


@dataclass(frozen=True)
class RunningAttempt:
    """A live SageMaker training job holding instances: one of ours, or one started outside the queue."""

    training_job_name: str
    demand: Mapping[str, int]
    priority: int
    started_at: datetime
    job_name: str | None = None  # the queue entry; None for jobs started by hand
    stopping: bool = False  # already being stopped: its instances come back soon, nothing to decide

    @property
    def preemptible(self) -> bool:
        return self.job_name is not None and not self.stopping


@dataclass(frozen=True)
class WarmPool:
    """A finished job's retained cluster, Available for a job with the same resource key."""

    training_job_name: str
    resource_key: ResourceKey

    @property
    def pool(self) -> str:
        return self.resource_key.instance_type

    @property
    def instances(self) -> int:
        return self.resource_key.instance_count


@dataclass(frozen=True)
class Snapshot:
    now: datetime
    capacity: Mapping[str, int]
    queued: Sequence[QueuedJob] = ()
    running: Sequence[RunningAttempt] = ()
    warm_pools: Sequence[WarmPool] = ()


@dataclass(frozen=True)
class PolicySettings:
    min_runtime_before_preemption_seconds: int = 0
    default_keep_alive_seconds: int = 0


# --- Actions -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    job_name: str
    warm_pool: str | None = None  # training job whose Available warm pool this start reuses
    keep_alive_seconds: int | None = None  # set when a queued job would match next; None: as requested


@dataclass(frozen=True)
class Preempt:
    job_name: str
    training_job_name: str
    for_job: str


@dataclass(frozen=True)
class ReleaseWarmPool:
    training_job_name: str
    for_job: str


Action = Start | Preempt | ReleaseWarmPool


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)  # job name -> why it did not start
    #: free instances set aside for a waiting job (pool -> instances), so lower-priority jobs cannot take them
    held: dict[str, dict[str, int]] = field(default_factory=dict)

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


def plan(snapshot: Snapshot, settings: PolicySettings | None = None) -> Plan:
    settings = settings or PolicySettings()
    return _Pass(snapshot, settings).run()


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
            pool: snapshot.capacity.get(pool, 0) - used[pool] for pool in set(snapshot.capacity) | set(used)
        }
        # capacity that attempts already being stopped will return, not yet promised to anyone
        self.returning: Counter[str] = Counter()
        for attempt in snapshot.running:
            if attempt.stopping:
                self.returning.update(attempt.demand)
        self.warm: list[WarmPool] = sorted(snapshot.warm_pools, key=lambda w: w.training_job_name)
        self.victims: set[str] = set()
        self.preemptible_by_pool: dict[str, list[RunningAttempt]] = {}
        for attempt in sorted(snapshot.running, key=victim_order):
            if attempt.preemptible:
                for pool in attempt.demand:
                    self.preemptible_by_pool.setdefault(pool, []).append(attempt)
        # 2. order
        self.order = sorted(snapshot.queued, key=queue_order)
        self.eligible = [j for j in self.order if j.not_before is None or j.not_before <= snapshot.now]
        self.started: set[str] = set()
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

    def run(self) -> Plan:
        eligible = {j.name for j in self.eligible}
        for job in self.order:
            if job.name not in eligible:
                self.result.waiting[job.name] = f"backing off until {job.not_before:%Y-%m-%dT%H:%M:%SZ}"
        for job in self.eligible:
            if job.resource_key:
                self.unadmitted_keys[job.resource_key] -= 1
                self.unadmitted_by_priority[job.priority][job.resource_key] -= 1
            self._admit(job)
            if job.resource_key and job.name not in self.started:
                self.waiting_keys[job.resource_key] += 1
        return self.result

    # 3. admit
    def _admit(self, job: QueuedJob) -> None:
        warm = self._matching_warm_pool(job)
        if warm is not None:
            self.warm.remove(warm)  # its instances are counted as used already: they become the job's
            self._start(job, warm_pool=warm.training_job_name)
            return
        if self._fits(job.demand):
            self._take(job.demand)
            self._start(job)
            return
        releasable = self._releasable_warm_pools(job)
        if self._fits(job.demand, extra=_instances(releasable)):
            for warm in self._fewest_to_release(job, releasable):
                self.warm.remove(warm)
                self.free[warm.pool] += warm.instances
                self.result.actions.append(ReleaseWarmPool(warm.training_job_name, for_job=job.name))
            self._take(job.demand)
            self._start(job)
            return
        self._wait_or_preempt(job)

    def _start(self, job: QueuedJob, warm_pool: str | None = None) -> None:
        self.started.add(job.name)
        if job.resource_key:
            self.open_keys[job.resource_key] -= 1
        self.result.actions.append(
            Start(job.name, warm_pool=warm_pool, keep_alive_seconds=self._keep_alive_for(job))
        )

    # 4. preempt
    def _wait_or_preempt(self, job: QueuedJob) -> None:
        deficit = self._deficit(job.demand)
        # capacity already on its way back from stopping attempts is promised to the first job that needs it
        promised = {pool: min(self.returning[pool], need) for pool, need in deficit.items()}
        remaining = {pool: need - promised[pool] for pool, need in deficit.items() if need > promised[pool]}
        if not remaining:
            self.returning.subtract(promised)
            self._claim(job)
            self.result.waiting[job.name] = "waiting for stopping jobs to release their instances"
            return
        candidates: dict[str, RunningAttempt] = {}
        for pool in remaining:
            for attempt in self.preemptible_by_pool.get(pool, ()):
                if attempt.priority >= job.priority:
                    break  # sorted by priority: the rest are at least as important
                if attempt.training_job_name not in self.victims:
                    candidates[attempt.training_job_name] = attempt
        ready = [a for a in candidates.values() if self._ran_long_enough(a)]
        victims = minimal_cover(ready, remaining)
        if victims is not None:
            self.returning.subtract(promised)
            for victim in victims:
                self.victims.add(victim.training_job_name)
                assert victim.job_name is not None  # preemptible attempts belong to the queue
                self.result.actions.append(
                    Preempt(victim.job_name, victim.training_job_name, for_job=job.name)
                )
            self._claim(job)
            self.result.waiting[job.name] = "waiting for preempted jobs to stop: " + ", ".join(
                v.training_job_name for v in victims
            )
            return
        if minimal_cover(list(candidates.values()), remaining) is not None:
            # It will outrank enough running work once that work has run its minimum time: hold the free
            # capacity for it rather than start lower-priority work that would be preempted right after.
            self._claim(job)
            self.result.waiting[job.name] = (
                "waiting for lower-priority jobs to reach the minimum runtime before preemption"
            )
            return
        self.result.waiting[job.name] = "waiting for capacity: " + ", ".join(
            f"needs {job.demand[pool]} {pool}, {max(self.free.get(pool, 0), 0)} free"
            for pool in sorted(job.demand)
        )

    def _ran_long_enough(self, attempt: RunningAttempt) -> bool:
        ran = (self.snapshot.now - attempt.started_at).total_seconds()
        return ran >= self.settings.min_runtime_before_preemption_seconds

    # 5. keep
    def _keep_alive_for(self, job: QueuedJob) -> int | None:
        if job.resource_key is None or self.settings.default_keep_alive_seconds <= 0:
            return None
        if self.open_keys[job.resource_key] > 0:
            return self.settings.default_keep_alive_seconds
        return None

    # capacity bookkeeping
    def _fits(self, demand: Mapping[str, int], extra: Mapping[str, int] | None = None) -> bool:
        extra = extra or {}
        return all(self.free.get(pool, 0) + extra.get(pool, 0) >= need for pool, need in demand.items())

    def _take(self, demand: Mapping[str, int]) -> None:
        for pool, need in demand.items():
            self.free[pool] = self.free.get(pool, 0) - need

    def _claim(self, job: QueuedJob) -> None:
        """Set aside the free capacity a waiting job will use, so lower-priority jobs cannot take it."""
        held: dict[str, int] = {}
        for pool, need in job.demand.items():
            take = min(max(self.free.get(pool, 0), 0), need)
            self.free[pool] = self.free.get(pool, 0) - take
            if take:
                held[pool] = take
        if held:
            self.result.held[job.name] = held

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
        """Warm pools in the job's pools that no queued job at least as important would reuse.

        Each such job reuses one pool, so of several pools with the same key only as many are kept as
        there are jobs wanting that key; the rest may be released.
        """
        if not any(w.pool in job.demand for w in self.warm):
            return []
        # jobs admitted before this one are at least as important; of those still to come, only the ones
        # of the same priority are
        wanted = self.waiting_keys + self.unadmitted_by_priority.get(job.priority, Counter())
        releasable: list[WarmPool] = []
        for warm in self.warm:
            if wanted[warm.resource_key] > 0:
                wanted[warm.resource_key] -= 1
            elif warm.pool in job.demand:
                releasable.append(warm)
        return releasable

    def _fewest_to_release(self, job: QueuedJob, releasable: Sequence[WarmPool]) -> list[WarmPool]:
        # Pools nobody queued would reuse go first; then those only less important jobs match.
        wanted_by_anyone = self.waiting_keys + self.unadmitted_keys
        ranked = sorted(
            releasable, key=lambda w: (w.resource_key in wanted_by_anyone, -w.instances, w.training_job_name)
        )
        deficit = self._deficit(job.demand)
        chosen: list[WarmPool] = []
        for warm in ranked:
            if not any(need > 0 for need in deficit.values()):
                break
            if deficit.get(warm.pool, 0) > 0:
                chosen.append(warm)
                deficit[warm.pool] -= warm.instances
        return chosen


def _instances(warm_pools: Iterable[WarmPool]) -> dict[str, int]:
    total: Counter[str] = Counter()
    for warm in warm_pools:
        total[warm.pool] += warm.instances
    return dict(total)


def victim_order(attempt: RunningAttempt) -> tuple[int, float, str]:
    """Least important first; among equals the most recently started, which loses the least work."""
    return (attempt.priority, -attempt.started_at.timestamp(), attempt.training_job_name)


def covers(attempts: Iterable[RunningAttempt], deficit: Mapping[str, int]) -> bool:
    freed: Counter[str] = Counter()
    for attempt in attempts:
        freed.update(attempt.demand)
    return all(freed[pool] >= need for pool, need in deficit.items())


def minimal_cover(
    candidates: Sequence[RunningAttempt], deficit: Mapping[str, int]
) -> list[RunningAttempt] | None:
    """The fewest candidates that together free `deficit`, preferring the least important; None if none do.

    The result is always minimal: dropping any victim leaves the deficit uncovered, so no job is stopped
    that the waiting job does not need.
    """
    ordered = sorted(candidates, key=victim_order)
    if not covers(ordered, deficit):
        return None
    if len(ordered) <= EXACT_VICTIM_SEARCH_LIMIT:
        # Combinations come out in lexicographic order of `ordered`, so the first cover of the smallest size
        # is also the one made of the least important jobs.
        for size in range(1, len(ordered) + 1):
            for combo in itertools.combinations(ordered, size):
                if covers(combo, deficit):
                    return list(combo)
    chosen: list[RunningAttempt] = []
    for attempt in ordered:
        chosen.append(attempt)
        if covers(chosen, deficit):
            break
    # prune: drop the most important victims the cover does not need
    for attempt in sorted(chosen, key=victim_order, reverse=True):
        rest = [a for a in chosen if a is not attempt]
        if covers(rest, deficit):
            chosen = rest
    return chosen
