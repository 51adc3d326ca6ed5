"""sagequeue-job run end to end: real processes, stand-in Neuron tools, S3 on moto and the Hub test server."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import boto3
import pytest
from conftest import HUB_TOKEN, STANDINS, VERSION, Cache, JobRoleCheck, make_cache, run_wrapper
from support.hub_server import HubServer

from sagequeue.job import neuron

# every request of the job image here is judged by the documented job role of the team it writes as
pytestmark = pytest.mark.usefixtures("job_requests_allowed_by_the_documented_role")


def _train(tmp_path: Path, report: str, graphs: str = "forward,backward") -> list[str]:
    return [str(STANDINS / "standin-train"), "--graphs", graphs, "--report", str(tmp_path / report)]


def test_miss_compiles_and_uploads_then_a_fresh_host_restores_and_hits(cache: Cache, tmp_path: Path) -> None:
    # GIVEN an empty remote cache and a host with an empty local cache
    first_dir = tmp_path / "host-1"
    # WHEN a job runs there
    first = run_wrapper(
        [
            "run",
            "--cache",
            cache.url,
            "--cache-dir",
            str(first_dir),
            "--model",
            "org/tiny-llama",
            "--config",
            "precision=bf16",
            "--no-progress",
            "--",
            *_train(tmp_path, "first.json"),
        ],
        cache.env,
    )
    # THEN its graphs compiled and were published, with a registry record naming them
    assert first.returncode == 0, first.stderr
    assert json.loads((tmp_path / "first.json").read_text())["compiled"] == ["forward", "backward"]
    remote_entries = cache.remote.entries(VERSION)
    local = {e.module for e in neuron.scan(first_dir, VERSION)}
    assert set(remote_entries) == local
    assert len(local) == 2
    records = cache.remote.records("org/tiny-llama")
    assert len(records) == 1
    assert set(records[0].entries) == local
    assert records[0].config["precision"] == "bf16"

    # WHEN the same job runs on a fresh host, configured the way an estimator's environment does it
    second_dir = tmp_path / "host-2"
    env = dict(
        cache.env,
        SAGEQUEUE_NEFF_CACHE=cache.url,
        SAGEQUEUE_MODEL="org/tiny-llama",
        SAGEQUEUE_JOB_CONFIG="precision=bf16",
        SAGEQUEUE_RESTORE="registry",
    )
    second = run_wrapper(
        ["run", "--cache-dir", str(second_dir), "--no-progress", "--", *_train(tmp_path, "second.json")], env
    )
    # THEN it restored the entries before the command started and compiled nothing
    assert second.returncode == 0, second.stderr
    outcome = json.loads((tmp_path / "second.json").read_text())
    assert outcome == {"hit": ["forward", "backward"], "compiled": [], "extracted": []}
    assert "restored 2 entries" in second.stderr
    restored = {e.module: e for e in neuron.scan(second_dir, VERSION)}
    for module, entry in restored.items():
        assert entry.state is neuron.EntryState.COMPLETE
        original = first_dir / neuron.version_dir(VERSION) / module / neuron.NEFF_FILE
        assert (entry.path / neuron.NEFF_FILE).read_bytes() == original.read_bytes()
    # no staging leftovers are visible to the compiler
    assert not any(p.name.endswith(".part") for p in second_dir.rglob("*"))


def test_a_failed_compile_is_cleaned_and_never_uploaded(cache: Cache, tmp_path: Path) -> None:
    local = tmp_path / "cache"
    # WHEN the second graph fails to compile
    result = run_wrapper(
        [
            "run",
            "--cache",
            cache.url,
            "--cache-dir",
            str(local),
            "--no-progress",
            "--",
            *_train(tmp_path, "r.json", graphs="forward,FAIL-attention"),
        ],
        cache.env,
    )
    # THEN the job fails with the command's status, only the good entry is shared, the failure is gone
    assert result.returncode == 1, result.stderr
    remote = cache.remote.entries(VERSION)
    assert len(remote) == 1
    states = [e.state for e in neuron.scan(local, VERSION)]
    assert states == [neuron.EntryState.COMPLETE]
    assert "1 failed entries cleaned" in result.stderr
    # AND a retry compiles the failed graph again instead of replaying a cached failure
    retry = run_wrapper(
        [
            "run",
            "--cache-dir",
            str(local),
            "--no-progress",
            "--",
            *_train(tmp_path, "r2.json", graphs="forward,FAIL-attention"),
        ],
        cache.env,
    )
    assert "Got a cached failed neff" not in retry.stderr
    assert "compilation failed" in retry.stderr


def test_the_hub_token_can_come_from_secrets_manager(
    base_env: dict[str, str],
    hub_server: HubServer,
    tmp_path: Path,
    job_requests_allowed_by_the_documented_role: JobRoleCheck,
) -> None:
    cache = make_cache("hub", base_env, hub_server)
    secret = f"sagequeue/hub-token-{uuid.uuid4().hex[:8]}"
    # the job role reads this secret and no other (docs/policies/job-role-hub-token.json)
    job_requests_allowed_by_the_documented_role.hub_token_secret = secret
    boto3.client("secretsmanager").create_secret(
        Name=secret, SecretString=json.dumps({"HF_TOKEN": HUB_TOKEN})
    )
    # GIVEN no token in the job's environment, only the secret's name
    env = {k: v for k, v in base_env.items() if k != "HF_TOKEN"}
    env["SAGEQUEUE_HF_TOKEN_SECRET"] = secret
    result = run_wrapper(
        [
            "run",
            "--cache",
            cache.url,
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-progress",
            "--",
            *_train(tmp_path, "r.json"),
        ],
        env,
    )
    # THEN the wrapper reached the (token-protected) Hub and published
    assert result.returncode == 0, result.stderr
    assert "uploaded 2 entries" in result.stderr
    assert len(cache.remote.entries(VERSION)) == 2
