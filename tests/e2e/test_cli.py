"""The `sagequeue` command, run as a user runs it (a separate process), against the local stack over HTTP.

The stack runs in the test process on a virtual clock; the command finds it through the connection file
`sagequeue local` would save ($SAGEQUEUE_HOME/local.json), signs as the stack's `user` identity, and the
test moves time between commands.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sagequeue.client import QueueClient
from sagequeue.config import save_local_connection
from sagequeue.local import LocalStack

#: The test run's fake AWS keys: in the environment they would win over the saved local stack's.
AWS_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")

POOL = "ml.trn1.32xlarge"
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


@pytest.fixture(scope="module")
def stack() -> Iterator[Any]:
    with LocalStack(settings={"capacity": {POOL: 1}}) as running:
        yield running


@pytest.fixture(scope="module")
def user_home(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("user-home")
    save_local_connection(stack.connection(), home / "local.json")
    return home


@pytest.fixture
def queue(stack: Any) -> QueueClient:
    return stack.client()


@pytest.fixture(autouse=True)
def drained(stack: Any, queue: QueueClient) -> Iterator[None]:
    yield
    for job in queue.jobs():
        if not job.terminal:
            queue.cancel(job.name)
    for _ in range(120):
        if all(j.terminal for j in queue.jobs()):
            break
        stack.advance(60)


def sagequeue(*args: str, home: Path, stdin: str | None = None, env: dict[str, str] | None = None) -> Run:
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith("SAGEQUEUE_") and k not in AWS_KEYS
    }
    environment["SAGEQUEUE_HOME"] = str(home)
    environment.update(env or {})
    done = subprocess.run(
        [COMMAND, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=environment,
        timeout=60,
        check=False,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def request(stack: Any, name: str, **extra: Any) -> dict[str, Any]:
    body = {
        "TrainingJobName": name,
        "RoleArn": stack.training_role_arn,
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": "s3://sagequeue-e2e/output"},
        "ResourceConfig": {"InstanceType": POOL, "InstanceCount": 1, "VolumeSizeInGB": 64},
        "StoppingCondition": {"MaxRuntimeInSeconds": 7200},
        "Environment": {"SAGEQUEUE_SIM_DURATION": "600"},
    }
    body.update(extra)
    return body


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def no_traceback(run: Run) -> None:
    assert "Traceback" not in run.out + run.err


def test_whoami_reports_the_signing_identity_and_where_the_queue_is(stack: Any, user_home: Path) -> None:
    run = sagequeue("whoami", "--json", home=user_home)
    assert run.code == 0, run.err
    assert run.json == {
        "arn": stack.identity().arn,
        "admin": False,
        "endpoint": stack.endpoint,
        "region": stack.region,
        "endpoint_from": "the saved local stack",
    }


def test_submit_ls_show_and_the_queue_table(
    stack: Any, queue: QueueClient, user_home: Path, tmp_path: Path
) -> None:
    first, second = unique("bert"), unique("llama")
    (tmp_path / "first.json").write_text(json.dumps(request(stack, first)))

    submitted = sagequeue("submit", str(tmp_path / "first.json"), "--priority", "100", home=user_home)
    piped = sagequeue(
        "submit",
        "-",
        "--json",
        home=user_home,
        stdin=json.dumps(request(stack, second, Tags=[{"Key": "priority", "Value": "7"}])),
    )

    assert submitted.code == 0, submitted.err
    assert submitted.out.startswith(f"queued {first}: queued, priority 100, pool {POOL}")
    assert piped.code == 0, piped.err
    assert (piped.json["name"], piped.json["priority"], piped.json["state"]) == (second, 7, "queued")

    stack.run_until_idle()  # the scheduler starts the higher priority job on the one instance

    table = sagequeue("ls", home=user_home)
    assert table.code == 0, table.err
    lines = table.out.splitlines()
    assert lines[0].split() == ["NAME", "STATE", "PRIORITY", "ATTEMPT", "POOL", "WAITED", "RAN"]
    rows = [line.split() for line in lines[1:]]
    assert [r[:5] for r in rows] == [
        [first, "starting", "100", "1", POOL],
        [second, "queued", "7", "0", POOL],
    ]

    queued_only = sagequeue("ls", "--state", "queued", "--json", home=user_home)
    assert [j["name"] for j in queued_only.json["jobs"]] == [second]
    other_pool = sagequeue("ls", "--pool", "ml.trn2.48xlarge", home=user_home)
    assert other_pool.out.strip() == "no jobs"

    detail = sagequeue("show", second, home=user_home)
    assert detail.code == 0, detail.err
    fields = dict(line.split(None, 1) for line in detail.out.split("\n\n")[0].splitlines())
    assert fields["state"] == "queued"
    assert fields["position"] == "1"
    assert fields["priority"] == "7"
    assert "history" in detail.out
    shown = sagequeue("show", first, "--json", home=user_home).json
    assert shown["attempts"] == [first]
    assert [h["state"] for h in shown["history"]][:2] == ["queued", "starting"]


def test_priority_hold_release_cancel(stack: Any, queue: QueueClient, user_home: Path) -> None:
    busy, waiting = unique("busy"), unique("waiting")
    queue.submit(request(stack, busy), priority=500)
    stack.run_until_idle()
    queue.submit(request(stack, waiting), priority=1)

    raised = sagequeue("priority", waiting, "300", home=user_home)
    held = sagequeue("hold", waiting, "--json", home=user_home)
    released = sagequeue("release", waiting, home=user_home)
    cancelled = sagequeue("cancel", waiting, busy, home=user_home)

    assert raised.code == 0, raised.err
    assert f"reprioritized {waiting}: queued, priority 300" in raised.out
    assert held.json["state"] == "held"
    assert released.out.startswith(f"released {waiting}: queued")
    assert cancelled.code == 0, cancelled.err
    assert f"cancelled {waiting}: cancelled" in cancelled.out
    assert f"cancelled {busy}: stopping" in cancelled.out
    assert queue.job(waiting).state == "cancelled"


def test_watch_prints_one_json_document_per_refresh(stack: Any, queue: QueueClient, user_home: Path) -> None:
    name = unique("watched")
    queue.submit(request(stack, name))
    run = sagequeue("ls", "--watch", "--count", "2", "--interval", "0.1", "--json", home=user_home)
    assert run.code == 0, run.err
    documents = [json.loads(line) for line in run.out.splitlines()]
    assert len(documents) == 2
    assert all(name in [j["name"] for j in d["jobs"]] for d in documents)


def test_pools_and_capacity_need_an_admin(stack: Any, user_home: Path, tmp_path: Path) -> None:
    pools = sagequeue("pools", "--json", home=user_home)
    assert pools.code == 0, pools.err
    assert {"instance_type": POOL, "capacity": 1}.items() <= pools.json["pools"][0].items()

    refused = sagequeue("capacity", POOL, "2", home=user_home)
    assert refused.code == 1
    assert refused.err.startswith("error: ")
    no_traceback(refused)

    # the admin signs with its own keys from the environment, naming the endpoint explicitly
    admin = stack.identity("admin")
    admin_env = {"AWS_ACCESS_KEY_ID": admin.access_key_id, "AWS_SECRET_ACCESS_KEY": admin.secret_access_key}
    admin_env["AWS_SESSION_TOKEN"] = ""
    admin_env["AWS_SECURITY_TOKEN"] = ""
    changed = sagequeue("capacity", POOL, "2", "--endpoint", stack.endpoint, home=tmp_path, env=admin_env)
    assert changed.code == 0, changed.err
    assert changed.out.startswith(f"{POOL}: capacity 2")
    table = sagequeue("pools", home=user_home)
    assert table.out.splitlines()[0].split() == ["POOL", "CAPACITY", "USED", "FREE", "QUEUED", "WARM"]
    assert table.out.splitlines()[1].split()[:2] == [POOL, "2"]
    sagequeue("capacity", POOL, "1", "--endpoint", stack.endpoint, home=tmp_path, env=admin_env)


@pytest.mark.parametrize(
    ("args", "stdin", "code", "message"),
    [
        (["submit", "-"], "{not json", 2, "error: standard input is not valid JSON"),
        (["submit", "-"], "[1, 2]", 2, "must hold a JSON object (a CreateTrainingJob request), not list"),
        (["submit", "/no/such/request.json"], None, 2, "error: cannot read /no/such/request.json"),
        (["show", "no-such-job-anywhere"], None, 1, "error: "),
        (["priority", "some-job", "high"], None, 2, "'high' is not a valid integer"),
        (["ls", "--state", "sleeping"], None, 2, "'sleeping' is not one of"),
    ],
)
def test_bad_input_is_one_clear_line_and_a_non_zero_exit(
    user_home: Path, args: list[str], stdin: str | None, code: int, message: str
) -> None:
    run = sagequeue(*args, home=user_home, stdin=stdin)
    assert run.code == code
    assert message in run.err
    assert run.out == ""
    no_traceback(run)


def test_a_request_the_server_refuses_shows_its_reason(stack: Any, user_home: Path) -> None:
    bad = request(stack, unique("bad"))
    del bad["ResourceConfig"]
    run = sagequeue("submit", "-", "--json", home=user_home, stdin=json.dumps(bad))
    assert run.code == 1
    error = json.loads(run.err)["error"]
    assert error["code"] == "ValidationError"
    assert "ResourceConfig" in error["message"]
    no_traceback(run)


def test_a_priority_out_of_range_is_refused_by_the_server(
    stack: Any, queue: QueueClient, user_home: Path
) -> None:
    name = unique("ranged")
    queue.submit(request(stack, name))
    run = sagequeue("priority", name, "5000", home=user_home)
    assert run.code == 1
    assert "priority" in run.err
    no_traceback(run)


def test_an_unreachable_endpoint_is_exit_3_with_the_address(user_home: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # nothing listens on that port once the probe is closed
    keys = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    run = sagequeue("ls", "--endpoint", f"http://127.0.0.1:{port}", home=user_home, env=keys)
    assert run.code == 3
    assert (
        run.err.strip()
        == f"error: cannot reach the sagequeue API at http://127.0.0.1:{port}: [Errno 111] Connection refused"
    )
    no_traceback(run)


def test_no_queue_anywhere_is_exit_3_with_every_way_to_name_one(tmp_path: Path) -> None:
    run = sagequeue("whoami", home=tmp_path)
    assert run.code == 3
    assert "no sagequeue endpoint" in run.err
    assert "--endpoint" in run.err
    assert "sagequeue local" in run.err
    no_traceback(run)


def test_a_wrong_secret_is_refused_by_the_gateway(stack: Any, tmp_path: Path) -> None:
    from dataclasses import replace

    save_local_connection(
        replace(stack.connection(), secret_access_key="not-the-secret"), tmp_path / "local.json"
    )
    run = sagequeue("whoami", home=tmp_path)
    assert run.code == 1
    assert run.err.startswith("error: ")
    assert "signature" in run.err.lower()
    no_traceback(run)


def test_the_endpoint_variable_is_named_as_the_source(stack: Any, user_home: Path) -> None:
    run = sagequeue("whoami", "--json", home=user_home, env={"SAGEQUEUE_ENDPOINT": stack.endpoint})
    assert run.code == 0, run.err
    assert run.json["endpoint_from"] == "SAGEQUEUE_ENDPOINT"
