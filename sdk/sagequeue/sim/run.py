"""Run one trace under several schedulers and settings: the simulator's Python API."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sagequeue.sim.engine import SimSettings, Simulation
from sagequeue.sim.metrics import Recorder, summarize
from sagequeue.sim.sagemaker import Timings
from sagequeue.sim.schedulers import SCHEDULERS
from sagequeue.sim.trace import Trace


@dataclass(frozen=True)
class Variant:
    """One column of the report: a scheduler and the settings it runs with."""

    label: str
    scheduler: str
    settings: SimSettings

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            known = ", ".join(SCHEDULERS)
            raise ValueError(f"unknown scheduler {self.scheduler!r} (known: {known})")


@dataclass
class Result:
    variant: Variant
    summary: dict[str, Any]
    recorder: Recorder = field(repr=False)
    wall_seconds: float = 0.0


def simulate(
    trace: Trace,
    variants: Sequence[Variant],
    timings: Timings | None = None,
    *,
    horizon_seconds: float | None = None,
    seed: int = 0,
    progress: Callable[[int, float], None] | None = None,
    timeline: bool = True,
    exact: bool = False,
) -> list[Result]:
    """Each variant on the same trace, the same modelled SageMaker and the same capacity-error draws.

    `progress(index, simulated_seconds)` is called as each run advances (for a progress bar)."""
    import time

    timings = timings or Timings()
    results = []
    for index, variant in enumerate(variants):
        began = time.perf_counter()
        sim = Simulation(
            trace,
            SCHEDULERS[variant.scheduler](),
            variant.settings,
            timings,
            horizon_seconds=horizon_seconds,
            seed=seed,
            progress=functools.partial(progress, index) if progress else None,
            timeline=timeline,
            exact=exact,
        )
        recorder = sim.run()
        summary = summarize(
            recorder,
            stop_grace_seconds=timings.stop_grace_seconds,
            provisioning_seconds=timings.provisioning_seconds,
        )
        results.append(Result(variant, summary, recorder, time.perf_counter() - began))
    return results


def baselines(settings: SimSettings, schedulers: Sequence[str] = tuple(SCHEDULERS)) -> list[Variant]:
    return [Variant(name, name, settings) for name in schedulers]


__all__ = ["Result", "Variant", "baselines", "simulate"]
