"""Team quotas per pool, lending and borrowing between teams, reclaim, and fair share within a priority.

A pool's capacity can be divided among teams. Each team has, per pool, a **nominal** quota in instances
(capacity guaranteed to it), a **borrowing limit** (how far above its nominal quota it may go on capacity
other teams do not use) and a **lending limit** (how much of its unused nominal quota others may borrow);
None means unlimited. Capacity no team's nominal quota covers is lent by nobody in particular: every team
may borrow it. A job of a team without a quota in the pool (or without a team) has a nominal quota of 0
and no borrowing limit there. A pool where no quota is configured is not governed at all: every job fits,
as without teams.

Pure: no clock, no table, no AWS; the scheduling pass (`policy.py`) consults it through a `TeamLedger`,
built once per pass from the snapshot and updated as the pass starts jobs. What it reads of jobs and
attempts is named by small protocols, so it imports nothing of the policy.

- Admission: a job fits when its team's usage plus the job fits the team's nominal quota, or when what it
  needs beyond that can be borrowed: unused nominal quota of teams that lend (within their lending limits)
  and unassigned capacity, not yet borrowed by anyone, within the team's own borrowing limit.
- Reclaim: a team whose usage plus the waiting job fits its nominal quota takes lent capacity back by
  preempting borrowing jobs of other teams, whatever their priority: of each borrowing team, its newest
  jobs until they cover what that team borrows. Minimum runtime and the preemption budget are the
  policy's rules; the caller passes them in as `ready`.
- Fair share: within a priority, jobs of teams that used less of their share recently go first. Usage is
  a decaying instance-hours counter per team (half-life, as Slurm's PriorityDecayHalfLife), and the factor
  is Slurm's classic `2 ** (-usage_share / quota_share)`: 1 for a team that used nothing, 0.5 for one that
  used exactly its share.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import InitVar, dataclass, field
from datetime import datetime
from typing import Any, Protocol, TypeVar

#: The team of a job that names none (no tag, no mapped role).
NO_TEAM = ""
#: How reasons, answers, tables, metrics and reports name the team of jobs without one; no team may take it.
NO_TEAM_LABEL = "none"
#: Longest team name; team names are tag values and URL path segments.
TEAM_NAME_MAX_LENGTH = 64
#: The team name rule as one pattern, for the API's path check and its document (check_team_name says it in
#: words; a test holds the two to each other): ASCII letters, digits, '-', '_' and '.', starting with a
#: letter or a digit (no '.', '..', or name a command line would read as an option), and not "none".
TEAM_NAME_PATTERN = rf"^(?![Nn][Oo][Nn][Ee]$)[A-Za-z0-9][A-Za-z0-9._-]{{0,{TEAM_NAME_MAX_LENGTH - 1}}}$"
_TEAM_CHARACTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.")
#: Names a quota may be stored under: the API's path pattern before the rule (the rule's characters and
#: length, any first character, "none" too). A quota stored under a name the rule now refuses may still be
#: removed (check_stored_team_name); no quota is set under one.
STORED_TEAM_NAME_PATTERN = rf"^[A-Za-z0-9._-]{{1,{TEAM_NAME_MAX_LENGTH}}}$"


class QuotaError(ValueError):
    """A quota that cannot be: the message names the problem."""


def check_team_name(team: object) -> str:
    """`team` if it may name a team, else QuotaError naming the rule it breaks. The one rule for team names,
    wherever they come from: a job's tag, a role mapping, the API's path, the CLI, the simulator."""
    team = check_stored_team_name(team)
    if not team[0].isascii() or not team[0].isalnum():
        raise QuotaError(f"team name {team!r} must start with a letter or a digit")
    if team.lower() == NO_TEAM_LABEL:
        raise QuotaError(f"team name {team!r} is reserved: {NO_TEAM_LABEL!r} stands for jobs without a team")
    return team


def check_stored_team_name(team: object) -> str:
    """`team` if a quota may be stored under it (STORED_TEAM_NAME_PATTERN): a name the rule accepts, or one
    earlier versions stored before the rule ("none", "-ops", "_infra"); else QuotaError naming the problem.
    For removing a stored quota only: every name set from now on passes check_team_name."""
    if not isinstance(team, str) or not team or len(team) > TEAM_NAME_MAX_LENGTH:
        raise QuotaError(f"a team name is 1 to {TEAM_NAME_MAX_LENGTH} characters, got {team!r}")
    if not _TEAM_CHARACTERS.issuperset(team):
        raise QuotaError(f"team name {team!r} may hold only ASCII letters, digits, '-', '_' and '.'")
    return team


def team_label(team: str | None) -> str:
    """The team as reasons, answers and tables show it: its name, or "none" for jobs without one."""
    return team or NO_TEAM_LABEL


def _limit(value: object, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise QuotaError(f"{what} must be a non-negative integer or null (unlimited), got {value!r}")
    return value


@dataclass(frozen=True)
class TeamQuota:
    """What one team may use of one pool. `team` is a name check_team_name accepts, unless `check_name` is
    False: a quota read back from the table, or the open quota of a job's team (`_open_quota`, NO_TEAM for
    jobs without one). The rule governs names coming in; a name stored before it (a team tag of any
    letters, "none" or "-ops" through the API's earlier path pattern) must still read, or every pass and
    submission would fail on it."""

    team: str
    pool: str
    nominal: int
    borrowing_limit: int | None = None  # instances above nominal it may borrow; None: unlimited
    lending_limit: int | None = None  # instances of its unused nominal others may borrow; None: all
    check_name: InitVar[bool] = True

    def __post_init__(self, check_name: bool) -> None:
        if check_name:
            check_team_name(self.team)
        if isinstance(self.nominal, bool) or not isinstance(self.nominal, int) or self.nominal < 0:
            raise QuotaError(
                f"nominal quota of team {self.team} in {self.pool} must be a non-negative integer"
            )
        _limit(self.borrowing_limit, "the borrowing limit")
        _limit(self.lending_limit, "the lending limit")

    @property
    def ceiling(self) -> float:
        """The most the team may hold in the pool: nominal plus its borrowing limit."""
        return math.inf if self.borrowing_limit is None else self.nominal + self.borrowing_limit

    def to_dict(self) -> dict[str, object]:
        return {
            "team": self.team,
            "pool": self.pool,
            "nominal": self.nominal,
            "borrowing_limit": self.borrowing_limit,
            "lending_limit": self.lending_limit,
        }


def _open_quota(team: str, pool: str) -> TeamQuota:
    """The quota of a team that has none in a governed pool: nothing guaranteed, borrowing unlimited."""
    return TeamQuota(team=team, pool=pool, nominal=0, check_name=False)


# --- what the ledger reads -------------------------------------------------------------------------------------


class Holding(Protocol):
    """A live attempt as far as quotas care (`policy.RunningAttempt`)."""

    @property
    def training_job_name(self) -> str: ...

    @property
    def demand(self) -> Mapping[str, int]: ...

    @property
    def team(self) -> str | None: ...

    @property
    def started_at(self) -> datetime: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def preemptible(self) -> bool: ...


H = TypeVar("H", bound=Holding)


class Waiting(Protocol):
    """A queued job as far as quotas care (`policy.QueuedJob`)."""

    @property
    def demand(self) -> Mapping[str, int]: ...

    @property
    def team(self) -> str | None: ...


W = TypeVar("W", bound=Waiting)


def by_pool(quotas: Iterable[TeamQuota]) -> dict[str, dict[str, TeamQuota]]:
    """pool -> team -> quota."""
    out: dict[str, dict[str, TeamQuota]] = {}
    for quota in quotas:
        out.setdefault(quota.pool, {})[quota.team] = quota
    return out


# --- one pool's arithmetic -------------------------------------------------------------------------------------


def borrowed(quota: TeamQuota, used: int) -> int:
    """Instances the team holds above its nominal quota."""
    return max(used - quota.nominal, 0)


def lendable(quota: TeamQuota, used: int) -> int:
    """Instances of the team's unused nominal quota that other teams may borrow."""
    unused = max(quota.nominal - used, 0)
    return unused if quota.lending_limit is None else min(unused, quota.lending_limit)


def oversubscription(quotas: Iterable[TeamQuota], pool: str, capacity: int) -> str | None:
    """A warning when the nominal quotas of all teams in `pool` sum to more than its capacity: they are
    accepted (capacity may grow back), but not every team can hold its nominal quota at once, and a team
    under its quota may wait for another that is too; None when they fit."""
    total = sum(quota.nominal for quota in quotas if quota.pool == pool)
    if total <= capacity:
        return None
    return (
        f"the nominal quotas of all teams in {pool} sum to {total}, above its capacity of {capacity}: "
        "not every team can hold its nominal quota at once"
    )


@dataclass(frozen=True)
class PoolShare:
    """One team's position in one pool: for the API, the CLI and reasons."""

    pool: str
    team: str
    nominal: int
    borrowing_limit: int | None
    lending_limit: int | None
    used: int
    borrowed: int
    lent: int  # of its nominal quota, instances other teams hold now
    borrowable: int  # what it could borrow now, free or not


class TeamLedger:
    """Team usage per governed pool, kept up to date through one pass.

    `capacity`: the pool's capacity (what the account's quota allows, if lower). `running`: live attempts;
    one being stopped still counts for its team until its instances are back, so neither it nor a team
    borrowing it counts twice.
    """

    def __init__(
        self,
        quotas: Iterable[TeamQuota],
        capacity: Mapping[str, int],
        running: Iterable[Holding] = (),
    ) -> None:
        self.quotas = by_pool(quotas)
        self.capacity = dict(capacity)
        self.used: dict[str, Counter[str]] = {pool: Counter() for pool in self.quotas}
        self.stopping: dict[str, Counter[str]] = {pool: Counter() for pool in self.quotas}
        for attempt in running:
            team = attempt.team or NO_TEAM
            for pool, n in attempt.demand.items():
                if pool in self.quotas:
                    self.used[pool][team] += n
                    if attempt.stopping:
                        self.stopping[pool][team] += n

    @property
    def governed(self) -> bool:
        return bool(self.quotas)

    def governs(self, pool: str) -> bool:
        return pool in self.quotas

    def quota(self, team: str | None, pool: str) -> TeamQuota:
        return self.quotas[pool].get(team or NO_TEAM) or _open_quota(team or NO_TEAM, pool)

    def _teams(self, pool: str) -> set[str]:
        return set(self.quotas[pool]) | {t for t, n in self.used[pool].items() if n > 0}

    def unassigned(self, pool: str) -> int:
        """Capacity no team's nominal quota covers: lent by nobody in particular."""
        return max(self.capacity.get(pool, 0) - sum(q.nominal for q in self.quotas[pool].values()), 0)

    def borrowable(self, team: str | None, pool: str) -> int:
        """What `team` may still borrow in `pool`: lent capacity not yet borrowed, within its limit."""
        team = team or NO_TEAM
        mine = self.quota(team, pool)
        lent_out = self.unassigned(pool)
        taken = 0
        for other in self._teams(pool):
            used = self.used[pool][other]
            taken += borrowed(self.quota(other, pool), used)
            if other != team:
                lent_out += lendable(self.quota(other, pool), used)
        room = lent_out - taken
        if mine.borrowing_limit is not None:
            room = min(room, mine.borrowing_limit - borrowed(mine, self.used[pool][team]))
        return max(room, 0)

    def headroom(self, team: str | None, pool: str) -> int:
        """What is left of the team's nominal quota."""
        return max(self.quota(team, pool).nominal - self.used[pool][team or NO_TEAM], 0)

    def short(
        self, team: str | None, demand: Mapping[str, int], *, returning: bool = False
    ) -> dict[str, int]:
        """Instances per governed pool by which `demand` exceeds what the team may use: its nominal
        headroom plus what it may borrow. Empty when the job fits. `returning`: count the team's own
        attempts being stopped as already gone (they are on their way out)."""
        out: dict[str, int] = {}
        if not self.quotas:
            return out
        for pool, need in demand.items():
            if pool not in self.quotas:
                continue
            give_back = self.stopping[pool][team or NO_TEAM] if returning else 0
            room = self.headroom(team, pool) + self.borrowable(team, pool) + give_back
            if need > room:
                out[pool] = need - room
        return out

    def within_nominal(self, team: str | None, demand: Mapping[str, int]) -> bool:
        """The job fits its team's nominal quota in every governed pool it needs (it may reclaim)."""
        return all(
            self.used[pool][team or NO_TEAM] + need <= self.quota(team, pool).nominal
            for pool, need in demand.items()
            if pool in self.quotas
        )

    def most(self, team: str | None, pool: str) -> int:
        """The most `team` could ever hold in `pool`, whatever the others use: its nominal quota plus all
        that could be lent to it (unassigned capacity and the others' lending limits), within its limit."""
        if pool not in self.quotas:
            return self.capacity.get(pool, 0)
        team = team or NO_TEAM
        mine = self.quota(team, pool)
        lent = self.unassigned(pool) + sum(
            lendable(quota, 0) for other, quota in self.quotas[pool].items() if other != team
        )
        if mine.borrowing_limit is not None:
            lent = min(lent, mine.borrowing_limit)
        return min(mine.nominal + lent, self.capacity.get(pool, 0))

    def admission_order(
        self,
        jobs: Iterable[W],
        key: Callable[[W], tuple[Any, ...]],
        counted: Callable[[W], bool] = lambda job: True,
    ) -> list[W]:
        """The order a pass admits `jobs` in, as Kueue orders the heads of its cluster queues.

        Each team's jobs form a queue in `key` order (priority, then submission). Across teams only the
        heads compete: a head whose team stays within its nominal quota with it goes before a head that
        would borrow, then `key` decides (priority, fair share, submission). Whether a head would borrow
        counts the team's usage plus the jobs ahead of it in its team's queue, those `counted` (jobs that
        may start in this pass). So a team's less important job never goes before its more important one,
        and a team's nominal share is offered to its own jobs before other teams borrow it. Jobs needing no
        governed pool form one queue of their own, in `key` order, as without quotas.

        `key` must be unique per job and, for two jobs of one team, order them as the team's queue should;
        a merge of the queues' heads costs O(n log teams) beyond sorting each queue.
        """
        queues: dict[str | None, list[tuple[tuple[Any, ...], W]]] = {}
        for job in jobs:
            governed = any(pool in self.quotas for pool in job.demand)
            queues.setdefault((job.team or NO_TEAM) if governed else None, []).append((key(job), job))
        flagged: list[list[tuple[bool, tuple[Any, ...], W]]] = []
        for team, queue in queues.items():
            queue.sort(key=lambda entry: entry[0])
            ahead: Counter[str] = Counter()  # demand of the team's counted jobs so far, per governed pool
            entries = []
            for rank, job in queue:
                borrows = False
                if team is not None:
                    mine = {pool: n for pool, n in job.demand.items() if pool in self.quotas}
                    borrows = any(
                        self.used[pool][team] + ahead[pool] + n > self.quota(team, pool).nominal
                        for pool, n in mine.items()
                    )
                    if counted(job):
                        ahead.update(mine)
                entries.append((borrows, rank, job))
            flagged.append(entries)
        # the heads' merge: one entry per team in the heap, the next of a team's queue when its head is taken
        # (whether a team's head borrows need not grow along its queue, so this is not a merge of sorted runs)
        heads = [(entries[0][0], entries[0][1], i, 0) for i, entries in enumerate(flagged)]
        heapq.heapify(heads)
        order: list[W] = []
        while heads:
            _, _, i, at = heapq.heappop(heads)
            order.append(flagged[i][at][2])
            if at + 1 < len(flagged[i]):
                borrows, rank, _ = flagged[i][at + 1]
                heapq.heappush(heads, (borrows, rank, i, at + 1))
        return order

    def reason(self, team: str | None, demand: Mapping[str, int], free: Mapping[str, int]) -> str:
        """Why a job waits for its team's quota, naming it."""
        parts = []
        for pool in sorted(self.short(team, demand)):
            quota = self.quota(team, pool)
            if demand[pool] > self.most(team, pool):
                parts.append(
                    f"can never fit: needs {demand[pool]} {pool}; team {team_label(team)} may hold at most "
                    f"{self.most(team, pool)} (quota {quota.nominal} and what others may lend it)"
                )
                continue
            left = self.headroom(team, pool)
            where = (
                f"at its quota of {quota.nominal} {pool}"
                if left == 0
                else f"has {left} of its quota of {quota.nominal} {pool} left, needs {demand[pool]}"
            )
            parts.append(
                f"team {team_label(team)} {where}; "
                f"{self.borrowable(team, pool)} borrowable, {max(free.get(pool, 0), 0)} free"
            )
        return "; ".join(parts)

    @contextmanager
    def without(self, attempts: Iterable[Holding]) -> Iterator[None]:
        """Count `attempts` as gone for a while: the loans of a waiting job's reserved capacity, which it
        takes back the moment it can start, while that job is admitted. They are its own capacity, so they
        neither fill its team's quota (a loan to its own team) nor use up what it may borrow."""
        gone: list[tuple[str, str, int]] = [
            (pool, attempt.team or NO_TEAM, n)
            for attempt in attempts
            if not attempt.stopping
            for pool, n in attempt.demand.items()
            if pool in self.quotas
        ]
        for pool, team, n in gone:
            self.used[pool][team] -= n
        try:
            yield
        finally:
            for pool, team, n in gone:
                self.used[pool][team] += n

    def take(self, team: str | None, demand: Mapping[str, int]) -> None:
        """A job of `team` starts on `demand`."""
        if not self.quotas:
            return
        for pool, need in demand.items():
            if pool in self.quotas:
                self.used[pool][team or NO_TEAM] += need

    def same_team_only(self, team: str | None, attempt: Holding) -> bool:
        """Whether preemption by priority of `attempt` for a job of `team` is barred by quotas: in a governed
        pool a higher priority preempts only its own team's work; other teams' is reclaimed, not preempted."""
        if not self.quotas:
            return False  # the common case, on the pass's hot path: no quotas at all
        governed = any(pool in self.quotas for pool in attempt.demand)
        return governed and (attempt.team or NO_TEAM) != (team or NO_TEAM)

    def reclaim_candidates(
        self, team: str | None, demand: Mapping[str, int], attempts: Iterable[H], ready: Callable[[H], bool]
    ) -> list[H]:
        """Borrowing attempts of other teams that a job of `team` may preempt to take its nominal quota back,
        whatever their priority: only when the job fits its team's nominal quota; of each borrowing team, its
        newest preemptible attempts that are `ready` until they cover what that team borrows."""
        team = team or NO_TEAM
        pools = [pool for pool in demand if pool in self.quotas]
        if not pools or not self.within_nominal(team, demand):
            return []
        chosen: dict[str, H] = {}
        newest_first = sorted(attempts, key=lambda a: (-a.started_at.timestamp(), a.training_job_name))
        for pool in pools:
            owed = {
                other: borrowed(self.quota(other, pool), self.used[pool][other])
                for other in self._teams(pool)
                if other != team
            }
            for attempt in newest_first:
                owner = attempt.team or NO_TEAM
                if owner == team or owed.get(owner, 0) <= 0 or pool not in attempt.demand:
                    continue
                if not attempt.preemptible or not ready(attempt):
                    continue
                owed[owner] -= attempt.demand[pool]
                chosen[attempt.training_job_name] = attempt
        return list(chosen.values())

    def share(self, team: str, pool: str) -> PoolShare:
        quota = self.quota(team, pool)
        used = self.used[pool][team]
        lent = 0
        if quota.nominal > used:
            # what others borrow comes first from unassigned capacity, then from lenders in proportion
            lent = min(quota.nominal - used, self._borrowed_from_lenders(pool))
        return PoolShare(
            pool=pool,
            team=team,
            nominal=quota.nominal,
            borrowing_limit=quota.borrowing_limit,
            lending_limit=quota.lending_limit,
            used=used,
            borrowed=borrowed(quota, used),
            lent=min(lent, lendable(quota, used)),
            borrowable=self.borrowable(team, pool),
        )

    def _borrowed_from_lenders(self, pool: str) -> int:
        total = sum(borrowed(self.quota(t, pool), self.used[pool][t]) for t in self._teams(pool))
        return max(total - self.unassigned(pool), 0)

    def shares(self) -> list[PoolShare]:
        return [self.share(team, pool) for pool in sorted(self.quotas) for team in sorted(self._teams(pool))]


# --- fair share --------------------------------------------------------------------------------------------------


#: Slurm's default PriorityDecayHalfLife is 7 days; a queue of training jobs turns over faster.
DEFAULT_HALF_LIFE_SECONDS = 24 * 3600


def decay(value: float, elapsed_seconds: float, half_life_seconds: float) -> float:
    """`value` after `elapsed_seconds` of exponential decay with the given half-life (0: no memory)."""
    if elapsed_seconds <= 0:
        return value
    if half_life_seconds <= 0:
        return 0.0
    return value * 0.5 ** (elapsed_seconds / half_life_seconds)


@dataclass(frozen=True)
class UsageCounter:
    """Decayed instance-hours per team, as of a moment."""

    as_of: datetime
    hours: Mapping[str, float] = field(default_factory=dict)

    def advance(self, now: datetime, holding: Mapping[str, int], half_life_seconds: float) -> UsageCounter:
        """The counter at `now`, given the instances each team held since `as_of` (`holding`). Usage accrued
        over the interval decays from its middle, which is exact enough for intervals of a pass."""
        elapsed = (now - self.as_of).total_seconds()
        if elapsed <= 0:
            return self
        hours: dict[str, float] = {}
        for team in set(self.hours) | set(holding):
            past = decay(self.hours.get(team, 0.0), elapsed, half_life_seconds)
            accrued = holding.get(team, 0) * elapsed / 3600 * decay(1.0, elapsed / 2, half_life_seconds)
            if past + accrued > 1e-9:
                hours[team] = past + accrued
        return UsageCounter(as_of=now, hours=hours)


def holding_by_team(running: Iterable[Holding]) -> dict[str, int]:
    """Instances each team holds now (in every pool)."""
    out: Counter[str] = Counter()
    for attempt in running:
        out[attempt.team or NO_TEAM] += sum(attempt.demand.values())
    return dict(out)


def fair_share_factors(usage: Mapping[str, float], quotas: Sequence[TeamQuota]) -> dict[str, float]:
    """Slurm's classic factor per team, `2 ** (-usage share / quota share)`: 1.0 for no recent usage, 0.5 at
    exactly its share. A team's share is its nominal quota summed over pools; where no team has any, or a
    team has none, the teams present share equally. Empty without quotas: ordering is then unchanged."""
    if not quotas:
        return {}
    nominal: Counter[str] = Counter()
    for quota in quotas:
        nominal[quota.team] += quota.nominal
    teams = set(nominal) | set(usage)
    total_usage = sum(usage.values())
    weights = {team: nominal[team] for team in teams}
    if not any(weights.values()):
        weights = dict.fromkeys(teams, 1)
    else:
        # a team with no nominal quota weighs as the smallest positive one, so it is not starved by order
        smallest = min(w for w in weights.values() if w > 0)
        weights = {team: w or smallest for team, w in weights.items()}
    total_weight = sum(weights.values())
    factors: dict[str, float] = {}
    for team in teams:
        used = usage.get(team, 0.0) / total_usage if total_usage > 0 else 0.0
        factors[team] = 2 ** (-used / (weights[team] / total_weight))
    return factors


def fair_share_key(team: str | None, factors: Mapping[str, float]) -> float:
    """Sort key within a priority: teams with the higher factor (less recent usage) first."""
    return -factors.get(team or NO_TEAM, 1.0)


__all__ = [
    "DEFAULT_HALF_LIFE_SECONDS",
    "NO_TEAM",
    "NO_TEAM_LABEL",
    "STORED_TEAM_NAME_PATTERN",
    "TEAM_NAME_MAX_LENGTH",
    "TEAM_NAME_PATTERN",
    "PoolShare",
    "QuotaError",
    "TeamLedger",
    "TeamQuota",
    "UsageCounter",
    "Waiting",
    "borrowed",
    "by_pool",
    "check_stored_team_name",
    "check_team_name",
    "decay",
    "fair_share_factors",
    "fair_share_key",
    "holding_by_team",
    "lendable",
    "oversubscription",
    "team_label",
]
