"""What EventBridge may do to SageMaker's events on their way to the scheduler: deliver one twice or
three times, lose it, hold it back and deliver it late (after newer ones), in any order.

`AdversarialDelivery` is a `mangle` for the server tests' QueueWorld: it gets each batch of events the
emulator emitted and returns what reaches the scheduler now; events it holds back come out with a later
batch. Seeded, so a failing seed replays exactly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any


@dataclass
class AdversarialDelivery:
    seed: int
    duplicate: float = 0.3  # chance an event comes more than once (2 or 3 times)
    loss: float = 0.1  # chance an event never comes (only the reconcile timer will tell)
    delay: float = 0.2  # chance an event is held back for one or more later batches
    delivered: int = 0
    lost: int = 0
    duplicated: int = 0
    delayed: int = 0
    _held: list[dict[str, Any]] = field(default_factory=list)
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def __call__(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rng = self._rng
        now: list[dict[str, Any]] = []
        still_held: list[dict[str, Any]] = []
        for event in self._held:
            (now if rng.random() < 0.5 else still_held).append(event)
        self._held = still_held
        for event in events:
            if rng.random() < self.loss:
                self.lost += 1
                continue
            copies = 1
            if rng.random() < self.duplicate:
                copies = rng.choice((2, 3))
                self.duplicated += 1
            for _ in range(copies):
                if rng.random() < self.delay:
                    self.delayed += 1
                    self._held.append(event)
                else:
                    now.append(event)
        rng.shuffle(now)
        self.delivered += len(now)
        return now

    def flush(self) -> list[dict[str, Any]]:
        """Whatever is still held back (delivered late, in a shuffled order)."""
        held, self._held = self._held, []
        self._rng.shuffle(held)
        self.delivered += len(held)
        return held
