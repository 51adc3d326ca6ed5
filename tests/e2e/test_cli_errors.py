"""Every error of the `sagequeue` command is one line on stderr and a documented exit code, never a
traceback: run through the installed entry point, as a user runs it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

COMMAND = str(Path(sys.executable).with_name("sagequeue"))


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEQUEUE_", "HF_"))}
    environment.update(SAGEQUEUE_HOME=str(tmp_path / "home"), HF_HOME=str(tmp_path / "hf"), **env)
    return subprocess.run(
        [COMMAND, *args], capture_output=True, text=True, env=environment, timeout=120, check=False
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def test_an_unreachable_hub_cache_is_one_line(tmp_path: Path) -> None:
    done = run(
        tmp_path,
        "cache",
        "ls",
        "--cache",
        "hf://org/neff-cache",
        HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}",
    )
    assert done.returncode == 1
    line = one_line(done)
    assert line.startswith("error: sagequeue cache ls: ")
    assert "Connection refused" in line or "connect" in line.lower()


def test_an_offline_hub_client_is_one_line(tmp_path: Path) -> None:
    done = run(tmp_path, "cache", "ls", "--cache", "hf://org/neff-cache", HF_HUB_OFFLINE="1")
    assert done.returncode == 1
    assert "offline" in one_line(done).lower()


def test_an_unreachable_s3_cache_is_one_line(tmp_path: Path) -> None:
    done = run(
        tmp_path,
        "cache",
        "ls",
        "--cache",
        "s3://neff-bucket/cache",
        AWS_ENDPOINT_URL_S3=f"http://127.0.0.1:{closed_port()}",
        AWS_MAX_ATTEMPTS="1",
    )
    assert done.returncode == 1
    assert "Could not connect to the endpoint URL" in one_line(done)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["cache", "ls", "--cache", "ftp://x"], "unknown NEFF cache URL 'ftp://x'"),
        (["ls", "--bogus"], "No such option '--bogus'"),
        (["priority"], "Missing argument 'NAME'"),
        (["no-such-command"], "No such command 'no-such-command'"),
        (["cache", "prune"], "say what to prune"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    done = run(tmp_path, *args)
    assert done.returncode == 2
    line = one_line(done)
    assert message in line
    assert line.endswith("--help)")


def test_help_and_version_exit_0(tmp_path: Path) -> None:
    assert run(tmp_path, "--version").returncode == 0
    helped = run(tmp_path, "ls", "--help")
    assert helped.returncode == 0
    assert "--format" in helped.stdout
    assert "--start" in helped.stdout


def test_one_home_holds_the_local_stack_and_the_neff_cache_settings(tmp_path: Path) -> None:
    # GIVEN a default cache saved in SAGEQUEUE_HOME (where local.json lives), and no SAGEQUEUE_CONFIG_DIR
    home = tmp_path / "home"
    home.mkdir()
    (home / "neff-cache-url").write_text("hf://org/cache-from-the-home\n")

    # WHEN the cache and the local stack's files are asked for
    listed = run(tmp_path, "cache", "ls", HF_HUB_OFFLINE="1")
    env = run(tmp_path, "local", "env")

    # THEN both were looked for in that one home
    assert "org/cache-from-the-home" in one_line(listed)
    assert f"{home / 'local.json'} does not exist" in one_line(env)


def test_without_sagequeue_home_both_live_in_the_user_config_directory(tmp_path: Path) -> None:
    xdg = tmp_path / "xdg"
    (xdg / "sagequeue").mkdir(parents=True)
    (xdg / "sagequeue" / "neff-cache-url").write_text("hf://org/cache-from-xdg\n")
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEQUEUE_", "HF_"))}
    environment.update(XDG_CONFIG_HOME=str(xdg), HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))

    listed = subprocess.run(
        [COMMAND, "cache", "ls"], capture_output=True, text=True, env=environment, timeout=60, check=False
    )
    env = subprocess.run(
        [COMMAND, "local", "env"], capture_output=True, text=True, env=environment, timeout=60, check=False
    )

    assert "org/cache-from-xdg" in one_line(listed)
    assert f"{xdg / 'sagequeue' / 'local.json'} does not exist" in one_line(env)


@pytest.mark.parametrize(
    "args",
    [
        # a queue command (its errors pass through the queue commands' own handler)
        (
            "submit",
            "--generate-skeleton",
            "--image",
            "123456789012.dkr.ecr.us-east-1.amazonaws.com/t:1",
            "--instance-type",
            "ml.trn1.32xlarge",
            "--role",
            "arn:aws:iam::123456789012:role/r",
            "--output",
            "s3://b/o",
        ),
        # a command of another group
        ("cache", "status", "--cache-dir", "."),
    ],
    ids=["submit", "cache-status"],
)
def test_a_reader_that_went_away_is_no_error(tmp_path: Path, args: tuple[str, ...]) -> None:
    """`sagequeue show NAME | head -3`: the reader closes the pipe before the output ends. That is the
    reader's choice, not a failure to report: no "unexpected error", no traceback (click's own handling of
    a closed pipe: exit 1, silently)."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEQUEUE_", "HF_"))}
    environment.update(SAGEQUEUE_HOME=str(tmp_path / "home"), HF_HOME=str(tmp_path / "hf"))
    (tmp_path / "neuronxcc-2.14.213.0+013d129b" / "MODULE_1+a").mkdir(parents=True)
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line
    try:
        done = subprocess.run(
            [COMMAND, *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
            cwd=tmp_path,
            timeout=120,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode == 1
