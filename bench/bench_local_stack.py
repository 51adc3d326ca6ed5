"""Start-up time of the embedded stack, and what one scheduling round trip costs on it.

    python bench/bench_local_stack.py [--repeat N]

- cold start: a fresh interpreter imports sagequeue.local and starts a LocalStack (moto's server, the
  resources of template.yaml, the SageMaker emulator, the handlers, the API), measured from before the
  import to `start()` returning; interpreter start-up itself is not counted.
- warm start: another LocalStack in the same process (imports and service models already loaded), which is
  what each test after the first pays.
- submit to running: a job submitted over the signed API until the scheduler has it running on the
  emulator, on the virtual clock (API, EventBridge, SQS, scheduler, SageMaker events, all over HTTP).

Figures are medians; the machine's load shows in them, so the load average is printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

COLD = """
import json, sys, time
began = time.perf_counter()
from sagequeue.local import LocalStack
imported = time.perf_counter()
stack = LocalStack(settings={"capacity": {"ml.trn1.32xlarge": 2}}, function_logs=False).start()
ready = time.perf_counter()
stack.stop()
print(json.dumps({"import": imported - began, "start": ready - imported, "total": ready - began}))
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    colds = [cold_start() for _ in range(args.repeat)]
    starts, round_trips = warm_figures(args.repeat)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"LocalStack start-up, median of {args.repeat} (load average {load:.1f} on {os.cpu_count()} CPUs)")
    print(f"  cold start (fresh process):  {statistics.median(c['total'] for c in colds):6.2f} s")
    print(f"    of which imports:          {statistics.median(c['import'] for c in colds):6.2f} s")
    print(f"    of which start():          {statistics.median(c['start'] for c in colds):6.2f} s")
    print(f"  warm start (same process):   {statistics.median(starts):6.2f} s")
    print(f"  submit -> running (virtual): {statistics.median(round_trips):6.2f} s")


if __name__ == "__main__":
    main()
