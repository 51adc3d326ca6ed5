"""A stop (SIGTERM) while the end-of-run upload is under way, on the Hub test server with a slow link:
what has been uploaded when the grace runs short is committed, and visible afterwards."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from conftest import BIN, STANDINS, VERSION, make_cache
from support.hub_server import HubServer

from sagequeue.job import neuron

GRAPHS = 30
GRACE = 12.0


def _wait(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def test_a_stop_mid_upload_commits_the_entries_already_uploaded_before_the_grace_ends(
    base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache("hub", base_env, hub_server)
    repo = cache.url[len("hf://") :]
    tag = uuid.uuid4().hex[:8]
    graphs = ",".join(f"g{i}-{tag}" for i in range(GRAPHS))
    # a slow link: each LFS upload takes two seconds, so uploading all 30 entries takes longer than the grace
    hub_server.state.lfs_delay = 2.0
    puts_before = hub_server.state.lfs_puts
    try:
        # GIVEN a job whose command ended normally and whose upload of 30 new entries is under way
        job = subprocess.Popen(
            [
                str(BIN / "sagequeue-job"),
                "run",
                "--cache",
                cache.url,
                "--cache-dir",
                str(tmp_path / "cache"),
                "--grace",
                str(GRACE),
                "--no-progress",
                "--",
                str(STANDINS / "standin-train"),
                "--graphs",
                graphs,
            ],
            env=cache.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # the first entry's files are up: the upload has measured the link and sized its next batch
        _wait(lambda: hub_server.state.lfs_puts >= puts_before + 2, timeout=120)
        time.sleep(1.0)
        # WHEN SageMaker stops the job (a spot reclaim right after training)
        stopped_at = time.monotonic()
        job.send_signal(signal.SIGTERM)
        _, stderr = job.communicate(timeout=60)
        elapsed = time.monotonic() - stopped_at
    finally:
        hub_server.state.lfs_delay = 0.0
    # THEN the wrapper left within the grace, with the command's status
    assert elapsed < GRACE, stderr
    assert job.returncode == 0, stderr
    # AND the entries whose files arrived before the grace ran short are committed and visible
    committed = {
        path.split("/")[1]
        for path in hub_server.files(repo)
        if path.startswith(neuron.version_dir(VERSION) + "/") and path.endswith("/model.done")
    }
    assert len(committed) >= 1, stderr
    assert "uploaded" in stderr
    assert "upload abandoned" not in stderr
    local = {e.module for e in neuron.scan(tmp_path / "cache", VERSION)}
    assert committed <= local
    assert len(local) == GRAPHS
