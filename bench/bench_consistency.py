"""Does the queue stay true to SageMaker under a random workload and adversarial event delivery?

    python bench/bench_consistency.py [--seeds 200] [--first 1] [--operations 8] [--workers 2]

Each seed runs tests/support/workload.py on the local stack's parts (the handlers, moto's server over HTTP,
the SageMaker emulator on a virtual clock): random arrivals, cancels, holds, priority changes, user
keep-alives, spot, heterogeneous jobs, with SageMaker's events duplicated, reordered, delayed and lost.
The invariant monitor checks SageMaker's side after every SageMaker operation and every clock step.
Prints violations per 1,000 checked SageMaker operations (goal 0) for the adversarial run and, as the
baseline in the same run, for a smaller set of seeds with exact delivery; lists failing seeds (keep them
as regression seeds in tests/functional/server/test_random_workload.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
os.environ.update(
    {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "POWERTOOLS_LOG_LEVEL": "CRITICAL",
        "POWERTOOLS_METRICS_DISABLED": "true",
        "POWERTOOLS_TRACE_DISABLED": "true",
    }
)
sys.path[:0] = [str(ROOT / "tests" / "functional" / "server"), str(ROOT / "tests")]


def _run_seeds(seeds: list[int], operations: int, exact: bool) -> list[dict[str, Any]]:
    logging.disable(logging.CRITICAL)
    from conftest import ACCOUNT, ADMIN, ROLE, SUBMITTER, make_world  # tests/functional/server
    from moto.server import ThreadedMotoServer
    from support.workload import CAPACITY, run_workload

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    results = []
    try:
        for seed in seeds:
            for world in make_world(f"http://{host}:{port}", capacity=dict(CAPACITY)):
                if exact:
                    import support.workload as workload

                    original = workload.AdversarialDelivery
                    workload.AdversarialDelivery = _exact  # type: ignore[assignment,misc]
                try:
                    result = run_workload(
                        world,
                        seed,
                        operations=operations,
                        admin=ADMIN,
                        submitter=SUBMITTER,
                        role=ROLE,
                        account=ACCOUNT,
                    )
                finally:
                    if exact:
                        workload.AdversarialDelivery = original  # type: ignore[misc]
                results.append(
                    {
                        "seed": seed,
                        "checks": result.sagemaker_checks,
                        "violations": result.violations,
                        "unfinished": result.unfinished,
                        "operations": result.user_operations,
                    }
                )
                mode = "exact" if exact else "adversarial"
                print(
                    f"# {mode} seed {seed}: {result.sagemaker_checks} checks, {len(result.violations)} "
                    f"violations, {len(result.unfinished)} unfinished",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        server.stop()
    return results


def _exact(seed: int) -> Any:
    from support.delivery import AdversarialDelivery

    return AdversarialDelivery(seed, duplicate=0.0, loss=0.0, delay=0.0)


def _summary(label: str, results: list[dict[str, Any]]) -> None:
    checks = sum(r["checks"] for r in results)
    violations = sum(len(r["violations"]) for r in results)
    failing = [r["seed"] for r in results if r["violations"] or r["unfinished"]]
    rate = 1000 * violations / checks if checks else 0.0
    print(
        f"{label:<22} seeds {len(results):>4}  user ops {sum(r['operations'] for r in results):>5}  "
        f"SageMaker ops checked {checks:>7}  violations {violations:>3}  per 1,000 ops {rate:.3f}  "
        f"unfinished jobs {sum(len(r['unfinished']) for r in results)}"
    )
    if failing:
        print(f"  failing seeds: {failing}")
        for r in results:
            for sentence in r["violations"][:3]:
                print(f"    seed {r['seed']}: {sentence}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--first", type=int, default=1)
    parser.add_argument("--operations", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--baseline-seeds", type=int, default=10)
    args = parser.parse_args()
    began = time.perf_counter()
    seeds = list(range(args.first, args.first + args.seeds))
    chunks = [seeds[i :: args.workers] for i in range(args.workers)]
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        adversarial = [
            r
            for part in pool.map(_run_seeds, chunks, [args.operations] * len(chunks), [False] * len(chunks))
            for r in part
        ]
        base = seeds[: args.baseline_seeds]
        base_chunks = [base[i :: args.workers] for i in range(args.workers)]
        exact = [
            r
            for part in pool.map(
                _run_seeds, base_chunks, [args.operations] * len(base_chunks), [True] * len(base_chunks)
            )
            for r in part
        ]
    print(f"load average {os.getloadavg()[0]:.1f}; {time.perf_counter() - began:.0f} s wall")
    _summary("adversarial delivery", adversarial)
    _summary("exact delivery", exact)


if __name__ == "__main__":
    main()
