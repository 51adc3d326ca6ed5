"""No two concurrent passes exceed a pool, whatever the queues and wherever the second pass runs (hypothesis).

Reserved concurrency 1 makes two scheduler invocations at once rare, not impossible. Hypothesis draws the
pools, the jobs queued behind them while an admin drained them, the step of the pass that follows the pools'
return (the timer's: reconcile and pass) where a second pass runs (before the n-th call of one operation,
DynamoDB's or SageMaker's), and what that second pass is: more submissions, each running a pass of its own,
or the timer again. The store is the real one on moto's server and SageMaker the emulator in its AWS
profile; the invariant monitor checks SageMaker's side after every SageMaker call of either pass and every
step of the clock: no pool held beyond its capacity, no job with two live attempts, nothing untracked.

The examples are derandomized (the same ones every run, as CI needs); `SAGEQUEUE_PROPERTY_EXAMPLES=N` runs
N examples from a fresh random seed instead, to look further.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from conftest import ACCOUNT, TRN1, TRN2, QueueWorld, make_world, training_request
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sagequeue_core.domain import Pool
from sagequeue_core.service.schedule import handle_event

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support.invariants import InvariantMonitor, advance, monitored

#: (pool, instances, priority, seconds) of one job
JobSpec = tuple[str, int, int, int]
#: What a pass calls (the store's DynamoDB operations, the scheduler's SageMaker ones); the second pass runs
#: before the n-th call of one of them (after the pass, if it makes fewer)
OPERATIONS = (
    "Query",
    "GetItem",
    "BatchGetItem",
    "PutItem",
    "UpdateItem",
    "TransactWriteItems",
    "ListTrainingJobs",
    "DescribeTrainingJob",
    "CreateTrainingJob",
    "StopTrainingJob",
)

_EXPLORE = int(os.environ.get("SAGEQUEUE_PROPERTY_EXAMPLES", "0"))
PROPERTY_SETTINGS = settings(
    max_examples=_EXPLORE or 8,
    derandomize=not _EXPLORE,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@st.composite
def cases(draw: st.DrawFn) -> tuple[dict[str, int], list[JobSpec], list[JobSpec]]:
    """Pools, the jobs queued behind them while drained, and the jobs submitted inside the first pass (none:
    the second pass is the timer's, as often as not)."""
    capacity = {TRN1: draw(st.integers(1, 3)), TRN2: draw(st.integers(1, 2))}

    def jobs(most: int, least: int) -> list[JobSpec]:
        specs = []
        for _ in range(draw(st.integers(least, most))):
            pool = draw(st.sampled_from(sorted(capacity)))
            specs.append(
                (
                    pool,
                    draw(st.integers(1, capacity[pool])),
                    draw(st.integers(0, 9)),
                    draw(st.sampled_from([300, 1800])),
                )
            )
        return specs

    return capacity, jobs(4, 1), jobs(2, 1) if draw(st.booleans()) else []


@contextmanager
def _world(moto_endpoint: str, capacity: dict[str, int]) -> Iterator[tuple[QueueWorld, InvariantMonitor]]:
    worlds = monitored(make_world(moto_endpoint, capacity=capacity))
    try:
        yield next(worlds)
    finally:
        worlds.close()


def _submit(world: QueueWorld, name: str, spec: JobSpec) -> None:
    pool, count, priority, seconds = spec
    status, body = world.api(
        "POST",
        "/jobs",
        training_request(name, priority=priority, duration=seconds, instance_type=pool, count=count),
    )
    assert status == 201, body


def _before(world: QueueWorld, operation: str, nth: int, second: Callable[[], None]) -> Callable[[], int]:
    """Run `second` once, before the `nth` call of `operation` the pass makes (DynamoDB or SageMaker), or
    after the pass if it makes fewer; returns a function that unhooks, runs `second` if it has not run, and
    says how many calls the pass made (outside `second`)."""
    seen: dict[str, int] = {}
    state = {"inside": False, "done": False}

    def run_second() -> None:
        state["inside"] = state["done"] = True
        try:
            second()
        finally:
            state["inside"] = False

    def before(event_name: str = "", **_: Any) -> None:
        if state["inside"]:
            return
        name = event_name.rsplit(".", 1)[-1]
        seen[name] = seen.get(name, 0) + 1
        if not state["done"] and name == operation and seen[name] == nth:
            run_second()

    clients = (world.deps.store.client, world.deps.sagemaker.client)
    for client in clients:
        client.meta.events.register("before-call.*.*", before)

    def unhook() -> int:
        for client in clients:
            client.meta.events.unregister("before-call.*.*", before)
        if not state["done"]:
            run_second()
        return sum(seen.values())

    return unhook


def _timer_event(world: QueueWorld) -> dict[str, Any]:
    """The Scheduled Event of the scheduler's one-minute rule."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": ACCOUNT,
        "time": world.clock.now().strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": "us-east-1",
        "resources": [f"arn:aws:events:us-east-1:{ACCOUNT}:rule/reconcile"],
        "detail": {},
    }


@PROPERTY_SETTINGS
@given(case=cases(), operation=st.sampled_from(OPERATIONS), nth=st.integers(1, 4))
# once failed: the timer's reconcile, inside the first pass's create, called the intent never created
@example(case=({TRN1: 1, TRN2: 1}, [(TRN1, 1, 0, 300)], []), operation="CreateTrainingJob", nth=1)
def test_no_two_concurrent_passes_exceed_a_pool(
    moto_endpoint: str,
    case: tuple[dict[str, int], list[JobSpec], list[JobSpec]],
    operation: str,
    nth: int,
) -> None:
    capacity, queued, inside = case
    with _world(moto_endpoint, capacity) as (world, monitor):
        # GIVEN jobs queued while an admin drained the pools, then the pools given back
        for pool in capacity:
            world.deps.store.set_capacity(Pool(pool, 0))
        for i, spec in enumerate(queued):
            _submit(world, f"queued-{i}", spec)
        for pool, instances in capacity.items():
            world.deps.store.set_capacity(Pool(pool, instances))
        assert not world.emulator.instances_in_use()

        # WHEN the timer's pass runs and, before the call of it hypothesis picks, a second pass runs inside it
        def second() -> None:
            if inside:
                for i, spec in enumerate(inside):
                    _submit(world, f"inside-{i}", spec)  # each submission runs a pass
            else:
                world.timer()

        unhook = _before(world, operation, nth, second)
        try:
            # the handler's work without its frame, so the test's own requests inside it are the test's
            handle_event(world.deps, _timer_event(world))
        finally:
            calls = unhook()
        assert calls > 0

        # THEN SageMaker never held more than a pool (checked after every SageMaker call of both passes)
        monitor.check_settled()
        assert monitor.violations == []
        held = world.emulator.instances_in_use()
        assert all(held.get(pool, 0) <= instances for pool, instances in capacity.items()), held
        # AND nothing is overbooked, doubled or left untracked as the queue goes on from there
        advance(world, monitor, 300)
        assert monitor.violations == []
