"""Request throttling as SageMaker applies it: a token bucket per API, and now and then a server error.

Buckets refill on the emulator's clock, so a burst at one virtual moment is throttled the same way on every
run; the occasional InternalFailure / ServiceUnavailable is drawn from the emulator's seed.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from sagequeue.local.emulator.errors import (
    InternalFailure,
    SageMakerError,
    ServiceUnavailable,
    ThrottlingError,
)


@dataclass(frozen=True)
class Rate:
    """`per_second` tokens refill a bucket of `burst`; each request takes one."""

    per_second: float
    burst: int

    def __post_init__(self) -> None:
        if not self.per_second > 0 or isinstance(self.burst, bool) or self.burst < 1:
            raise ValueError(f"a rate needs per_second > 0 and burst >= 1, got {self}")


#: Default buckets. SageMaker publishes no figures for these APIs; these are the order of magnitude its
#: throttling shows (reads faster than writes, List slowest) while a test's bursts of a few dozen pass.
DEFAULT_RATES: dict[str, Rate] = {
    "DescribeTrainingJob": Rate(20.0, 200),
    "ListTrainingJobs": Rate(5.0, 100),
    "CreateTrainingJob": Rate(5.0, 100),
    "StopTrainingJob": Rate(5.0, 100),
    "UpdateTrainingJob": Rate(5.0, 100),
    "DeleteTrainingJob": Rate(5.0, 100),
    "AddTags": Rate(5.0, 100),
    "ListTags": Rate(10.0, 100),
    "DeleteTags": Rate(5.0, 100),
}


class Throttle:
    """Buckets per operation plus seeded transient errors; not thread-safe (the caller locks)."""

    def __init__(
        self,
        rates: Mapping[str, Rate] | None,
        transient_error_share: float,
        rng: random.Random,
    ) -> None:
        if not 0 <= transient_error_share <= 1:
            raise ValueError(f"transient_error_share must be between 0 and 1, got {transient_error_share!r}")
        self.rates = dict(rates or {})
        self.transient_error_share = transient_error_share
        self._rng = rng
        self._tokens: dict[str, float] = {}
        self._last: dict[str, datetime] = {}

    def admit(self, operation: str, now: datetime) -> SageMakerError | None:
        """The error to answer instead of running `operation` now, or None."""
        rate = self.rates.get(operation)
        if rate is not None:
            tokens = self._tokens.get(operation, float(rate.burst))
            last = self._last.get(operation)
            if last is not None and now > last:
                tokens = min(float(rate.burst), tokens + (now - last).total_seconds() * rate.per_second)
            self._last[operation] = now
            if tokens < 1:
                self._tokens[operation] = tokens
                return ThrottlingError("Rate exceeded")
            self._tokens[operation] = tokens - 1
        if self.transient_error_share and self._rng.random() < self.transient_error_share:
            if self._rng.random() < 0.5:
                return InternalFailure("We encountered an internal error. Please try again.")
            return ServiceUnavailable("Service Unavailable")
        return None
