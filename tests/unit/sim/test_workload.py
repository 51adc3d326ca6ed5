"""The workload generator: seeded, office-hours, weighted, gangs, log-normal durations, sweep families."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sagequeue.sim import WorkloadSpec, generate
from sagequeue.sim.workload import DAY, HOUR

CAPACITY = {"ml.trn1.32xlarge": 8, "ml.trn2.48xlarge": 4}


@pytest.fixture(scope="module")
def trace():  # type: ignore[no-untyped-def]
    return generate(WorkloadSpec(capacity=CAPACITY), seed=11)


def test_the_same_seed_gives_the_same_trace_and_another_seed_another() -> None:
    spec = WorkloadSpec(jobs=80, days=5)
    assert generate(spec, seed=4) == generate(spec, seed=4)
    assert generate(spec, seed=4) != generate(spec, seed=5)


def test_the_documented_trace_shape(trace) -> None:  # type: ignore[no-untyped-def]
    jobs = trace.jobs
    assert len(jobs) == 350
    assert len({j.name for j in jobs}) == 350
    assert all(0 <= j.submit_seconds < 21 * DAY for j in jobs)
    # arrivals cover the whole span, not only its start
    assert trace.last_submit_seconds > 19 * DAY
    assert min(j.submit_seconds for j in jobs) < 2 * DAY
    assert list(jobs) == sorted(jobs, key=lambda j: (j.submit_seconds, j.name))
    assert {j.instance_count for j in jobs} >= {1, 2, 4, 8}
    assert all(j.instance_count <= CAPACITY[j.instance_type] for j in jobs)
    assert {j.priority for j in jobs} == {1, 3, 5, 6, 9}


def test_office_hours_carry_most_arrivals(trace) -> None:  # type: ignore[no-untyped-def]
    def office(seconds: float) -> bool:
        day, hour = int(seconds // DAY), seconds % DAY / HOUR
        return day % 7 < 5 and 9 <= hour < 19

    share = sum(office(j.submit_seconds) for j in trace.jobs) / len(trace.jobs)
    # office hours are 30% of the week's hours
    assert share > 0.6


def test_durations_are_log_normal_around_the_median(trace) -> None:  # type: ignore[no-untyped-def]
    logs = [math.log(j.duration_seconds) for j in trace.jobs]
    assert abs(statistics.median(logs) - math.log(1.5 * HOUR)) < 0.3
    assert 0.7 < statistics.stdev(logs) < 1.3


def test_sweeps_share_a_family_shape_and_keep_alive(trace) -> None:  # type: ignore[no-untyped-def]
    families: dict[str, list] = {}  # type: ignore[type-arg]
    for job in trace.jobs:
        if job.family:
            families.setdefault(job.family, []).append(job)
    assert len(families) >= 5
    for members in families.values():
        assert (
            len({(j.instance_type, j.instance_count, j.priority, j.keep_alive_seconds) for j in members}) == 1
        )
        assert members[0].keep_alive_seconds >= 600
    assert all(j.keep_alive_seconds == 0 for j in trace.jobs if not j.family)


@settings(max_examples=20, deadline=None)
@given(jobs=st.integers(1, 120), days=st.floats(0.5, 30), seed=st.integers(0, 2**32))
def test_any_spec_gives_exactly_the_jobs_asked_for_within_the_span(jobs: int, days: float, seed: int) -> None:
    trace = generate(WorkloadSpec(jobs=jobs, days=days, capacity=CAPACITY), seed=seed)
    assert len(trace.jobs) == jobs
    # sweeps spread their members minutes apart past the last arrival at most
    assert all(0 <= j.submit_seconds < days * DAY + 8 * 600 for j in trace.jobs)
