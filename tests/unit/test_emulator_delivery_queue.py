"""The delivery queue's promises, for any policy and seed: late within bounds, 1..max copies, lost means never."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from sagequeue.local.emulator.delivery import DeliveryQueue, EventDelivery

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)

policies = st.builds(
    lambda dup, copies, low, spread, loss: EventDelivery(
        duplicate_share=dup if copies > 1 else 0.0,
        max_copies=copies,
        min_delay_seconds=low,
        max_delay_seconds=low + spread,
        loss_share=loss,
    ),
    st.floats(0, 1),
    st.integers(1, 4),
    st.floats(0, 30),
    st.floats(0, 60),
    st.floats(0, 1),
)


def run(
    policy: EventDelivery, seed: int, changes: list[float]
) -> tuple[DeliveryQueue, list[tuple[datetime, Any]]]:
    queue = DeliveryQueue(policy, random.Random(seed))
    for index, offset in enumerate(changes):
        queue.add({"id": queue.new_id(), "change": index}, START + timedelta(seconds=offset))
    delivered: list[tuple[datetime, Any]] = []
    moment = START
    while (due := queue.next_due()) is not None:
        moment = max(moment, due)
        delivered.extend((moment, event) for event in queue.pop_due(moment))
    return queue, delivered


@settings(max_examples=150, deadline=None)
@given(policies, st.integers(0, 2**32), st.lists(st.floats(0, 3600), min_size=1, max_size=40))
def test_every_change_is_delivered_late_within_bounds_one_to_max_times_unless_lost(
    policy: EventDelivery, seed: int, offsets: list[float]
) -> None:
    changes = sorted(offsets)
    queue, delivered = run(policy, seed, changes)
    lost = {event["change"] for event in queue.lost}
    counts: dict[int, int] = {}
    for moment, event in delivered:
        change = event["change"]
        delay = (moment - (START + timedelta(seconds=changes[change]))).total_seconds()
        assert policy.min_delay_seconds - 1e-6 <= delay <= policy.max_delay_seconds + 1e-6
        counts[change] = counts.get(change, 0) + 1
    assert not lost & set(counts)
    assert lost | set(counts) == set(range(len(changes)))
    assert all(1 <= n <= policy.max_copies for n in counts.values())
    assert len({event["id"] for _, event in delivered}) == len(delivered)
    moments = [moment for moment, _ in delivered]
    assert moments == sorted(moments)


@settings(max_examples=50, deadline=None)
@given(policies, st.integers(0, 2**32), st.lists(st.floats(0, 600), min_size=1, max_size=20))
def test_the_same_seed_replays_the_same_deliveries(
    policy: EventDelivery, seed: int, offsets: list[float]
) -> None:
    _, first = run(policy, seed, sorted(offsets))
    _, again = run(policy, seed, sorted(offsets))
    assert first == again


def test_exactly_once_in_order_delivers_each_change_once_at_its_moment() -> None:
    changes = [0.0, 0.0, 1.5, 2.0, 2.0, 10.0]
    queue, delivered = run(EventDelivery.exactly_once_in_order(), 9, changes)
    assert [event["change"] for _, event in delivered] == list(range(len(changes)))
    assert [(m - START).total_seconds() for m, _ in delivered] == changes
    assert queue.lost == []
