"""When queued jobs may start: the simple estimate `sagequeue ls --start` showed before forecasts
(`sagequeue.forecast`); kept as the baseline bench/bench_forecast.py scores forecasts against.

The estimate replays one pool's queue in order on its capacity: each running attempt frees its instances
when it has run the pool's typical duration (the mean run time of the pool's completed jobs), each queued job
starts when enough instances are free and then holds them for that typical duration. It knows nothing of
preemption, warm pools or jobs submitted later, so it is a guide, not a promise; without a completed job in
the pool there is no typical duration and no estimate.

Pure: no I/O, no clock; the caller passes the jobs and `now`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Protocol


class _Job(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def instances(self) -> int: ...
    @property
    def started_at(self) -> datetime | None: ...
    @property
    def ended_at(self) -> datetime | None: ...


def typical_duration(completed: Iterable[_Job]) -> float | None:
    """Mean seconds from start to end of completed jobs; None when there is none."""
    spans = [
        (job.ended_at - job.started_at).total_seconds()
        for job in completed
        if job.started_at is not None and job.ended_at is not None and job.ended_at >= job.started_at
    ]
    return sum(spans) / len(spans) if spans else None


def estimate_starts(
    capacity: int,
    live: Sequence[_Job],
    queued_in_order: Sequence[_Job],
    duration: float | None,
    now: datetime,
) -> dict[str, datetime | None]:
    """Estimated start of each queued job (queue order, first first), by name; None when it cannot start
    (larger than the pool, or no typical duration)."""
    if duration is None or duration <= 0:
        return {job.name: None for job in queued_in_order}
    # the moment each instance of the pool is free, earliest first
    free_at: list[datetime] = []
    for job in live:
        started = job.started_at or now
        ends = max(now, started + timedelta(seconds=duration))
        free_at.extend([ends] * max(job.instances, 1))
    free_at = sorted(free_at)[:capacity]
    free_at += [now] * max(capacity - len(free_at), 0)
    heapq.heapify(free_at)
    starts: dict[str, datetime | None] = {}
    for job in queued_in_order:
        need = max(job.instances, 1)
        if need > capacity:
            starts[job.name] = None  # it cannot start until the pool grows
            continue
        taken = [heapq.heappop(free_at) for _ in range(need)]
        start = max(taken)
        starts[job.name] = start
        for _ in range(need):
            heapq.heappush(free_at, start + timedelta(seconds=duration))
    return starts
