"""The Neuron SDK's own S3 cache (`NEURON_CC_FLAGS=--cache_dir=s3://...`, `NEURON_COMPILE_CACHE_URL=s3://...`)
and sagequeue's, both ways, on moto's server with the stand-in compiler (which reads and writes S3 the way
the Neuron compiler's cache does)."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import boto3
import pytest
from conftest import STANDINS, VERSION, run_cli, run_wrapper

from sagequeue.job import neuron
from sagequeue.job.backends import open_remote

# every request of the job image here is judged by the documented job role of the team it writes as
pytestmark = pytest.mark.usefixtures("job_requests_allowed_by_the_documented_role")


def _train(tmp_path: Path, report: str, graphs: str) -> list[str]:
    return [str(STANDINS / "standin-train"), "--graphs", graphs, "--report", str(tmp_path / report)]


def _compiled(tmp_path: Path, report: str) -> list[str]:
    return list(json.loads((tmp_path / report).read_text())["compiled"])


@pytest.fixture
def sdk_url(base_env: dict[str, str]) -> str:
    bucket = f"sdk-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=base_env["AWS_ENDPOINT_URL"]).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/neuron-cache"


def _sdk_only_job(base_env: dict[str, str], sdk_url: str, tmp_path: Path, report: str, graphs: str) -> None:
    """A job that uses only the Neuron SDK's caching: the compiler reads and writes the S3 cache itself."""
    env = dict(base_env, NEURON_CC_FLAGS=f"--cache_dir={sdk_url}")
    done = subprocess.run(
        _train(tmp_path, report, graphs), env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("variable", ["NEURON_CC_FLAGS", "NEURON_COMPILE_CACHE_URL"])
def test_an_sdk_s3_cache_without_a_sagequeue_cache_is_adopted_and_shared_both_ways(
    base_env: dict[str, str], sdk_url: str, tmp_path: Path, variable: str
) -> None:
    # GIVEN a team's S3 cache the Neuron SDK filled by itself
    _sdk_only_job(base_env, sdk_url, tmp_path, "sdk.json", "forward,backward")
    assert _compiled(tmp_path, "sdk.json") == ["forward", "backward"]
    listed = run_cli(["cache", "ls", "--cache", sdk_url], base_env)
    assert listed.returncode == 0, listed.stderr
    assert f"{neuron.version_dir(VERSION)}: 2 entries" in listed.stdout

    # WHEN the team moves to the image, its SDK setting unchanged and no sagequeue cache set
    value = f"--cache_dir={sdk_url}" if variable == "NEURON_CC_FLAGS" else sdk_url
    env = dict(base_env, **{variable: value})
    run = run_wrapper(
        [
            "run",
            "--cache-dir",
            str(tmp_path / "host"),
            "--no-progress",
            "--",
            *_train(tmp_path, "wrapped.json", "forward,backward,extra"),
        ],
        env,
    )

    # THEN the SDK's cache is the remote: its entries are restored (no recompile) and the new one published
    assert run.returncode == 0, run.stderr
    assert f"adopting the Neuron SDK's S3 cache {sdk_url} (from {variable})" in run.stderr
    assert "restored 2 entries" in run.stderr
    assert _compiled(tmp_path, "wrapped.json") == ["extra"]
    remote = open_remote(sdk_url)
    entries = remote.entries(VERSION)
    assert len(entries) == 3
    assert sorted(e.origin for e in entries.values()).count("neuron-sdk") == 2
    # and what sagequeue published is a hit for the SDK's own client
    _sdk_only_job(base_env, sdk_url, tmp_path, "sdk-again.json", "forward,backward,extra")
    assert _compiled(tmp_path, "sdk-again.json") == []

    # verify checks the SDK's entries and --repair adopts them: they get manifests with SHA-256
    checked = run_cli(["cache", "verify", "--cache", sdk_url], base_env)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert checked.stdout.count("written by the Neuron SDK, not recorded by sagequeue") == 2
    repaired = run_cli(["cache", "verify", "--cache", sdk_url, "--repair"], base_env)
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert "adopted 2 entries the Neuron SDK wrote" in repaired.stdout
    after = remote.entries(VERSION)
    assert [e.origin for e in after.values()] == ["sagequeue"] * 3
    again = run_cli(["cache", "verify", "--cache", sdk_url], base_env)
    assert again.returncode == 0, again.stdout + again.stderr
    fresh = run_cli(
        [
            "cache",
            "restore",
            "--cache",
            sdk_url,
            "--cache-dir",
            str(tmp_path / "fresh"),
            "--compiler-version",
            VERSION,
            "--no-progress",
        ],
        base_env,
    )
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    assert "restored 3 entries" in fresh.stdout


def test_with_a_sagequeue_cache_too_the_replaced_sdk_cache_is_named(
    base_env: dict[str, str], sdk_url: str, tmp_path: Path
) -> None:
    other = f"s3://{sdk_url[len('s3://') :].split('/')[0]}/sagequeue-cache"
    open_remote(other).create()
    env = dict(base_env, NEURON_CC_FLAGS=f"--cache_dir={sdk_url}")
    run = run_wrapper(
        [
            "run",
            "--cache",
            other,
            "--cache-dir",
            str(tmp_path / "host"),
            "--no-progress",
            "--",
            *_train(tmp_path, "wrapped.json", "forward"),
        ],
        env,
    )
    assert run.returncode == 0, run.stderr
    assert f"NEURON_CC_FLAGS names the S3 cache {sdk_url}" in run.stderr
    assert len(open_remote(other).entries(VERSION)) == 1
