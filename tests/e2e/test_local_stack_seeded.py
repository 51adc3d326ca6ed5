"""The whole embedded stack on the harsh emulator is reproducible: the same seed gives the same SageMaker
event log, byte for byte, in two separate processes; another seed gives another run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SCENARIO = """
import sys
from sagequeue.local import LocalStack
POOL = "ml.trn1.32xlarge"
settings = {"capacity": {POOL: 2}, "min_runtime_before_preemption_seconds": 0}
with LocalStack(settings=settings, emulator={"seed": int(sys.argv[1])}, function_logs=False) as stack:
    queue = stack.client()
    for index, priority in enumerate((1, 5, 3)):
        queue.submit(
            {
                "TrainingJobName": f"seeded-{index}",
                "RoleArn": stack.training_role_arn,
                "AlgorithmSpecification": {"TrainingImage": "img:1", "TrainingInputMode": "File"},
                "OutputDataConfig": {"S3OutputPath": "s3://bucket/output"},
                "ResourceConfig": {"InstanceType": POOL, "InstanceCount": 1, "VolumeSizeInGB": 64},
                "StoppingCondition": {"MaxRuntimeInSeconds": 7200},
                "Environment": {"SAGEQUEUE_SIM_DURATION": "600"},
            },
            priority=priority,
        )
        stack.advance(30)
    stack.advance(3000)
    log = stack.emulator.event_log_bytes()
with open(sys.argv[2], "wb") as out:
    out.write(log)
"""


def event_log(seed: int, where: Path) -> bytes:
    target = where / f"events-{seed}-{len(list(where.iterdir()))}.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", SCENARIO, str(seed), str(target)],
        capture_output=True,
        timeout=300,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return target.read_bytes()


def test_the_same_seed_replays_the_whole_stack_byte_for_byte(tmp_path: Path) -> None:
    first = event_log(4, tmp_path)
    assert first.count(b"\n") >= 3 * 5, "every job's changes were delivered"
    assert b'"TrainingJobStatus":"Completed"' in first
    assert event_log(4, tmp_path) == first
    assert event_log(5, tmp_path) != first
