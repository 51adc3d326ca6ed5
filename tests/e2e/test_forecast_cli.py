"""Forecasts where users look, on a busy pool with a reservation and a loan: `ls --start`, `show`, `why` and
`submit --dry-run`, run as a user runs them (a separate process) against the local stack over HTTP."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from sagequeue.client import QueueClient
from sagequeue.config import save_local_connection
from sagequeue.local import LocalStack

AWS_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
POOL = "ml.trn1.32xlarge"
OTHER = "ml.trn2.48xlarge"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/neuron-train:2.21"
COMMAND = str(Path(sys.executable).with_name("sagequeue"))


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        return json.loads(self.out)


def sagequeue(*args: str, home: Path, stdin: str | None = None) -> Run:
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith("SAGEQUEUE_") and k not in AWS_KEYS
    }
    environment["SAGEQUEUE_HOME"] = str(home)
    done = subprocess.run(
        [COMMAND, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        check=False,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def request(
    stack: Any, name: str, count: int = 1, seconds: int = 7200, checkpoint: bool = True
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "TrainingJobName": name,
        "RoleArn": stack.training_role_arn,
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": "s3://sagequeue-e2e/output"},
        "ResourceConfig": {"InstanceType": POOL, "InstanceCount": count, "VolumeSizeInGB": 64},
        "StoppingCondition": {"MaxRuntimeInSeconds": 4 * 3600},
        "Environment": {"SAGEQUEUE_SIM_DURATION": str(seconds)},
    }
    if checkpoint:
        body["CheckpointConfig"] = {"S3Uri": f"s3://sagequeue-e2e/checkpoints/{name}/"}
    return body


@pytest.fixture(scope="module")
def stack() -> Iterator[Any]:
    with LocalStack(settings={"capacity": {POOL: 2, OTHER: 1}}) as running:
        yield running


@pytest.fixture(scope="module")
def home(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("user-home")
    save_local_connection(stack.connection(), where / "local.json")
    return where


@pytest.fixture(scope="module")
def busy(stack: Any) -> QueueClient:
    """A pool of 2: one long job runs, a 2-instance job holds a drain reservation on the free instance, a
    small checkpointed job runs on loan from it, and a low-priority job waits."""
    queue: QueueClient = stack.client()
    queue.submit(request(stack, "done", seconds=1800), priority=5)
    stack.run_until_idle()
    for _ in range(90):
        if queue.job("done").state == "completed":
            break
        stack.advance(60)
    assert queue.job("done").state == "completed"
    queue.submit(request(stack, "runner", seconds=6 * 3600), priority=5)
    stack.run_until_idle()
    queue.submit(request(stack, "wide", count=2), priority=5)
    stack.run_until_idle()
    stack.advance(1900)  # waited at the head past reserve_after_seconds: it reserves what it can
    stack.run_until_idle()
    assert queue.job("wide").raw.get("reservation"), queue.job("wide").reason
    queue.submit(request(stack, "borrower", seconds=3 * 3600), priority=3)
    stack.run_until_idle()
    for _ in range(10):
        if queue.job("borrower").raw.get("on_loan_for") == "wide":
            break
        stack.advance(60)
    assert queue.job("borrower").raw.get("on_loan_for") == "wide"
    queue.submit(request(stack, "waiter", checkpoint=False), priority=1)
    stack.run_until_idle()
    return queue


def _when(value: str) -> datetime:
    return datetime.fromisoformat(value)


def test_ls_start_and_show_forecast_every_waiting_job(busy: QueueClient, home: Path) -> None:
    listed = sagequeue("ls", "--start", "--json", "--active", home=home)
    assert listed.code == 0, listed.err
    jobs = {j["name"]: j for j in listed.json["jobs"]}
    assert "forecast" not in jobs["runner"]
    for name in ("wide", "waiter"):
        predicted = jobs[name]["forecast"]
        assert _when(predicted["p10"]) <= _when(predicted["p50"]) <= _when(predicted["p90"]), name
    # the reservation holder starts before the job behind it, at the P50 and across the range
    assert _when(jobs["wide"]["forecast"]["p50"]) < _when(jobs["waiter"]["forecast"]["p50"])
    now = busy.server_time
    assert now is not None
    assert _when(jobs["wide"]["forecast"]["p10"]) > now
    table = sagequeue("ls", "--start", "--state", "queued", "--format", "name,start", home=home)
    rows = {line.split()[0]: line for line in table.out.splitlines()[1:]}
    assert rows["wide"].split()[1] == "in"
    assert "(" in rows["wide"]
    shown = sagequeue("show", "wide", "--json", home=home).json
    assert shown["forecast"]["p50"] == jobs["wide"]["forecast"]["p50"]
    text = sagequeue("show", "waiter", home=home).out
    assert any(line.startswith("forecast start") and " in " in line for line in text.splitlines())


def test_why_names_the_jobs_ahead_the_rules_and_what_would_start_it_sooner(
    busy: QueueClient, home: Path
) -> None:
    told = sagequeue("why", "waiter", "--json", home=home)
    assert told.code == 0, told.err
    answer = told.json
    ahead = {a["name"]: a["rule"] for a in answer["ahead"]}
    assert ahead == {"wide": "higher priority (5 > 1)"}
    running = {r["name"] for r in answer["running"]}
    assert running == {"runner", "borrower"}
    options = {o["change"]: o["p50"] for o in answer["options"]}
    assert "priority 2" in options
    assert f"pool {OTHER}" in options  # an empty pool of another type: it would start at once there
    assert _when(options[f"pool {OTHER}"]) < _when(answer["forecast"]["p50"])
    text = sagequeue("why", "waiter", home=home)
    assert text.code == 0, text.err
    assert "what would start it sooner" in text.out
    assert "higher priority (5 > 1)" in text.out
    running_job = sagequeue("why", "runner", home=home)
    assert running_job.code == 1
    assert "not queued" in running_job.err


def test_submit_dry_run_says_where_it_would_queue_and_stores_nothing(
    stack: Any, busy: QueueClient, home: Path
) -> None:
    before = sorted((j.name, j.state, j.priority, j.attempt) for j in busy.jobs())
    dry = sagequeue(
        "submit",
        "-",
        "--priority",
        "4",
        "--dry-run",
        "--json",
        home=home,
        stdin=json.dumps(request(stack, "maybe")),
    )
    assert dry.code == 0, dry.err
    answer = dry.json
    assert answer["stored"] is False
    assert answer["position"] == 2  # behind the reservation holder (5), before the low job (1)
    assert _when(answer["forecast"]["p10"]) <= _when(answer["forecast"]["p50"])
    text = sagequeue("submit", "-", "--dry-run", home=home, stdin=json.dumps(request(stack, "maybe")))
    assert text.code == 0, text.err
    assert "nothing submitted" in text.out
    after = sorted((j.name, j.state, j.priority, j.attempt) for j in busy.jobs())
    assert after == before
    missing = busy.jobs()
    assert "maybe" not in {j.name for j in missing}
