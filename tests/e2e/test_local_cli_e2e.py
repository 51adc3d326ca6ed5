"""`sagequeue local` in one process and the `sagequeue` CLI in others, as a person would use them, and
`sagequeue demo` passing (and failing loudly when the scheduler misbehaves)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sagequeue.local import LocalStack
from sagequeue.local.cli import demo
from sagequeue.local.demo import POOL, SETTINGS, Demo, DemoFailed, timings

SAGEQUEUE = (
    [sys.executable, "-m", "sagequeue.cli"]
    if not Path(sys.executable).with_name("sagequeue").exists()
    else [str(Path(sys.executable).with_name("sagequeue"))]
)


def cli_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SAGEQUEUE_"))}
    env.update({"SAGEQUEUE_HOME": str(home), "AWS_EC2_METADATA_DISABLED": "true", "PYTHONUNBUFFERED": "1"})
    return env


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """`sagequeue local` running in the background until the test ends."""
    home = tmp_path / "home"
    process = subprocess.Popen(
        [*SAGEQUEUE, "local", "--capacity", f"{POOL}=1", "--speed", "60"],
        env=cli_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    connection = home / "local.json"
    deadline = time.monotonic() + 60
    while not connection.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            output = process.stdout.read() if process.stdout else ""
            pytest.fail(f"sagequeue local did not come up: {output}")
        time.sleep(0.1)
    yield process, home
    if process.poll() is None:
        process.kill()
        process.wait(10)


def run_cli(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SAGEQUEUE, *args],
        env=cli_env(home),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_local_serves_other_terminals_and_stops_on_ctrl_c(
    served: tuple[subprocess.Popen[str], Path], tmp_path: Path
) -> None:
    process, home = served
    saved = json.loads((home / "local.json").read_text())
    assert saved["endpoint"].startswith("http://127.0.0.1:")
    identities = json.loads((home / "local-identities.json").read_text())
    assert identities["admin"]["admin"] is True

    # WHEN another terminal uses the CLI with nothing but the saved connection
    whoami = run_cli(home, "whoami", "--json")
    assert whoami.returncode == 0, whoami.stderr
    assert json.loads(whoami.stdout)["arn"] == identities["user"]["arn"]
    request = {
        "TrainingJobName": "from-the-cli",
        "RoleArn": f"arn:aws:iam::{identities['user']['account_id']}:role/sagequeue-local-training",
        "AlgorithmSpecification": {
            "TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1",
            "TrainingInputMode": "File",
        },
        "OutputDataConfig": {"S3OutputPath": "s3://b/o"},
        "ResourceConfig": {"InstanceType": POOL, "InstanceCount": 1, "VolumeSizeInGB": 64},
        "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        "Environment": {"SAGEQUEUE_SIM_DURATION": "600"},
    }
    submitted = run_cli(home, "submit", "-", "--priority", "4", "--json", stdin=json.dumps(request))
    assert submitted.returncode == 0, submitted.stderr
    assert json.loads(submitted.stdout)["priority"] == 4

    # THEN the running stack schedules it on its own (real clock, 60x): it starts within seconds
    deadline = time.monotonic() + 30
    state = ""
    while time.monotonic() < deadline:
        listed = run_cli(home, "ls", "--json")
        assert listed.returncode == 0, listed.stderr
        answer = json.loads(listed.stdout)
        jobs: list[dict[str, Any]] = answer["jobs"] if isinstance(answer, dict) else answer
        state = next(j["state"] for j in jobs if j["name"] == "from-the-cli")
        if state in ("starting", "running"):
            break
        time.sleep(0.5)
    assert state in ("starting", "running")

    # WHEN Ctrl-C, THEN it stops cleanly and forgets the saved connection
    process.send_signal(signal.SIGINT)
    assert process.wait(30) == 0
    output = process.stdout.read() if process.stdout else ""
    assert "sagequeue local stack up" in output
    assert "stopped." in output
    assert not (home / "local.json").exists()


def test_the_cli_says_when_no_stack_runs(tmp_path: Path) -> None:
    result = run_cli(tmp_path / "empty-home", "ls")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_the_demo_passes() -> None:
    result = CliRunner().invoke(demo, [])
    assert result.exit_code == 0, result.output
    assert "job4 (priority 3) submitted: job1 is preempted for it" in result.output
    assert "queued (preempted)" in result.output
    # the summary's count of warm-pool reuses is the reuses it names, the narrated one among them
    lines = result.output.splitlines()
    (at,) = [i for i, line in enumerate(lines) if line.strip().startswith("warm-pool reuses: ")]
    named = [line for line in lines[at + 1 :] if "'s warm instances" in line]
    assert int(lines[at].split(": ")[1]) == len(named) > 0
    assert "    warm-2 started on warm-1's warm instances" in named
    assert "article" not in result.output
    assert "idle stops: 1" in result.output
    assert "Demo passed" in result.output


@pytest.mark.slow
def test_the_demo_fails_loudly_when_the_scheduler_misbehaves() -> None:
    # GIVEN a stack that holds one instance where the scenario needs two
    settings = {**SETTINGS, "capacity": {POOL: 1}}
    lines: list[str] = []
    # WHEN the demo runs, THEN it stops at the first step, naming it and the queue it found
    with (
        LocalStack(settings=settings, emulator=timings(), function_logs=False) as stack,
        pytest.raises(DemoFailed, match="job1 and job2 start: still not true after 600 s"),
    ):
        Demo(stack, lines.append, step_seconds=120).run()
