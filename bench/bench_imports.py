"""Cold import time of each Lambda handler as a ratio to `import boto3`, and of the SDK entry points.

    python bench/bench_imports.py [--repeat N]

Every round starts one fresh interpreter per target, in a rotating order, so a burst of load on the
machine falls on all targets alike; the figure of a target is its median over the rounds, minus the median
of an interpreter that imports nothing (start-up). That is what a Lambda cold start pays on top of the
runtime's own start. Goals (issue #17): scheduler, governance and idle_stop at most 1.5 x boto3, api at
most 2 x (its event handler validates requests with pydantic).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LOAD_HANDLER = (
    "import importlib.util, sys; "
    "spec = importlib.util.spec_from_file_location('app', sys.argv[1]); "
    "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)"
)

#: Ratio to `import boto3` each handler must stay under.
GOALS = {"api": 2.0, "scheduler": 1.5, "governance": 1.5, "idle_stop": 1.5}

SDK_MODULES = ("sagequeue", "sagequeue.client", "sagequeue.hook", "sagemaker")


def _run(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, cwd=ROOT, stderr=subprocess.PIPE)
    return time.perf_counter() - start


def _targets() -> dict[str, list[str]]:
    python = sys.executable
    targets = {"start-up": [python, "-c", "pass"], "boto3": [python, "-c", "import boto3"]}
    for handler in sorted(ROOT.glob("functions/*/app.py")):
        targets[handler.parent.name] = [python, "-c", LOAD_HANDLER, str(handler)]
    for module in SDK_MODULES:
        probe = subprocess.run([python, "-c", f"import {module}"], cwd=ROOT, capture_output=True)
        if probe.returncode == 0:
            targets[module] = [python, "-c", f"import {module}"]
    return targets


def measure(repeat: int) -> dict[str, float]:
    """Median seconds per target over `repeat` interleaved rounds (start-up not yet subtracted)."""
    targets = _targets()
    names = list(targets)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(2):  # warm the file cache and the bytecode
        for name in names:
            _run(targets[name])
    for round_ in range(repeat):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(_run(targets[name]))
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    medians = measure(args.repeat)
    start_up = medians.pop("start-up")
    boto3_ms = (medians.pop("boto3") - start_up) * 1000
    print(f"interpreter start-up: {start_up * 1000:.0f} ms (subtracted below); median of {args.repeat}")
    print(f"{'import':<24} {'ms':>6} {'x boto3':>8} {'goal':>6}")
    print(f"{'boto3':<24} {boto3_ms:>6.0f} {1.0:>8.2f}")
    failed = []
    for name, seconds in medians.items():
        ms = (seconds - start_up) * 1000
        goal = GOALS.get(name)
        ratio = ms / boto3_ms
        label = f"functions/{name}" if goal is not None else name
        print(f"{label:<24} {ms:>6.0f} {ratio:>8.2f} {goal if goal else '':>6}")
        if goal is not None and ratio > goal:
            failed.append(name)
    if failed:
        print(f"over the goal: {', '.join(failed)}")


if __name__ == "__main__":
    main()
