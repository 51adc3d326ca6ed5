"""Start-up time of the embedded stack, and what one scheduling round trip costs on it.

    python bench/bench_local_stack.py [--repeat N] [--cold-only] [--demo] [--pass-cost] [--queued 10,1000,10000]

- cold start: a fresh interpreter imports sagequeue.local and starts a LocalStack (moto's server, the
  resources of template.yaml, the SageMaker emulator, the handlers, the API), measured from before the
  import to `start()` returning; interpreter start-up itself is not counted. The SAM translation of
  template.yaml is kept between processes (docs/adr/0012), so this is every start but the first after the
  template or the translator changes; `SAGEQUEUE_CACHE_DIR=` (empty) measures a start that translates.
- warm start: another LocalStack in the same process (imports and service models already loaded), which is
  what each test after the first pays.
- submit to running: a job submitted over the signed API until the scheduler has it running on the
  emulator, on the virtual clock (API, EventBridge, SQS, scheduler, SageMaker events, all over HTTP).

- the demo (`--demo`): `sagequeue demo` in a fresh process, its wall and CPU time (goal: under 10 s wall).
- ready (`--ready`): `sagequeue local` in a fresh process, from its start until its API answers an HTTP
  request (goal: under 2 s), interpreter start-up included; the stack is then stopped with Ctrl-C.
- `--baseline REF` runs `--demo` and `--ready` alternately on this tree and on the git revision REF (its
  `sdk` and `layers/core` exported to a temporary folder and put first on PYTHONPATH; same interpreter and
  packages), so both see the same load, and prints the ratio of the medians.
- pass cost (`--pass-cost`): DynamoDB read and write requests and SageMaker calls of one scheduler pass
  with 8 pools of 2 instances, all running, and 10 / 1,000 / 10,000 queued jobs behind them: the first pass
  after the burst (it writes why each job in the pools' windows waits), the next one (nothing changed),
  and a timer pass; then the ratio 10,000 / 10 (goal for reads: at most 1.1).

Figures are medians; the machine's load shows in them, so the load average is printed too.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

COLD = """
import json, sys, time
began, cpu_began = time.perf_counter(), time.process_time()
from sagequeue.local import LocalStack
imported = time.perf_counter()
stack = LocalStack(settings={"capacity": {"ml.trn1.32xlarge": 2}}, function_logs=False).start()
ready, cpu_ready = time.perf_counter(), time.process_time()
stack.stop()
print(json.dumps({"import": imported - began, "start": ready - imported, "total": ready - began,
                  "cpu": cpu_ready - cpu_began}))
"""


def cold_start() -> dict[str, float]:
    answer = subprocess.run(
        [sys.executable, "-c", COLD],
        check=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=os.environ.copy(),
    )
    figures: dict[str, float] = json.loads(answer.stdout.strip().splitlines()[-1])
    return figures


def warm_figures(repeat: int) -> tuple[list[float], list[float]]:
    from sagequeue.local import LocalStack

    starts: list[float] = []
    round_trips: list[float] = []
    request = {
        "RoleArn": "",
        "AlgorithmSpecification": {
            "TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1",
            "TrainingInputMode": "File",
        },
        "OutputDataConfig": {"S3OutputPath": "s3://bench/out"},
        "ResourceConfig": {"InstanceType": "ml.trn1.32xlarge", "InstanceCount": 1, "VolumeSizeInGB": 64},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "Environment": {"SAGEQUEUE_SIM_DURATION": "600"},
    }
    for index in range(repeat):
        began = time.perf_counter()
        stack = LocalStack(
            settings={"capacity": {"ml.trn1.32xlarge": 2}},
            emulator={"provisioning_seconds": 60, "download_seconds": 10},
            function_logs=False,
        ).start()
        starts.append(time.perf_counter() - began)
        try:
            queue = stack.client()
            began = time.perf_counter()
            queue.submit({**request, "TrainingJobName": f"bench-{index}", "RoleArn": stack.training_role_arn})
            stack.run_until_idle()
            stack.advance(70)
            state = queue.job(f"bench-{index}").state
            round_trips.append(time.perf_counter() - began)
            if state != "running":
                raise SystemExit(f"the benchmark job should be running after 70 s, it is {state}")
        finally:
            stack.stop()
    return starts, round_trips


#: Eight pools (instance types) of two instances each, as in issue #17's figures.
POOLS = (
    "ml.trn1.32xlarge",
    "ml.trn1n.32xlarge",
    "ml.trn2.48xlarge",
    "ml.trn1.2xlarge",
    "ml.p5.48xlarge",
    "ml.p4d.24xlarge",
    "ml.g5.12xlarge",
    "ml.g6.12xlarge",
)
READS = {"GetItem", "Query", "Scan", "BatchGetItem", "TransactGetItems"}
WRITES = {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"}


def _training_request(name: str, instance_type: str, role: str) -> dict[str, Any]:
    return {
        "TrainingJobName": name,
        "RoleArn": role,
        "AlgorithmSpecification": {
            "TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1",
            "TrainingInputMode": "File",
        },
        "OutputDataConfig": {"S3OutputPath": "s3://bench/out"},
        "ResourceConfig": {"InstanceType": instance_type, "InstanceCount": 1, "VolumeSizeInGB": 64},
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
        "Environment": {"SAGEQUEUE_SIM_DURATION": "86400"},
    }


def _metered(deps: Any, run: Any) -> Counter[str]:
    """Requests by operation ("dynamodb:Query", "sagemaker:DescribeTrainingJob") while `run()` runs, and
    the CPU milliseconds of the handler's own thread ("cpu_ms"; moto and the emulator serve on others)."""
    counts: Counter[str] = Counter()

    def count(model: Any, **_: Any) -> None:
        counts[f"{model.service_model.service_name}:{model.name}"] += 1

    clients = [deps.store.client, deps.clients["sagemaker"]]
    for client in clients:
        client.meta.events.register("before-call.*.*", count)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the handler's EMF metric documents
            began = time.thread_time()
            run()
            counts["cpu_ms"] = round((time.thread_time() - began) * 1000)
    finally:
        for client in clients:
            client.meta.events.unregister("before-call.*.*", count)
    return counts


def _summary(counts: Counter[str]) -> tuple[int, int, int]:
    def total(service: str, operations: set[str] | None) -> int:
        return sum(
            n
            for op, n in counts.items()
            if op.startswith(service + ":") and (operations is None or op.split(":")[1] in operations)
        )

    return total("dynamodb", READS), total("dynamodb", WRITES), total("sagemaker", None)


def pass_cost(queued: int) -> dict[str, Counter[str]]:
    """Metered scheduler passes with every pool full and `queued` jobs waiting behind them."""
    import pynamodb.settings

    # moto copies the whole table for each TransactWriteItems (to roll back), so with 10,000 jobs one
    # transaction takes seconds here, never on DynamoDB: let it finish rather than time out and retry.
    pynamodb.settings.default_settings_dict["read_timeout_seconds"] = 600
    from sagequeue.local import LocalStack
    from sagequeue.local.router import LambdaContext
    from sagequeue_core import runtime
    from sagequeue_core.domain import Job

    stack = LocalStack(
        settings={"capacity": dict.fromkeys(POOLS, 2), "min_runtime_before_preemption_seconds": 3600},
        emulator={"provisioning_seconds": 60, "download_seconds": 10},
        function_logs=False,
    ).start()
    try:
        queue = stack.client()
        for pool_index, pool in enumerate(POOLS):
            for n in range(2):
                name = f"running-{pool_index}-{n}"
                queue.submit({**_training_request(name, pool, stack.training_role_arn), "priority": 9})
        stack.run_until_idle()
        stack.advance(120)
        deps = runtime.dependencies()
        jobs = []
        for n in range(queued):
            name = f"waiting-{n:05d}"
            body = _training_request(name, POOLS[n % len(POOLS)], stack.training_role_arn)
            jobs.append(
                Job(
                    name=name,
                    request=body,
                    priority=n % 7,
                    owner=stack.identity().arn,
                    submitted_at=stack.now() + timedelta(milliseconds=n),
                )
            )
        deps.store.import_jobs(jobs)  # bulk: submitting 10,000 over the API would measure the API
        scheduler = _load_handler("scheduler")
        context = LambdaContext(
            "bench-scheduler", "arn:aws:lambda:us-east-1:123456789012:function:bench", 512, 120
        )

        def changed() -> None:
            event = {
                "version": "0",
                "id": str(uuid.uuid4()),
                "source": "sagequeue",
                "detail-type": "JobChanged",
                "detail": {"name": "bench", "change": "changed"},
            }
            scheduler.handler(event, context)

        def timer() -> None:
            event = json.loads((ROOT / "tests/events/scheduled-reconcile.json").read_text())
            scheduler.handler(event, context)

        return {
            "first pass after the burst": _metered(deps, changed),
            "next pass (nothing changed)": _metered(deps, changed),
            "timer pass": _metered(deps, timer),
        }
    finally:
        stack.stop()


def _load_handler(function: str) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        f"bench_{function}", ROOT / "functions" / function / "app.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def print_pass_cost(sizes: list[int]) -> None:
    results = {size: pass_cost(size) for size in sizes}
    print(f"scheduler pass cost: {len(POOLS)} pools x 2 instances, all running; requests per pass")
    print(f"  {'queued':>7}  {'pass':<28} {'DDB reads':>9} {'DDB writes':>10} {'SageMaker':>9} {'CPU ms':>7}")
    for size, passes in results.items():
        for label, counts in passes.items():
            reads, writes, sagemaker = _summary(counts)
            print(f"  {size:>7}  {label:<28} {reads:>9} {writes:>10} {sagemaker:>9} {counts['cpu_ms']:>7}")
    small, large = min(sizes), max(sizes)
    for label in results[small]:
        (r1, w1, s1), (r2, w2, s2) = _summary(results[small][label]), _summary(results[large][label])
        print(
            f"  {large:,} / {small:,} {label}: reads {r2 / max(r1, 1):.2f}, writes {w2 / max(w1, 1):.2f}, "
            f"SageMaker {s2 / max(s1, 1):.2f}"
        )
    detail = {label: dict(sorted(counts.items())) for label, counts in results[large].items()}
    print(f"  by operation at {large:,} queued: {json.dumps(detail)}")


SAGEQUEUE = str(Path(sys.executable).with_name("sagequeue"))


def _tree_env(tree: Path | None, home: Path) -> dict[str, str]:
    """The environment of a run: this checkout (`tree` None) or an exported revision first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGEQUEUE_")}
    env["SAGEQUEUE_HOME"] = str(home)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree / "sdk"), str(tree / "layers" / "core")])
        env["SAGEQUEUE_TEMPLATE"] = str(tree / "template.yaml")
    return env


def _export(revision: str, into: Path) -> Path:
    """The files of git revision `revision` in a new folder under `into`."""
    tree = into / "baseline"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", revision], cwd=ROOT, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def demo_run(tree: Path | None, home: Path) -> tuple[float, float]:
    """Wall and CPU seconds of `sagequeue demo` in a fresh process (the demo checks every step itself)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    subprocess.run([SAGEQUEUE, "demo"], check=True, capture_output=True, cwd=home, env=_tree_env(tree, home))
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def ready_run(tree: Path | None, home: Path) -> tuple[float, float]:
    """Seconds from starting `sagequeue local` until its API answers an HTTP request, and the seconds it
    says its stack took to start."""
    import re
    import signal
    import urllib.error
    import urllib.request

    began = time.perf_counter()
    server = subprocess.Popen(
        [SAGEQUEUE, "local", "--capacity", "ml.trn1.32xlarge=2"],
        cwd=home,
        env=_tree_env(tree, home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert server.stdout is not None
        endpoint, up = None, float("nan")
        for line in server.stdout:
            if match := re.search(r"stack up in ([0-9.]+) s", line):
                up = float(match.group(1))
            if match := re.search(r"API endpoint\s+(http://\S+)", line):
                endpoint = match.group(1)
                break
        if endpoint is None:
            raise SystemExit(f"sagequeue local printed no API endpoint (exit {server.poll()})")
        # unsigned: any answer (a 403) shows the stack serves; the endpoint is the http:// URL it printed
        with contextlib.suppress(urllib.error.HTTPError):
            urllib.request.urlopen(endpoint + "/jobs", timeout=30)  # noqa: S310
        return time.perf_counter() - began, up
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.communicate()


def compare(what: str, run: Any, repeat: int, baseline: str | None, unit: str) -> None:
    """`run(tree, home)` `repeat` times on this tree, alternating with `baseline` when given."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="sagequeue-bench-") as scratch:
        trees: dict[str, Path | None] = {"now": None}
        if baseline is not None:
            trees[baseline] = _export(baseline, Path(scratch))
        runs: dict[str, list[tuple[float, float]]] = {label: [] for label in trees}
        for index in range(repeat):
            # each tree goes first every other round, so neither always follows the other's shutdown
            order = list(trees.items())
            for label, tree in order if index % 2 == 0 else order[::-1]:
                home = Path(scratch) / f"home-{label}-{index}"
                home.mkdir()
                runs[label].append(run(tree, home))
        load = os.getloadavg()[0]
        print(f"{what}, {repeat} runs each, alternating (load average {load:.1f} on {os.cpu_count()} CPUs)")
        for label, figures in runs.items():
            shown = ", ".join(f"{first:.2f}" for first, _ in figures)
            print(
                f"  {label:>10}: median {statistics.median(f for f, _ in figures):6.2f} s "
                f"(runs {shown}); {unit} {statistics.median(s for _, s in figures):.2f} s"
            )
        if baseline is not None:
            now = statistics.median(f for f, _ in runs["now"])
            before = statistics.median(f for f, _ in runs[baseline])
            print(f"  now / {baseline}: {now / before:.2f} (median against median)")


def print_demo(repeat: int, baseline: str | None = None) -> None:
    compare("sagequeue demo, wall time", demo_run, repeat, baseline, "median CPU")


def print_ready(repeat: int, baseline: str | None = None) -> None:
    compare(
        "sagequeue local ready (start until the API answers)",
        ready_run,
        repeat,
        baseline,
        "stack's own start",
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--pass-cost", action="store_true", help="only the scheduler's per-pass cost")
    parser.add_argument("--queued", default="10,1000,10000", help="queue sizes for --pass-cost")
    parser.add_argument("--cold-only", action="store_true", help="only the fresh-process start")
    parser.add_argument("--demo", action="store_true", help="only `sagequeue demo`, run --repeat times")
    parser.add_argument("--ready", action="store_true", help="only `sagequeue local` until it answers")
    parser.add_argument("--baseline", metavar="REF", help="with --demo or --ready: also run git revision REF")
    args = parser.parse_args()
    if args.pass_cost:
        print_pass_cost([int(size) for size in args.queued.split(",")])
        return
    if args.demo or args.ready:
        if args.demo:
            print_demo(args.repeat, args.baseline)
        if args.ready:
            print_ready(args.repeat, args.baseline)
        return
    colds = [cold_start() for _ in range(args.repeat)]
    starts, round_trips = ([], []) if args.cold_only else warm_figures(args.repeat)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"LocalStack start-up, median of {args.repeat} (load average {load:.1f} on {os.cpu_count()} CPUs)")
    print(f"  cold start (fresh process):  {statistics.median(c['total'] for c in colds):6.2f} s")
    print(f"    of which imports:          {statistics.median(c['import'] for c in colds):6.2f} s")
    print(f"    of which start():          {statistics.median(c['start'] for c in colds):6.2f} s")
    print(f"    CPU time (all threads):    {statistics.median(c['cpu'] for c in colds):6.2f} s")
    if starts:
        print(f"  warm start (same process):   {statistics.median(starts):6.2f} s")
        print(f"  submit -> running (virtual): {statistics.median(round_trips):6.2f} s")


if __name__ == "__main__":
    main()
