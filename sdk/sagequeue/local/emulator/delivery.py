"""How state-change events reach subscribers: at least once, not in order, after a delay, sometimes never.

EventBridge promises at-least-once delivery and no ordering, and SageMaker emits its events asynchronously:
a consumer sees an event seconds after the change, possibly twice or three times, possibly after a later
change's event, and (when a target fails for long enough) not at all. `EventDelivery` says how harsh the
emulator is; `DeliveryQueue` applies it with one seeded random generator, so the same seed and the same
requests give the same deliveries, byte for byte.
"""

from __future__ import annotations

import heapq
import itertools
import json
import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any


@dataclass(frozen=True)
class EventDelivery:
    """The delivery rules. Every event waits `min_delay_seconds`..`max_delay_seconds` (uniform) after the
    change before it is delivered, so events closer together than the spread may arrive in either order (the
    reorder window is `max_delay_seconds - min_delay_seconds`). A `duplicate_share` of the events arrive
    2..`max_copies` times, each copy with its own delay and id; a `loss_share` never arrive."""

    duplicate_share: float = 0.2
    max_copies: int = 3
    min_delay_seconds: float = 1.0
    max_delay_seconds: float = 8.0
    loss_share: float = 0.0

    def __post_init__(self) -> None:
        for name in ("duplicate_share", "loss_share"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
                raise ValueError(f"{name} must be a share between 0 and 1, got {value!r}")
        if isinstance(self.max_copies, bool) or not isinstance(self.max_copies, int) or self.max_copies < 1:
            raise ValueError(f"max_copies must be a positive integer, got {self.max_copies!r}")
        if self.duplicate_share > 0 and self.max_copies < 2:
            raise ValueError("duplicate_share > 0 needs max_copies of at least 2")
        if not 0 <= self.min_delay_seconds <= self.max_delay_seconds:
            raise ValueError(
                "delays must satisfy 0 <= min_delay_seconds <= max_delay_seconds, got "
                f"{self.min_delay_seconds!r} and {self.max_delay_seconds!r}"
            )

    @classmethod
    def exactly_once_in_order(cls) -> EventDelivery:
        """One copy of every event, at once and in order: kinder than AWS, for a test that says why."""
        return cls(duplicate_share=0.0, max_copies=1, min_delay_seconds=0.0, max_delay_seconds=0.0)

    @property
    def immediate(self) -> bool:
        return self.max_delay_seconds == 0


class DeliveryQueue:
    """Events waiting for their delivery time; not thread-safe (the emulator holds its state lock)."""

    def __init__(self, policy: EventDelivery, rng: random.Random) -> None:
        self.policy = policy
        self._rng = rng
        self._heap: list[tuple[datetime, int, dict[str, Any]]] = []
        self._seq = itertools.count()
        #: Events dropped on purpose, in the order they were produced (for tests and the event log).
        self.lost: list[dict[str, Any]] = []

    def new_id(self) -> str:
        """An event id drawn from the seeded generator (uuid4-shaped)."""
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def add(self, event: dict[str, Any], changed_at: datetime) -> None:
        policy = self.policy
        rng = self._rng
        if policy.loss_share and rng.random() < policy.loss_share:
            self.lost.append(event)
            return
        copies = 1
        if policy.duplicate_share and rng.random() < policy.duplicate_share:
            copies = rng.randint(2, policy.max_copies)
        for index in range(copies):
            copy = event if index == 0 else _copy_with_id(event, self.new_id())
            delay = 0.0
            if not policy.immediate:
                delay = rng.uniform(policy.min_delay_seconds, policy.max_delay_seconds)
            heapq.heappush(self._heap, (changed_at + timedelta(seconds=delay), next(self._seq), copy))

    def next_due(self) -> datetime | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: datetime) -> list[dict[str, Any]]:
        due: list[dict[str, Any]] = []
        while self._heap and self._heap[0][0] <= now:
            due.append(heapq.heappop(self._heap)[2])
        return due

    def __len__(self) -> int:
        return len(self._heap)


def _copy_with_id(event: dict[str, Any], event_id: str) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(event))
    copy["id"] = event_id
    return copy


#: Tags whose values are secret and random by design (sagequeue's attempt seal, an HMAC under a per-job
#: secret): the event log, which a seed must replay byte for byte, shows that they were there, not what.
RANDOM_TAGS = frozenset({"sagequeue:seal"})


def log_line(event: dict[str, Any]) -> str:
    """One event as a line of the event log: canonical JSON, keys sorted, random tag values masked."""
    detail = event.get("detail")
    tags = detail.get("Tags") if isinstance(detail, dict) else None
    if isinstance(detail, dict) and isinstance(tags, dict) and RANDOM_TAGS & tags.keys():
        masked = {k: ("<random>" if k in RANDOM_TAGS else v) for k, v in tags.items()}
        event = {**event, "detail": {**detail, "Tags": masked}}
    return json.dumps(event, sort_keys=True, separators=(",", ":"))
