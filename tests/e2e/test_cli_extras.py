"""Every `--help` runs whatever extras are installed, and a command whose extra is missing says, in one
line, which extra to install. An install without an extra is made by hiding the extra's modules from
the interpreter (an import of a module set to None in sys.modules fails as if it were not installed)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from support.cli_help import every_help, failures

#: the modules each extra brings that the CLI may import
WITHOUT_JOB = ("tqdm", "huggingface_hub")
WITHOUT_LOCAL = ("moto", "werkzeug", "yaml", "samtranslator", "pynamodb", "aws_lambda_powertools")
#: what the wheel installs alone (no extra)
BARE = WITHOUT_JOB + WITHOUT_LOCAL


def runner(tmp_path: Path, hidden: Sequence[str]):  # type: ignore[no-untyped-def]
    code = (
        "import sys\n"
        f"for name in {tuple(hidden)!r}:\n"
        "    sys.modules[name] = None\n"
        "from sagequeue.cli import main\n"
        "main(prog_name='sagequeue')\n"
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEQUEUE_", "HF_"))}
    environment.update(SAGEQUEUE_HOME=str(tmp_path / "home"), HF_HOME=str(tmp_path / "hf"))

    def run(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            capture_output=True,
            text=True,
            env=environment,
            timeout=120,
            check=False,
        )

    return run


@pytest.mark.parametrize("hidden", [(), WITHOUT_JOB, BARE], ids=["dev", "local-without-job", "bare-wheel"])
def test_every_help_runs_without_the_extras(tmp_path: Path, hidden: tuple[str, ...]) -> None:
    answers = every_help(runner(tmp_path, hidden))

    assert failures(answers) == []
    # the walk reached the groups' subcommands, not only the top
    assert {("ls",), ("cache",), ("cache", "ls"), ("local",), ("simulate",), ("preflight",)} <= set(answers)


@pytest.mark.parametrize(
    ("hidden", "args", "extra"),
    [
        (WITHOUT_JOB, ["cache", "ls", "--cache", "hf://org/neff-cache"], "job"),
        (BARE, ["local", "--capacity", "ml.trn1.32xlarge=1"], "local"),
        (BARE, ["demo"], "local"),
    ],
)
def test_a_command_whose_extra_is_missing_names_it_in_one_line(
    tmp_path: Path, hidden: tuple[str, ...], args: list[str], extra: str
) -> None:
    done = runner(tmp_path, hidden)(args)

    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: `sagequeue {args[0]}")
    assert f"pip install 'sagequeue[{extra}]'" in line
