"""The built artifacts, as Lambda runs them: every function of `sam build`'s output, with the layer built
for the functions' runtime, invoked on Python 3.12 against moto's server and the SageMaker emulator.

Run after `sam build` (.ci/run does): SAGEQUEUE_BUILD_DIR names the build (default .aws-sam/build) and
SAGEQUEUE_LAMBDA_PYTHON the python3.12 interpreter whose site-packages stand for Lambda's runtime (boto3,
botocore). Nothing of the source tree is importable in the handlers' process (tests/packaging/lambda_runner.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.cfn_template import create_table

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("SAGEQUEUE_BUILD_DIR", ROOT / ".aws-sam" / "build")).resolve()
PYTHON = os.environ.get("SAGEQUEUE_LAMBDA_PYTHON", "")
RUNNER = Path(__file__).with_name("lambda_runner.py")
EVENTS = ROOT / "tests" / "events"
ACCOUNT = "123456789012"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/SageMakerTraining"


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_multi_constructor("!", lambda loader, suffix, node: None)


def _built() -> dict[str, Any]:
    template = BUILD / "template.yaml"
    assert template.is_file(), f"no build at {BUILD}: run `sam build` first (.ci/run does)"
    built: dict[str, Any] = yaml.load(template.read_text(), Loader=_Loader)  # noqa: S506 - a safe loader
    return built


def _runtime_site() -> str:
    assert PYTHON, "SAGEQUEUE_LAMBDA_PYTHON must name the python3.12 that stands for Lambda's runtime"
    found = subprocess.run(
        [
            PYTHON,
            "-c",
            "import sys, sysconfig, boto3; print(sys.version_info[:2] == (3, 12)); print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert found[0] == "True", f"{PYTHON} is not Python 3.12"
    return found[1]


@pytest.fixture(scope="module")
def stack(moto_endpoint: str) -> Iterator[dict[str, str]]:
    from sagequeue.local import SageMakerEmulator

    suffix = uuid.uuid4().hex[:8]
    aws = {"endpoint_url": moto_endpoint, "region_name": "us-east-1"}
    table = create_table(boto3.client("dynamodb", **aws), f"smoke-jobs-{suffix}")
    bus = f"smoke-bus-{suffix}"
    boto3.client("events", **aws).create_event_bus(Name=bus)
    sns = boto3.client("sns", **aws)
    alarms = sns.create_topic(Name=f"smoke-alarms-{suffix}")["TopicArn"]
    notes = sns.create_topic(Name=f"smoke-notes-{suffix}")["TopicArn"]
    notices = sns.create_topic(Name=f"smoke-job-notices-{suffix}")["TopicArn"]
    emulator = SageMakerEmulator(
        events_client=boto3.client("events", **aws), cloudwatch_client=boto3.client("cloudwatch", **aws)
    ).start()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        # botocore's per-service endpoints: the handlers' own clients (and pynamodb's) read them
        "AWS_ENDPOINT_URL": moto_endpoint,
        "AWS_ENDPOINT_URL_SAGEMAKER": emulator.endpoint_url,
        "POWERTOOLS_SERVICE_NAME": "sagequeue",
        "POWERTOOLS_METRICS_NAMESPACE": "SageQueue",
        "SAGEQUEUE_TABLE_NAME": table,
        "SAGEQUEUE_EVENT_BUS_NAME": bus,
        "SAGEQUEUE_CAPACITY": "ml.trn1.32xlarge=2",
        "SAGEQUEUE_ALLOWED_ROLE_ARNS": ROLE,
        "SAGEQUEUE_ALARM_TOPIC_ARN": alarms,
        "SAGEQUEUE_NOTIFICATION_TOPIC_ARN": notes,
        "SAGEQUEUE_JOB_NOTICES_TOPIC_ARN": notices,
    }
    try:
        yield {"env": json.dumps(env), "sagemaker": emulator.endpoint_url}
    finally:
        emulator.stop()


def _invoke(
    stack: dict[str, str],
    function: str,
    event: dict[str, Any],
    tmp_path: Path,
    more_layers: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Run `function` from the build with the CoreLayer (every function's, from Globals) and `more_layers`
    (its own Layers, in their order)."""
    resources = _built()["Resources"]
    props = resources[function]["Properties"]
    assert resources["CoreLayer"]["Type"] == "AWS::Serverless::LayerVersion"
    layer_python = BUILD / "CoreLayer" / "python"
    assert (layer_python / "sagequeue_core").is_dir(), f"the built layer {layer_python} has no sagequeue_core"
    layers = [str(layer_python), *(str(BUILD / layer / "python") for layer in more_layers)]
    event_file = tmp_path / f"{function}.json"
    event_file.write_text(json.dumps(event))
    done = subprocess.run(
        [
            PYTHON,
            "-I",
            "-S",
            str(RUNNER),
            str(BUILD / function),
            os.pathsep.join(layers),
            _runtime_site(),
            props["Handler"],
            str(event_file),
        ],
        capture_output=True,
        text=True,
        env=json.loads(stack["env"]),
        timeout=120,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, f"{function} failed on Python 3.12 from the build:\n{done.stderr[-4000:]}"
    line = next(line for line in reversed(done.stdout.splitlines()) if line.startswith("SMOKE-ANSWER "))
    answer: dict[str, Any] = json.loads(line.removeprefix("SMOKE-ANSWER "))
    assert answer["python"] == [3, 12]
    assert answer["sagequeue_core"].startswith(str(layer_python)), answer["sagequeue_core"]
    return dict(answer["answer"])


def test_the_build_has_every_function_of_the_template() -> None:
    functions = {k for k, v in _built()["Resources"].items() if v.get("Type") == "AWS::Serverless::Function"}
    assert functions == {
        "ApiFunction",
        "SchedulerFunction",
        "GovernanceFunction",
        "IdleStopFunction",
        "NoticesFunction",
        "ForecastFunction",
    }
    for function in functions:
        assert (BUILD / function / "app.py").is_file()
        assert not (BUILD / function / "sagequeue_core").exists(), (
            "the layer's code belongs in the layer only"
        )
        assert not (BUILD / function / "sagequeue").exists(), (
            "the SDK's code belongs in the ForecastLayer only"
        )
    # the forecast engine, and none of the SDK's dependencies: the function needs none of them
    engine = BUILD / "ForecastLayer" / "python" / "sagequeue" / "forecast" / "engine.py"
    assert engine.is_file(), f"the built ForecastLayer has no {engine}"
    assert not any((BUILD / "ForecastLayer" / "python").glob("click*")), "the ForecastLayer carries packages"


def test_built_handlers_run_on_python_312(stack: dict[str, str], tmp_path: Path) -> None:
    submit = json.loads((EVENTS / "apigw-rest-post-jobs.json").read_text())
    name = f"smoke-{uuid.uuid4().hex[:8]}"
    body = json.loads(submit["body"])
    body["TrainingJobName"] = name
    body["RoleArn"] = ROLE
    submit["body"] = json.dumps(body)
    answer = _invoke(stack, "ApiFunction", submit, tmp_path)
    assert answer["statusCode"] == 201, answer
    timer = json.loads((EVENTS / "scheduled-reconcile.json").read_text())
    report = _invoke(stack, "SchedulerFunction", timer, tmp_path)
    assert any(str(started).startswith(name) for started in report["started"]), report
    sagemaker = boto3.client("sagemaker", endpoint_url=stack["sagemaker"], region_name="us-east-1")
    started = {job["TrainingJobName"] for job in sagemaker.list_training_jobs()["TrainingJobSummaries"]}
    assert any(n.startswith(name) for n in started), started
    # a 2-instance job waits behind it on the pool of 2: the forecast function forecasts it from the table
    waiting = json.loads(submit["body"])
    waiting["TrainingJobName"] = f"{name}-wide"
    waiting["ResourceConfig"] = {**waiting["ResourceConfig"], "InstanceCount": 2}
    queued = _invoke(stack, "ApiFunction", {**submit, "body": json.dumps(waiting)}, tmp_path)
    assert queued["statusCode"] == 201, queued
    forecast = _invoke(stack, "ForecastFunction", timer, tmp_path, more_layers=("ForecastLayer",))
    assert forecast["forecast"] == 1, forecast
    assert forecast["logged"] == 1, forecast
    assert forecast["runs"] >= 3, forecast
    shown = _invoke(
        stack,
        "ApiFunction",
        {
            **submit,
            "httpMethod": "GET",
            "resource": "/jobs/{name}",
            "path": f"/jobs/{name}-wide",
            "pathParameters": {"name": f"{name}-wide"},
            "body": None,
        },
        tmp_path,
    )
    assert shown["statusCode"] == 200, shown
    predicted = json.loads(shown["body"])["forecast"]
    assert predicted is not None, shown
    assert predicted["p10"] <= predicted["p50"], predicted
    reconciled = _invoke(stack, "GovernanceFunction", timer, tmp_path)
    assert reconciled["jobs_seen"] >= 1, reconciled  # the job the scheduler started
    # the start's event, as the bus delivers it to the notices function: its owner is told
    started_event = {"source": "sagequeue", "detail-type": "JobStarted", "detail": {"name": name}}
    told = _invoke(stack, "NoticesFunction", started_event, tmp_path)
    assert told["notice"], told
    assert told["notice"]["event"] == "started", told
    forged = {
        "Records": [
            {
                "EventSource": "aws:sns",
                "Sns": {
                    "TopicArn": json.loads(stack["env"])["SAGEQUEUE_ALARM_TOPIC_ARN"],
                    "Message": json.dumps({"AlarmName": f"sagequeue-idle-{name}", "NewStateValue": "ALARM"}),
                    "MessageAttributes": {},
                },
            }
        ]
    }
    outcome = _invoke(stack, "IdleStopFunction", forged, tmp_path)
    # an alarm CloudWatch does not know is a forgery: verified, refused, nothing stopped
    assert outcome["outcomes"], outcome
    assert not any(o["stopped"] for o in outcome["outcomes"]), outcome
