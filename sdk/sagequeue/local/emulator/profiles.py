"""The emulator as AWS documents SageMaker, and the named ways a test may make it kinder.

`aws_options(...)` gives `SageMakerEmulator`'s arguments for SageMaker as AWS documents it: regional
capacity finite (a create beyond it waits in Starting), the warm-pool quota 0 per instance type unless the
account raised it, training plans registered with their instances (jobs beyond them wait in Pending), the
120 s stop grace, EventBridge delivery (late, duplicated, reordered, sometimes lost), 5xx answers and
throttling. `SageMakerEmulator.departures_from_aws()` names every way an emulator is kinder than that;
the scheduler, governance and end-to-end suites fail a test whose emulator departs from AWS without a
`Kinder` naming the departure and the reason (tests/conftest.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sagequeue.local.emulator.delivery import EventDelivery
from sagequeue.local.emulator.throttling import DEFAULT_RATES

#: SIGTERM, then this long before the kill (StoppingCondition, StopTrainingJob API reference).
AWS_STOP_GRACE_SECONDS = 120.0
#: "<type> for training warm pool usage": 0 per instance type until the account asks for more.
AWS_WARM_POOL_QUOTA = 0
#: EventBridge: at least once (copies), no ordering, seconds late; a target that keeps failing loses some.
AWS_EVENT_DELIVERY = EventDelivery(loss_share=0.02)
#: InternalFailure / ServiceUnavailable answers: SageMaker publishes no rate; a small share, seeded.
AWS_TRANSIENT_ERROR_SHARE = 0.002

#: Every way an emulator can be kinder than AWS, by the name a `Kinder` gives it.
DEPARTURES = {
    "stop_grace": "stop grace shorter than SageMaker's 120 s",
    "region_capacity": "regional capacity unlimited for an instance type a job used",
    "warm_pool_quota": "warm pools retained without a warm-pool quota (AWS's default is 0)",
    "training_plans": "a job named a training plan the emulator was not given (it started at once)",
    "event_delivery": "events delivered once, at once or in order",
    "event_loss": "no event is ever lost",
    "faults": "no 5xx answers",
    "throttling": "no throttling",
}


@dataclass(frozen=True)
class Kinder:
    """An explicit opt-out from AWS's behaviour: the departures a test needs (names from `DEPARTURES`) and
    why. The suites' guard accepts exactly these departures from the emulator that carries it."""

    reason: str
    departures: frozenset[str]

    def __init__(self, reason: str, *departures: str) -> None:
        if not reason.strip():
            raise ValueError("a kinder emulator needs a reason")
        unknown = set(departures) - set(DEPARTURES)
        if unknown or not departures:
            raise ValueError(
                f"name the departures from AWS, among {sorted(DEPARTURES)}; got {sorted(unknown)}"
            )
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "departures", frozenset(departures))


def aws_options(
    *,
    region_capacity: Mapping[str, int],
    warm_pool_quota: Mapping[str, int] | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """`SageMakerEmulator` arguments for SageMaker as AWS documents it. `region_capacity`: instances of each
    type the region can launch for the account (finite; shared by its pools, jobs outside the queue and
    plans not registered). `warm_pool_quota`: the types whose warm-pool quota the account raised (others
    keep 0). `overrides` replace any other argument (timings, clock, seed, ...); those that make the
    emulator kinder than AWS need a `kinder=Kinder(...)` among them."""
    options: dict[str, Any] = {
        "capacity": dict(region_capacity),
        "warm_pool_limits": dict(warm_pool_quota or {}),
        "default_warm_pool_limit": AWS_WARM_POOL_QUOTA,
        "stop_grace_seconds": AWS_STOP_GRACE_SECONDS,
        "delivery": AWS_EVENT_DELIVERY,
        "transient_error_share": AWS_TRANSIENT_ERROR_SHARE,
        "rates": DEFAULT_RATES,
    }
    options.update(overrides)
    if options.get("exactly_once_in_order"):
        options.pop("delivery", None)
    return options


__all__ = [
    "AWS_EVENT_DELIVERY",
    "AWS_STOP_GRACE_SECONDS",
    "AWS_TRANSIENT_ERROR_SHARE",
    "AWS_WARM_POOL_QUOTA",
    "DEPARTURES",
    "Kinder",
    "aws_options",
]
