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
from datetime import datetime, timedelta
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
    # the region launches the 2 instances an admin raises the pool to (test_pools_and_capacity_need_an_admin)
    with LocalStack(settings={"capacity": {POOL: 1}}, emulator={"capacity": {POOL: 2}}) as running:
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
    assert lines[0].split() == [
        "NAME",
        "STATE",
        "PRIORITY",
        "ATTEMPT",
        "POOL",
        "POSITION",
        "WAITED",
        "RAN",
        "CKPT",
        "REASON",
    ]
    rows = [line.split() for line in lines[1:]]
    assert [r[:6] for r in rows] == [
        [first, "starting", "100", "1", POOL, "-"],
        [second, "queued", "7", "0", POOL, "1"],
    ]
    # the reason: why it waits
    reason = sagequeue("show", second, "--json", home=user_home).json["reason"]
    assert reason
    assert lines[2].endswith(f"  {reason}")

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
    assert table.out.splitlines()[0].split() == [
        "POOL",
        "CAPACITY",
        "USED",
        "FREE",
        "QUEUED",
        "WARM",
        "WARM_QUOTA",
    ]
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


def test_an_endpoint_of_another_service_is_exit_3_not_an_empty_queue(stack: Any, user_home: Path) -> None:
    # moto's server answers GET /jobs with a `{"jobs": []}` of its own: not the queue, not "no jobs"
    keys = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    run = sagequeue("ls", "--endpoint", stack.moto_endpoint, home=user_home, env=keys)
    assert run.code == 3, run.out + run.err
    assert run.out == ""
    (line,) = run.err.strip().splitlines()
    assert line.startswith(f"error: {stack.moto_endpoint} is not a sagequeue API (GET /jobs answered ")
    assert "ApiUrl" in line


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


def test_submit_prints_the_position_and_ls_formats_columns(
    stack: Any, queue: QueueClient, user_home: Path
) -> None:
    busy, waiting = unique("busy"), unique("waiting")
    queue.submit(request(stack, busy), priority=900)
    stack.run_until_idle()
    submitted = sagequeue("submit", "-", home=user_home, stdin=json.dumps(request(stack, waiting)))
    assert submitted.code == 0, submitted.err
    assert submitted.out.strip() == f"queued {waiting}: queued, priority 0, pool {POOL}, position 1"
    as_json = sagequeue("show", waiting, "--json", home=user_home).json
    assert as_json["position"] == 1

    custom = sagequeue("ls", "--format", "name,position,reason", "--state", "queued", home=user_home)
    assert custom.code == 0, custom.err
    assert custom.out.splitlines()[0].split() == ["NAME", "POSITION", "REASON"]
    # no pass has run since the submit: no reason yet
    assert custom.out.splitlines()[1].split(None, 2) == [waiting, "1", queue.job(waiting).reason or "-"]
    listed = sagequeue("ls", "--state", "queued", "--json", home=user_home).json["jobs"]
    assert [(j["name"], j["position"]) for j in listed] == [(waiting, 1)]

    bad = sagequeue("ls", "--format", "name,colour", home=user_home)
    assert bad.code == 2
    assert bad.err.startswith("error: ")
    assert "colour" in bad.err
    assert len(bad.err.strip().splitlines()) == 1


def test_ls_start_and_show_forecast_from_the_queues_completed_jobs(
    stack: Any, queue: QueueClient, user_home: Path
) -> None:
    done = unique("done")
    queue.submit(request(stack, done), priority=900)
    for _ in range(60):
        if queue.job(done).state == "completed":
            break
        stack.advance(60)
    finished = queue.job(done)
    assert finished.state == "completed"
    assert finished.seconds_trained > 0
    runs, waits = unique("runs"), unique("waits")
    queue.submit(request(stack, runs), priority=900)
    for _ in range(30):
        if queue.job(runs).raw.get("training_started_at"):
            break
        stack.advance(30)
    queue.submit(request(stack, waits), priority=1)
    listed = sagequeue("ls", "--start", "--json", "--state", "queued", "--state", "running", home=user_home)
    assert listed.code == 0, listed.err
    jobs = {j["name"]: j for j in listed.json["jobs"]}
    assert "estimated_start" not in jobs[runs]
    predicted = jobs[waits]["forecast"]
    p10, p50, p90 = (datetime.fromisoformat(predicted[q]) for q in ("p10", "p50", "p90"))
    assert jobs[waits]["estimated_start"] == predicted["p50"]
    assert p10 <= p50 <= p90
    # one instance: the queued job starts when the running one has trained about as long as the completed
    # one did (the only run time the queue has seen, drawn with some spread)
    trained_from = datetime.fromisoformat(queue.job(runs).raw["training_started_at"])
    expected = trained_from + timedelta(seconds=finished.seconds_trained)
    assert abs((p50 - expected).total_seconds()) <= 0.35 * finished.seconds_trained + 120
    table = sagequeue("ls", "--start", "--format", "name,start", "--state", "queued", home=user_home)
    assert table.out.splitlines()[0].split() == ["NAME", "START"]
    assert table.out.splitlines()[1].split()[:2] == [waits, "in"]
    assert "(" in table.out.splitlines()[1]  # the P10-P90 range beside the P50
    shown = sagequeue("show", waits, home=user_home)
    assert shown.code == 0, shown.err
    line = next(x for x in shown.out.splitlines() if x.startswith("forecast start"))
    assert line.split()[2] == "in"
    as_json = sagequeue("show", waits, "--json", home=user_home).json
    assert as_json["forecast"]["p50"] == predicted["p50"]


def test_negative_priority_release_conflict_and_bad_endpoint(
    stack: Any, queue: QueueClient, user_home: Path
) -> None:
    name = unique("lowly")
    queue.submit(request(stack, name), priority=900)
    stack.run_until_idle()
    # -1 parses as a number (not click's "No such option"): the API answers that priorities start at 0
    lowered = sagequeue("priority", name, "-1", home=user_home)
    assert lowered.code == 1
    assert lowered.err.strip() == "error: priority: Input should be greater than or equal to 0"
    assert sagequeue("priority", name, "0", home=user_home).code == 0
    # capacity's N too: a negative count is bad usage named as such, not an unknown option
    negative = sagequeue("capacity", "ml.trn1.32xlarge", "-1", home=user_home)
    assert negative.code == 2
    assert negative.err.strip().startswith("error: Invalid value for 'N': -1 is not in the range x>=0")
    assert queue.job(name).priority == 0

    release = sagequeue("release", name, home=user_home)
    assert release.code == 1
    state = queue.job(name).state
    assert release.err.strip() == f"error: {name}: only a held job can be released; {name!r} is {state}"

    endpoint = sagequeue("ls", "--endpoint", "localhost:1234", home=user_home)
    assert endpoint.code == 2
    assert endpoint.err.strip().startswith(
        "error: the sagequeue endpoint from --endpoint must be an http(s) URL"
    )
    assert len(endpoint.err.strip().splitlines()) == 1

    missing = sagequeue("cancel", unique("nobody"), "--json", home=user_home)
    assert missing.code == 1
    assert missing.out == ""
    assert json.loads(missing.err)["error"]["code"]


def test_cancel_json_is_the_cancelled_job_or_a_list_for_several(
    stack: Any, queue: QueueClient, user_home: Path
) -> None:
    one, two, three = unique("one"), unique("two"), unique("three")
    for name in (one, two, three):
        queue.submit(request(stack, name), priority=1)

    single = sagequeue("cancel", one, "--json", home=user_home)
    several = sagequeue("cancel", two, three, "--json", home=user_home)

    assert single.code == 0, single.err
    assert single.json["name"] == one
    assert single.json["state"] == queue.job(one).state == "cancelled"
    assert several.code == 0, several.err
    assert [(j["name"], j["state"]) for j in several.json] == [(two, "cancelled"), (three, "cancelled")]


def test_an_unknown_instance_type_gets_no_pool(stack: Any, user_home: Path, tmp_path: Path) -> None:
    admin = stack.identity("admin")
    admin_env = {"AWS_ACCESS_KEY_ID": admin.access_key_id, "AWS_SECRET_ACCESS_KEY": admin.secret_access_key}
    refused = sagequeue("capacity", "ml.bogus.huge", "1", home=user_home, env=admin_env)
    assert refused.code == 1
    assert refused.err.startswith(
        "error: pool 'ml.bogus.huge' is not a SageMaker training instance type; valid: "
    )
    assert POOL in refused.err
    assert len(refused.err.strip().splitlines()) == 1
    pools = sagequeue("pools", "--json", home=user_home).json["pools"]
    assert "ml.bogus.huge" not in [p["instance_type"] for p in pools]
    for pool in pools:
        assert pool["free"] == max(pool["capacity"] - pool["used"], 0)


def test_a_request_from_flags_and_the_skeleton_round_trip(
    stack: Any, queue: QueueClient, user_home: Path, tmp_path: Path
) -> None:
    name = unique("flags")
    flags = [
        "--image",
        IMAGE,
        "--instance-type",
        POOL,
        "--role",
        stack.training_role_arn,
        "--output",
        "s3://sagequeue-e2e/output",
        "--env",
        "SAGEQUEUE_SIM_DURATION=60",
        "--hyperparameter",
        "epochs=3",
    ]
    skeleton = sagequeue("submit", "--generate-skeleton", "--name", name, *flags, home=user_home)
    assert skeleton.code == 0, skeleton.err
    written = skeleton.json
    assert written["TrainingJobName"] == name
    assert written["ResourceConfig"] == {"InstanceType": POOL, "InstanceCount": 1, "VolumeSizeInGB": 64}
    assert written["Environment"] == {"SAGEQUEUE_SIM_DURATION": "60"}
    assert written["HyperParameters"] == {"epochs": "3"}
    (tmp_path / "job.json").write_text(skeleton.out)
    # the skeleton, unchanged, is a request the queue takes
    submitted = sagequeue("submit", str(tmp_path / "job.json"), "--priority", "5", home=user_home)
    assert submitted.code == 0, submitted.err
    assert queue.job(name).priority == 5
    negative = sagequeue("submit", str(tmp_path / "job.json"), "--priority", "-5", home=user_home)
    assert negative.err.strip() == "error: priority: Input should be greater than or equal to 0"

    direct = unique("direct")
    built = sagequeue("submit", "--name", direct, *flags, "--json", home=user_home)
    assert built.code == 0, built.err
    assert built.json["name"] == direct

    incomplete = sagequeue("submit", "--image", IMAGE, home=user_home)
    assert incomplete.code == 2
    assert incomplete.err.strip().startswith(
        "error: give a request FILE (or - for standard input), or build one with flags: --instance-type, "
        "--role, --output missing"
    )
    # the bare skeleton names what to fill in, and the queue refuses it as it stands
    bare = sagequeue("submit", "--generate-skeleton", home=user_home)
    assert "<account>" in bare.json["RoleArn"]
    refused = sagequeue("submit", "-", home=user_home, stdin=bare.out)
    assert refused.code == 1
    assert refused.err.startswith("error: ")
