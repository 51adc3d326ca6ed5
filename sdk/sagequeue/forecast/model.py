"""What a forecast starts from: the queue as it is now, and what the queue has seen.

`QueueState` is the scheduler's snapshot (the policy's own `QueuedJob`, `RunningAttempt` and `WarmPool`)
plus what the policy does not need and a forecast does: each job's work (training already done, its
`MaxRuntimeInSeconds`, its keep-alive, the traits its run time is drawn by) and when each warm pool expires.
`History` is what the queue has seen: the training time of completed jobs and past submissions, from
which run times and later arrivals are drawn.

Pure data: built from the live queue by `sagequeue.forecast.live`, from a simulation by
`sagequeue.sim.forecast`.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from sagequeue.sim.sagemaker import Timings
from sagequeue_core.domain import ResourceKey
from sagequeue_core.policy import PolicySettings, QueuedJob, RunningAttempt, WarmPool
from sagequeue_core.quotas import TeamQuota

#: Completed jobs a trait needs before run times are drawn from its jobs alone rather than from all.
MIN_HISTORY = 8
#: How far back submissions count for the arrival rate.
ARRIVAL_WINDOW_SECONDS = 7 * 86400.0
#: Width (log scale) of the jitter around each drawn run time, so a short history is not a few fixed values.
_JITTER = 0.15


@dataclass(frozen=True)
class Traits:
    """What a job's run time is drawn by: jobs of the same user, image or instance count, where the queue
    has seen enough of them (in that order)."""

    user: str | None = None
    image: str | None = None
    instances: int = 1

    def groups(self) -> list[tuple[str, object]]:
        keys: list[tuple[str, object]] = []
        if self.user:
            keys.append(("user", self.user))
        if self.image:
            keys.append(("image", self.image))
        keys.append(("instances", self.instances))
        return keys


@dataclass(frozen=True)
class Work:
    """A job's work as far as the queue knows it."""

    traits: Traits = Traits()
    #: training seconds its ended attempts kept (checkpointed jobs resume from them)
    trained_seconds: float = 0.0
    #: SageMaker stops an attempt past this many seconds (StoppingCondition.MaxRuntimeInSeconds)
    max_runtime_seconds: float | None = None
    #: the keep-alive the request asks for (a warm pool is left when it ends)
    keep_alive_seconds: int = 0
    #: its warm-pool key, for a running job (a queued job's is on its QueuedJob)
    resource_key: ResourceKey | None = None
    #: when it was submitted, for a running job (a queued job's is on its QueuedJob): its place in the queue
    #: should it wait again; None: its attempt's start stands in
    submitted_at: datetime | None = None
    #: its training seconds in all, when known in advance: only a reference run that knows the future sets
    #: it (bench_forecast's oracle, which says how much of the error run times alone cause)
    known_total_seconds: float | None = None
    #: seconds between its checkpoints, where the queue has seen them (docs/adr/0023): a stop in the forward
    #: run then keeps the training up to its last checkpoint, and the policy reads its attempts' checkpoints
    #: as the service does; None: unknown (a stop loses up to half an hour, and its attempts report none)
    checkpoint_interval_seconds: float | None = None
    #: the queue was told the interval before this attempt (an earlier attempt wrote two checkpoints): the
    #: policy reads it from the attempt's start; else once the attempt wrote two
    checkpoint_interval_reported: bool = True


@dataclass(frozen=True)
class RetainedPool:
    """An Available warm pool and when its keep-alive runs out."""

    warm_pool: WarmPool
    expires_at: datetime


@dataclass(frozen=True)
class QueueState:
    now: datetime
    capacity: Mapping[str, int]
    queued: Sequence[QueuedJob] = ()
    running: Sequence[RunningAttempt] = ()
    warm_pools: Sequence[RetainedPool] = ()
    quota: Mapping[str, int] = field(default_factory=dict)
    team_quotas: Sequence[TeamQuota] = ()
    team_usage: Mapping[str, float] = field(default_factory=dict)
    #: each queued or running job's work, by job name; a job absent here has default work
    work: Mapping[str, Work] = field(default_factory=dict)


@dataclass(frozen=True)
class ForecastSettings:
    """The scheduler's settings the forward run plans with, and SageMaker's timings."""

    policy: PolicySettings = field(
        default_factory=lambda: PolicySettings(
            min_runtime_before_preemption_seconds=600,
            default_keep_alive_seconds=600,
            reserve_after_seconds=1800,
        )
    )
    queue_lookahead: int = 50
    #: queued jobs per pool the forward run's passes read (at most the lookahead): a shallower window is
    #: faster but misses backfill from deep in the queue (docs/forecast.md measures what it changes)
    pass_lookahead: int = 50
    #: a pass first reads this many jobs per pool, and reads the whole window only where a job behind them
    #: could act (an idle instance it fits in, an attempt it outranks, a warm pool, a loan or reservation of
    #: its own), and plans only the pools where something changed: the same plans at a fraction of the cost
    #: on a long queue (engine.py); 0: every pass reads the whole window of every pool
    narrow_lookahead: int = 8
    #: the scheduler's timer period: a threshold the clock crosses is acted on at the timer's next pass
    pass_every_seconds: float = 60.0
    #: happenings this close together share one pass in the forward run; 0: a pass after each, as the
    #: service passes on each event (an end, a submission)
    batch_seconds: float = 0.0
    timings: Timings = field(default_factory=Timings)
    #: runs of the queue forward (Monte Carlo samples)
    samples: int = 40
    #: stop drawing runs once this many seconds went by (after `min_samples`); None: all `samples`
    budget_seconds: float | None = None
    min_samples: int = 3
    #: how far ahead a run goes; a job not started by then is reported as later than this
    horizon_seconds: float = 14 * 86400.0
    #: model later arrivals (jobs submitted after now that may go ahead)
    arrivals: bool = True
    #: how far ahead later arrivals are drawn: the last week says little about the load days from now, and a
    #: queue overloaded today is not overloaded forever
    arrivals_ahead_seconds: float = 86400.0
    #: how much the coming day's submission rate differs from the last week's (a coefficient of variation):
    #: each run draws its own rate (`Arrivals.scale`); 0: every run at last week's rate
    arrival_rate_spread: float = 0.5
    #: each run draws run times from a resample of the completed jobs (a bootstrap); False: from them all
    resample_history: bool = True
    #: draw later arrivals less important than every job forecast too: they queue behind them, but backfill
    #: into idle instances ahead of them and hold those instances until the minimum runtime is over
    less_important_arrivals: bool = True
    seed: int = 0


@dataclass(frozen=True)
class Submission:
    """A past submission, as a template for arrivals to come."""

    at: datetime
    priority: int
    demand: Mapping[str, int]
    traits: Traits
    checkpointed: bool = True
    keep_alive_seconds: int = 0
    resource_key: ResourceKey | None = None
    team: str | None = None


class RunTimeModel(Protocol):
    """Where a run draws training times from: `RunTimes` (what the queue has seen) in the product; a reference
    run may draw from what made the trace (bench_forecast's distribution oracle, `sagequeue.sim.forecast`)."""

    def draw(self, rng: random.Random, traits: Traits, at_least: float = 0.0) -> float: ...


@dataclass(frozen=True)
class Arrival:
    """A job submitted `at` seconds after now in one run, drawn by an `ArrivalSource`."""

    at: float
    submission: Submission
    #: its training seconds in all, when the source knows them (None: drawn as any job's)
    known_total_seconds: float | None = None
    #: seconds between its checkpoints, when the source knows them (the queue learns them from its reports)
    checkpoint_interval_seconds: float | None = None


class ArrivalSource(Protocol):
    """Later submissions for one run, in place of the engine's own model (`engine.Arrivals`): only reference
    runs use one (bench_forecast's oracles, which know how the trace was made or what it holds)."""

    def draw(self, rng: random.Random) -> Sequence[Arrival]: ...


class RunTimes:
    """Training seconds drawn from completed jobs, by the most specific trait with enough history."""

    def __init__(self, completed: Sequence[tuple[Traits, float]]) -> None:
        self.all = sorted(seconds for _, seconds in completed if seconds > 0)
        self.by_key: dict[tuple[str, object], list[float]] = {}
        for traits, seconds in completed:
            if seconds > 0:
                for key in traits.groups():
                    self.by_key.setdefault(key, []).append(seconds)
        for values in self.by_key.values():
            values.sort()

    @property
    def known(self) -> bool:
        return bool(self.all)

    def _pool(self, traits: Traits) -> list[float]:
        for key in traits.groups():
            values = self.by_key.get(key)
            if values is not None and len(values) >= MIN_HISTORY:
                return values
        return self.all

    def draw(self, rng: random.Random, traits: Traits, at_least: float = 0.0) -> float:
        """Total training seconds of a job like `traits`, given it has trained `at_least` already."""
        values = self._pool(traits)
        if not values:
            return max(at_least, 1.0) * (1.0 + rng.expovariate(1.0))
        start = bisect.bisect_right(values, at_least)
        longer = len(values) - start
        if longer >= 1:
            drawn = values[start + rng.randrange(longer)] * math.exp(rng.gauss(0.0, _JITTER))
            return max(drawn, at_least)
        # past nearly everything seen: long jobs tend to run on (a heavy tail), by about as long again
        return at_least * (1.0 + rng.expovariate(1.0))


@dataclass(frozen=True)
class History:
    """What the queue has seen: completed jobs' training seconds and past submissions (oldest first)."""

    completed: Sequence[tuple[Traits, float]] = ()
    submissions: Sequence[Submission] = ()


__all__ = [
    "ARRIVAL_WINDOW_SECONDS",
    "MIN_HISTORY",
    "Arrival",
    "ArrivalSource",
    "ForecastSettings",
    "History",
    "QueueState",
    "RetainedPool",
    "RunTimeModel",
    "RunTimes",
    "Submission",
    "Traits",
    "Work",
]
