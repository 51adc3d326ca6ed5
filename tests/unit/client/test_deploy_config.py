"""`sagequeue configure` asks what a first deploy needs and saves it in samconfig.toml, keeping what the file
already holds, so that `sam deploy` needs no `--guided` (which asks every parameter of the template)."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path

from click.testing import CliRunner

from sagequeue.deploy_config import QUESTIONS, configure, read_overrides

ROOT = Path(__file__).resolve().parents[3]
ROLE = "arn:aws:iam::123456789012:role/SageMakerExecution"
ADMIN = "arn:aws:iam::123456789012:role/MLAdmins"


def run(config: Path, answers: list[str]) -> str:
    result = CliRunner().invoke(configure, ["--config-file", str(config)], input="\n".join(answers) + "\n")
    assert result.exit_code == 0, result.output
    return result.output


def test_a_first_deploy_is_asked_six_questions_and_samconfig_keeps_its_defaults(tmp_path: Path) -> None:
    config = tmp_path / "samconfig.toml"
    config.write_text((ROOT / "samconfig.toml").read_text())

    output = run(config, ["", "eu-west-1", ROLE, ADMIN, "ml.trn1.32xlarge=4", "ops@example.com"])

    asked = ["Stack name", "Region", *(question for _, question, _, _ in QUESTIONS)]
    assert all(question in output for question in asked)
    assert len(asked) == 6
    saved = tomllib.loads(config.read_text())
    assert saved["default"]["global"]["parameters"]["stack_name"] == "sagequeue"
    deploy = saved["default"]["deploy"]["parameters"]
    assert deploy["region"] == "eu-west-1"
    # what was there stays
    assert deploy["capabilities"] == "CAPABILITY_IAM"
    assert saved["default"]["build"]["parameters"]["cached"] is True
    # the answers, as sam deploy reads parameter_overrides
    pairs = dict(pair.split("=", 1) for pair in shlex.split(deploy["parameter_overrides"]))
    assert pairs == {
        "AllowedRoleArns": ROLE,
        "AdminRoleArns": ADMIN,
        "Capacity": "ml.trn1.32xlarge=4",
        "OperationsEndpoint": "ops@example.com",
    }


def test_a_second_run_offers_the_saved_answers_and_refuses_bad_ones(tmp_path: Path) -> None:
    config = tmp_path / "samconfig.toml"
    config.write_text((ROOT / "samconfig.toml").read_text())
    run(config, ["", "", ROLE, "", "ml.trn1.32xlarge=4", ""])

    # the role is required and must be an ARN; the pools must be TYPE=N; then enter keeps the saved values
    output = run(config, ["", "", "not-an-arn", "", "", "trn1", "ml.trn1.32xlarge=2", ""])

    assert "not an IAM ARN: not-an-arn" in output
    assert "expected TYPE=N pairs" in output
    overrides = read_overrides(config.read_text())
    assert overrides["AllowedRoleArns"] == ROLE
    assert overrides["Capacity"] == "ml.trn1.32xlarge=2"
    assert overrides["AdminRoleArns"] == ""
