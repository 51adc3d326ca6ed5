"""Does the queue stay true to SageMaker under a random workload and adversarial event delivery?

    python bench/bench_consistency.py [--seeds 200] [--first 1] [--operations 8] [--jobs N]
                                      [--baseline-seeds 10] [--transport in-process|http] [--scarce]

`--scarce`: SageMaker short as on AWS (tests/support/workload.py `scarce_world`): the region launches fewer
instances than the pools hold, the warm-pool quota is 0 (even seeds) or 1 (odd seeds), and a training plan
has fewer instances than its pool; jobs that do not finish must say why they wait ("without reason").

Each seed runs tests/support/workload.py on the local stack's parts (the handlers, moto's DynamoDB,
EventBridge and SQS, the SageMaker emulator over HTTP on a virtual clock): random arrivals, cancels, holds,
priority changes, user keep-alives, spot, heterogeneous jobs, with SageMaker's events duplicated,
reordered, delayed and lost. The invariant monitor checks SageMaker's side after every SageMaker operation
and every clock step. Prints violations per 1,000 checked SageMaker operations (goal 0) for the adversarial
run and, as the baseline in the same run, for a smaller set of seeds with exact delivery; lists failing
seeds (keep them as regression seeds in tests/functional/server/test_random_workload.py); and the wall
time, the CPU time per seed and the load average.

Seeds are spread over `--jobs` processes (default: one per core), handed out one at a time so a slow seed
does not hold back a whole share. Each process keeps one moto: in process by default (moto's own backends
answer botocore directly, no HTTP; the tests run the same backends behind moto's server), or
`--transport http` for moto's server, as the tests do.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import warnings
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

#: The moto this worker process uses: an endpoint URL (moto's server) or None (moto in process).
_ENDPOINT: str | None = None


def _start_worker(transport: str) -> None:
    """Once per worker process: one moto for all its seeds; the handlers' EMF lines go nowhere."""
    global _ENDPOINT
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")  # Powertools warns of invocations that emit no metric
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the life of the worker process
    if transport == "http":
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        _ENDPOINT = f"http://{host}:{port}"
    else:
        from moto import mock_aws

        mock_aws().start()  # stopped when the process ends
        _ENDPOINT = None


def _run_seed(seed: int, operations: int, exact: bool, scarce: bool = False) -> dict[str, Any]:
    from conftest import ACCOUNT, ADMIN, ROLE, SUBMITTER, make_world  # tests/functional/server
    from support.delivery import AdversarialDelivery
    from support.workload import CAPACITY, PLAN_ARN, run_workload, scarce_world, shrink_plan

    began = time.process_time()
    delivery = AdversarialDelivery(seed, duplicate=0.0, loss=0.0, delay=0.0) if exact else None
    outcome: dict[str, Any] = {
        "seed": seed,
        "checks": 0,
        "violations": [],
        "unfinished": [],
        "without_reason": [],
        "operations": 0,
        "scarce": scarce,
    }
    world_options: dict[str, Any] = scarce_world(seed) if scarce else {"capacity": dict(CAPACITY)}
    try:
        for world in make_world(_ENDPOINT, **world_options):
            if scarce:
                shrink_plan(world)
            result = run_workload(
                world,
                seed,
                operations=operations,
                admin=ADMIN,
                submitter=SUBMITTER,
                role=ROLE,
                account=ACCOUNT,
                delivery=delivery,
                plan=PLAN_ARN if scarce else None,
            )
            outcome.update(
                checks=result.sagemaker_checks,
                violations=result.violations,
                unfinished=result.unfinished,
                without_reason=result.without_reason,
                operations=result.user_operations,
            )
    except Exception as exc:  # a crashing seed is a finding, not the end of the bench
        outcome["violations"] = [f"the run failed: {type(exc).__name__}: {exc}"]
    outcome["cpu"] = time.process_time() - began
    mode = "exact" if exact else "adversarial"
    print(
        f"# {mode} seed {seed}: {outcome['checks']} checks, {len(outcome['violations'])} violations, "
        f"{len(outcome['unfinished'])} unfinished, {outcome['cpu']:.1f} s CPU",
        file=sys.stderr,
        flush=True,
    )
    return outcome


def _summary(label: str, results: list[dict[str, Any]]) -> None:
    checks = sum(r["checks"] for r in results)
    violations = sum(len(r["violations"]) for r in results)
    # in a scarce region a job may still wait when the run ends (a wide job the region cannot launch):
    # then it must say why; otherwise every job must end
    failing = [
        r["seed"]
        for r in results
        if r["violations"] or r["without_reason"] or (r["unfinished"] and not r["scarce"])
    ]
    rate = 1000 * violations / checks if checks else 0.0
    cpu = sum(r["cpu"] for r in results) / len(results) if results else 0.0
    print(
        f"{label:<22} seeds {len(results):>4}  user ops {sum(r['operations'] for r in results):>5}  "
        f"SageMaker ops checked {checks:>7}  violations {violations:>3}  per 1,000 ops {rate:.3f}  "
        f"unfinished jobs {sum(len(r['unfinished']) for r in results)} "
        f"(without reason {sum(len(r['without_reason']) for r in results)})  CPU per seed {cpu:.2f} s"
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
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--baseline-seeds", type=int, default=10)
    parser.add_argument("--transport", choices=("in-process", "http"), default="in-process")
    parser.add_argument(
        "--scarce", action="store_true", help="SageMaker short: region, warm-pool quota, plan"
    )
    args = parser.parse_args()
    if args.jobs < 1 or args.seeds < 0 or args.baseline_seeds < 0:
        parser.error("--jobs must be at least 1; --seeds and --baseline-seeds at least 0")
    load_before = os.getloadavg()[0]
    began = time.perf_counter()
    seeds = list(range(args.first, args.first + args.seeds))
    base = seeds[: args.baseline_seeds]
    tasks = [(seed, False) for seed in seeds] + [(seed, True) for seed in base]
    with ProcessPoolExecutor(
        max_workers=args.jobs, initializer=_start_worker, initargs=(args.transport,)
    ) as pool:
        results = list(
            pool.map(
                _run_seed,
                [seed for seed, _ in tasks],
                [args.operations] * len(tasks),
                [exact for _, exact in tasks],
                [args.scarce] * len(tasks),
            )
        )
    wall = time.perf_counter() - began
    adversarial = results[: len(seeds)]
    exact = results[len(seeds) :]
    print(
        f"{len(tasks)} runs on {args.jobs} processes ({args.transport} moto): {wall:.0f} s wall; "
        f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after ({os.cpu_count()} cores)"
    )
    _summary("adversarial delivery", adversarial)
    _summary("exact delivery", exact)


if __name__ == "__main__":
    main()
