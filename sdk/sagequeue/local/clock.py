"""Clocks shared by the SageMaker emulator, the embedded stack and the handlers, so `now` agrees everywhere.

`VirtualClock` moves only when told to: tests and simulations are deterministic and a day of training
passes in milliseconds. `RealClock` follows wall time, optionally faster, for the interactive local stack.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Anything that tells the current time as a timezone-aware UTC datetime."""

    def now(self) -> datetime: ...


def _utc_now_to_the_second() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _as_utc(moment: datetime) -> datetime:
    if moment.tzinfo is None:
        raise ValueError(f"clock times must be timezone-aware (UTC), got the naive datetime {moment!r}")
    return moment.astimezone(UTC)


class VirtualClock:
    """A clock that stands still until `advance()` moves it. Safe to share between threads."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = _as_utc(start) if start is not None else _utc_now_to_the_second()
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> datetime:
        """Move forward by `seconds` (never backwards) and return the new time."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go back in time: advance({seconds})")
        with self._lock:
            self._now += timedelta(seconds=seconds)
            return self._now

    def advance_to(self, moment: datetime) -> datetime:
        """Move forward to `moment`; a moment already past leaves the clock where it is."""
        moment = _as_utc(moment)
        with self._lock:
            if moment > self._now:
                self._now = moment
            return self._now

    def __repr__(self) -> str:
        return f"VirtualClock({self.now().isoformat()})"


class RealClock:
    """Wall time from the moment of creation, running `speed` times faster (speed 60: a minute a second)."""

    def __init__(self, speed: float = 1.0) -> None:
        if not speed > 0:
            raise ValueError(f"RealClock speed must be positive, got {speed}")
        self.speed = float(speed)
        self._start = datetime.now(UTC)
        self._start_monotonic = time.monotonic()

    def now(self) -> datetime:
        elapsed = (time.monotonic() - self._start_monotonic) * self.speed
        return self._start + timedelta(seconds=elapsed)

    def advance_to(self, moment: datetime) -> datetime:
        """Never earlier than `moment` from now on (a stack resuming a saved queue whose clock ran fast)."""
        shift = _as_utc(moment) - self.now()
        if shift > timedelta(0):
            self._start += shift
        return self.now()

    def __repr__(self) -> str:
        return f"RealClock(speed={self.speed})"
