"""Fixtures for the job image's tests: stand-in Neuron tools on PATH, S3 on moto's server, the Hub-API
test server, and a helper that runs `sagequeue-job` / `sagequeue` as real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from support import iam_check
from support.hub_server import HubServer

STANDINS = Path(__file__).resolve().parents[2] / "standins"
BIN = Path(sys.executable).parent
VERSION = "2.14.213.0+013d129b"
HUB_TOKEN = "hf_sagequeue_test_token"


@pytest.fixture(scope="session")
def hub_server() -> Iterator[HubServer]:
    with HubServer(token=HUB_TOKEN) as server:
        yield server


@pytest.fixture(autouse=True)
def _no_xet(monkeypatch: pytest.MonkeyPatch) -> None:
    # The test server speaks LFS only; huggingface_hub would otherwise upload through Xet.
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)


@dataclass
class JobRoleCheck:
    """What the test tells the job role check: the secret holding the team's Hub token, if it made one."""

    hub_token_secret: str = iam_check.NO_SECRET


@pytest.fixture
def job_requests_allowed_by_the_documented_role(
    base_env: dict[str, str], tmp_path: Path
) -> Iterator[JobRoleCheck]:
    """For the test files that use it (`pytestmark`): every AWS request the job image makes, in this
    process or in the `sagequeue-job` processes started with `base_env`, is judged by the documented job
    role (docs/policies/job-role-*.json) of the team its cache handle writes as; a denial fails the test,
    naming the team, the action and the statement (tests/support/iam_check.py, ADR 0021)."""
    recorder = iam_check.install()
    assert recorder.job is not None
    log = tmp_path / "iam-job-requests.jsonl"
    base_env[iam_check.JOB_LOG_ENV] = str(log)
    base_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(iam_check.JOB_SITE), base_env.get("PYTHONPATH", "")) if p
    )
    first = len(recorder.job_requests)
    recorder.job.enabled = True
    check = JobRoleCheck()
    try:
        yield check
    finally:
        recorder.job.enabled = False
    made = recorder.job_requests[first:]
    del recorder.job_requests[first:]
    made += job_requests_in(log)
    where = iam_check.Where("us-east-1", iam_check.DEFAULT_ACCOUNT)
    problems = iam_check.job_denials(made, where, check.hub_token_secret)
    if problems:
        pytest.fail(
            "the documented job role does not allow what the job image did:\n  " + "\n  ".join(problems),
            pytrace=False,
        )


def job_requests_in(log: Path) -> list[iam_check.JobRequest]:
    """The requests `sagequeue-job` processes appended to `log`."""
    if not log.is_file():
        return []
    return [iam_check.JobRequest.from_json(json.loads(line)) for line in log.read_text().splitlines() if line]


@dataclass
class Cache:
    """A remote cache under test: its URL, an in-process handle, and the environment to reach it."""

    kind: str
    url: str
    remote: object
    env: dict[str, str]


@pytest.fixture
def base_env(
    tmp_path: Path, moto_endpoint: str, hub_server: HubServer, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    env = dict(os.environ)
    for name in (
        "TRAINING_JOB_NAME",
        "SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY",
        "NEURON_CC_FLAGS",
        "NEURON_COMPILE_CACHE_URL",
        "SAGEQUEUE_NEFF_CACHE",
    ):
        env.pop(name, None)
    env.update(
        {
            "PATH": f"{STANDINS}{os.pathsep}{BIN}{os.pathsep}{env.get('PATH', '')}",
            "AWS_ENDPOINT_URL": moto_endpoint,
            "HF_ENDPOINT": hub_server.url,
            "HF_TOKEN": HUB_TOKEN,
            "HF_HOME": str(tmp_path / "hf-home"),
            "HF_HUB_DISABLE_XET": "1",
            "SAGEQUEUE_CONFIG_DIR": str(tmp_path / "config"),
            "STANDIN_COMPILE_SECONDS": "0.02",
            "PYTHONUNBUFFERED": "1",
        }
    )
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    return env


def make_cache(kind: str, env: dict[str, str], hub_server: HubServer) -> Cache:
    from sagequeue.job.backends import open_remote

    name = f"neff-{uuid.uuid4().hex[:10]}"
    if kind == "s3":
        url = f"s3://{name}/team/cache"
        remote = open_remote(url)
    else:
        url = f"hf://sq-org/{name}"
        remote = open_remote(url, endpoint=hub_server.url, token=HUB_TOKEN, backoff_base=0.05)
    remote.create(private=True)
    return Cache(kind, url, remote, env)


@pytest.fixture(params=["s3", "hub"])
def cache(request: pytest.FixtureRequest, base_env: dict[str, str], hub_server: HubServer) -> Cache:
    return make_cache(request.param, base_env, hub_server)


def run_wrapper(
    args: list[str], env: dict[str, str], timeout: float = 90, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "sagequeue-job"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        check=False,
    )


def run_cli(args: list[str], env: dict[str, str], timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "sagequeue"), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def stop_and_wait(job: subprocess.Popen[Any], timeout: float = 30) -> tuple[int, float]:
    """Stop `job` as SageMaker does (SIGTERM): its exit status and the seconds it took to leave."""
    stopped_at = time.monotonic()
    job.send_signal(signal.SIGTERM)
    status = job.wait(timeout=timeout)
    return status, time.monotonic() - stopped_at


def assert_no_more_traffic(proxy: Any) -> None:
    """Nothing passes a `fault_proxy.FaultProxy` any more: a second to settle, then two watched."""
    time.sleep(1.0)
    sent = proxy.sent
    time.sleep(2.0)
    assert proxy.sent == sent
