"""Cold import time of each Lambda handler, and of the SDK entry points users import.

    python bench/bench_imports.py [--repeat N]

Each figure is the median wall time of a fresh interpreter importing the module (interpreter start-up
subtracted), which is what a Lambda cold start pays on top of the runtime's own start.
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


def _run(code: str, *args: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, *args], check=True, cwd=ROOT, stderr=subprocess.PIPE)
    return time.perf_counter() - start


def median_ms(code: str, *args: str, repeat: int) -> float:
    return statistics.median(_run(code, *args) for _ in range(repeat)) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    baseline = median_ms("pass", repeat=args.repeat)
    print(f"interpreter start-up: {baseline:.0f} ms (subtracted below)")
    print(f"{'module':<40} {'import ms':>10}")
    for handler in sorted(ROOT.glob("functions/*/app.py")):
        ms = median_ms(LOAD_HANDLER, str(handler), repeat=args.repeat) - baseline
        print(f"{handler.relative_to(ROOT)!s:<40} {ms:>10.0f}")
    for module in ("sagequeue", "sagequeue.client", "sagequeue.hook", "boto3", "sagemaker"):
        try:
            ms = median_ms(f"import {module}", repeat=args.repeat) - baseline
        except subprocess.CalledProcessError:
            print(f"{module:<40} {'not installed':>10}")
            continue
        print(f"{module:<40} {ms:>10.0f}")


if __name__ == "__main__":
    main()
