"""The two commands a newcomer runs: `sagequeue local` in one terminal, the queue commands in another.

Both are separate processes; they meet only through the connection file `sagequeue local` saves in
$SAGEQUEUE_HOME. The stack runs on the real clock sixty times faster, so a training job of a few
simulated minutes runs in seconds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: The test run's fake AWS keys: in the environment they would win over the saved local stack's.
AWS_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")

COMMAND = str(Path(sys.executable).with_name("sagequeue"))
POOL = "ml.trn1.32xlarge"


def environment(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGEQUEUE_") and k not in AWS_KEYS}
    env["SAGEQUEUE_HOME"] = str(home)
    return env


def sagequeue(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [COMMAND, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=environment(home),
        timeout=60,
        check=False,
    )


@pytest.fixture
def local_stack(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    home = tmp_path / "home"
    server = subprocess.Popen(
        [COMMAND, "local", "--speed", "60", "--capacity", f"{POOL}=1"],
        env=environment(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while not (home / "local.json").exists():
            assert server.poll() is None, (
                f"sagequeue local exited: {server.stdout.read() if server.stdout else ''}"
            )
            assert time.monotonic() < deadline, "sagequeue local did not save its connection"
            time.sleep(0.1)
        yield home, server
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def test_a_job_submitted_from_the_cli_runs_on_the_local_stack(local_stack: tuple[Path, Any]) -> None:
    home, server = local_stack
    saved = json.loads((home / "local.json").read_text())
    assert set(saved) == {
        "endpoint",
        "region",
        "access_key_id",
        "secret_access_key",
        "sagemaker_endpoint",
        "aws_endpoint",
        "job_notices_topic_arn",
        "pid",
    }
    assert saved["pid"] == server.pid

    identity = json.loads(sagequeue(home, "whoami", "--json").stdout)
    assert identity["endpoint"] == saved["endpoint"]
    account = identity["arn"].split(":")[4]
    name = f"hello-{uuid.uuid4().hex[:6]}"
    request = {
        "TrainingJobName": name,
        "RoleArn": f"arn:aws:iam::{account}:role/sagequeue-local-training",
        "AlgorithmSpecification": {
            "TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1",
            "TrainingInputMode": "File",
        },
        "OutputDataConfig": {"S3OutputPath": "s3://sagequeue-local/output"},
        "ResourceConfig": {"InstanceType": POOL, "InstanceCount": 1, "VolumeSizeInGB": 32},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "Environment": {"SAGEQUEUE_SIM_DURATION": "60"},
    }

    submitted = sagequeue(home, "submit", "-", "--priority", "50", stdin=json.dumps(request))
    assert submitted.returncode == 0, submitted.stderr

    deadline = time.monotonic() + 90
    seen: list[str] = []
    while True:
        shown = sagequeue(home, "show", name, "--json")
        assert shown.returncode == 0, shown.stderr
        state = json.loads(shown.stdout)["state"]
        if not seen or seen[-1] != state:
            seen.append(state)
        if state == "completed":
            break
        assert time.monotonic() < deadline, f"the job did not complete; states seen: {seen}"
        time.sleep(0.5)
    # polling can miss a short state on a busy machine; the job's history cannot
    history = [entry["state"] for entry in json.loads(shown.stdout)["history"]]
    assert history[-3:] == ["starting", "running", "completed"], history

    table = sagequeue(home, "ls", "--all")  # the queue is what has not ended; --all shows the rest
    assert [name, "completed", "50", "1", POOL] == table.stdout.splitlines()[1].split()[:5]

    # --wait follows a job to its end and says how it went in the exit code
    followed = f"{name}-again"
    waited = sagequeue(
        home, "submit", "-", "--name", followed, "--wait", "--poll", "0.2", stdin=json.dumps(request)
    )
    assert waited.returncode == 0, waited.stderr
    lines = waited.stdout.splitlines()
    # the first poll may already find it started (the pool has room); a busy machine may skip a state
    assert lines[0].split(",")[0] in (f"{followed}: queued", f"{followed}: starting", f"{followed}: running")
    assert any(f"attempt 1 as {followed}" in line for line in lines)
    assert lines[-1].startswith(f"{followed}: completed")
    failing = {
        **request,
        "Environment": {
            "SAGEQUEUE_SIM_DURATION": "30",
            "SAGEQUEUE_SIM_OUTCOME": "Failed:AlgorithmError: boom",
        },
    }
    failed = sagequeue(
        home, "submit", "-", "--name", f"{name}-fails", "--wait", "--poll", "0.2", stdin=json.dumps(failing)
    )
    assert failed.returncode == 1
    assert failed.stderr.startswith(f"error: job {name}-fails ended failed")
    assert "boom" in failed.stderr

    server.send_signal(signal.SIGINT)
    assert server.wait(timeout=30) == 0
    assert not (home / "local.json").exists()
    after = sagequeue(home, "ls")
    assert after.returncode == 3
    assert "no sagequeue endpoint" in after.stderr
