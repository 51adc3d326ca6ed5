"""A seeded workload generator: what a team on a few Trainium pools submits over weeks.

Arrivals are bursty and follow office hours (weekdays 09:00-19:00 UTC carry most of them, nights and weekends
a trickle); priorities, instance types and counts (including 4- and 8-instance gang jobs) are drawn with
weights; training times are log-normal; a share of arrivals are sweeps, families of jobs with one resource
key and a keep-alive, submitted minutes apart. The same seed gives the same trace, on every machine.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from sagequeue.sim.trace import DEFAULT_START, Trace, TraceJob

_T = TypeVar("_T")
HOUR = 3600.0
DAY = 24 * HOUR


@dataclass(frozen=True)
class WorkloadSpec:
    """What to generate. The defaults are the documented 21-day trace (docs/simulator.md)."""

    jobs: int = 350
    days: float = 21.0
    #: instance type -> share of arrivals
    instance_types: Mapping[str, float] = field(
        default_factory=lambda: {"ml.trn1.32xlarge": 0.7, "ml.trn2.48xlarge": 0.3}
    )
    #: instances per job -> share; counts above a pool's capacity are clipped to it
    counts: Mapping[int, float] = field(default_factory=lambda: {1: 0.62, 2: 0.2, 4: 0.12, 8: 0.06})
    #: priority -> share
    priorities: Mapping[int, float] = field(
        default_factory=lambda: {1: 0.3, 3: 0.25, 5: 0.3, 6: 0.1, 9: 0.05}
    )
    #: training time: log-normal with this median (seconds) and sigma, clipped to [min, max]
    median_duration_seconds: float = 1.5 * HOUR
    duration_sigma: float = 1.0
    min_duration_seconds: float = 300.0
    max_duration_seconds: float = 48 * HOUR
    #: share of arrivals that open a sweep, and its size
    sweep_share: float = 0.15
    sweep_size: tuple[int, int] = (3, 8)
    sweep_keep_alive_seconds: tuple[int, int] = (600, 1800)
    #: share of jobs that keep checkpoints, and how often
    checkpoint_share: float = 0.7
    checkpoint_minutes: Sequence[float] = (10.0, 30.0, 60.0)
    #: share of checkpointing jobs whose interval drifts, and how far each interval may differ from the
    #: one before; drawn from the job's name, not from the seed's stream, so a seed keeps its jobs
    checkpoint_drift_share: float = 0.3
    checkpoint_drift: float = 0.25
    #: relative arrival rate by hour of a weekday (UTC) and on a weekend day
    weekday_rate: Sequence[float] = (
        (0.1,) * 7
        + (0.4, 0.8)
        + (1.0, 1.0, 1.0, 0.6, 1.0, 1.0, 1.0, 1.0, 0.9, 0.9)
        + (0.4, 0.2, 0.1, 0.1, 0.1)
    )
    weekend_rate: float = 0.08
    #: share of arrivals that come in a burst (a few jobs within minutes of each other)
    burst_share: float = 0.25
    capacity: Mapping[str, int] | None = None  # clip counts to these pools' capacities


def generate(spec: WorkloadSpec | None = None, *, seed: int = 0) -> Trace:
    spec = spec or WorkloadSpec()
    if spec.jobs < 1:
        raise ValueError("a workload needs at least one job")
    if spec.days <= 0:
        raise ValueError("a workload spans a positive number of days")
    rng = random.Random(seed)
    sizes = _group_sizes(spec, rng)
    jobs: list[TraceJob] = []
    for (kind, size), arrival in zip(sizes, _arrivals(spec, rng, len(sizes)), strict=True):
        jobs.extend(_group(spec, rng, arrival, kind=kind, size=size, number=len(jobs)))
    jobs.sort(key=lambda j: (j.submit_seconds, j.name))
    description = f"generated: seed {seed}, {len(jobs)} jobs over {spec.days:g} days"
    return Trace(tuple(jobs), start=DEFAULT_START, description=description)


def _group_sizes(spec: WorkloadSpec, rng: random.Random) -> list[tuple[str, int]]:
    """The groups of submissions (a single job, a burst or a sweep) and their sizes, adding up to the jobs."""
    groups: list[tuple[str, int]] = []
    left = spec.jobs
    while left > 0:
        draw = rng.random()
        if draw < spec.sweep_share:
            kind, size = "sweep", rng.randint(*spec.sweep_size)
        elif draw < spec.sweep_share + spec.burst_share:
            kind, size = "burst", rng.randint(2, 4)
        else:
            kind, size = "single", 1
        size = min(size, left)
        groups.append((kind, size))
        left -= size
    return groups


def _arrivals(spec: WorkloadSpec, rng: random.Random, count: int) -> list[float]:
    """`count` arrival times over the span following the office-hours rate: given their number, the times
    of a non-homogeneous Poisson process are independent draws with density proportional to the rate
    (drawn here by rejection), sorted."""
    horizon = spec.days * DAY
    peak = max(max(spec.weekday_rate), spec.weekend_rate)
    times: list[float] = []
    while len(times) < count:
        t = rng.uniform(0, horizon)
        if rng.random() * peak < _rate(spec, t):
            times.append(t)
    times.sort()
    return times


def _rate(spec: WorkloadSpec, seconds: float) -> float:
    day = int(seconds // DAY)
    if day % 7 >= 5:  # the trace starts on a Monday
        return spec.weekend_rate
    return spec.weekday_rate[int(seconds % DAY // HOUR)]


def _group(
    spec: WorkloadSpec, rng: random.Random, at: float, *, kind: str, size: int, number: int
) -> list[TraceJob]:
    if kind == "sweep":
        family = f"sweep-{number:04d}"
        template = _job(spec, rng, at, f"{family}-1", family=family)
        keep_alive = rng.randint(*spec.sweep_keep_alive_seconds)
        out = []
        moment = at
        for index in range(size):
            out.append(
                TraceJob(
                    name=f"{family}-{index + 1}",
                    submit_seconds=round(moment, 3),
                    priority=template.priority,
                    instance_type=template.instance_type,
                    instance_count=template.instance_count,
                    duration_seconds=_duration(spec, rng),
                    keep_alive_seconds=keep_alive,
                    family=family,
                    checkpoint_minutes=template.checkpoint_minutes,
                    checkpoint_drift=_drift(spec, f"{family}-{index + 1}", template.checkpoint_minutes),
                )
            )
            moment += rng.uniform(30, 600)
        return out
    if kind == "burst":
        out = []
        moment = at
        for index in range(size):
            out.append(_job(spec, rng, moment, f"job-{number + index:04d}"))
            moment += rng.uniform(5, 300)
        return out
    return [_job(spec, rng, at, f"job-{number:04d}")]


def _job(
    spec: WorkloadSpec, rng: random.Random, at: float, name: str, *, family: str | None = None
) -> TraceJob:
    instance_type = _pick(rng, spec.instance_types)
    count = _pick(rng, spec.counts)
    if spec.capacity and instance_type in spec.capacity:
        count = max(1, min(count, spec.capacity[instance_type]))
    checkpoint = rng.choice(list(spec.checkpoint_minutes)) if rng.random() < spec.checkpoint_share else None
    return TraceJob(
        name=name,
        submit_seconds=round(at, 3),
        priority=_pick(rng, spec.priorities),
        instance_type=instance_type,
        instance_count=count,
        duration_seconds=_duration(spec, rng),
        keep_alive_seconds=0,
        family=family,
        checkpoint_minutes=checkpoint,
        checkpoint_drift=_drift(spec, name, checkpoint),
    )


def _drift(spec: WorkloadSpec, name: str, checkpoint: float | None) -> float | None:
    """The drift of a job's checkpoint interval, or None: from a hash of its name, so that adding drift
    left the seed's random stream, and so every other field of the seed's jobs, as it was."""
    if not checkpoint or spec.checkpoint_drift_share <= 0:
        return None
    draw = zlib.crc32(f"checkpoint-drift:{name}".encode()) / 0xFFFFFFFF
    return spec.checkpoint_drift if draw < spec.checkpoint_drift_share else None


def _duration(spec: WorkloadSpec, rng: random.Random) -> float:
    value = rng.lognormvariate(math.log(spec.median_duration_seconds), spec.duration_sigma)
    return round(min(max(value, spec.min_duration_seconds), spec.max_duration_seconds))


def _pick(rng: random.Random, weights: Mapping[_T, float]) -> _T:
    keys = list(weights)
    return rng.choices(keys, weights=[weights[k] for k in keys])[0]


__all__ = ["WorkloadSpec", "generate"]
