"""Forecasts made during a simulation, scored against the starts that happened.

Every `every_seconds` of simulated time, the queue as the scheduler sees it (`state_of`: queued jobs with
their reservations, live attempts with their training start, tracked warm pools with their expiry) and
what it has seen (`history_of`: training times of completed jobs, past submissions) go to
`sagequeue.forecast.forecast`, and the start of every waiting job is forecast; `estimate_starts` (the
earlier `ls --start` estimate) is made beside it from the same observations. After the run, each forecast
is compared with the job's next start: whether it fell in the P10-P90 range, and how far the P50 (and the
earlier estimate) was from it.

Only what the queue itself could observe is read: never a trace job's duration before it completed.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sagequeue.estimate import estimate_starts, typical_duration
from sagequeue.forecast import (
    ForecastSettings,
    History,
    QueueState,
    RetainedPool,
    Submission,
    Traits,
    Work,
    forecast,
)
from sagequeue.forecast.calibrate import Calibration, CalibrationSettings, Outcome, learn
from sagequeue.forecast.model import Arrival, ArrivalSource, RunTimeModel
from sagequeue.sim.engine import SimJob, SimSettings, Simulation, _request
from sagequeue.sim.sagemaker import Timings
from sagequeue.sim.schedulers import SagequeuePolicy, TrackedPool, _reported
from sagequeue.sim.trace import Trace, TraceJob
from sagequeue.sim.workload import DAY, WorkloadSpec, _group, _group_sizes, _rate
from sagequeue_core.domain import JobState
from sagequeue_core.snapshot import build_snapshot, policy_settings


def forecast_settings(settings: SimSettings, timings: Timings, **changes: object) -> ForecastSettings:
    return ForecastSettings(
        policy=policy_settings(settings),
        queue_lookahead=settings.queue_lookahead,
        timings=timings,
        **changes,  # type: ignore[arg-type]
    )


def state_of(sim: Simulation, *, oracle: bool = False) -> QueueState:
    """The queue as the scheduler service would read it now. `oracle`: with every submitted job's true
    training time (a reference that knows what no forecast can, to say how much error run times cause)."""
    queued = [job for pool in sim.queued.values() for job in pool.values()]
    live = list(sim.live.values())
    warm = [TrackedPool(sim, name) for name in sim.sagemaker.warm]
    snapshot = build_snapshot(
        now=sim.now_dt,
        capacity=sim.settings.capacity,
        queued=queued,
        live=live,
        warm_pools=warm,
        team_quotas=sim.settings.team_quotas,
    )
    if sim.settings.checkpoint_reports:
        # the checkpoints live attempts reported, as the service's snapshot carries them (docs/adr/0023)
        snapshot = dataclasses.replace(snapshot, running=[_reported(sim, a) for a in snapshot.running])
    reported = {a.job_name: a.checkpoint_interval_seconds for a in snapshot.running}
    work: dict[str, Work] = {}
    for job in (*queued, *live):
        run = sim.runs[job.name]
        interval = (
            reported.get(job.name) or run.checkpoint_interval if sim.settings.checkpoint_reports else None
        )
        told = interval is not None
        if oracle and run.spec.checkpoint_minutes:
            interval = run.spec.checkpoint_minutes * 60
        work[job.name] = Work(
            traits=_traits(run.spec.instance_count),
            trained_seconds=run.saved_work,
            keep_alive_seconds=run.spec.keep_alive_seconds,
            resource_key=job.resource_key,
            submitted_at=job.submitted_at,
            known_total_seconds=run.spec.duration_seconds if oracle else None,
            checkpoint_interval_seconds=interval,
            checkpoint_interval_reported=told,
        )
    expires = {w.training_job_name: w.expires_at for w in warm}
    return QueueState(
        now=sim.now_dt,
        capacity=dict(sim.settings.capacity),
        queued=list(snapshot.queued),
        running=list(snapshot.running),
        warm_pools=[RetainedPool(w, expires[w.training_job_name]) for w in snapshot.warm_pools],
        team_quotas=tuple(sim.settings.team_quotas),
        work=work,
    )


def _traits(instances: int) -> Traits:
    return Traits(instances=instances)


def history_of(sim: Simulation) -> History:
    """What the queue has seen by now: completed jobs' training seconds, and every submission so far."""
    completed = []
    submissions = []
    for run in sim.runs.values():
        job = run.job
        if job.state is JobState.COMPLETED:
            completed.append((_traits(run.spec.instance_count), run.spec.duration_seconds))
        submissions.append(
            Submission(
                at=job.submitted_at,
                priority=job.priority,
                demand=job.demand,
                traits=_traits(run.spec.instance_count),
                checkpointed=job.checkpointed,
                keep_alive_seconds=run.spec.keep_alive_seconds,
                resource_key=job.resource_key,
                team=job.team,
            )
        )
    return History(completed=completed, submissions=submissions)


# --- reference forecasts that know more than a queue can (bench_forecast's oracles) ------------------------


class TrueRunTimes:
    """Training times drawn from the distribution the workload generator draws them from (`WorkloadSpec`:
    log-normal, clipped), conditioned on what a job has trained: what the best run-time model could know."""

    def __init__(self, spec: WorkloadSpec) -> None:
        self.spec = spec
        self.normal = statistics.NormalDist(math.log(spec.median_duration_seconds), spec.duration_sigma)

    def draw(self, rng: random.Random, traits: Traits, at_least: float = 0.0) -> float:
        spec = self.spec
        if at_least >= spec.max_duration_seconds:
            return at_least
        floor = self.normal.cdf(math.log(at_least)) if at_least > 0 else 0.0
        # the inverse CDF of the log-normal above `at_least` (the clip at the minimum only raises short draws)
        u = floor + (1.0 - floor) * rng.random()
        value = math.exp(self.normal.inv_cdf(min(max(u, 1e-12), 1 - 1e-12)))
        return max(min(max(value, spec.min_duration_seconds), spec.max_duration_seconds), at_least)


def _submission(job: TraceJob, at: datetime) -> Submission:
    sim_job = SimJob(
        name=job.name, request=_request(job), priority=job.priority, owner="sim", submitted_at=at
    )
    return Submission(
        at=at,
        priority=job.priority,
        demand=sim_job.demand,
        traits=_traits(job.instance_count),
        checkpointed=sim_job.checkpointed,
        keep_alive_seconds=job.keep_alive_seconds,
        resource_key=sim_job.resource_key,
        team=job.team,
    )


class RealArrivals:
    """The trace's own later submissions, with their training times: what the full oracle knows."""

    def __init__(self, trace: Trace, now: float) -> None:
        self.arrivals = [
            Arrival(
                at=job.submit_seconds - now,
                submission=_submission(job, trace.start),
                known_total_seconds=job.duration_seconds,
                checkpoint_interval_seconds=job.checkpoint_minutes * 60 if job.checkpoint_minutes else None,
            )
            for job in trace.jobs
            if job.submit_seconds > now
        ]

    def draw(self, rng: random.Random) -> Sequence[Arrival]:
        return self.arrivals


#: the generator's gap between a sweep's submissions (`workload._group`)
_SWEEP_GAP = (30.0, 600.0)


class TrueArrivals:
    """Later submissions drawn as the workload generator draws them (`WorkloadSpec`, `workload.generate`):
    the jobs still to come (the trace's count less those submitted), in groups (singles, bursts, sweeps) at
    times following the office-hours rate up to the trace's end, each job's fields and training time drawn
    by the generator's own code; a sweep under way goes on as its size and gaps allow. Knows how the trace
    was made, none of what it drew."""

    def __init__(self, spec: WorkloadSpec, trace: Trace, sim: Simulation) -> None:
        self.spec = spec
        self.start = trace.start
        self.now = sim.now
        self.end = min(spec.days * DAY, trace.last_submit_seconds + 1.0)
        self.left = len(trace.jobs) - len(sim.runs)
        # sweeps under way: their last submission, members seen, and a template
        families: dict[str, tuple[float, int, TraceJob]] = {}
        for run in sim.runs.values():
            family = run.spec.family
            if family is None:
                continue
            last, seen, _ = families.get(family, (-math.inf, 0, run.spec))
            families[family] = (max(last, run.spec.submit_seconds), seen + 1, run.spec)
        self.sweeps = [
            (last, seen, spec_job)
            for last, seen, spec_job in families.values()
            if self.now - last < _SWEEP_GAP[1] and seen < spec.sweep_size[1]
        ]

    def draw(self, rng: random.Random) -> Sequence[Arrival]:
        spec = self.spec
        left = self.left
        out: list[Arrival] = []
        for last, seen, template in self.sweeps:
            # more to come: the size allows it and the next gap is longer than the time since the last one
            elapsed = self.now - last
            low, high = spec.sweep_size
            sizes = range(max(seen, low), high + 1)
            later = min(max((_SWEEP_GAP[1] - elapsed) / (_SWEEP_GAP[1] - _SWEEP_GAP[0]), 0.0), 1.0)
            weights = [1.0 if size == seen else later for size in sizes]
            size = rng.choices(list(sizes), weights=weights)[0] if sum(weights) > 0 else seen
            moment = last
            for index in range(seen, min(size, seen + left)):
                gap_low = max(_SWEEP_GAP[0], self.now - moment) if index == seen else _SWEEP_GAP[0]
                moment += rng.uniform(gap_low, _SWEEP_GAP[1])
                job = dataclasses.replace(
                    template,
                    name=f"{template.family}-{index + 1}",
                    submit_seconds=moment,
                    duration_seconds=TrueRunTimes(spec).draw(rng, Traits()),
                )
                out.append(self._arrival(job))
                left -= 1
        if left > 0 and self.end > self.now:
            groups = _group_sizes(dataclasses.replace(spec, jobs=left), rng)
            peak = max(max(spec.weekday_rate), spec.weekend_rate)
            for number, (kind, size) in enumerate(groups):
                while True:
                    t = rng.uniform(self.now, self.end)
                    if rng.random() * peak < _rate(spec, t):
                        break
                for job in _group(spec, rng, t, kind=kind, size=size, number=100_000 + 100 * number):
                    out.append(self._arrival(job))
        return out

    def _arrival(self, job: TraceJob) -> Arrival:
        return Arrival(
            at=job.submit_seconds - self.now,
            submission=_submission(job, self.start),
            known_total_seconds=job.duration_seconds,
            checkpoint_interval_seconds=job.checkpoint_minutes * 60 if job.checkpoint_minutes else None,
        )


def oracle_sources(
    truth: str, spec: WorkloadSpec | None, trace: Trace, sim: Simulation
) -> tuple[RunTimeModel | None, ArrivalSource | None]:
    """The run-time model and arrival source of a reference forecast: "distribution" (how the trace was
    made: `TrueRunTimes`, `TrueArrivals`) or "full" (what it holds: every job's training time, the trace's
    later submissions)."""
    if truth == "distribution":
        if spec is None:
            raise ValueError("the distribution oracle needs the trace's WorkloadSpec")
        return TrueRunTimes(spec), TrueArrivals(spec, trace, sim)
    if truth == "full":
        return None, RealArrivals(trace, sim.now)
    # halves of the distribution oracle, to tell which half of the model its gap comes from
    if truth in ("run times", "arrivals"):
        if spec is None:
            raise ValueError("the distribution oracle needs the trace's WorkloadSpec")
        if truth == "run times":
            return TrueRunTimes(spec), None
        return None, TrueArrivals(spec, trace, sim)
    raise ValueError(f"unknown oracle {truth!r}: distribution, full, run times or arrivals")


def baseline_of(sim: Simulation) -> dict[str, datetime | None]:
    """The earlier `ls --start` estimate, from what `sagequeue ls --start` reads: each pool's queue in
    order, its live jobs, and the mean run time of its 50 latest completed jobs."""
    now = sim.now_dt
    starts: dict[str, datetime | None] = {}
    for pool, queued in sim.queued.items():
        if not queued:
            continue
        order = sorted(queued.values(), key=lambda j: (-j.priority, j.submitted_at, j.name))
        live = [
            _Seen(j.name, j.demand.get(pool, 0), j.started_at, None)
            for j in sim.live.values()
            if pool in j.demand
        ]
        done = sorted(
            (
                _Seen(r.job.name, r.spec.instance_count, r.job.started_at, r.job.ended_at)
                for r in sim.runs.values()
                if r.job.state is JobState.COMPLETED and r.job.pool == pool
            ),
            key=lambda s: s.ended_at or now,
        )[-50:]
        seen = [_Seen(j.name, j.demand.get(pool, 0), None, None) for j in order]
        starts.update(
            estimate_starts(sim.settings.capacity.get(pool, 0), live, seen, typical_duration(done), now)
        )
    return starts


@dataclass(frozen=True)
class _Seen:
    name: str
    instances: int
    started_at: datetime | None
    ended_at: datetime | None


@dataclass
class Made:
    """One forecast of one waiting job."""

    job: str
    made: float  # seconds into the run
    p10: float  # seconds after `made` (inf: not within the horizon)
    p50: float
    p90: float
    baseline: float | None  # the earlier estimate, seconds after `made`; None when it gives none
    waiting: int  # jobs waiting when it was made
    actual: float | None = None  # seconds after `made` the job started; None: it never did in the run
    pool: str = ""  # the pool it waits in


@dataclass
class Score:
    """How forecasts compared with the starts that happened."""

    pairs: int = 0
    covered: int = 0
    errors: list[float] = field(default_factory=list)  # |P50 - actual| seconds
    baseline_errors: list[float] = field(default_factory=list)  # |estimate - actual|, where it gave one
    forecast_errors_where_baseline: list[float] = field(default_factory=list)
    no_baseline: int = 0
    seconds: list[float] = field(default_factory=list)  # wall time of each forecast

    @property
    def coverage(self) -> float:
        return self.covered / self.pairs if self.pairs else math.nan

    @property
    def median_error(self) -> float:
        return statistics.median(self.errors) if self.errors else math.nan

    @property
    def baseline_median_error(self) -> float:
        return statistics.median(self.baseline_errors) if self.baseline_errors else math.nan

    @property
    def median_error_where_baseline(self) -> float:
        return (
            statistics.median(self.forecast_errors_where_baseline)
            if self.forecast_errors_where_baseline
            else math.nan
        )

    def add(self, made: Made, actual: float) -> None:
        self.pairs += 1
        if made.p10 <= actual <= made.p90:
            self.covered += 1
        error = abs(made.p50 - actual)
        self.errors.append(error)
        if made.baseline is None:
            self.no_baseline += 1
        else:
            self.baseline_errors.append(abs(made.baseline - actual))
            self.forecast_errors_where_baseline.append(error)


def scored_run(
    trace: Trace,
    settings: SimSettings,
    timings: Timings | None = None,
    *,
    every_seconds: float = 900.0,
    horizon_seconds: float | None = None,
    samples: int = 30,
    progress: bool = False,
    oracle: bool = False,
    **forecast_changes: object,
) -> tuple[Score, list[Made]]:
    """Run `trace` under sagequeue's policy, forecasting every waiting job every `every_seconds`, and score
    the forecasts against the starts that happened."""
    scored = scored_runs(
        trace,
        settings,
        timings,
        every_seconds=every_seconds,
        horizon_seconds=horizon_seconds,
        progress=progress,
        variants={"forecast": {"samples": samples, "oracle": oracle, **forecast_changes}},
    )
    return scored["forecast"]


def scored_runs(
    trace: Trace,
    settings: SimSettings,
    timings: Timings | None = None,
    *,
    every_seconds: float = 900.0,
    horizon_seconds: float | None = None,
    progress: bool = False,
    variants: Mapping[str, Mapping[str, object]],
    spec: WorkloadSpec | None = None,
) -> dict[str, tuple[Score, list[Made]]]:
    """`scored_run` for several forecasts at once, side by side in one run of the trace: each variant is
    a set of changes to the forecast's settings (`oracle: True` for the reference that knows training
    times; `truth: "distribution"` for the one that knows how the trace was made from `spec`, `"full"` for
    the one that knows every training time and later submission), forecast at the same moments from the
    same observations.

    A variant `{"calibrate": "now"}` (optionally with `"calibration": CalibrationSettings(...)`) runs no
    forecast of its own: it is variant "now"'s forecasts (given before it) each calibrated when made, by
    what "now"'s earlier forecasts got wrong as far as the run had got (`calibrated_made`)."""
    timings = timings or Timings()
    made: dict[str, list[Made]] = {name: [] for name in variants}
    wall: dict[str, list[float]] = {name: [] for name in variants}
    configured: dict[str, tuple[ForecastSettings, bool, str | None]] = {}
    calibrated: dict[str, tuple[str, CalibrationSettings]] = {}
    for name, changes in variants.items():
        changes = dict(changes)
        if "calibrate" in changes:
            base = str(changes["calibrate"])
            calibration = changes.get("calibration") or CalibrationSettings()
            assert isinstance(calibration, CalibrationSettings)
            calibrated[name] = (base, calibration)
            continue
        truth = changes.pop("truth", None)
        oracle = bool(changes.pop("oracle", False)) or truth == "full"
        if truth in ("distribution", "run times", "arrivals") and spec is None:
            raise ValueError("the distribution oracle needs the trace's WorkloadSpec")
        configured[name] = (
            forecast_settings(settings, timings, **changes),
            oracle,
            str(truth) if truth is not None else None,
        )
    next_at = [every_seconds]

    def observe(now: float) -> None:
        if now < next_at[0]:
            return
        while next_at[0] <= now:
            next_at[0] += every_seconds
        waiting = [j.name for pool in sim.queued.values() for j in pool.values()]
        if not waiting:
            return
        baseline = baseline_of(sim)
        origin = sim.now_dt
        history = history_of(sim)
        pools = {j.name: pool for pool, queued in sim.queued.items() for j in queued.values()}
        for name, (fsettings, oracle, truth) in configured.items():
            began = time.perf_counter()
            run_times, arrival_source = (
                oracle_sources(truth, spec, trace, sim) if truth is not None else (None, None)
            )
            if arrival_source is not None:
                # the reference draws arrivals as far ahead as any run goes
                fsettings = dataclasses.replace(fsettings, arrivals_ahead_seconds=fsettings.horizon_seconds)
            result = forecast(
                state_of(sim, oracle=oracle),
                history,
                fsettings,
                run_times=run_times,
                arrival_source=arrival_source,
            )
            wall[name].append(time.perf_counter() - began)
            for job in waiting:
                jf = result.jobs[job]
                estimate = baseline.get(job)
                made[name].append(
                    Made(
                        job=job,
                        made=now,
                        p10=jf.p10,
                        p50=jf.p50,
                        p90=jf.p90,
                        baseline=(estimate - origin).total_seconds() if estimate is not None else None,
                        waiting=len(waiting),
                        pool=pools.get(job, ""),
                    )
                )
        for name, (base, calibration) in calibrated.items():
            began = time.perf_counter()
            learnt = learn(outcomes_of(made[base], now, sim, trace.start), calibration)
            wall[name].append(time.perf_counter() - began)
            made[name].extend(calibrated_made(m, learnt) for m in made[base] if m.made == now)
        if progress:
            took = ", ".join(f"{name} {wall[name][-1]:.2f} s" for name in configured)
            print(f"  {now / 86400:.2f} d: {len(waiting)} waiting, {took}", flush=True)

    sim = Simulation(
        trace,
        SagequeuePolicy(),
        settings,
        timings,
        horizon_seconds=horizon_seconds,
        progress=observe,
        timeline=False,
    )
    sim.run()
    starts = {name: _starts(run.job.history, trace.start) for name, run in sim.runs.items()}
    scored: dict[str, tuple[Score, list[Made]]] = {}
    for name in variants:
        score = Score(seconds=wall[name])
        for forecast_made in made[name]:
            actual = _next_start(starts.get(forecast_made.job, []), forecast_made.made)
            if actual is None:
                continue  # it never started within the run: nothing to compare with
            forecast_made.actual = actual - forecast_made.made
            score.add(forecast_made, forecast_made.actual)
        scored[name] = (score, made[name])
    return scored


def outcomes_of(made: Iterable[Made], now: float, sim: Simulation, origin: datetime) -> list[Outcome]:
    """What came of forecasts made before `now`, as far as the run has got: the start that followed, or,
    for a job still waiting, how long it has waited since (nothing later is read)."""
    starts: dict[str, list[float]] = {}
    out = []
    for m in made:
        if m.made >= now:
            continue
        if m.job not in starts:
            starts[m.job] = [s for s in _starts(sim.runs[m.job].job.history, origin) if s <= now]
        started = _next_start(starts[m.job], m.made)
        out.append(
            Outcome(
                pool=m.pool,
                age=now - m.made,
                quantiles=(m.p10, m.p50, m.p90),
                started=None if started is None else started - m.made,
                waited=now - m.made,
            )
        )
    return out


def calibrated_made(made: Made, calibration: Calibration) -> Made:
    """A forecast with its quantiles calibrated (the job, moment and estimate are the same)."""
    p10, p50, p90 = calibration.apply(made.pool, (made.p10, made.p50, made.p90))
    return dataclasses.replace(made, p10=p10, p50=p50, p90=p90)


def _starts(history: Iterable[dict[str, object]], origin: datetime) -> list[float]:
    out = []
    for entry in history:
        if entry.get("state") == JobState.STARTING.value:
            at = datetime.fromisoformat(str(entry["at"]))
            out.append((at - origin).total_seconds())
    return out


def _next_start(starts: list[float], after: float) -> float | None:
    return next((s for s in starts if s >= after), None)


__all__ = [
    "Made",
    "RealArrivals",
    "Score",
    "TrueArrivals",
    "TrueRunTimes",
    "baseline_of",
    "calibrated_made",
    "forecast_settings",
    "history_of",
    "oracle_sources",
    "outcomes_of",
    "scored_run",
    "scored_runs",
    "state_of",
]
