"""The start estimate `sagequeue ls --start` shows: a replay of one pool's queue on its capacity."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from sagequeue.estimate import estimate_starts, typical_duration

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class J:
    name: str
    instances: int = 1
    started_at: datetime | None = None
    ended_at: datetime | None = None


def test_typical_duration_is_the_mean_run_time_of_completed_jobs() -> None:
    done = [
        J("a", started_at=NOW, ended_at=NOW + timedelta(minutes=10)),
        J("b", started_at=NOW, ended_at=NOW + timedelta(minutes=20)),
        J("never-started"),
    ]
    assert typical_duration(done) == 900.0
    assert typical_duration([J("x")]) is None


def test_one_instance_queue_starts_one_after_another() -> None:
    live = [J("running", started_at=NOW - timedelta(minutes=4))]
    queued = [J("q1"), J("q2"), J("too-big", instances=3), J("q3")]
    starts = estimate_starts(1, live, queued, 600.0, NOW)
    assert starts == {
        "q1": NOW + timedelta(minutes=6),
        "q2": NOW + timedelta(minutes=16),
        "too-big": None,  # larger than the pool: it cannot start until the pool grows
        "q3": NOW + timedelta(minutes=26),
    }


def test_a_job_that_outran_the_typical_duration_frees_its_instance_now_not_in_the_past() -> None:
    live = [J("long", started_at=NOW - timedelta(hours=3))]
    assert estimate_starts(1, live, [J("q")], 600.0, NOW) == {"q": NOW}


def test_no_typical_duration_means_no_estimate() -> None:
    assert estimate_starts(2, [], [J("q")], None, NOW) == {"q": None}


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(min_value=1, max_value=6),
    running=st.lists(st.tuples(st.integers(1, 3), st.integers(0, 7200)), max_size=6),
    queued=st.lists(st.integers(1, 4), max_size=12),
    duration=st.floats(min_value=1, max_value=86400),
)
def test_estimates_never_precede_now_and_never_overcommit_the_pool(
    capacity: int, running: list[tuple[int, int]], queued: list[int], duration: float
) -> None:
    live = [
        J(f"r{i}", instances=n, started_at=NOW - timedelta(seconds=ago)) for i, (n, ago) in enumerate(running)
    ]
    waiting = [J(f"q{i}", instances=n) for i, n in enumerate(queued)]
    starts = estimate_starts(capacity, live, waiting, duration, NOW)
    assert set(starts) == {j.name for j in waiting}
    intervals = []
    for job in waiting:
        start = starts[job.name]
        if job.instances > capacity:
            assert start is None
            continue
        assert start is not None
        assert start >= NOW
        intervals.append((start, start + timedelta(seconds=duration), job.instances))
    # at any estimated start, the estimated jobs running then use at most the pool's capacity
    for moment, _, _ in intervals:
        in_use = sum(n for begin, end, n in intervals if begin <= moment < end)
        assert in_use <= capacity
