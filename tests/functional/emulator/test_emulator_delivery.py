"""EventBridge delivery as AWS does it: late, some events more than once, not in order, some never; seeded."""

from __future__ import annotations

import itertools
import json
from datetime import datetime, timedelta
from typing import Any

import pytest

from sagequeue.local import SageMakerEmulator, VirtualClock
from sagequeue.local.emulator.delivery import EventDelivery
from tests.functional.emulator.conftest import START, TIMINGS

PHASES = ["Starting", "Downloading", "Training", "Uploading", "Completed"]


def run_scenario(
    make_request: Any, seed: int, delivery: EventDelivery | None = None, jobs: int = 12
) -> tuple[SageMakerEmulator, list[tuple[datetime, dict[str, Any]]]]:
    """Jobs created a second apart, each trained a little differently, then stopped or completed."""
    clock = VirtualClock(START)
    seen: list[tuple[datetime, dict[str, Any]]] = []
    emulator = SageMakerEmulator(
        clock=clock, on_event=lambda e: seen.append((clock.now(), e)), seed=seed, delivery=delivery, **TIMINGS
    )
    with emulator:
        client = emulator.client()
        for n in range(jobs):
            before = len(seen)
            client.create_training_job(
                **make_request(f"job-{n}", Environment={"SAGEQUEUE_SIM_DURATION": str(600 + 7 * n)})
            )
            if not emulator.delivery.immediate:
                assert len(seen) == before, "no event is delivered before the request that caused it returns"
            emulator.advance(1)
        emulator.advance(200)
        client.stop_training_job(TrainingJobName="job-0")
        emulator.advance(3000)
    return emulator, seen


def changes(event: dict[str, Any]) -> tuple[str, str, int]:
    detail = event["detail"]
    return detail["TrainingJobName"], detail["SecondaryStatus"], detail["LastModifiedTime"]


def test_default_delivery_is_late_repeated_and_out_of_order_but_never_early(make_request: Any) -> None:
    emulator, seen = run_scenario(make_request, seed=7)
    policy = EventDelivery()
    copies: dict[tuple[str, str, int], int] = {}
    for delivered_at, event in seen:
        changed_at = datetime.fromtimestamp(event["detail"]["LastModifiedTime"] / 1000, tz=START.tzinfo)
        delay = (delivered_at - changed_at).total_seconds()
        assert policy.min_delay_seconds <= delay <= policy.max_delay_seconds + 1e-6
        copies[changes(event)] = copies.get(changes(event), 0) + 1
    # every change arrives (no loss by default), some more than once, never more than three times
    assert set(copies.values()) <= {1, 2, 3}
    assert any(n > 1 for n in copies.values())
    assert len({e["id"] for _, e in seen}) == len(seen), "each copy has its own id"
    per_job: dict[str, list[str]] = {}
    for _, event in seen:
        per_job.setdefault(event["detail"]["TrainingJobName"], []).append(event["detail"]["SecondaryStatus"])
    for name, statuses in per_job.items():
        expected = (
            ["Starting", "Downloading", "Training", "Stopping", "Uploading", "Stopped"]
            if name == "job-0"
            else PHASES
        )
        assert set(statuses) == set(expected), name
    # some consumer sees a change after one that happened later
    times = [e["detail"]["LastModifiedTime"] for _, e in seen]
    assert any(later < earlier for earlier, later in itertools.pairwise(times))
    assert emulator.pending_events() == 0


def test_the_same_seed_gives_the_same_event_log_byte_for_byte(make_request: Any) -> None:
    first, _ = run_scenario(make_request, seed=42)
    again, _ = run_scenario(make_request, seed=42)
    other, _ = run_scenario(make_request, seed=43)
    assert first.event_log_bytes() == again.event_log_bytes()
    assert first.event_log_bytes() != other.event_log_bytes()
    lines = first.event_log_bytes().decode().splitlines()
    assert [json.loads(line)["id"] for line in lines] == [json.loads(x)["id"] for x in first.event_log]


@pytest.mark.parametrize("seed", range(6))
def test_a_seeded_share_is_lost_and_the_rest_arrive(make_request: Any, seed: int) -> None:
    policy = EventDelivery(loss_share=0.25, duplicate_share=0.3)
    emulator, seen = run_scenario(make_request, seed=seed, delivery=policy)
    lost = {changes(e) for e in emulator.lost_events}
    delivered = {changes(e) for _, e in seen}
    assert lost, "a quarter of ~60 changes is lost"
    assert not lost & delivered, "a lost change never arrives, not even as a copy"
    per_job_total = len(lost | delivered)
    assert per_job_total == 5 * 12 + 1, "every change was either delivered or lost"


def test_exactly_once_in_order_is_the_friendly_exception(make_request: Any) -> None:
    _emulator, seen = run_scenario(make_request, seed=1, delivery=EventDelivery.exactly_once_in_order())
    times = [e["detail"]["LastModifiedTime"] for _, e in seen]
    assert times == sorted(times)
    assert len({changes(e) for _, e in seen}) == len(seen)
    for delivered_at, event in seen:
        assert event["detail"]["LastModifiedTime"] == round(delivered_at.timestamp() * 1000)


def test_detail_members_without_a_value_are_json_null(make_request: Any) -> None:
    emulator, seen = run_scenario(make_request, seed=3, jobs=1)
    starting = next(e for _, e in seen if e["detail"]["SecondaryStatus"] == "Starting")["detail"]
    for member in ("FailureReason", "TrainingStartTime", "TrainingEndTime", "VpcConfig", "WarmPoolStatus"):
        assert member in starting, member
        assert starting[member] is None, member
    line = next(x for x in emulator.event_log if '"Starting"' in x)
    assert '"FailureReason":null' in line
    stopped = next(e for _, e in seen if e["detail"]["SecondaryStatus"] == "Stopped")["detail"]
    assert isinstance(stopped["TrainingEndTime"], int)


@pytest.mark.parametrize(
    "bad",
    [
        {"duplicate_share": 1.5},
        {"loss_share": -0.1},
        {"max_copies": 0},
        {"min_delay_seconds": 5, "max_delay_seconds": 1},
        {"duplicate_share": 0.5, "max_copies": 1},
    ],
)
def test_a_bad_delivery_policy_is_refused_by_name(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad)).split("_")[0]):
        EventDelivery(**bad)


def test_delivery_and_the_friendly_switch_are_exclusive() -> None:
    with pytest.raises(ValueError, match="exactly_once_in_order"):
        SageMakerEmulator(delivery=EventDelivery(), exactly_once_in_order=True)


def test_delayed_events_are_delivered_by_a_driver_that_moves_the_clock_itself(make_request: Any) -> None:
    clock = VirtualClock(START)
    seen: list[dict[str, Any]] = []
    with SageMakerEmulator(clock=clock, on_event=seen.append, seed=5, **TIMINGS) as emulator:
        emulator.client().create_training_job(**make_request("driven"))
        due = emulator.next_due()
        assert due is not None
        assert START < due <= START + timedelta(seconds=8)
        clock.advance_to(due)
        emulator.process_due()
        assert [e["detail"]["SecondaryStatus"] for e in seen][:1] == ["Starting"]
