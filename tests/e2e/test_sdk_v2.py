"""SageMaker Python SDK v2: a real `Estimator.fit()` with `QueueSession`, against the local stack over HTTP.

Needs the SDK v2 (`pip install -e '.[dev,sagemaker]'`, in its own environment: the SDK pins packages the
rest of the project's tools are newer than). The clock is virtual: while `fit()` waits in a thread, the
test moves time forward, as the world would.

GIVEN a pool of one ml.trn1.32xlarge that another job holds,
WHEN a data scientist calls `estimator.fit()` with `sagemaker_session=QueueSession()`,
THEN the job is queued with the estimator's priority tag, other tags, keep-alive, checkpoints and training
plan; `fit()` reports its place while it waits, follows the attempt the scheduler starts, and returns when
the job completes (or raises the SDK's error when it fails).
"""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
pytest.importorskip(
    "sagemaker.session", reason="SDK v2 tests run in an environment with 'sagequeue[sagemaker]' (sagemaker<3)"
)

import boto3
from sagemaker.estimator import Estimator
from sagemaker.exceptions import UnexpectedStatusException
from sdk_world import IMAGE, POOL, advance_until, hold_the_pool

from sagequeue.client import QueueClient
from sagequeue.local import LocalStack
from sagequeue.session import SDK_MAJOR, QueueSession

PLAN_POOL = "plan:trn1-reserved"


@pytest.fixture(scope="module")
def stack() -> Iterator[Any]:
    assert SDK_MAJOR == 2
    # a training plan is a pool of its own; this one is drained (capacity 0), so its jobs stay queued
    settings = {"capacity": {POOL: 1, PLAN_POOL: 0}, "min_runtime_before_preemption_seconds": 0}
    with LocalStack(settings=settings) as running:
        yield running


@pytest.fixture(autouse=True)
def no_telemetry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`QueueSession` opts out of the SDK's usage telemetry: a fit through it must not send any (the SDK
    would GET an S3 URL naming the account, and print a traceback where it cannot reach it). Any request
    the SDK tries is caught here, kept from the network, and fails the test."""
    from sagemaker.telemetry import telemetry_logging

    sent: list[str] = []
    monkeypatch.setattr(telemetry_logging, "_requests_helper", lambda url, timeout: sent.append(url))
    yield
    assert sent == [], f"the SageMaker SDK sent telemetry: {sent[:1]}"


def test_the_session_opts_out_of_the_sdks_telemetry_and_keeps_the_users_config(stack: Any) -> None:
    from sagemaker.config.config_schema import SESSION_DEFAULT_S3_BUCKET_PATH, TELEMETRY_OPT_OUT_PATH
    from sagemaker.utils import get_sagemaker_config_value

    # GIVEN no SageMaker config of the user's, then one that sets a default bucket, then one that opts in
    bare = QueueSession(queue_client=stack.client())
    own = {
        "SchemaVersion": "1.0",
        "SageMaker": {"PythonSDK": {"Modules": {"Session": {"DefaultS3Bucket": "my-bucket"}}}},
    }
    kept = QueueSession(queue_client=stack.client(), sagemaker_config=own)
    opted_in = {"SchemaVersion": "1.0", "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": False}}}}
    chosen = QueueSession(queue_client=stack.client(), sagemaker_config=opted_in)

    # THEN telemetry is off unless the user's config says otherwise, and the user's settings stay
    assert get_sagemaker_config_value(bare, TELEMETRY_OPT_OUT_PATH) is True
    assert get_sagemaker_config_value(kept, TELEMETRY_OPT_OUT_PATH) is True
    assert get_sagemaker_config_value(kept, SESSION_DEFAULT_S3_BUCKET_PATH) == "my-bucket"
    assert get_sagemaker_config_value(chosen, TELEMETRY_OPT_OUT_PATH) is False
    assert own["SageMaker"]["PythonSDK"]["Modules"] == {
        "Session": {"DefaultS3Bucket": "my-bucket"}
    }  # not mutated


@pytest.fixture(autouse=True)
def sdk_clock_sixty_times_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's log loop describes the job every 30 s of wall time (hard-coded); the stack's clock is
    virtual, so the SDK's wall clock runs 60 times faster here (its sleeps stay real)."""
    import types

    import sagemaker.session

    began = time.time()
    fast = types.SimpleNamespace(time=lambda: began + (time.time() - began) * 60, sleep=time.sleep)
    monkeypatch.setattr(sagemaker.session, "time", fast)


@pytest.fixture
def queue(stack: Any) -> QueueClient:
    return stack.client()


@pytest.fixture
def session(stack: Any, queue: QueueClient) -> QueueSession:
    return QueueSession(
        boto_session=boto3.Session(region_name=stack.region),
        sagemaker_client=stack.emulator.client(),
        queue_client=queue,
        poll_seconds=0.2,
        # CloudWatch Logs on the stack's moto: the emulator writes none, so following shows status only
        logs_client=stack.aws_client("logs"),
    )


@pytest.fixture(autouse=True)
def drained(stack: Any, queue: QueueClient) -> Iterator[None]:
    yield
    for job in queue.jobs():
        if not job.terminal:
            queue.cancel(job.name)
    advance_until(stack, lambda: all(j.terminal for j in queue.jobs()))


def estimator(stack: Any, session: QueueSession, *, seconds: int = 300, **extra: Any) -> Estimator:
    options: dict[str, Any] = {
        "image_uri": IMAGE,
        "role": stack.training_role_arn,
        "instance_count": 1,
        "instance_type": POOL,
        "volume_size": 64,
        "output_path": "s3://sagequeue-e2e/output",
        "base_job_name": f"bert-{uuid.uuid4().hex[:4]}",
        "sagemaker_session": session,
        "tags": [{"Key": "priority", "Value": "100"}, {"Key": "team", "Value": "nlp"}],
        "keep_alive_period_in_seconds": 900,
        "checkpoint_s3_uri": "s3://sagequeue-e2e/checkpoints",
        "environment": {"SAGEQUEUE_SIM_DURATION": str(seconds)},
        "disable_profiler": True,
    }
    options.update(extra)
    return Estimator(**options)


def said(stdout: str) -> str:
    """What fit() printed: stdout without the metric documents the stack's functions print beside it."""
    return re.sub(r'\{"_aws".*\n', "", stdout)  # the SDK's dots leave them mid-line


def run_while_time_passes(
    stack: Any, queue: QueueClient, work: Callable[[], Any], *, timeout: float = 60
) -> Any:
    """Run `work` (which waits on the queue) in a thread; once its job is queued, move the clock until it
    returns. Returns its result or raises its error."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target, name="fit", daemon=True)
    known = {j.name for j in queue.jobs()}
    thread.start()
    deadline = time.monotonic() + timeout
    # let the job be queued before time moves, so the wait in the queue is real
    while thread.is_alive() and not ({j.name for j in queue.jobs()} - known):
        assert time.monotonic() < deadline, "the job was never submitted"
        time.sleep(0.02)
    while thread.is_alive():
        assert time.monotonic() < deadline, "fit() did not return"
        stack.advance(60)
        time.sleep(0.05)
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def test_fit_without_waiting_queues_the_request_whole(
    stack: Any, queue: QueueClient, session: QueueSession
) -> None:
    hold_the_pool(stack, queue)
    plan = f"arn:aws:sagemaker:{stack.region}:{stack.account_id}:training-plan/{PLAN_POOL.split(':')[1]}"
    est = estimator(stack, session, training_plan=plan)

    est.fit(wait=False)

    name = est.latest_training_job.name
    job = queue.job(name)
    assert (job.state, job.priority, job.pool, job.position) == ("queued", 100, PLAN_POOL, 1)
    described = est.latest_training_job.describe()
    assert (described["TrainingJobStatus"], described["SecondaryStatus"]) == ("InProgress", "Pending")
    assert described["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 900
    assert described["ResourceConfig"]["TrainingPlanArn"] == plan
    assert described["CheckpointConfig"]["S3Uri"] == "s3://sagequeue-e2e/checkpoints"


def test_fit_waits_in_the_queue_then_follows_the_attempt_until_it_completes(
    stack: Any, queue: QueueClient, session: QueueSession, capsys: pytest.CaptureFixture[str]
) -> None:
    hold_the_pool(stack, queue)
    est = estimator(stack, session)

    run_while_time_passes(stack, queue, est.fit)

    name = est.latest_training_job.name
    job = queue.job(name)
    assert job.state == "completed"
    assert job.priority == 100
    printed = said(capsys.readouterr().out)
    # the queue's lines, each once: queued (position 1, unchanged while it waits), then the attempt
    assert printed.count(f"queued training job {name} for {POOL} with priority 100, position 1") == 1
    assert printed.lower().count("queued") == 1
    # the position never changed: said again only when the stack's forecast came, and then with it
    waits = [line for line in printed.splitlines() if "Waiting in the sagequeue queue" in line]
    assert len(waits) <= 1, waits
    assert all("Forecast start" in line for line in waits), waits
    assert printed.count(f"attempt 1 runs as training job {name}") == 1
    # then the SDK's own loop: its status lines and, at the end, its summary, once
    real = stack.sagemaker.describe_training_job(TrainingJobName=name)
    assert real["TrainingJobStatus"] == "Completed"
    assert "Completed - Training job completed" in printed
    assert printed.count("Training seconds:") == 1
    assert printed.count("Billable seconds:") == 1
    assert f"Training seconds: {real['TrainingTimeInSeconds']}\n" in printed
    assert f"Billable seconds: {real['BillableTimeInSeconds']}\n" in printed
    assert printed.index("queued training job") < printed.index("attempt 1 runs") < printed.index("Billable")
    # the attempt SageMaker ran carries the estimator's tags and keep-alive
    assert real["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 900
    tags = {
        t["Key"]: t["Value"] for t in stack.sagemaker.list_tags(ResourceArn=real["TrainingJobArn"])["Tags"]
    }
    assert tags["team"] == "nlp"
    assert tags["priority"] == "100"
    # what the SDK reads afterwards comes from the attempt, under the job's name
    assert est.model_data == f"s3://sagequeue-e2e/output/{name}/output/model.tar.gz"


def test_fit_with_logs_off_uses_wait_for_job(
    stack: Any, queue: QueueClient, session: QueueSession, capsys: pytest.CaptureFixture[str]
) -> None:
    est = estimator(stack, session, seconds=120)
    run_while_time_passes(stack, queue, lambda: est.fit(logs="None"))
    assert queue.job(est.latest_training_job.name).state == "completed"
    printed = said(capsys.readouterr().out)
    assert printed.lower().count("queued") == 1
    assert "Completed - Training job completed" in printed  # the SDK's wait loop followed the attempt


def test_session_priority_wins_over_the_tag(stack: Any, queue: QueueClient) -> None:
    urgent = QueueSession(
        boto_session=boto3.Session(region_name=stack.region),
        sagemaker_client=stack.emulator.client(),
        queue_client=queue,
        priority=750,
    )
    est = estimator(stack, urgent)
    est.fit(wait=False)
    assert queue.job(est.latest_training_job.name).priority == 750


def test_a_failing_job_makes_fit_raise_the_sdks_error(
    stack: Any, queue: QueueClient, session: QueueSession
) -> None:
    est = estimator(
        stack, session, environment={"SAGEQUEUE_SIM_OUTCOME": "Failed:AlgorithmError: loss is NaN"}
    )

    with pytest.raises(UnexpectedStatusException, match="loss is NaN"):
        run_while_time_passes(stack, queue, est.fit)

    assert queue.job(est.latest_training_job.name).state == "failed"


def test_a_preempted_fit_keeps_waiting_and_follows_the_next_attempt(
    stack: Any, queue: QueueClient, session: QueueSession, capsys: pytest.CaptureFixture[str]
) -> None:
    est = estimator(stack, session, seconds=400, tags=[{"Key": "priority", "Value": "10"}])

    outcome: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: outcome.update(done=est.fit()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 90
    while est.latest_training_job is None:
        assert time.monotonic() < deadline, "fit() never submitted"
        time.sleep(0.02)
    name = est.latest_training_job.name
    advance_until(stack, lambda: queue.job(name).state == "running")
    hold_the_pool(stack, queue, seconds=120)  # priority 900 preempts it
    while thread.is_alive():
        assert time.monotonic() < deadline, "fit() did not return"
        stack.advance(60)
        time.sleep(0.05)

    job = queue.job(name)
    assert "done" in outcome
    assert job.state == "completed"
    assert job.attempts == (name, f"{name}--2")
    printed = said(capsys.readouterr().out)
    assert printed.count(f"attempt 1 runs as training job {name}\n") == 1
    assert printed.count(f"attempt 2 runs as training job {name}--2") == 1
    # between the attempts: why the SDK's loop saw attempt 1 stop, said once (and where the job waits,
    # if it waited long enough to be seen waiting)
    between = printed[printed.index("attempt 1 runs") : printed.index("attempt 2 runs")]
    said_why = f"sagequeue: {name}: attempt 1 was preempted; the queue runs the job again\n"
    assert between.count(said_why) == 1, between[-400:]
    assert between.index("Billable seconds:") < between.index(said_why)
    waits = [line for line in between.splitlines() if "Waiting in the sagequeue queue" in line]
    assert len([line for line in waits if "Forecast start" not in line]) <= 1, waits
    assert len([line for line in waits if "Forecast start" in line]) <= 1, waits  # once, when it came
    # the SDK summed up each attempt it followed: the preempted one and the one that completed
    assert printed.count("Billable seconds:") == 2
    last = stack.sagemaker.describe_training_job(TrainingJobName=f"{name}--2")
    assert printed.rstrip().endswith(f"Billable seconds: {last['BillableTimeInSeconds']}")


def test_fit_prints_the_attempts_training_logs(
    stack: Any, queue: QueueClient, session: QueueSession, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = stack.aws_client("logs")
    group = "/aws/sagemaker/TrainingJobs"
    if not logs.describe_log_groups(logGroupNamePrefix=group)["logGroups"]:
        logs.create_log_group(logGroupName=group)
    est = estimator(stack, session, seconds=180)
    thread = threading.Thread(target=est.fit, daemon=True)
    thread.start()
    deadline = time.monotonic() + 90
    while est.latest_training_job is None:
        assert time.monotonic() < deadline, "fit() never submitted"
        time.sleep(0.02)
    name = est.latest_training_job.name
    # the container's output, as SageMaker's log agent would write it
    stream = f"{name}/algo-1-1763780000"
    logs.create_log_stream(logGroupName=group, logStreamName=stream)
    logs.put_log_events(
        logGroupName=group,
        logStreamName=stream,
        logEvents=[
            {"timestamp": int(time.time() * 1000), "message": "epoch 1 loss 2.31"},
            {"timestamp": int(time.time() * 1000) + 1, "message": "epoch 2 loss 1.07"},
        ],
    )
    while thread.is_alive():
        assert time.monotonic() < deadline, "fit() did not return"
        stack.advance(60)
        time.sleep(0.05)

    printed = capsys.readouterr().out
    assert "epoch 1 loss 2.31\nepoch 2 loss 1.07\n" in printed  # the SDK's own log loop printed them
    assert printed.count("epoch 1 loss 2.31") == 1  # each line once, however often the logs are read
    assert queue.job(name).state == "completed"


def test_fit_without_reachable_logs_follows_the_status_only(
    stack: Any, queue: QueueClient, capsys: pytest.CaptureFixture[str]
) -> None:
    from botocore.config import Config

    unreachable_logs = boto3.client(
        "logs",
        region_name=stack.region,
        endpoint_url="http://127.0.0.1:9",
        config=Config(connect_timeout=1, retries={"max_attempts": 1}),
    )
    session = QueueSession(
        boto_session=boto3.Session(region_name=stack.region),
        sagemaker_client=stack.emulator.client(),
        queue_client=queue,
        poll_seconds=0.2,
        logs_client=unreachable_logs,
    )
    est = estimator(stack, session, seconds=120)

    run_while_time_passes(stack, queue, est.fit)

    printed = capsys.readouterr().out
    assert printed.count("cannot read the training logs") == 1
    assert "following the job's status only" in printed
    assert "Completed - Training job completed" in printed
    assert queue.job(est.latest_training_job.name).state == "completed"


def test_a_pytorch_estimator_uploads_its_code_and_runs_from_the_queue(
    stack: Any, queue: QueueClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from sagemaker.pytorch import PyTorch

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", stack.moto_endpoint)  # the code goes to the stack's S3
    (tmp_path / "train.py").write_text("print('training on Trainium')\n")
    session = QueueSession(
        boto_session=boto3.Session(region_name=stack.region),
        sagemaker_client=stack.emulator.client(),
        queue_client=queue,
        poll_seconds=0.2,
        logs_client=stack.aws_client("logs"),
        default_bucket="sagequeue-e2e-code",
    )
    est = PyTorch(
        entry_point="train.py",
        source_dir=str(tmp_path),
        image_uri="763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training-neuronx:2.1.2-neuronx-py310-sdk2.20.0-ubuntu20.04",
        role=stack.training_role_arn,
        instance_count=1,
        instance_type=POOL,
        sagemaker_session=session,
        tags=[{"Key": "priority", "Value": "300"}],
        hyperparameters={"epochs": 3},
        environment={"SAGEQUEUE_SIM_DURATION": "120"},
        disable_profiler=True,
    )

    run_while_time_passes(stack, queue, est.fit)

    name = est.latest_training_job.name
    assert queue.job(name).priority == 300
    assert queue.job(name).state == "completed"
    real = stack.sagemaker.describe_training_job(TrainingJobName=name)
    assert real["HyperParameters"]["epochs"] == "3"
    assert real["HyperParameters"]["sagemaker_program"] == '"train.py"'
    code = real["HyperParameters"]["sagemaker_submit_directory"].strip('"')
    bucket, _, key = code.removeprefix("s3://").partition("/")
    assert stack.aws_client("s3").head_object(Bucket=bucket, Key=key)["ContentLength"] > 0


def test_estimator_attach_reads_a_job_the_emulator_describes_as_sagemaker_does() -> None:
    # GIVEN a job created straight on the emulator with only what the request needs (no KmsKeyId, no
    # EnableNetworkIsolation): SageMaker fills those in, and SDK v2's attach reads them without defaults
    from sagemaker.session import Session

    from sagequeue.local import SageMakerEmulator

    with SageMakerEmulator() as emulator:
        client = emulator.client()
        name = f"attached-{uuid.uuid4().hex[:6]}"
        client.create_training_job(
            TrainingJobName=name,
            RoleArn="arn:aws:iam::123456789012:role/SageMakerTraining",
            AlgorithmSpecification={"TrainingImage": IMAGE, "TrainingInputMode": "File"},
            OutputDataConfig={"S3OutputPath": "s3://sagequeue-e2e/output"},
            ResourceConfig={"InstanceType": POOL, "InstanceCount": 2, "VolumeSizeInGB": 64},
            StoppingCondition={"MaxRuntimeInSeconds": 7200},
            HyperParameters={"epochs": "3"},
            Environment={"SAGEQUEUE_SIM_DURATION": "120"},
        )
        emulator.advance(3600)
        session = Session(boto_session=boto3.Session(region_name="us-east-1"), sagemaker_client=client)

        # WHEN the SDK attaches to it
        estimator = Estimator.attach(name, sagemaker_session=session)

        # THEN it rebuilt the estimator from the description
        assert estimator.latest_training_job.name == name
        assert estimator.instance_type == POOL
        assert estimator.instance_count == 2
        assert estimator.output_kms_key == ""
        assert estimator.enable_network_isolation() is False
        assert estimator.hyperparameters()["epochs"] == "3"
        assert estimator.model_data.endswith(f"/{name}/output/model.tar.gz")


def test_the_snippet_sagequeue_local_prints_runs_verbatim_on_a_bare_machine(
    stack: Any, queue: QueueClient, tmp_path: Any
) -> None:
    """What `sagequeue local` prints under "SDK v2 session", run as printed by a Python with no AWS
    configuration at all (no AWS_* variable, no ~/.aws), then used as a data scientist would."""
    import subprocess
    import sys

    from sagequeue.config import save_local_connection
    from sagequeue.local.cli import _banner

    # GIVEN the printout of a local stack, and its local.json in a home of its own
    home = tmp_path / "home"
    saved = save_local_connection(stack.connection(), home / "local.json")
    lines = _banner(stack, saved, home / "local-identities.json").splitlines()
    start = lines.index("SDK v2 session (estimator.fit() queues the job), Python:") + 2
    code = "\n".join(lines[start : lines.index("", start)]) + "\n"
    name = f"snippet-v2-{uuid.uuid4().hex[:6]}"
    then = f"""
from sagemaker.estimator import Estimator
estimator = Estimator(image_uri={IMAGE!r}, role={stack.training_role_arn!r}, instance_count=1,
    instance_type={POOL!r}, output_path="s3://sagequeue-e2e/output", sagemaker_session=session,
    disable_profiler=True, tags=[{{"Key": "priority", "Value": "321"}}])
estimator.fit(job_name={name!r}, wait=False)
print(estimator.latest_training_job.describe()["SecondaryStatus"])
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "SAGEQUEUE_"))}
    env.update(
        HOME=str(tmp_path / "user"),
        SAGEQUEUE_HOME=str(home),
        AWS_EC2_METADATA_DISABLED="true",
        SAGEMAKER_SUPPRESS_V2_WARNING="1",
    )

    # WHEN it runs
    ran = subprocess.run(
        [sys.executable, "-c", code + then],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )

    # THEN the job is queued with the estimator's priority, said once, and describes as SageMaker would;
    # no traceback (the SDK's telemetry, were it on, would print one where it cannot reach AWS)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "Traceback" not in ran.stderr + ran.stdout, ran.stderr[-3000:]
    printed = re.sub(r'\{"_aws".*\n', "", ran.stdout)
    assert printed.count(f"queued training job {name} for {POOL} with priority 321") == 1
    assert printed.rstrip().splitlines()[-1] in ("Pending", "Starting")  # queued, or started since
    job = queue.job(name)
    assert (job.priority, job.pool) == (321, POOL)
    assert job.state in ("queued", "starting", "running")


def test_a_job_cancelled_while_it_runs_ends_fit_with_the_queues_word_on_it(
    stack: Any, queue: QueueClient, session: QueueSession, capsys: pytest.CaptureFixture[str]
) -> None:
    est = estimator(stack, session, seconds=3600)
    thread = threading.Thread(target=est.fit, daemon=True)
    thread.start()
    deadline = time.monotonic() + 90
    while est.latest_training_job is None:
        assert time.monotonic() < deadline, "fit() never submitted"
        time.sleep(0.02)
    name = est.latest_training_job.name
    advance_until(stack, lambda: queue.job(name).state == "running")

    queue.cancel(name)
    while thread.is_alive():
        assert time.monotonic() < deadline, "fit() did not return"
        stack.advance(60)
        time.sleep(0.05)

    job = queue.job(name)
    assert job.state == "cancelled"
    printed = said(capsys.readouterr().out)
    # the SDK's loop saw the attempt stop and summed it up; the queue said why, once, after it
    assert printed.count("Billable seconds:") == 1
    assert printed.count(f"sagequeue: {name}: cancelled") == 1
    assert printed.index("Billable seconds:") < printed.index(f"sagequeue: {name}: cancelled")
    assert "runs the job again" not in printed
