"""Stops, precompilation, the warm-pool cache and NeuronCore metrics, with real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest
from conftest import BIN, STANDINS, VERSION, Cache, make_cache, run_wrapper
from support.hub_server import HubServer

from sagequeue.job import neuron
from sagequeue_core.defaults import HOST_DIMENSION, NEURON_METRIC_NAMESPACE, NEURONCORE_UTILIZATION_METRIC


def _wait(condition, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.05)


def _start_long_job(cache: Cache, tmp_path: Path, local: Path, grace: float) -> subprocess.Popen[str]:
    # graph names unique to the test: identical NEFF bytes would already be stored on the shared servers
    tag = uuid.uuid4().hex[:8]
    command = [
        str(STANDINS / "standin-train"),
        "--graphs",
        f"forward-{tag},backward-{tag}",
        "--steps",
        "600",
        "--step-seconds",
        "0.1",
        "--checkpoint",
        str(tmp_path / "checkpoint.json"),
        "--term-status",
        "143",
    ]
    return subprocess.Popen(
        [
            str(BIN / "sagequeue-job"),
            "run",
            "--cache",
            cache.url,
            "--cache-dir",
            str(local),
            "--grace",
            str(grace),
            "--no-progress",
            "--",
            *command,
        ],
        env=cache.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _complete(local: Path) -> int:
    return sum(e.state is neuron.EntryState.COMPLETE for e in neuron.scan(local, VERSION))


def test_sigterm_reaches_the_command_and_new_entries_upload_within_the_grace(
    cache: Cache, tmp_path: Path
) -> None:
    local = tmp_path / "cache"
    job = _start_long_job(cache, tmp_path, local, grace=30)
    # GIVEN the command compiled its graphs and is training
    _wait(lambda: _complete(local) == 2)
    # WHEN SageMaker stops the job (SIGTERM to the container's entry point)
    stopped_at = time.monotonic()
    job.send_signal(signal.SIGTERM)
    _, stderr = job.communicate(timeout=60)
    # THEN the command got the signal and checkpointed, and the wrapper exits with the command's status
    assert job.returncode == 143, stderr
    checkpoint = json.loads((tmp_path / "checkpoint.json").read_text())
    assert checkpoint["signal"] == signal.SIGTERM
    # AND the compiled entries were published inside the grace
    assert time.monotonic() - stopped_at < 30
    assert len(cache.remote.entries(VERSION)) == 2


def test_an_upload_that_cannot_finish_is_abandoned_within_the_grace(
    base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache("hub", base_env, hub_server)
    repo = cache.url[len("hf://") :]
    head = hub_server.head(repo).oid
    local = tmp_path / "cache"
    job = _start_long_job(cache, tmp_path, local, grace=5)
    _wait(lambda: _complete(local) == 2)
    # GIVEN the Hub accepts LFS uploads only very slowly
    hub_server.state.lfs_gate = threading.Event()
    try:
        stopped_at = time.monotonic()
        job.send_signal(signal.SIGTERM)
        _, stderr = job.communicate(timeout=30)
        elapsed = time.monotonic() - stopped_at
    finally:
        hub_server.state.lfs_gate.set()
        hub_server.state.lfs_gate = None
    # THEN the wrapper gives up before the grace ends, keeps the command's status, and the Hub has not moved
    assert job.returncode == 143, stderr
    assert elapsed < 5, stderr
    assert "upload abandoned" in stderr
    time.sleep(0.5)
    assert hub_server.head(repo).oid == head


def test_precompile_on_a_miss_fills_the_cache_before_training(
    base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache("s3", base_env, hub_server)
    local = tmp_path / "cache"
    report = tmp_path / "report.json"
    result = run_wrapper(
        [
            "run",
            "--cache",
            cache.url,
            "--cache-dir",
            str(local),
            "--precompile-steps",
            "1",
            "--no-progress",
            "--",
            str(STANDINS / "standin-train"),
            "--graphs",
            "embed,forward,backward",
            "--steps",
            "3",
            "--report",
            str(report),
        ],
        cache.env,
    )
    assert result.returncode == 0, result.stderr
    assert "cache miss: precompiling" in result.stderr
    # every graph was compiled by neuron_parallel_compile, so training only hit the cache
    outcome = json.loads(report.read_text())
    assert outcome["compiled"] == []
    assert outcome["hit"] == ["embed", "forward", "backward"]
    assert len(cache.remote.entries(VERSION)) == 3


def test_the_warm_pool_cache_wins_and_survives_for_the_next_job(
    base_env: dict[str, str], tmp_path: Path
) -> None:
    warm = tmp_path / "warmpool"
    elsewhere = tmp_path / "elsewhere"
    env = dict(
        base_env,
        SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY=str(warm),
        NEURON_CC_FLAGS=f"--cache_dir={elsewhere} --model-type=transformer",
    )
    command = [str(STANDINS / "standin-train"), "--report", str(tmp_path / "first.json")]
    first = run_wrapper(["run", "--no-progress", "--", *command], env)
    assert first.returncode == 0, first.stderr
    # the compiler was pointed at the warm pool's directory, whatever NEURON_CC_FLAGS said
    assert _complete(warm / neuron.WARMPOOL_CACHE_SUBDIR) == 2
    assert not elsewhere.exists()
    # WHEN the next job lands on the same (reused) instance, with no remote cache at all
    command[-1] = str(tmp_path / "second.json")
    second = run_wrapper(["run", "--no-progress", "--", *command], env)
    assert second.returncode == 0, second.stderr
    assert json.loads((tmp_path / "second.json").read_text())["compiled"] == []


def test_neuroncore_utilization_is_published_per_host_while_the_command_runs(
    base_env: dict[str, str], tmp_path: Path
) -> None:
    job_name = f"sq-metrics-{uuid.uuid4().hex[:8]}"
    resource_config = tmp_path / "resourceconfig.json"
    resource_config.write_text(json.dumps({"current_host": "algo-2", "hosts": ["algo-1", "algo-2"]}))
    pidfile = tmp_path / "monitor.pid"
    env = dict(
        base_env,
        TRAINING_JOB_NAME=job_name,
        SAGEQUEUE_RESOURCE_CONFIG=str(resource_config),
        STANDIN_NEURONCORE_UTILIZATION="42.5",
        STANDIN_MONITOR_PIDFILE=str(pidfile),
    )
    started = datetime.now(UTC) - timedelta(minutes=1)
    result = run_wrapper(
        [
            "run",
            "--metrics",
            "on",
            "--metrics-period",
            "1",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-progress",
            "--",
            str(STANDINS / "standin-train"),
            "--steps",
            "20",
            "--step-seconds",
            "0.1",
        ],
        env,
    )
    assert result.returncode == 0, result.stderr
    cloudwatch = boto3.client("cloudwatch")
    host = f"{job_name}/algo-2"
    metrics = cloudwatch.list_metrics(
        Namespace=NEURON_METRIC_NAMESPACE, MetricName=NEURONCORE_UTILIZATION_METRIC
    )
    hosts = {d["Value"] for m in metrics["Metrics"] for d in m["Dimensions"] if d["Name"] == HOST_DIMENSION}
    assert host in hosts
    assert f"{job_name}/algo-1" not in hosts
    stats = cloudwatch.get_metric_statistics(
        Namespace=NEURON_METRIC_NAMESPACE,
        MetricName=NEURONCORE_UTILIZATION_METRIC,
        Dimensions=[{"Name": HOST_DIMENSION, "Value": host}],
        StartTime=started,
        EndTime=datetime.now(UTC) + timedelta(minutes=1),
        Period=60,
        Statistics=["Average", "SampleCount", "Maximum"],
    )
    points = stats["Datapoints"]
    assert points, stats
    assert sum(p["SampleCount"] for p in points) >= 2
    assert all(p["Average"] == pytest.approx(42.5) for p in points)
    # the monitor stopped with the command
    with pytest.raises(ProcessLookupError):
        os.kill(int(pidfile.read_text()), 0)


def test_without_a_neuron_compiler_the_command_still_runs(base_env: dict[str, str], tmp_path: Path) -> None:
    env = dict(base_env, PATH=str(BIN))  # no stand-ins: no neuronx-cc anywhere
    result = run_wrapper(
        [
            "run",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--",
            str(BIN / "python"),
            "-c",
            "raise SystemExit(3)",
        ],
        env,
    )
    assert result.returncode == 3
    assert "NEFF cache disabled" in result.stderr


def test_a_missing_remote_cache_costs_a_compile_not_the_job(base_env: dict[str, str], tmp_path: Path) -> None:
    result = run_wrapper(
        [
            "run",
            "--cache",
            "s3://sagequeue-no-such-bucket/neff",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--restore",
            "all",
            "--no-progress",
            "--",
            str(STANDINS / "standin-train"),
            "--report",
            str(tmp_path / "r.json"),
        ],
        base_env,
    )
    assert result.returncode == 0, result.stderr
    assert "restore failed" in result.stderr
    assert "upload failed" in result.stderr
    assert "sagequeue-no-such-bucket does not exist" in result.stderr
    assert json.loads((tmp_path / "r.json").read_text())["compiled"] == ["forward", "backward"]


def test_a_stop_during_the_final_upload_cuts_it_to_the_grace(
    base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache("hub", base_env, hub_server)
    tag = uuid.uuid4().hex[:8]
    arrivals = hub_server.state.lfs_arrivals
    hub_server.state.lfs_gate = threading.Event()
    try:
        # GIVEN the command ended normally and its upload is stuck on a slow Hub
        job = subprocess.Popen(
            [
                str(BIN / "sagequeue-job"),
                "run",
                "--cache",
                cache.url,
                "--cache-dir",
                str(tmp_path / "cache"),
                "--grace",
                "5",
                "--no-progress",
                "--",
                str(STANDINS / "standin-train"),
                "--graphs",
                f"a-{tag},b-{tag}",
            ],
            env=cache.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _wait(lambda: hub_server.state.lfs_arrivals > arrivals)
        # WHEN SageMaker stops the job now
        stopped_at = time.monotonic()
        job.send_signal(signal.SIGTERM)
        _, stderr = job.communicate(timeout=30)
        elapsed = time.monotonic() - stopped_at
    finally:
        hub_server.state.lfs_gate.set()
        hub_server.state.lfs_gate = None
    # THEN the wrapper leaves within the grace, with the command's own status
    assert elapsed < 5, stderr
    assert job.returncode == 0, stderr
    assert "upload abandoned" in stderr


@pytest.mark.parametrize("where", ["no training job name", "no resource config", "no neuron-monitor"])
def test_metrics_on_outside_sagemaker_runs_the_command_with_a_one_line_warning(
    where: str, base_env: dict[str, str], tmp_path: Path
) -> None:
    env = dict(base_env)
    env.pop("SAGEQUEUE_RESOURCE_CONFIG", None)
    if where != "no training job name":
        env["TRAINING_JOB_NAME"] = f"sq-metrics-{uuid.uuid4().hex[:8]}"
    if where == "no resource config":
        # /opt/ml/input/config/resourceconfig.json is read unless this names another file
        env["SAGEQUEUE_RESOURCE_CONFIG"] = str(tmp_path / "missing" / "resourceconfig.json")
    if where == "no neuron-monitor":
        config = tmp_path / "resourceconfig.json"
        config.write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
        env["SAGEQUEUE_RESOURCE_CONFIG"] = str(config)
        # the stand-ins without neuron-monitor
        bare = tmp_path / "bin"
        bare.mkdir()
        for tool in ("neuronx-cc", "_standin_neuron.py"):
            (bare / tool).symlink_to(STANDINS / tool)
        env["PATH"] = os.pathsep.join([str(bare), str(BIN), "/usr/bin", "/bin"])
    result = run_wrapper(
        [
            "run",
            "--metrics",
            "on",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-progress",
            "--",
            str(STANDINS / "standin-train"),
            "--report",
            str(tmp_path / "report.json"),
        ],
        env,
    )
    # the command ran and its status is the wrapper's
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "report.json").read_text())["compiled"]
    assert "Traceback" not in result.stderr
    warnings = [line for line in result.stderr.splitlines() if " WARNING " in line and "utilization" in line]
    assert len(warnings) == 1, result.stderr
    expected = {
        "no training job name": "TRAINING_JOB_NAME",
        "no resource config": "resourceconfig.json",
        "no neuron-monitor": "neuron-monitor",
    }[where]
    assert expected in warnings[0]
