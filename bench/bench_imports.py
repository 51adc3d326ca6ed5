"""Cold import time of each Lambda handler as a ratio to `import boto3`, and of the SDK entry points.

    python bench/bench_imports.py [--repeat N] [--source] [--instructions]

Every round starts one fresh interpreter per target, in a rotating order, so a burst of load on the
machine falls on all targets alike; the figure of a target is its median over the rounds, minus the median
of an interpreter that imports nothing (start-up). That is what a Lambda cold start pays on top of the
runtime's own start. Two figures per target: wall time, and the CPU time (user + system) the interpreter
used, which a busy machine changes less; on a quiet machine they agree. `--instructions` counts the instructions
each import executes instead (valgrind; slow, but the same figure however busy the machine is). Goals (issue #17): scheduler,
governance and idle_stop at most 1.5 x boto3, api at most 2 x (its event handler validates requests with
pydantic), judged on CPU time.

Run it with the functions' runtime (python3.12 in template.yaml) for the figures Lambda sees: a venv of that
interpreter with boto3 (the runtime's own) and layers/core/requirements.txt, e.g.
`python3.12 -m venv /tmp/v312 && /tmp/v312/bin/pip install boto3 -r layers/core/requirements.txt &&
/tmp/v312/bin/python bench/bench_imports.py`; it prints which interpreter it ran.

Handlers load as in the Lambda layer: modules this environment has but the layer does not carry (blinker,
which pynamodb uses when present and moto's Flask brings here) are hidden from them, and sagequeue_core
comes with its bytecode compiled ahead, as layers/core/Makefile builds it (`--source`: from source without
bytecode, as the default Python builder shipped the layer, which compiles every module at every cold start).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Installed here (moto's server needs them) but not in the layer (layers/core/requirements.txt).
LAYER_LACKS = ("blinker",)

LOAD_HANDLER = (
    "import importlib.util, sys; "
    "sys.path.insert(0, sys.argv[2]); "
    f"sys.modules.update(dict.fromkeys({LAYER_LACKS!r})); "
    "spec = importlib.util.spec_from_file_location('app', sys.argv[1]); "
    "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)"
)

#: Ratio to `import boto3` each handler must stay under.
GOALS = {"api": 2.0, "scheduler": 1.5, "governance": 1.5, "idle_stop": 1.5}

SDK_MODULES = ("sagequeue", "sagequeue.client", "sagequeue.hook", "sagemaker")


def _run(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one fresh interpreter running `argv`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, cwd=ROOT, stderr=subprocess.PIPE)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def interpreter() -> str:
    """This interpreter's version beside the one the functions run on: the figures are the interpreter's."""
    runtime = re.search(r"Runtime: python(\d+\.\d+)", (ROOT / "template.yaml").read_text())
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    lambda_runtime = runtime.group(1) if runtime else "unknown"
    same = "the same as" if here == lambda_runtime else "not"
    return f"Python {here}, {same} the functions' runtime (python{lambda_runtime}, template.yaml)"


def layer(into: Path, *, bytecode: bool) -> Path:
    """sagequeue_core as the layer carries it, in `into`: with bytecode compiled ahead (layers/core/Makefile)
    or without (the source alone)."""
    shutil.copytree(ROOT / "layers/core/sagequeue_core", into / "sagequeue_core")
    if bytecode:
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", "--invalidation-mode", "unchecked-hash", str(into)],
            check=True,
        )
    return into


def _targets(layer_dir: Path) -> dict[str, list[str]]:
    python = sys.executable
    targets = {"start-up": [python, "-c", "pass"], "boto3": [python, "-c", "import boto3"]}
    for handler in sorted(ROOT.glob("functions/*/app.py")):
        targets[handler.parent.name] = [python, "-c", LOAD_HANDLER, str(handler), str(layer_dir)]
    for module in SDK_MODULES:
        probe = subprocess.run([python, "-c", f"import {module}"], cwd=ROOT, capture_output=True)
        if probe.returncode == 0:
            targets[module] = [python, "-c", f"import {module}"]
    return targets


def instructions(argv: list[str]) -> int:
    """Instructions one fresh interpreter executes running `argv`, counted by valgrind (callgrind): the same
    on a busy machine as on a quiet one, where times are not."""
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from valgrind: {out.stderr[-300:]}")
    return int(found.group(1))


def count(layer_dir: Path) -> None:
    """Each target's instructions as a ratio to boto3's, start-up subtracted."""
    counts = {name: instructions(argv) for name, argv in _targets(layer_dir).items()}
    start = counts.pop("start-up")
    boto3 = counts.pop("boto3") - start
    print(f"instructions (valgrind), interpreter start-up {start / 1e6:.0f} M subtracted")
    print(f"{'import':<24} {'M instr':>8} {'x boto3':>8} {'goal':>6}")
    print(f"{'boto3':<24} {boto3 / 1e6:>8.0f} {1.0:>8.2f}")
    failed = []
    for name, value in counts.items():
        goal = GOALS.get(name)
        ratio = (value - start) / boto3
        label = f"functions/{name}" if goal is not None else name
        print(f"{label:<24} {(value - start) / 1e6:>8.0f} {ratio:>8.2f} {goal if goal else '':>6}")
        if goal is not None and ratio > goal:
            failed.append(name)
    print(f"over the goal: {', '.join(failed)}" if failed else "every handler within its goal")


def measure(repeat: int, layer_dir: Path) -> dict[str, tuple[float, float]]:
    """Median (wall, CPU) seconds per target over `repeat` interleaved rounds, start-up not subtracted."""
    targets = _targets(layer_dir)
    names = list(targets)
    walls: dict[str, list[float]] = {name: [] for name in names}
    cpus: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(2):  # warm the file cache and the bytecode
        for name in names:
            _run(targets[name])
    for round_ in range(repeat):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            wall, cpu = _run(targets[name])
            walls[name].append(wall)
            cpus[name].append(cpu)
    return {name: (statistics.median(walls[name]), statistics.median(cpus[name])) for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--source", action="store_true", help="sagequeue_core without bytecode")
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions with valgrind instead of timing"
    )
    args = parser.parse_args()
    print(
        f"sagequeue_core {'from source, no bytecode' if args.source else 'with bytecode (layers/core/Makefile)'}"
    )
    print(f"{interpreter()} ({sys.executable})")
    with tempfile.TemporaryDirectory() as tmp:
        if args.instructions:
            count(layer(Path(tmp), bytecode=not args.source))
            return
        medians = measure(args.repeat, layer(Path(tmp), bytecode=not args.source))
    start_wall, start_cpu = medians.pop("start-up")
    boto3_wall, boto3_cpu = (
        value - base for value, base in zip(medians.pop("boto3"), (start_wall, start_cpu), strict=True)
    )
    load = os.getloadavg()[0]
    print(
        f"median of {args.repeat} interleaved rounds; interpreter start-up {start_wall * 1000:.0f} ms wall, "
        f"{start_cpu * 1000:.0f} ms CPU (subtracted below); load average {load:.1f} on {os.cpu_count()} CPUs"
    )
    print(f"{'import':<24} {'wall ms':>8} {'x boto3':>8} {'CPU ms':>8} {'x boto3':>8} {'goal':>6}")
    print(f"{'boto3':<24} {boto3_wall * 1000:>8.0f} {1.0:>8.2f} {boto3_cpu * 1000:>8.0f} {1.0:>8.2f}")
    failed = []
    for name, (wall, cpu) in medians.items():
        wall, cpu = wall - start_wall, cpu - start_cpu
        goal = GOALS.get(name)
        label = f"functions/{name}" if goal is not None else name
        print(
            f"{label:<24} {wall * 1000:>8.0f} {wall / boto3_wall:>8.2f} {cpu * 1000:>8.0f} "
            f"{cpu / boto3_cpu:>8.2f} {goal if goal else '':>6}"
        )
        if goal is not None and cpu / boto3_cpu > goal:
            failed.append(name)
    print(f"over the goal: {', '.join(failed)}" if failed else "every handler within its goal")


if __name__ == "__main__":
    main()
