"""Two passes racing never start on one instance.

Reserved concurrency 1 makes two scheduler invocations at once rare, not impossible (asynchronous retries,
the timer). Here a second pass runs inside the first, at every step of it in turn (before each call the
first makes to DynamoDB or SageMaker): a job more important than the first pass's picks is submitted
there, and its submission runs a pass of its own. Whatever the step, SageMaker never holds more than the
pool, checked by the invariant monitor after every SageMaker call and every step of the clock.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from conftest import TRN1, QueueWorld, make_world, training_request

from sagequeue_core.domain import Pool
from sagequeue_core.service.schedule import run_pass

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support.invariants import InvariantMonitor, advance, monitored

CAPACITY = 2


@contextmanager
def _world(moto_endpoint: str) -> Iterator[tuple[QueueWorld, InvariantMonitor]]:
    worlds = monitored(make_world(moto_endpoint, capacity={TRN1: CAPACITY}))
    try:
        yield next(worlds)
    finally:
        worlds.close()


def _queued_behind_a_drained_pool(world: QueueWorld) -> None:
    """Two jobs queued while the pool is drained, then the pool given back: the next pass starts both."""
    world.deps.store.set_capacity(Pool(TRN1, 0))
    for name in ("first", "second"):
        status, body = world.api("POST", "/jobs", training_request(name, priority=5, duration=3600))
        assert status == 201, body
    assert world.emulator.instances_in_use().get(TRN1, 0) == 0
    world.deps.store.set_capacity(Pool(TRN1, CAPACITY))


def _every_call(world: QueueWorld, at: int, interleave: Callable[[], None]) -> Callable[[], int]:
    """Run `interleave` before the `at`-th call the pass makes (DynamoDB or SageMaker); returns a counter
    of the calls seen (outside `interleave`)."""
    seen = 0
    inside = False

    def before(**_: Any) -> None:
        nonlocal seen, inside
        if inside:
            return
        seen += 1
        if seen == at:
            inside = True
            try:
                interleave()
            finally:
                inside = False

    clients = (world.deps.store.client, world.deps.sagemaker.client)
    for client in clients:
        client.meta.events.register("before-call.*.*", before)

    def calls() -> int:
        for client in clients:
            client.meta.events.unregister("before-call.*.*", before)
        return seen

    return calls


def test_a_pass_run_inside_another_at_any_step_never_overbooks_the_pool(moto_endpoint: str) -> None:
    # GIVEN the steps of one pass that starts two jobs on a pool of two
    with _world(moto_endpoint) as (world, monitor):
        _queued_behind_a_drained_pool(world)
        steps = _every_call(world, 0, lambda: None)
        run_pass(world.deps)
        total = steps()
        assert world.emulator.instances_in_use()[TRN1] == CAPACITY
    assert total >= 4
    outcomes: dict[int, int] = {}
    for at in range(1, total + 1):
        with _world(moto_endpoint) as (world, monitor):
            _queued_behind_a_drained_pool(world)

            def urgent(world: QueueWorld = world) -> None:
                # WHEN a priority-9 job is submitted at this step: its submission runs a second pass
                status, body = world.api(
                    "POST", "/jobs", training_request("urgent", priority=9, duration=600)
                )
                assert status == 201, body

            steps = _every_call(world, at, urgent)
            run_pass(world.deps)
            steps()
            monitor.check_settled()
            # THEN at no step did SageMaker hold more than the pool, and nothing runs untracked
            held = world.emulator.instances_in_use().get(TRN1, 0)
            assert held <= CAPACITY, f"step {at}: SageMaker holds {held} of {CAPACITY}"
            assert monitor.violations == [], f"step {at}: {monitor.violations}"
            # AND the queue goes on from there: nothing left untracked or over the pool as the clock moves
            advance(world, monitor, 180)
            assert monitor.violations == [], f"step {at}: {monitor.violations}"
            assert world.emulator.instances_in_use().get(TRN1, 0) <= CAPACITY
            outcomes[at] = held
    assert outcomes
