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
import statistics
import time
from collections.abc import Iterable, Mapping
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
from sagequeue.sim.engine import SimSettings, Simulation
from sagequeue.sim.sagemaker import Timings
from sagequeue.sim.schedulers import SagequeuePolicy, TrackedPool
from sagequeue.sim.trace import Trace
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
    work: dict[str, Work] = {}
    for job in (*queued, *live):
        run = sim.runs[job.name]
        work[job.name] = Work(
            traits=_traits(run.spec.instance_count),
            trained_seconds=run.saved_work,
            keep_alive_seconds=run.spec.keep_alive_seconds,
            resource_key=job.resource_key,
            known_total_seconds=run.spec.duration_seconds if oracle else None,
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
) -> dict[str, tuple[Score, list[Made]]]:
    """`scored_run` for several forecasts at once, side by side in one run of the trace: each variant is
    a set of changes to the forecast's settings (`oracle: True` for the reference that knows training
    times), forecast at the same moments from the same observations.

    A variant `{"calibrate": "now"}` (optionally with `"calibration": CalibrationSettings(...)`) runs no
    forecast of its own: it is variant "now"'s forecasts (given before it) each calibrated when made, by
    what "now"'s earlier forecasts got wrong as far as the run had got (`calibrated_made`)."""
    timings = timings or Timings()
    made: dict[str, list[Made]] = {name: [] for name in variants}
    wall: dict[str, list[float]] = {name: [] for name in variants}
    configured: dict[str, tuple[ForecastSettings, bool]] = {}
    calibrated: dict[str, tuple[str, CalibrationSettings]] = {}
    for name, changes in variants.items():
        changes = dict(changes)
        if "calibrate" in changes:
            base = str(changes["calibrate"])
            calibration = changes.get("calibration") or CalibrationSettings()
            assert isinstance(calibration, CalibrationSettings)
            calibrated[name] = (base, calibration)
            continue
        oracle = bool(changes.pop("oracle", False))
        configured[name] = (forecast_settings(settings, timings, **changes), oracle)
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
        for name, (fsettings, oracle) in configured.items():
            began = time.perf_counter()
            result = forecast(state_of(sim, oracle=oracle), history, fsettings)
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
    "Score",
    "baseline_of",
    "calibrated_made",
    "forecast_settings",
    "history_of",
    "outcomes_of",
    "scored_run",
    "scored_runs",
    "state_of",
]
