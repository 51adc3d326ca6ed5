"""A scheduling pass reads what it needs by Query, so its DynamoDB reads do not grow with the queue.

The figures are counted on the repository's own botocore client (the one the handlers use) with event
hooks: requests per operation, and the read capacity DynamoDB reports it consumed.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from conftest import START, SUBMITTER, TRN1, TRN2, QueueWorld, make_world, training_request

from sagequeue_core.domain import Job

READ_OPERATIONS = {"GetItem", "Query", "Scan", "BatchGetItem", "TransactGetItems"}


@dataclass
class ReadMeter:
    requests: Counter[str] = field(default_factory=Counter)
    read_units: float = 0.0
    items_returned: int = 0

    def before(self, model: Any, **_: Any) -> None:
        self.requests[model.name] += 1

    def after(self, model: Any, parsed: dict[str, Any], **_: Any) -> None:
        if model.name in READ_OPERATIONS:
            self.read_units += float((parsed.get("ConsumedCapacity") or {}).get("CapacityUnits", 0.0))
            self.items_returned += len(parsed.get("Items", []))

    @property
    def reads(self) -> int:
        return sum(n for op, n in self.requests.items() if op in READ_OPERATIONS)


@contextmanager
def metered(world: QueueWorld) -> Iterator[ReadMeter]:
    """Count the DynamoDB requests (and read units) the repository's client makes inside the block."""
    meter = ReadMeter()
    events = world.deps.store.client.meta.events
    events.register("before-call.dynamodb.*", meter.before)
    events.register("after-call.dynamodb.*", meter.after)
    try:
        yield meter
    finally:
        events.unregister("before-call.dynamodb.*", meter.before)
        events.unregister("after-call.dynamodb.*", meter.after)


def measure_pass(world: QueueWorld) -> ReadMeter:
    """One scheduler invocation for a JobChanged event, metered."""
    with metered(world) as meter:
        world.schedule(
            {
                "version": "0",
                "id": str(uuid.uuid4()),
                "source": "sagequeue",
                "detail-type": "JobChanged",
                "detail": {"name": "x", "change": "changed"},
            }
        )
    return meter


def queue_of(world: QueueWorld, queued: int) -> None:
    """Both instances busy, then `queued` waiting jobs (bulk-loaded: submitting 10,000 over the API would
    only measure the API)."""
    world.submit("running-1", duration=7200, priority=900)
    world.submit("running-2", duration=7200, priority=900)
    jobs = []
    for n in range(queued):
        body = training_request(f"waiting-{n:05d}", priority=n % 7)
        body.pop("priority")
        jobs.append(
            Job(
                name=body["TrainingJobName"],
                request=body,
                priority=n % 7,
                owner=SUBMITTER,
                submitted_at=START + timedelta(milliseconds=n),
            )
        )
    world.deps.store.import_jobs(jobs)


@pytest.fixture
def two_pools(moto_endpoint: str) -> Iterator[QueueWorld]:
    yield from make_world(moto_endpoint, capacity={TRN1: 2, TRN2: 1}, settings={"queue_lookahead": 20})


@pytest.mark.slow
def test_reads_per_pass_do_not_grow_with_the_number_of_queued_jobs(moto_endpoint: str) -> None:
    meters: dict[int, ReadMeter] = {}
    for queued in (10, 10_000):
        for world in make_world(moto_endpoint, settings={"queue_lookahead": 20}):
            queue_of(world, queued)
            assert world.api("GET", "/pools")[1]["pools"][0]["queued"] == queued
            meters[queued] = measure_pass(world)
            assert world.reports[-1]["started"] == []
    small, large = meters[10], meters[10_000]
    print(
        f"\nreads per pass: 10 queued -> {small.reads} requests, {small.read_units} RCU, "
        f"{small.items_returned} items; 10,000 queued -> {large.reads} requests, {large.read_units} RCU, "
        f"{large.items_returned} items; by operation {dict(large.requests)}"
    )
    assert large.requests["Scan"] == 0
    assert large.reads == small.reads
    # the queued window is the lookahead (20), not the queue: at most 10 more items than with 10 queued
    assert large.items_returned <= small.items_returned + 10
    assert large.read_units <= small.read_units + 10 * 2


def test_a_pass_reads_once_per_pool_plus_a_constant(two_pools: QueueWorld) -> None:
    meter = measure_pass(two_pools)
    # pools (1), the queued window of each pool (2), live attempts (1), external attempts (1), warm pools (1)
    assert meter.requests["Query"] == 6
    assert meter.requests["Scan"] == 0
    assert meter.requests["GetItem"] == 0


@pytest.mark.slow
def test_waiting_reasons_are_written_once_and_in_batches(moto_endpoint: str) -> None:
    for world in make_world(moto_endpoint, settings={"queue_lookahead": 150}):
        # GIVEN both instances busy and 150 jobs waiting behind them, none told why yet
        queue_of(world, 150)
        # WHEN a pass runs, then another with nothing changed
        first, second = measure_pass(world), measure_pass(world)
        # THEN the first writes the 150 reasons in two requests (100 per transaction), the second nothing
        assert first.requests["TransactWriteItems"] == 2
        assert first.requests["PutItem"] == first.requests["UpdateItem"] == 0
        writes = {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"}
        assert sum(n for op, n in second.requests.items() if op in writes) == 0
        waiting = world.api("GET", "/jobs/waiting-00149")[1]
        assert waiting["reason"].startswith("waiting for capacity")
