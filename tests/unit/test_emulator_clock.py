"""The clocks the emulator, the embedded stack and the handlers share."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta, timezone

import pytest

from sagequeue.local.clock import Clock, RealClock, VirtualClock


def test_a_virtual_clock_starts_now_to_the_second_in_utc_and_moves_only_when_advanced() -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    clock = VirtualClock()
    after = datetime.now(UTC)
    start = clock.now()
    assert start.tzinfo is UTC
    assert start.microsecond == 0
    assert before <= start <= after
    time.sleep(0.01)
    assert clock.now() == start
    assert clock.advance(90.5) == start + timedelta(seconds=90.5)
    assert clock.now() == start + timedelta(seconds=90.5)


def test_a_virtual_clock_converts_its_start_to_utc_and_refuses_naive_times_and_going_back() -> None:
    paris = timezone(timedelta(hours=1))
    clock = VirtualClock(datetime(2026, 1, 1, 10, 0, tzinfo=paris))
    assert clock.now() == datetime(2026, 1, 1, 9, 0, tzinfo=UTC)
    assert clock.now().utcoffset() == timedelta(0)
    with pytest.raises(ValueError, match="timezone-aware"):
        VirtualClock(datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="back in time"):
        clock.advance(-1)


def test_advance_to_never_moves_a_virtual_clock_backwards() -> None:
    clock = VirtualClock(datetime(2026, 1, 1, tzinfo=UTC))
    clock.advance_to(datetime(2026, 1, 2, tzinfo=UTC))
    clock.advance_to(datetime(2026, 1, 1, 12, tzinfo=UTC))
    assert clock.now() == datetime(2026, 1, 2, tzinfo=UTC)


def test_a_real_clock_runs_speed_times_faster_than_wall_time() -> None:
    clock = RealClock(speed=1000)
    first = clock.now()
    time.sleep(0.05)
    elapsed = clock.now() - first
    assert timedelta(seconds=40) <= elapsed <= timedelta(seconds=5000)
    assert first.tzinfo is UTC
    with pytest.raises(ValueError, match="positive"):
        RealClock(speed=0)


def test_both_clocks_satisfy_the_clock_protocol() -> None:
    assert isinstance(VirtualClock(), Clock)
    assert isinstance(RealClock(), Clock)
