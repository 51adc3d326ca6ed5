"""The forecast: the scheduler's own `plan` run forward from the queue as it is, many times.

Each run (a Monte Carlo sample) draws what nobody knows yet: how long each running and waiting job
trains (from what the queue has seen, `RunTimes`, at most its `MaxRuntimeInSeconds`) and which jobs are
submitted meanwhile (at the rate and of the kinds the queue has seen lately, by hour of day and weekday).
Then it runs the queue forward as the service runs it: a pass (`sagequeue_core.policy.plan` on the
lookahead window of each pool) whenever an attempt ends or stops, a warm pool expires, a job arrives, or
the clock crosses a time the policy compares with (a minimum runtime reached, a wait long enough to
reserve, a backoff over); starts take SageMaker's provisioning time, stops its grace period, ended attempts
with a keep-alive leave warm pools. Each waiting job's start in each run gives its P10, P50 and P90.
A pass plans only the pools where something changed, and reads a pool's whole window only where a job
behind its first few could act; the plans are those of passes reading every pool's whole window
(`ForecastSettings.narrow_lookahead`, docs/adr/0022).

Runs share their seeds across calls, so two forecasts of the same state that differ only by a change to one
job (`counterfactuals`) differ by that change, not by luck (common random numbers).

Pure: no I/O, no clock; `now` is the state's.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import heapq
import itertools
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sagequeue.forecast.model import (
    ARRIVAL_WINDOW_SECONDS,
    Arrival,
    ArrivalSource,
    ForecastSettings,
    History,
    QueueState,
    RetainedPool,
    RunTimeModel,
    RunTimes,
    Submission,
    Work,
)
from sagequeue_core.policy import (
    Plan,
    Preempt,
    QueuedJob,
    ReleaseWarmPool,
    RunningAttempt,
    Snapshot,
    Start,
    WarmPool,
    plan,
    queue_order,
)

_HOUR = 3600.0
_DAY = 86400.0


@dataclass(frozen=True)
class JobForecast:
    """When a waiting job starts, over the runs: quantiles in seconds from `now` (inf: not by the horizon)."""

    name: str
    now: datetime
    starts: tuple[float, ...]  # sorted

    def quantile(self, q: float) -> float:
        """The q-quantile at plotting position q(n + 1) (Weibull's), interpolated: over n runs, the range from
        the 0.1 to the 0.9 quantile then holds a new draw 80 % of the time, where nearest ranks would hold it
        less often (with 10 runs, the 1st to the 9th of 10 hold it 8 times in 11)."""
        n = len(self.starts)
        if not n:
            return math.inf
        position = min(max(q * (n + 1), 1.0), float(n)) - 1.0
        low = int(position)
        high = min(low + 1, n - 1)
        below, above = self.starts[low], self.starts[high]
        if math.isinf(above):
            return above if position - low > 0 else below
        return below + (above - below) * (position - low)

    @property
    def p10(self) -> float:
        return self.quantile(0.1)

    @property
    def p50(self) -> float:
        return self.quantile(0.5)

    @property
    def p90(self) -> float:
        return self.quantile(0.9)

    def at(self, seconds: float) -> datetime | None:
        return None if math.isinf(seconds) else self.now + timedelta(seconds=seconds)

    def to_dict(self) -> dict[str, str | None]:
        return {
            "p10": _iso(self.at(self.p10)),
            "p50": _iso(self.at(self.p50)),
            "p90": _iso(self.at(self.p90)),
            "made_at": _iso(self.now),
        }


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


@dataclass
class Forecast:
    now: datetime
    jobs: dict[str, JobForecast] = field(default_factory=dict)
    samples: int = 0

    def get(self, name: str) -> JobForecast | None:
        return self.jobs.get(name)


# --- arrivals --------------------------------------------------------------------------------------------------


class Arrivals:
    """Jobs submitted after `now`: a Poisson process whose rate follows the hour of day (weekdays and weekends
    apart) as the last week's submissions did, each a copy of a recent submission."""

    def __init__(self, submissions: Sequence[Submission], now: datetime) -> None:
        since = now - timedelta(seconds=ARRIVAL_WINDOW_SECONDS)
        recent = [s for s in submissions if since <= s.at <= now]
        self.templates = recent
        first = min((s.at for s in submissions), default=now)
        span = max((now - max(first, since)).total_seconds(), 0.0)
        # a first busy morning is not a daily rate: the rate is over a day at least
        self.rate = len(recent) / max(span, _DAY) if recent else 0.0
        self.count = len(recent)
        # hour-of-day profile, weekdays and weekends apart, smoothed toward the flat rate
        counts: Counter[tuple[bool, int]] = Counter(self._bucket(s.at) for s in recent)
        exposure: Counter[tuple[bool, int]] = Counter()
        start = max(first, since)
        hours = int(span // _HOUR)
        for h in range(hours):
            exposure[self._bucket(start + timedelta(hours=h))] += 1
        prior = 3.0  # hours of the flat rate each bucket starts from
        self.profile: dict[tuple[bool, int], float] = {}
        for weekend in (False, True):
            for hour in range(24):
                key = (weekend, hour)
                self.profile[key] = (counts[key] + prior * self.rate * _HOUR) / (
                    (exposure[key] + prior) * _HOUR
                )
        self.peak = max(self.profile.values(), default=0.0)
        self.now = now

    @staticmethod
    def _bucket(at: datetime) -> tuple[bool, int]:
        return (at.weekday() >= 5, at.hour)

    def rate_at(self, seconds: float) -> float:
        return self.profile[self._bucket(self.now + timedelta(seconds=seconds))]

    def scale(self, rng: random.Random, spread: float) -> float:
        """A run's factor on the rate: the rate is known from `count` submissions only, and the load of the
        coming hours differs from last week's by about `spread` (a coefficient of variation) besides. A
        gamma draw of mean 1 and squared coefficient of variation 1/count + spread²: runs then differ in how
        busy the coming day is, so a forecast's range widens the further its start lies ahead."""
        if spread <= 0 or not self.count:
            return 1.0
        shape = 1.0 / (1.0 / self.count + spread * spread)
        return rng.gammavariate(shape, 1.0 / shape)

    def next_after(self, rng: random.Random, seconds: float, scale: float = 1.0) -> float:
        """The next arrival after `seconds` (from now), by thinning, at `scale` times the rate; inf when
        nothing arrives."""
        if self.peak <= 0 or not self.templates or scale <= 0:
            return math.inf
        t = seconds
        for _ in range(10_000):
            t += rng.expovariate(self.peak * scale)
            if rng.random() * self.peak < self.rate_at(t):
                return t
        return math.inf


# --- one run forward -------------------------------------------------------------------------------------------


@dataclass
class _Live:
    attempt: RunningAttempt
    job: QueuedJob
    work: Work
    total: float  # training seconds the job needs in all
    training_at: float  # when this attempt trains (seconds from now)
    done_before: float  # training seconds kept from earlier attempts
    keep_alive: int
    token: int = 0
    taken_back: bool = False  # stopped to end a loan: counted apart from preemptions
    #: when the attempt writes its first checkpoint (seconds from now; its last one before now, for an
    #: attempt of the snapshot that reported one); None: its checkpoints are not known
    first_mark: float | None = None
    #: when it was asked to stop (seconds from now): training ends there, not when the stop lands
    stop_requested_at: float | None = None

    def last_mark(self, now: float) -> float | None:
        """When the attempt wrote its last checkpoint by `now` (seconds from now); None: none yet, or unknown."""
        interval = self.work.checkpoint_interval_seconds
        if self.first_mark is None or not interval or now < self.first_mark:
            return None
        return self.first_mark + math.floor((now - self.first_mark) / interval) * interval

    def marks(self, now: float) -> int:
        """Checkpoints the attempt wrote by `now` (counting from its first known)."""
        interval = self.work.checkpoint_interval_seconds
        if self.first_mark is None or not interval or now < self.first_mark:
            return 0
        return 1 + math.floor((now - self.first_mark) / interval)


class _Run:
    """One sample: the queue run forward with drawn run times and arrivals."""

    #: plan every narrow pass wide too and fail on a difference (tests)
    check_narrow = False

    def __init__(
        self,
        state: QueueState,
        settings: ForecastSettings,
        run_times: RunTimeModel,
        arrivals: Arrivals | None,
        rng: random.Random,
        tracked: set[str],
        drawn: Sequence[Arrival] | None = None,
    ) -> None:
        self.state = state
        self.settings = settings
        self.timings = settings.timings
        self.run_times = run_times
        self.arrivals = arrivals
        self.rng = rng
        self.tracked = set(tracked)
        self.now = 0.0
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.queued: dict[str, QueuedJob] = {}
        #: each pool's queued jobs in queue order (its `queue_order` key and name), kept as jobs come and go
        self.order: dict[str, list[tuple[tuple[int, datetime, str], str]]] = {}
        #: queued jobs holding a reservation: a pass clears the reservations of jobs it no longer reads
        self.reserved: set[str] = set()
        #: the times (from now) a queued job's wait crosses what the policy compares with (`_wake`)
        self.thresholds: dict[str, tuple[float, float]] = {}
        self.limits = {
            pool: min(capacity, state.quota.get(pool, capacity)) for pool, capacity in state.capacity.items()
        }
        #: pools are planned apart where nothing ties them: no team quotas, no job across pools. A pass then
        #: plans only the pools where something happened since their last plan changed nothing (`dirty`):
        #: the plan of the others would be the same as their last one
        self.apart = (
            settings.narrow_lookahead > 0
            and not state.team_quotas
            and all(len(j.demand) == 1 for j in state.queued)
            and all(len(a.demand) == 1 for a in state.running)
            and (arrivals is None or all(len(t.demand) == 1 for t in arrivals.templates))
            and all(len(a.submission.demand) == 1 for a in drawn or ())
        )
        #: narrow passes (`ForecastSettings.narrow_lookahead`) need pools planned apart
        self.narrow = self.apart and settings.narrow_lookahead < min(
            settings.queue_lookahead, settings.pass_lookahead
        )
        self.dirty: set[str] = set(state.capacity)
        #: per pool, the next time the clock alone could make its plan differ (`_wake`)
        self.wake_by_pool: dict[str, float] = {}
        #: per pool, when a pass that waits for a victim's checkpoint looks again (`Plan.wake_at`)
        self.checkpoint_wakes: dict[str, float] = {}
        #: passes planned narrow, and those planned wide after all (`_pass`)
        self.narrow_passes = 0
        self.wide_passes = 0
        for job in state.queued:
            self._enqueue(job)
        self.work: dict[str, Work] = {}
        self.total: dict[str, float] = {}
        self.live: dict[str, _Live] = {}  # by training job name
        self.warm: dict[str, tuple[WarmPool, float]] = {}
        self.started: dict[str, float] = {}
        self.window: Mapping[str, list[QueuedJob]] = {}
        self.windows: dict[str, list[QueuedJob]] = {}  # each pool's, while its queue is unchanged
        self.planned: set[str] = set()
        self.arrived = 0
        #: arrivals less important than every tracked job go behind them all: they are not drawn
        self.least = (
            0
            if settings.less_important_arrivals
            else min((j.priority for j in state.queued if j.name in tracked), default=0)
        )
        for job in state.queued:
            work = state.work.get(job.name, Work())
            self.work[job.name] = work
            self.total[job.name] = self._draw_total(work, work.trained_seconds)
        for attempt in state.running:
            self._adopt(attempt)
        for retained in state.warm_pools:
            self._keep(retained.warm_pool, (retained.expires_at - state.now).total_seconds())
        self.arrival_scale = 1.0
        for arrival in drawn or ():
            self._push(arrival.at, functools.partial(self._submitted, arrival.submission, arrival))
        if arrivals is not None:
            self.arrival_scale = arrivals.scale(rng, settings.arrival_rate_spread)
            first = arrivals.next_after(rng, 0.0, self.arrival_scale)
            if first <= settings.arrivals_ahead_seconds:
                self._push(first, self._arrive)

    # time
    def dt(self, seconds: float) -> datetime:
        return self.state.now + timedelta(seconds=seconds)

    def _push(self, at: float, step: Callable[[], None]) -> None:
        if not math.isinf(at):
            heapq.heappush(self.events, (at, next(self.seq), step))

    def _draw_total(self, work: Work, at_least: float) -> float:
        if work.known_total_seconds is not None:
            return max(work.known_total_seconds, at_least)
        total = self.run_times.draw(self.rng, work.traits, at_least)
        if work.max_runtime_seconds:
            # SageMaker stops the attempt at its MaxRuntimeInSeconds (counted from training, near enough)
            total = min(total, work.trained_seconds + work.max_runtime_seconds)
        return max(total, at_least)

    def _adopt(self, attempt: RunningAttempt) -> None:
        """A live attempt of the snapshot: when it ends, from what it has trained."""
        name = attempt.job_name or attempt.training_job_name
        work = self.state.work.get(name, Work())
        now = self.state.now
        if attempt.training_started_at is not None and attempt.training_started_at <= now:
            trained_now = (now - attempt.training_started_at).total_seconds()
            training_at = -trained_now
        else:
            trained_now = 0.0
            since = attempt.started_at
            elapsed = max((now - since).total_seconds(), 0.0)
            training_at = max(self.timings.provisioning_seconds - elapsed, 0.0)
            if attempt.training_started_at is not None:
                training_at = (attempt.training_started_at - now).total_seconds()
        total = self._draw_total(work, work.trained_seconds + trained_now)
        job = QueuedJob(
            name=name,
            priority=attempt.priority,
            submitted_at=work.submitted_at or attempt.started_at,
            demand=attempt.demand,
            resource_key=work.resource_key,
            preemptions=attempt.preemptions,
            checkpointed=attempt.checkpointed,
            team=attempt.team,
            loans_taken_back=attempt.loans_taken_back,
        )
        live = _Live(attempt, job, work, total, training_at, work.trained_seconds, work.keep_alive_seconds)
        if work.checkpoint_interval_seconds and job.checkpointed:
            last = attempt.last_checkpoint_at
            if (
                last is not None
                and attempt.training_started_at is not None
                and last > attempt.training_started_at
            ):
                live.first_mark = (last - now).total_seconds()
            else:
                live.first_mark = training_at + work.checkpoint_interval_seconds
        self.live[attempt.training_job_name] = live
        if attempt.stopping:
            live.stop_requested_at = 0.0
            self._schedule(live, self.timings.stop_grace_seconds / 2, self._stopped)
        else:
            ends = training_at + (total - work.trained_seconds) + self.timings.upload_seconds
            self._schedule(live, max(ends, 0.0), self._completed)

    def _schedule(self, live: _Live, at: float, step: Callable[[_Live], None]) -> None:
        live.token += 1
        token = live.token

        def run() -> None:
            if live.token == token and live.attempt.training_job_name in self.live:
                step(live)

        self._push(at, run)

    def _keep(self, warm: WarmPool, expires_in: float) -> None:
        if expires_in <= 0:
            return
        self.warm[warm.training_job_name] = (warm, expires_in)
        self.dirty.add(warm.pool)
        name = warm.training_job_name

        def expire() -> None:
            held = self.warm.get(name)
            if held is not None and held[1] <= self.now:
                del self.warm[name]
                self.dirty.add(warm.pool)

        self._push(expires_in, expire)

    # what happens
    def _arrive(self) -> None:
        assert self.arrivals is not None
        template = self.rng.choice(self.arrivals.templates)
        following = self.arrivals.next_after(self.rng, self.now, self.arrival_scale)
        if following <= self.settings.arrivals_ahead_seconds:
            self._push(following, self._arrive)
        self._submitted(template)

    def _submitted(self, template: Submission, drawn: Arrival | None = None) -> None:
        if template.priority < self.least:
            return
        self.arrived += 1
        name = f"\x00arrival-{self.arrived}"
        job = QueuedJob(
            name=name,
            priority=template.priority,
            submitted_at=self.dt(self.now),
            demand=template.demand,
            resource_key=template.resource_key,
            checkpointed=template.checkpointed,
            team=template.team,
        )
        work = Work(
            traits=template.traits,
            keep_alive_seconds=template.keep_alive_seconds,
            known_total_seconds=drawn.known_total_seconds if drawn is not None else None,
            # a job's interval reaches the policy once an attempt of its own wrote two checkpoints
            checkpoint_interval_seconds=drawn.checkpoint_interval_seconds if drawn is not None else None,
            checkpoint_interval_reported=False,
        )
        self._enqueue(job)
        self.work[name] = work
        self.total[name] = self._draw_total(work, 0.0)

    def _completed(self, live: _Live) -> None:
        self._end(live)

    def _stopped(self, live: _Live) -> None:
        # training ends when the stop is asked for (SIGTERM), not when it lands
        ended = self.now if live.stop_requested_at is None else min(live.stop_requested_at, self.now)
        trained = max(ended - live.training_at, 0.0) if live.training_at <= ended else 0.0
        kept = live.done_before + (trained if live.job.checkpointed else 0.0)
        interval = live.work.checkpoint_interval_seconds
        if live.job.checkpointed and live.first_mark is not None and interval:
            # the training up to its last checkpoint is kept
            last = live.last_mark(ended)
            kept = live.done_before + (max(last - live.training_at, 0.0) if last is not None else 0.0)
        elif live.job.checkpointed and trained > 0:
            kept -= self.rng.uniform(0, min(trained, 1800.0))  # work since the last checkpoint is lost
        self._end(live)
        job = live.job
        if live.taken_back:
            job = dataclasses.replace(job, loans_taken_back=job.loans_taken_back + 1)
        else:
            job = dataclasses.replace(job, preemptions=job.preemptions + 1)
        job = dataclasses.replace(job, queued_since=self.dt(self.now), reservation=None, not_before=None)
        self._enqueue(job)
        reported = live.work.checkpoint_interval_reported or live.marks(ended) >= 2
        self.work[job.name] = dataclasses.replace(
            live.work, trained_seconds=max(kept, 0.0), checkpoint_interval_reported=reported
        )
        self.total[job.name] = live.total

    def _end(self, live: _Live) -> None:
        del self.live[live.attempt.training_job_name]
        self.dirty.update(live.attempt.demand)
        key = live.job.resource_key
        launched = self.now >= live.training_at - self.timings.download_seconds
        if live.keep_alive > 0 and key is not None and launched:
            lent_by = live.attempt.on_loan_for
            self._keep(
                WarmPool(live.attempt.training_job_name, key, lent_by=lent_by), self.now + live.keep_alive
            )

    # the queue
    def _enqueue(self, job: QueuedJob) -> None:
        self.queued[job.name] = job
        self.dirty.update(job.demand)
        origin = self.state.now
        self.thresholds[job.name] = (
            (job.waiting_since - origin).total_seconds() + self.settings.policy.reserve_after_seconds,
            (job.not_before - origin).total_seconds() if job.not_before else math.inf,
        )
        if job.reservation is not None:
            self.reserved.add(job.name)
        for pool in job.demand:
            bisect.insort(self.order.setdefault(pool, []), (queue_order(job), job.name))

    def _dequeue(self, name: str) -> QueuedJob | None:
        job = self.queued.pop(name, None)
        if job is None:
            return None
        self.reserved.discard(name)
        self.dirty.update(job.demand)
        entry = (queue_order(job), name)
        for pool in job.demand:
            jobs = self.order[pool]
            del jobs[bisect.bisect_left(jobs, entry)]
        return job

    # the pass
    def _window(self, lookahead: int, pools: Iterable[str] | None = None) -> dict[str, list[QueuedJob]]:
        """Each pool's jobs a pass reads (of `pools`; None: all): the first `lookahead` in queue order that
        can fit (and, with team quotas, each team's first `lookahead`), as the service's lookahead window
        reads them."""
        window: dict[str, list[QueuedJob]] = {}
        teams_by_pool: dict[str, set[str]] = {}
        for quota in self.state.team_quotas:
            teams_by_pool.setdefault(quota.pool, set()).add(quota.team)
        for pool in self.order if pools is None else pools:
            entries = self.order.get(pool)
            if not entries:
                continue
            capacity = self.state.capacity.get(pool, 0)
            teams = teams_by_pool.get(pool)
            head: list[QueuedJob] = []
            extra: list[QueuedJob] = []
            taken: Counter[str] = Counter()
            for _, name in entries:
                job = self.queued[name]
                if next(iter(job.demand)) != pool:
                    continue  # a job across pools is read in its first pool's window
                if capacity and job.demand.get(pool, 0) > capacity:
                    continue
                if len(head) < lookahead:
                    head.append(job)
                    if teams and job.team in teams:
                        taken[job.team or ""] += 1
                elif teams and job.team in teams and taken[job.team or ""] < lookahead:
                    taken[job.team or ""] += 1
                    extra.append(job)
                elif not teams:
                    break
            if head:
                window[pool] = head + extra
        return window

    def _snapshot(self, queued: Sequence[QueuedJob], pools: set[str] | None = None) -> Snapshot:
        """What a pass reads: `queued`, and what runs and waits warm in `pools` (None: everywhere)."""
        running = [self._reported(live) for live in self.live.values()]
        warm = [warm for warm, _ in self.warm.values()]
        if pools is not None:
            running = [a for a in running if next(iter(a.demand)) in pools]
            warm = [w for w in warm if w.pool in pools]
        return Snapshot(
            now=self.dt(self.now),
            capacity=self.state.capacity,
            quota=self.state.quota,
            queued=queued,
            running=running,
            warm_pools=warm,
            team_quotas=self.state.team_quotas,
            team_usage=self.state.team_usage,
        )

    def _reported(self, live: _Live) -> RunningAttempt:
        """A live attempt as a pass reads it: with the checkpoints it has reported by now (docs/adr/0023),
        where the run knows them: the time of its last, and its interval once known to the queue."""
        if live.first_mark is None:
            return live.attempt
        last = live.last_mark(self.now)
        known = live.work.checkpoint_interval_reported or live.marks(self.now) >= 2
        if last is None and not known:
            return live.attempt
        return dataclasses.replace(
            live.attempt,
            last_checkpoint_at=self.dt(last) if last is not None else live.attempt.last_checkpoint_at,
            checkpoint_interval_seconds=live.work.checkpoint_interval_seconds
            if known
            else live.attempt.checkpoint_interval_seconds,
        )

    def _plan(self) -> Plan:
        """The pass's plan. A narrow pass reads only the first `narrow_lookahead` jobs of each pool; it stands
        for the wide one where nothing past them could act (`_narrow_holds`), else the pass reads all."""
        lookahead = min(self.settings.queue_lookahead, self.settings.pass_lookahead)
        if self.apart:
            # a pool's window changes only with its queue, which makes it dirty
            for pool in self.dirty:
                self.windows.pop(pool, None)
            self.windows.update(self._window(lookahead, self.dirty))
            everywhere = self.windows
            by_pool = {pool: jobs for pool, jobs in everywhere.items() if pool in self.dirty}
        else:
            everywhere = by_pool = self._window(lookahead)
        self.window = everywhere
        # the pools whose reservations this pass decides (a job it does not read holds none after it)
        self.planned = set(self.dirty) if self.apart else set(self.order)
        self.dirty = set()
        decided = self._plan_pools(by_pool)
        if self.check_narrow:
            self._compare(decided, everywhere)
        return decided

    def _plan_pools(self, by_pool: Mapping[str, list[QueuedJob]]) -> Plan:
        if not by_pool:
            return Plan()
        wide = [job for jobs in by_pool.values() for job in jobs]
        pools = set(by_pool) if self.apart else None
        k = self.settings.narrow_lookahead
        if self.narrow and any(len(jobs) > k for jobs in by_pool.values()):
            heads = {pool: jobs[:k] for pool, jobs in by_pool.items()}
            behind = {pool: jobs[k:] for pool, jobs in by_pool.items() if len(jobs) > k}
            if self._narrow_may_hold(behind):
                snapshot = self._snapshot([job for jobs in heads.values() for job in jobs], pools)
                decided = plan(snapshot, self.settings.policy)
                if self._narrow_holds(decided, snapshot, heads, behind):
                    self.narrow_passes += 1
                    return decided
        self.wide_passes += 1
        return plan(self._snapshot(wide, pools), self.settings.policy)

    def _narrow_may_hold(self, behind: Mapping[str, list[QueuedJob]]) -> bool:
        """Before a narrow pass: nothing a job behind the heads could take now. No warm pool in its pool
        (it might reuse or release one), no stopping attempt (their instances are promised in order), no
        loan it lent, no reservation of its own, no attempt it outranks (it might preempt or hold for one)."""
        for pool, jobs in behind.items():
            if any(warm.pool == pool for warm, _ in self.warm.values()):
                return False
            names = {job.name for job in jobs}
            if any(job.reservation is not None for job in jobs):
                return False
            top = max(job.priority for job in jobs)
            for live in self.live.values():
                attempt = live.attempt
                if pool not in attempt.demand:
                    continue
                if attempt.stopping or attempt.on_loan_for in names:
                    return False
                if attempt.job_name is not None and attempt.priority < top:
                    return False
        return True

    def _narrow_holds(
        self,
        decided: Plan,
        snapshot: Snapshot,
        heads: Mapping[str, list[QueuedJob]],
        behind: Mapping[str, list[QueuedJob]],
    ) -> bool:
        """After a narrow pass: in each pool, a job at the head still waits (so the pool is blocked and no
        job behind it drains), no idle instance (free, or held by a reservation and lendable) is left that
        a job behind fits in, and no job started shares its warm-pool key with one behind (its keep-alive
        depends on who would reuse the pool)."""
        started: dict[str, QueuedJob] = {}
        names = {action.job_name for action in decided.actions if isinstance(action, Start)}
        for jobs in heads.values():
            for job in jobs:
                if job.name in names:
                    started[job.name] = job
        now = snapshot.now
        for pool, jobs in behind.items():
            if not any(
                job.name not in started and (job.not_before is None or job.not_before <= now)
                for job in heads.get(pool, ())
            ):
                return False
            used = sum(a.demand.get(pool, 0) for a in snapshot.running)
            used += sum(job.demand.get(pool, 0) for job in started.values())
            idle = self.limits.get(pool, 0) - used
            if idle > 0 and min(job.demand[pool] for job in jobs) <= idle:
                return False
            keys = {job.resource_key for job in jobs if job.resource_key is not None}
            if keys and any(job.resource_key in keys for job in started.values()):
                return False
        return True

    def _compare(self, decided: Plan, everywhere: Mapping[str, list[QueuedJob]]) -> None:
        """Tests: the pass as planned (narrow, in the pools that changed) against every pool's whole window
        planned at once, where the pools not planned keep their reservations and do nothing."""
        wide = plan(
            self._snapshot([job for jobs in everywhere.values() for job in jobs]), self.settings.policy
        )
        expected = dict(decided.reservations)
        for pool, jobs in everywhere.items():
            if pool not in self.planned:
                expected.update({j.name: j.reservation for j in jobs if j.reservation is not None})
        if sorted(map(repr, decided.actions)) != sorted(map(repr, wide.actions)) or expected != dict(
            wide.reservations
        ):
            raise AssertionError(
                f"a pass planned {decided.actions}, every pool's whole window {wide.actions}"
            )

    def _pass(self) -> None:
        if not self.queued:
            return
        decided = self._plan()
        # a pass that waits for a victim's checkpoint looks again when it is due or the wait ends
        for pool in self.planned:
            self.checkpoint_wakes.pop(pool, None)
        if decided.wake_at is not None:
            wake = max((decided.wake_at - self.state.now).total_seconds(), self.now)
            for victim in decided.checkpoint_waits:
                live = self.live.get(victim)
                if live is not None:
                    for pool in live.attempt.demand:
                        self.checkpoint_wakes[pool] = min(self.checkpoint_wakes.get(pool, math.inf), wake)
        for action in decided.actions:
            if isinstance(action, Start):
                self._start(action)
            elif isinstance(action, Preempt):
                self._preempt(action)
            elif isinstance(action, ReleaseWarmPool):
                released = self.warm.pop(action.training_job_name, None)
                if released is not None:
                    self.dirty.add(released[0].pool)
        for name in self.reserved | decided.reservations.keys():
            job = self.queued.get(name)
            if job is None or not self.planned & job.demand.keys():
                continue
            reservation = decided.reservations.get(name)
            if reservation != job.reservation:
                self.dirty.update(job.demand)
                self.queued[name] = dataclasses.replace(job, reservation=reservation)
                if reservation is None:
                    self.reserved.discard(name)
                else:
                    self.reserved.add(name)

    def _start(self, action: Start) -> None:
        job = self._dequeue(action.job_name)
        if job is None:
            return
        if job.name in self.tracked and job.name not in self.started:
            self.started[job.name] = self.now
        work = self.work[job.name]
        warm = self.warm.pop(action.warm_pool, None) if action.warm_pool else None
        provisioning = (
            self.timings.warm_start_seconds if warm is not None else self.timings.cold_start_seconds
        ) + self.timings.download_seconds
        training_at = self.now + provisioning
        name = f"{job.name}\x00{self.now:.0f}"
        attempt = RunningAttempt(
            training_job_name=name,
            demand=job.demand,
            priority=job.priority,
            started_at=self.dt(self.now),
            job_name=job.name,
            training_started_at=self.dt(training_at),
            preemptions=job.preemptions,
            checkpointed=job.checkpointed,
            on_loan_for=action.on_loan_for,
            team=job.team,
        )
        keep_alive = max(work.keep_alive_seconds, action.keep_alive_seconds or 0)
        total = self.total[job.name]
        live = _Live(attempt, job, work, total, training_at, work.trained_seconds, keep_alive)
        if work.checkpoint_interval_seconds and job.checkpointed:
            live.first_mark = training_at + work.checkpoint_interval_seconds
        self.live[name] = live
        remaining = max(total - work.trained_seconds, 0.0)
        self._schedule(live, training_at + remaining + self.timings.upload_seconds, self._completed)

    def _preempt(self, action: Preempt) -> None:
        live = self.live.get(action.training_job_name)
        if live is None or live.attempt.stopping:
            return
        live.attempt = dataclasses.replace(live.attempt, stopping=True)
        self.dirty.update(live.attempt.demand)
        live.taken_back = action.taken_back
        live.stop_requested_at = self.now
        self._schedule(live, self.now + self.timings.stop_grace_seconds, self._stopped)

    def _wake(self) -> float:
        """The next time the clock alone could make a pass decide differently."""
        policy = self.settings.policy
        # a pool neither planned nor changed since keeps its time (it lies ahead, or the pool would be dirty)
        fresh = self.planned | self.dirty if self.apart else None
        by_pool = (
            {pool: at for pool, at in self.wake_by_pool.items() if pool not in fresh}
            if fresh is not None
            else {}
        )
        for pool, jobs in self.window.items():
            if fresh is not None and pool not in fresh:
                continue
            for job in jobs:
                if job.name not in self.queued:
                    continue
                for at in self.thresholds[job.name]:
                    if self.now < at < by_pool.get(pool, math.inf):
                        by_pool[pool] = at
        for live in self.live.values():
            pool = next(iter(live.attempt.demand))
            if fresh is not None and pool not in fresh:
                continue
            at = live.training_at + policy.min_runtime_before_preemption_seconds
            if self.now < at < by_pool.get(pool, math.inf):
                by_pool[pool] = at
        for pool, at in self.checkpoint_wakes.items():
            if self.now < at < by_pool.get(pool, math.inf):
                by_pool[pool] = at
        self.wake_by_pool = by_pool
        return min(by_pool.values(), default=math.inf)

    def _on_timer(self, at: float) -> float:
        """The first pass of the scheduler's timer at or after `at` (seconds from now): a threshold the clock
        crosses is acted on by the next timer pass, which runs on the whole minute (the timer's period)."""
        period = self.settings.pass_every_seconds
        if period <= 0 or math.isinf(at):
            return at
        origin = self.state.now.timestamp()
        return math.ceil((origin + at) / period - 1e-9) * period - origin

    def run(self) -> dict[str, float]:
        horizon = self.settings.horizon_seconds
        self._pass()
        while self.tracked - self.started.keys():
            wake = self._on_timer(self._wake())
            if self.dirty and self.settings.pass_every_seconds > 0:
                # a pass that changed something is followed by the timer's next pass, which may decide more
                # (take back a loan the change made needless, start what the change let through)
                wake = min(wake, self._on_timer(self.now + self.settings.pass_every_seconds / 2))
            at = min(self.events[0][0] if self.events else math.inf, wake)
            if math.isinf(at) or at > horizon:
                break
            self.now = at
            batch = at + self.settings.batch_seconds
            while self.events and (self.events[0][0] < batch or self.events[0][0] <= at):
                self.now = max(self.now, self.events[0][0])
                _, _, step = heapq.heappop(self.events)
                step()
            self.dirty.update(pool for pool, at in self.wake_by_pool.items() if at <= self.now)
            self._pass()
        return self.started


# --- the forecast ----------------------------------------------------------------------------------------------


def forecast(
    state: QueueState,
    history: History,
    settings: ForecastSettings | None = None,
    *,
    only: Iterable[str] | None = None,
    run_times: RunTimeModel | None = None,
    arrival_source: ArrivalSource | None = None,
) -> Forecast:
    """Each queued job's start over `settings.samples` runs (those named in `only`, if given).

    `run_times` and `arrival_source` replace the model drawn from `history` (what the queue has seen) for
    reference runs that know more than a queue can: how the workload was made, or what it held
    (bench_forecast's oracles)."""
    settings = settings or ForecastSettings()
    known = run_times
    if known is None:
        run_times = RunTimes(history.completed)
    arrivals = (
        Arrivals(history.submissions, state.now) if settings.arrivals and arrival_source is None else None
    )
    tracked = set(only) if only is not None else {j.name for j in state.queued}
    starts: dict[str, list[float]] = {name: [] for name in tracked}
    began = time.perf_counter()
    runs = 0
    for sample in range(settings.samples):
        budget = settings.budget_seconds
        if budget is not None and runs >= settings.min_samples and time.perf_counter() - began > budget:
            break  # a large queue: fewer runs, a rougher range, an answer in time
        rng = random.Random(f"{settings.seed}:{sample}")
        drawn: RunTimeModel = run_times if run_times is not None else RunTimes(())
        if known is None and settings.resample_history and len(history.completed) > 1:
            # the run-time distribution is known from the completed jobs only: each run draws from a
            # resample of them (a bootstrap), so a short history widens the range as it should
            drawn = RunTimes(rng.choices(history.completed, k=len(history.completed)))
        future = arrival_source.draw(rng) if arrival_source is not None and settings.arrivals else None
        started = _Run(state, settings, drawn, arrivals, rng, tracked, future).run()
        runs += 1
        for name in tracked:
            starts[name].append(started.get(name, math.inf))
    result = Forecast(state.now, samples=runs)
    for name, values in starts.items():
        result.jobs[name] = JobForecast(name, state.now, tuple(sorted(values)))
    return result


def with_job(state: QueueState, job: QueuedJob, work: Work | None = None) -> QueueState:
    """`state` with `job` queued too (a dry run of a submission)."""
    works: Mapping[str, Work] = {**state.work, job.name: work or Work()}
    return dataclasses.replace(state, queued=[*state.queued, job], work=works)


def replace_job(state: QueueState, name: str, change: Callable[[QueuedJob], QueuedJob]) -> QueueState:
    return dataclasses.replace(state, queued=[change(j) if j.name == name else j for j in state.queued])


__all__ = ["Arrivals", "Forecast", "JobForecast", "RetainedPool", "forecast", "replace_job", "with_job"]
