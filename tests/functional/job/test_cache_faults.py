"""A cache that is dead, slow or resetting costs a bounded delay, never the job: `sagequeue-job` behind a
fault-injecting proxy on 127.0.0.1, with its default bounds."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from conftest import (
    BIN,
    HUB_TOKEN,
    STANDINS,
    VERSION,
    Cache,
    assert_no_more_traffic,
    make_cache,
    stop_and_wait,
)
from fault_proxy import FaultProxy
from support.hub_server import HubServer

from sagequeue.job import neuron, sync
from sagequeue.job.backends import open_remote
from sagequeue.job.remote import Deadline, RemoteCache

#: What the issue promises: a dead cache delays training by at most this much (defaults).
DEAD_CACHE_BOUND = 60.0


def _behind(proxy: FaultProxy, kind: str, env: dict[str, str]) -> dict[str, str]:
    routed = dict(env)
    routed["AWS_ENDPOINT_URL" if kind == "s3" else "HF_ENDPOINT"] = proxy.url
    return routed


def _upstream(kind: str, env: dict[str, str]) -> str:
    return env["AWS_ENDPOINT_URL"] if kind == "s3" else env["HF_ENDPOINT"]


def _wrapper(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [str(BIN / "sagequeue-job"), "run", "--no-progress", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )


def _wait_for(condition, timeout: float) -> float:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, "condition not met in time"
        time.sleep(0.05)
    return time.monotonic() - started


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["s3", "hub"])
def test_a_blackholed_cache_delays_training_and_the_exit_by_less_than_a_minute(
    kind: str, base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache(kind, base_env, hub_server)
    tag = uuid.uuid4().hex[:8]
    log = tmp_path / "wrapper.log"
    with FaultProxy(_upstream(kind, cache.env), mode="blackhole") as proxy:
        # GIVEN a cache endpoint that accepts connections and never answers
        job = _wrapper(
            [
                "--cache",
                cache.url,
                "--cache-dir",
                str(tmp_path / "cache"),
                "--model",
                "org/blackholed",
                "--",
                str(STANDINS / "standin-train"),
                "--graphs",
                f"f-{tag},b-{tag}",
                "--started",
                str(tmp_path / "started"),
            ],
            _behind(proxy, kind, cache.env),
            log,
        )
        try:
            # THEN training starts within the bound, and the log said why it waited
            delay = _wait_for(lambda: (tmp_path / "started").exists(), DEAD_CACHE_BOUND + 30)
            ended_at = time.monotonic()
            status = job.wait(timeout=DEAD_CACHE_BOUND + 30)
            after_training = time.monotonic() - ended_at
        finally:
            job.kill()
        stderr = log.read_text()
        assert proxy.accepted >= 1
    assert delay < DEAD_CACHE_BOUND, stderr
    assert "has not answered for" in stderr
    assert "restore called off" in stderr
    # AND the upload after training gives up within the bound too, with the command's status
    assert status == 0, stderr
    assert after_training < DEAD_CACHE_BOUND, stderr
    assert "upload called off" in stderr or "upload failed" in stderr
    # AND the command compiled what it needed
    assert sum(e.state is neuron.EntryState.COMPLETE for e in neuron.scan(tmp_path / "cache", VERSION)) == 2


@pytest.mark.parametrize("kind", ["s3", "hub"])
def test_a_resetting_cache_costs_no_wait(
    kind: str, base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache(kind, base_env, hub_server)
    log = tmp_path / "wrapper.log"
    with FaultProxy(_upstream(kind, cache.env), mode="reset") as proxy:
        job = _wrapper(
            [
                "--cache",
                cache.url,
                "--cache-dir",
                str(tmp_path / "cache"),
                "--restore",
                "all",
                "--",
                str(STANDINS / "standin-train"),
                "--started",
                str(tmp_path / "started"),
            ],
            _behind(proxy, kind, cache.env),
            log,
        )
        try:
            delay = _wait_for(lambda: (tmp_path / "started").exists(), 60)
            assert job.wait(timeout=60) == 0, log.read_text()
        finally:
            job.kill()
    stderr = log.read_text()
    assert proxy.accepted >= 1
    # connection resets fail fast: no stall cut-off needed
    assert delay < 15, stderr
    assert "restore failed" in stderr


def _big_entry(remote: RemoteCache, tmp_path: Path, size: int) -> str:
    """Publish one complete entry of `size` random bytes; returns its module name."""
    root = tmp_path / "publisher"
    module = f"MODULE_{int(uuid.uuid4().hex[:12], 16)}+abcdef12"
    entry = root / neuron.version_dir(VERSION) / module
    entry.mkdir(parents=True)
    (entry / "model.neff").write_bytes(os.urandom(size))
    (entry / "model.done").write_bytes(b"")
    report = sync.upload(remote, root, VERSION)
    assert report.result.published == [neuron.entry_key(VERSION, module)]
    return module


def _staged_bytes(root: Path) -> int:
    staging = sync.staging_dir(root)
    return sum(p.stat().st_size for p in staging.rglob("*") if p.is_file()) if staging.exists() else 0


def _slow_restore_job(
    cache: Cache, proxy: FaultProxy, tmp_path: Path, extra: list[str], steps: int = 2
) -> tuple[subprocess.Popen[bytes], Path]:
    log = tmp_path / "wrapper.log"
    job = _wrapper(
        [
            "--cache",
            cache.url,
            "--cache-dir",
            str(tmp_path / "cache"),
            "--restore",
            "all",
            "--workers",
            "2",
            *extra,
            "--",
            str(STANDINS / "standin-train"),
            "--steps",
            str(steps),
            "--step-seconds",
            "0.5",
            "--started",
            str(tmp_path / "started"),
            "--checkpoint",
            str(tmp_path / "checkpoint.json"),
            "--term-status",
            "143",
        ],
        _behind(proxy, cache.kind, cache.env),
        log,
    )
    return job, log


@pytest.mark.parametrize("kind", ["s3", "hub"])
def test_a_stop_during_a_slow_restore_exits_within_the_grace_and_stops_downloading(
    kind: str, base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache(kind, base_env, hub_server)
    _big_entry(cache.remote, tmp_path, 8 * 1024 * 1024)  # 32 s at the proxy's rate
    with FaultProxy(_upstream(kind, cache.env), mode="slow", rate=256 * 1024) as proxy:
        job, log = _slow_restore_job(cache, proxy, tmp_path, ["--grace", "6"])
        try:
            # GIVEN the restore is downloading
            _wait_for(lambda: _staged_bytes(tmp_path / "cache") > 512 * 1024, 60)
            # AND what is in flight sits outside the cache root: a tool that uploads the whole cache folder
            # (optimum-neuron's synchronize) sees no partial file
            root = tmp_path / "cache"
            assert not sync.staging_dir(root).is_relative_to(root)
            assert [p for p in root.rglob("*") if p.name.endswith((".part", ".ranges"))] == []
            # WHEN SageMaker stops the job
            status, elapsed = stop_and_wait(job)
        finally:
            job.kill()
        stderr = log.read_text()
        # THEN the wrapper left within the grace, without starting the command
        assert elapsed < 6, stderr
        assert status == 128 + signal.SIGTERM, stderr
        assert not (tmp_path / "started").exists()
        # AND nothing downloads any more
        assert_no_more_traffic(proxy)


@pytest.mark.parametrize("kind", ["s3", "hub"])
def test_a_restore_over_its_timeout_stops_downloading_while_training_runs(
    kind: str, base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache(kind, base_env, hub_server)
    _big_entry(cache.remote, tmp_path, 8 * 1024 * 1024)
    with FaultProxy(_upstream(kind, cache.env), mode="slow", rate=256 * 1024) as proxy:
        job, log = _slow_restore_job(cache, proxy, tmp_path, ["--restore-timeout", "3"], steps=12)
        try:
            # GIVEN the restore ran out of time and training started
            _wait_for(lambda: (tmp_path / "started").exists(), 30)
            time.sleep(1.5)
            # THEN the abandoned restore no longer downloads while the command trains
            sent = proxy.sent
            staged = _staged_bytes(tmp_path / "cache")
            time.sleep(2.0)
            assert job.poll() is None, "the command should still be training"
            assert proxy.sent == sent
            assert _staged_bytes(tmp_path / "cache") == staged
            # AND the wrapper ends with the command, not with the download
            assert job.wait(timeout=60) == 0, log.read_text()
        finally:
            job.kill()
    stderr = log.read_text()
    assert "restore did not finish" in stderr


def test_a_hub_upload_under_a_deadline_commits_what_fits(
    base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache("hub", base_env, hub_server)
    root = tmp_path / "local"
    # GIVEN 10 entries of 1 MB and a Hub that takes them at 1 MB/s: 10 s of upload
    for _ in range(10):
        module = f"MODULE_{int(uuid.uuid4().hex[:12], 16)}+abcdef12"
        entry = root / neuron.version_dir(VERSION) / module
        entry.mkdir(parents=True)
        (entry / "model.neff").write_bytes(os.urandom(1024 * 1024))
        (entry / "model.done").write_bytes(b"")
    with FaultProxy(hub_server.url, mode="slow", rate=16 * 1024 * 1024, up_rate=1024 * 1024) as proxy:
        remote = open_remote(cache.url, endpoint=proxy.url, token=HUB_TOKEN, backoff_base=0.05)
        # WHEN it must be done in 6 s (a stop's grace)
        started = time.monotonic()
        report = sync.upload(remote, root, VERSION, deadline=Deadline(6.0))
        elapsed = time.monotonic() - started
    # THEN it sized its batches to the time left, committed what went up, and kept to the deadline
    published = report.result.published
    assert 1 <= len(published) < 10, report
    assert elapsed < 7.0
    assert set(cache.remote.entries(VERSION)) == {key.split("/", 1)[1] for key in published}
    assert sorted(report.result.skipped + published) == sorted(report.candidates)


def test_a_blackholed_secrets_manager_delays_training_by_less_than_a_minute(
    base_env: dict[str, str], moto_endpoint: str, hub_server: HubServer, tmp_path: Path
) -> None:
    """The Hub token comes from Secrets Manager (SAGEQUEUE_HF_TOKEN_SECRET): a Secrets Manager that never
    answers is part of a dead cache and must not hold training longer than the cache's own bound."""
    cache = make_cache("hf", base_env, hub_server)
    log = tmp_path / "wrapper.log"
    with FaultProxy(moto_endpoint, mode="blackhole") as secrets:
        env = dict(
            cache.env,
            SAGEQUEUE_HF_TOKEN_SECRET="neff-cache-token",
            AWS_ENDPOINT_URL_SECRETSMANAGER=secrets.url,
            AWS_ENDPOINT_URL_SECRETS_MANAGER=secrets.url,
        )
        # GIVEN a wrapper that must read its Hub token from a Secrets Manager that never answers
        job = _wrapper(
            [
                "--cache",
                cache.url,
                "--cache-dir",
                str(tmp_path / "cache"),
                "--restore",
                "none",
                "--no-upload",
                "--",
                str(STANDINS / "standin-train"),
                "--graphs",
                f"s-{uuid.uuid4().hex[:8]}",
                "--started",
                str(tmp_path / "started"),
            ],
            env,
            log,
        )
        try:
            # THEN training starts within the dead-cache bound, with the default Hub credentials
            delay = _wait_for(lambda: (tmp_path / "started").exists(), DEAD_CACHE_BOUND + 10)
            assert job.wait(timeout=30) == 0, log.read_text()
        finally:
            job.kill()
        assert secrets.accepted >= 1
    stderr = log.read_text()
    assert delay < DEAD_CACHE_BOUND, stderr
    assert "using the default Hub credentials: cannot read secret neff-cache-token" in stderr
