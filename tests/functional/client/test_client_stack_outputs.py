"""Finding the API from a deployed stack's outputs, against CloudFormation served by moto over HTTP."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import boto3
import pytest
from click.testing import CliRunner

from sagequeue.cli import main
from sagequeue.client import QueueClient
from sagequeue.exceptions import ConfigurationError, EndpointUnreachable

API_URL = "http://127.0.0.1:9/prod"  # nothing listens on the discard port


@pytest.fixture
def cloudformation(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> object:
    # botocore's per-service endpoint variable: the client under test finds moto without being told
    monkeypatch.setenv("AWS_ENDPOINT_URL_CLOUDFORMATION", moto_endpoint)
    monkeypatch.setenv("SAGEQUEUE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SAGEQUEUE_ENDPOINT", raising=False)
    monkeypatch.delenv("SAGEQUEUE_STACK_NAME", raising=False)
    return boto3.client("cloudformation", region_name="us-east-1", endpoint_url=moto_endpoint)


def create_stack(cloudformation: object, outputs: dict[str, str]) -> str:
    name = f"sagequeue-{uuid.uuid4().hex[:8]}"
    template = {
        "AWSTemplateFormatVersion": "2010-09-09",
        "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {key: {"Value": value} for key, value in outputs.items()},
    }
    cloudformation.create_stack(StackName=name, TemplateBody=json.dumps(template))  # type: ignore[attr-defined]
    return name


def test_stack_name_gives_the_api_url_output(cloudformation: object) -> None:
    name = create_stack(cloudformation, {"ApiUrl": API_URL, "JobsTable": "jobs"})
    client = QueueClient(stack_name=name)
    assert client.endpoint == API_URL
    assert client.endpoint_origin == f"stack {name}"


def test_the_stack_name_variable_is_used_when_nothing_else_is_given(
    cloudformation: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = create_stack(cloudformation, {"ApiUrl": API_URL})
    monkeypatch.setenv("SAGEQUEUE_STACK_NAME", name)
    assert QueueClient().endpoint == API_URL


def test_a_stack_without_the_output_is_named_in_the_error(cloudformation: object) -> None:
    name = create_stack(cloudformation, {"Other": "x"})
    with pytest.raises(ConfigurationError, match=rf"stack '{name}' has no ApiUrl output.*outputs: Other"):
        QueueClient(stack_name=name)


def test_a_missing_stack_is_a_configuration_error(cloudformation: object) -> None:
    with pytest.raises(ConfigurationError, match="cannot read the outputs of stack 'no-such-stack'"):
        QueueClient(stack_name="no-such-stack")


def test_the_resolved_endpoint_is_then_called_and_reported_unreachable(cloudformation: object) -> None:
    name = create_stack(cloudformation, {"ApiUrl": API_URL})
    with pytest.raises(EndpointUnreachable, match=r"127\.0\.0\.1:9/prod"):
        QueueClient(stack_name=name).whoami()


def test_cli_stack_name_option_and_its_errors(cloudformation: object) -> None:
    name = create_stack(cloudformation, {"ApiUrl": API_URL})
    runner = CliRunner()

    unreachable = runner.invoke(main, ["whoami", "--stack-name", name])
    missing = runner.invoke(main, ["ls", "--stack-name", "no-such-stack", "--json"])

    assert unreachable.exit_code == 3
    assert unreachable.output.startswith("error: cannot reach the sagequeue API at http://127.0.0.1:9/prod")
    assert "Traceback" not in unreachable.output
    assert missing.exit_code == 3
    error = json.loads(missing.output)["error"]
    assert error["code"] == "ConfigurationError"
    assert "no-such-stack" in error["message"]
