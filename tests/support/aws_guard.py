"""The scheduler, governance and end-to-end suites meet SageMaker as AWS documents it: an emulator that is
kinder (a short stop, events once and in order, no faults, unlimited region or warm pools, plans that never
wait) fails the test, unless the test gave it a `Kinder` naming each departure and why."""

from __future__ import annotations

from pathlib import Path

from sagequeue.local.emulator import DEPARTURES
from sagequeue.local.emulator.emulator import SageMakerEmulator

#: The suites held to the AWS profile (folders under tests/).
GUARDED = ("functional/server", "functional/governance", "e2e")


def guarded(path: Path) -> bool:
    parts = path.resolve().as_posix()
    return any(f"/tests/{suite}/" in parts for suite in GUARDED)


def unexplained(emulator: SageMakerEmulator) -> list[str]:
    """Departures from AWS the emulator showed that no `Kinder` of its names, in words."""
    allowed = emulator.kinder.departures if emulator.kinder is not None else frozenset()
    return [DEPARTURES[name] for name in sorted(emulator.departures_from_aws() - allowed)]
