"""What the emulator's harshness costs: the same workload with AWS-like defaults and with the kind settings.

    .venv/bin/python bench/bench_emulator.py [jobs]

Creates `jobs` training jobs through boto3 (each request validated against botocore's service model), then
advances a simulated day; prints seconds for each setting and the ratio against the kind baseline.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from typing import Any

from botocore.config import Config

from sagequeue.local import SageMakerEmulator, VirtualClock


def request(name: str) -> dict[str, Any]:
    return {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::123456789012:role/SageMakerTraining",
        "AlgorithmSpecification": {"TrainingImage": "neuron-train:2.21", "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": "s3://bench/output"},
        "ResourceConfig": {"InstanceType": "ml.trn1.32xlarge", "InstanceCount": 1, "VolumeSizeInGB": 64},
        "Environment": {"SAGEQUEUE_SIM_DURATION": "600"},
    }


def run(jobs: int, **options: Any) -> tuple[float, int]:
    events: list[dict[str, Any]] = []
    clock = VirtualClock(datetime(2026, 3, 2, 9, tzinfo=UTC))
    with SageMakerEmulator(clock=clock, on_event=events.append, **options) as emulator:
        client = emulator.client(config=Config(retries={"total_max_attempts": 1}))
        began = time.perf_counter()
        for n in range(jobs):
            client.create_training_job(**request(f"bench-{n}"))
            if n % 50 == 49:
                emulator.advance(10)  # creates spread over time, as a scheduler's would be
        emulator.advance(86400)
        return time.perf_counter() - began, len(events)


def main() -> None:
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    kind, kind_events = run(jobs, exactly_once_in_order=True, rates=None)
    harsh, harsh_events = run(jobs)
    print(f"{jobs} jobs, then a simulated day")
    print(f"kind (exactly once, no throttling): {kind:6.2f} s, {kind_events} events")
    print(f"AWS-like defaults (seed 0):        {harsh:6.2f} s, {harsh_events} events, x{harsh / kind:.2f}")


if __name__ == "__main__":
    main()
