"""A newcomer's first hour with `sagequeue local`, each step through the real `sagequeue` command in a
clean environment (no AWS configuration, no AWS variables, a home of its own):

- the Python snippets the start-up printout shows run as printed, and a job created through them is queued
  and watched without NoRegionError or NoCredentialsError;
- `eval "$(sagequeue local env --identity admin)"` makes the admin's keys win over local.json (flags >
  environment > local.json), and `sagequeue local env` points plain boto3 at the emulator;
- a second `sagequeue local` on the same home refuses, naming the first one's PID and URL, and leaves the
  first one's local.json alone;
- `--state PATH` keeps the queue across a restart.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

BIN = Path(sys.executable).parent
COMMAND = str(BIN / "sagequeue")
POOL = "ml.trn1.32xlarge"


def clean_environment(home: Path) -> dict[str, str]:
    """What a fresh machine has: no AWS_* variable, no ~/.aws, sagequeue's home in a temporary directory."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "SAGEQUEUE_")) and k not in ("HOME", "XDG_CONFIG_HOME")
    }
    env.update(
        HOME=str(home.parent / "user"),
        SAGEQUEUE_HOME=str(home),
        AWS_EC2_METADATA_DISABLED="true",
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    return env


@dataclass
class Served:
    home: Path
    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    #: what it prints after its banner, line by line (None once it exits)
    later: queue.Queue[str | None] = field(default_factory=queue.Queue)

    def wait_for_line(self, text: str, timeout: float = 60) -> str:
        """The first line printed from now on that holds `text`."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.later.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, "sagequeue local exited:\n" + "\n".join(self.lines)
            self.lines.append(line)
            if text in line:
                return line

    def run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [COMMAND, *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=clean_environment(self.home),
            timeout=60,
            check=False,
        )

    def stop(self) -> int:
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout=60)


def serve(home: Path, *args: str) -> Served:
    """Start `sagequeue local` and read its printout up to "Ctrl-C stops it"."""
    process = subprocess.Popen(
        [COMMAND, "local", "--speed", "60", "--capacity", f"{POOL}=1", *args],
        env=clean_environment(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    served = Served(home, process)
    lines = served.later

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 90
    while True:
        line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        assert line is not None, "sagequeue local exited:\n" + "\n".join(served.lines)
        served.lines.append(line)
        if line.startswith("Ctrl-C stops it"):
            return served


def snippet(printout: list[str], heading: str) -> str:
    """The lines under `heading` (after one blank line) up to the next blank line, exactly as printed."""
    start = next(i for i, line in enumerate(printout) if line.startswith(heading))
    assert printout[start + 1] == ""
    end = printout.index("", start + 2)
    return "\n".join(printout[start + 2 : end]) + "\n"


def training_request(name: str, account: str, seconds: int = 600) -> dict[str, Any]:
    return {
        "TrainingJobName": name,
        "RoleArn": f"arn:aws:iam::{account}:role/sagequeue-local-training",
        "AlgorithmSpecification": {
            "TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1",
            "TrainingInputMode": "File",
        },
        "OutputDataConfig": {"S3OutputPath": "s3://sagequeue-local/output"},
        "ResourceConfig": {"InstanceType": POOL, "InstanceCount": 1, "VolumeSizeInGB": 32},
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
        "Environment": {"SAGEQUEUE_SIM_DURATION": str(seconds)},
    }


def account_of(served: Served) -> str:
    whoami = served.run("whoami", "--json")
    assert whoami.returncode == 0, whoami.stderr
    return str(json.loads(whoami.stdout)["arn"].split(":")[4])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("first-hour") / "home"
    running = serve(home)
    try:
        yield running
    finally:
        if running.process.poll() is None:
            running.stop()


def test_the_printed_boto3_snippet_runs_as_printed_in_a_clean_environment(
    served: Served, tmp_path: Path
) -> None:
    code = snippet(served.lines, "Plain boto3 (SDK v3 too)")
    assert code.startswith("import boto3, sagequeue\n")
    name = f"snippet-{uuid.uuid4().hex[:6]}"
    request = training_request(name, account_of(served))
    script = tmp_path / "snippet.py"
    # the snippet verbatim, then what a user does next with `sm`
    script.write_text(
        code
        + "import json, sys\n"
        + f"sm.create_training_job(**json.loads({json.dumps(json.dumps(request))}))\n"
        + f"print(sm.describe_training_job(TrainingJobName={name!r})['TrainingJobStatus'])\n"
    )
    ran = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=clean_environment(served.home),
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "InProgress"  # a queued job describes as InProgress (Pending)
    shown = served.run("show", name, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["state"] in ("queued", "starting", "running", "completed")


def test_the_printed_sdk_v2_snippet_names_everything_a_bare_machine_lacks(served: Served) -> None:
    """The SDK v2 snippet needs the SageMaker SDK; tests/e2e/test_sdk_v2.py runs it verbatim in a clean
    environment. Here: it passes the region, the user's keys and the emulator's and logs' endpoints, the
    same the boto3 snippet passes."""
    v2 = snippet(served.lines, "SDK v2 session")
    v3 = snippet(served.lines, "Plain boto3 (SDK v3 too)")
    for line in v3.splitlines():
        if line.strip().startswith(("region_name=", "aws_access_key_id=", "aws_secret_access_key=")):
            assert line in v2
    sagemaker = next(line for line in v3.splitlines() if "endpoint_url=" in line).split("=", 1)[1]
    assert f'aws.client("sagemaker", endpoint_url={sagemaker.rstrip(",")})' in v2
    assert 'logs_client=aws.client("logs", endpoint_url="http://127.0.0.1:' in v2


def test_admin_keys_from_local_env_win_over_local_json(served: Served) -> None:
    as_user = served.run("capacity", "ml.trn1.2xlarge", "1")
    assert as_user.returncode == 1
    assert "admin" in as_user.stderr

    script = 'eval "$(sagequeue local env --identity admin)" && sagequeue capacity ml.trn1.2xlarge 1 --json'
    as_admin = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        env=clean_environment(served.home),
        timeout=60,
        check=False,
    )
    assert as_admin.returncode == 0, as_admin.stderr
    assert json.loads(as_admin.stdout)["capacity"] == 1
    whoami = subprocess.run(
        ["bash", "-c", 'eval "$(sagequeue local env --identity admin)" && sagequeue whoami --json'],
        capture_output=True,
        text=True,
        env=clean_environment(served.home),
        timeout=60,
        check=False,
    )
    assert json.loads(whoami.stdout)["admin"] is True


def test_local_env_points_plain_boto3_at_the_emulator(served: Served) -> None:
    saved = json.loads((served.home / "local.json").read_text())
    assert saved["pid"] == served.process.pid
    assert saved["sagemaker_endpoint"].startswith("http://127.0.0.1:")
    exported = served.run("local", "env")
    assert exported.returncode == 0, exported.stderr
    assert f"export AWS_ENDPOINT_URL_SAGEMAKER={saved['sagemaker_endpoint']}" in exported.stdout.splitlines()
    assert f"export SAGEQUEUE_ENDPOINT={saved['endpoint']}" in exported.stdout.splitlines()
    # S3 too: `sagequeue cache` against the local stack must not reach the real S3
    assert f"export AWS_ENDPOINT_URL_S3={saved['aws_endpoint']}" in exported.stdout.splitlines()
    cached = subprocess.run(
        ["bash", "-c", 'eval "$(sagequeue local env)" && sagequeue cache create s3://local-neff/cache'],
        capture_output=True,
        text=True,
        env=clean_environment(served.home),
        timeout=60,
        check=False,
    )
    assert cached.returncode == 0, cached.stderr
    listed = subprocess.run(
        [
            "bash",
            "-c",
            'eval "$(sagequeue local env)" && python -c '
            '\'import boto3; print(boto3.client("sagemaker").meta.endpoint_url); '
            'boto3.client("sagemaker").list_training_jobs()\'',
        ],
        capture_output=True,
        text=True,
        env=clean_environment(served.home),
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip() == saved["sagemaker_endpoint"]

    unknown = served.run("local", "env", "--identity", "nobody")
    assert unknown.returncode == 2  # bad usage, as docs/client.md's table has it
    assert unknown.stderr.strip() == "error: no local identity named 'nobody'; known: admin, other, user"


def test_a_second_stack_on_the_same_home_refuses_naming_the_first(served: Served) -> None:
    before = (served.home / "local.json").read_text()
    endpoint = json.loads(before)["endpoint"]
    second = served.run("local", "--speed", "60")
    assert second.returncode == 1
    assert second.stderr.strip() == (
        f"error: another sagequeue local (PID {served.process.pid}, {endpoint}) runs on {served.home}; "
        "stop it, or give this one a home of its own with SAGEQUEUE_HOME=DIR"
    )
    assert (served.home / "local.json").read_text() == before
    assert served.process.poll() is None
    assert served.run("whoami").returncode == 0


def test_local_env_without_a_stack_says_so(tmp_path: Path) -> None:
    home = tmp_path / "nothing"
    ran = subprocess.run(
        [COMMAND, "local", "env"],
        capture_output=True,
        text=True,
        env=clean_environment(home),
        timeout=60,
        check=False,
    )
    # exit 3 (the queue cannot be located), as `sagequeue ls` answers the same home, and one line
    listed = subprocess.run(
        [COMMAND, "ls"], capture_output=True, text=True, env=clean_environment(home), timeout=60, check=False
    )
    assert (ran.returncode, listed.returncode) == (3, 3)
    assert ran.stderr.startswith(f"error: no local stack runs on this home: {home}/local.json does not exist")
    assert len(ran.stderr.splitlines()) == 1


@pytest.mark.slow
def test_the_queue_survives_a_restart_with_state(tmp_path: Path) -> None:
    home = tmp_path / "home"
    state = tmp_path / "queue.json"
    first = serve(home, "--state", str(state))
    assert any("--state" not in line and str(state) in line for line in first.lines)
    account = account_of(first)
    # a long job takes the one instance; the second waits behind it
    for name, priority in (("long-runner", "5"), ("waiting", "1")):
        submitted = first.run(
            "submit", "-", "--priority", priority, stdin=json.dumps(training_request(name, account, 36000))
        )
        assert submitted.returncode == 0, submitted.stderr
    deadline = time.monotonic() + 60
    while json.loads(first.run("show", "long-runner", "--json").stdout)["state"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert first.stop() == 0
    assert not (home / "local.json").exists()
    saved = json.loads(state.read_text())
    assert saved["format"] == 1
    assert oct(state.stat().st_mode & 0o777) == "0o600"

    second = serve(home, "--state", str(state))
    try:
        jobs = {j["name"]: j for j in json.loads(second.run("ls", "--json").stdout)["jobs"]}
        assert set(jobs) == {"long-runner", "waiting"}
        assert jobs["waiting"]["state"] == "queued"
        assert jobs["waiting"]["priority"] == 1
        # the training job died with the first stack's emulator: the reconcile requeues and restarts it
        deadline = time.monotonic() + 60
        while True:
            shown = json.loads(second.run("show", "long-runner", "--json").stdout)
            if shown["attempt"] == 2 and shown["state"] in ("starting", "running"):
                break
            assert time.monotonic() < deadline, shown
            time.sleep(0.5)
        assert any("no longer exists" in (h.get("reason") or "") for h in shown["history"])
        # the history stays in time order across the restart
        times = [h["at"] for h in shown["history"]]
        assert times == sorted(times)
    finally:
        second.stop()


def test_a_state_file_that_is_not_one_is_left_alone(tmp_path: Path) -> None:
    home = tmp_path / "home"
    state = tmp_path / "queue.json"
    state.write_text('{"some": "other file"}')
    ran = subprocess.run(
        [COMMAND, "local", "--state", str(state)],
        capture_output=True,
        text=True,
        env=clean_environment(home),
        timeout=90,
        check=False,
    )
    assert ran.returncode == 1
    assert ran.stderr.strip().startswith(f"error: the local stack did not start: {state} is not a sagequeue")
    assert state.read_text() == '{"some": "other file"}'
    assert not (home / "local.json").exists()


def test_the_terminal_shows_each_jobs_notices(served: Served) -> None:
    account = account_of(served)
    submitted = served.run("submit", "-", stdin=json.dumps(training_request("noticed", account, 60)))
    assert submitted.returncode == 0, submitted.stderr

    started = served.wait_for_line("job noticed started")
    finished = served.wait_for_line("job noticed finished", timeout=120)

    assert started == "notice: sagequeue: job noticed started (owner sagequeue-local-user)"
    assert finished == "notice: sagequeue: job noticed finished (owner sagequeue-local-user)"
