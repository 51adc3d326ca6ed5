"""While the command's compiler runs, the wrapper publishes the host as compiling: a real neuronx-cc
(stand-in) process under a real `sagequeue-job`, metrics on moto's CloudWatch."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import pytest
from conftest import BIN, STANDINS, run_wrapper

from sagequeue_core.defaults import HOST_DIMENSION, NEURON_COMPILING_METRIC, NEURON_METRIC_NAMESPACE

# the utilization publisher's requests are judged by the documented job role (its namespace condition)
pytestmark = pytest.mark.usefixtures("job_requests_allowed_by_the_documented_role")


def test_a_compile_in_progress_is_published_as_compiling(base_env: dict[str, str], tmp_path: Path) -> None:
    job_name = f"sq-compiling-{uuid.uuid4().hex[:8]}"
    resource_config = tmp_path / "resourceconfig.json"
    resource_config.write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    env = dict(
        base_env,
        TRAINING_JOB_NAME=job_name,
        SAGEQUEUE_RESOURCE_CONFIG=str(resource_config),
        STANDIN_NEURONCORE_UTILIZATION="0",
        STANDIN_COMPILE_SECONDS="4",  # each neuronx-cc run takes this long, at 0% utilization
    )
    started = datetime.now(UTC) - timedelta(minutes=1)
    # GIVEN a command whose one graph compiles for 4 s, then trains for 4 s without compiling
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
            "--graphs",
            f"g-{uuid.uuid4().hex[:8]}",
            "--steps",
            "40",
            "--step-seconds",
            "0.1",
        ],
        env,
    )
    assert result.returncode == 0, result.stderr
    # THEN the host's NeuronCompiling reads 1 while the compiler ran and 0 after it
    cloudwatch = boto3.client("cloudwatch")
    answer = cloudwatch.get_metric_data(
        MetricDataQueries=[
            {
                "Id": "compiling",
                "MetricStat": {
                    "Metric": {
                        "Namespace": NEURON_METRIC_NAMESPACE,
                        "MetricName": NEURON_COMPILING_METRIC,
                        "Dimensions": [{"Name": HOST_DIMENSION, "Value": f"{job_name}/algo-1"}],
                    },
                    "Period": 1,
                    "Stat": "Maximum",
                },
            }
        ],
        StartTime=started,
        EndTime=datetime.now(UTC) + timedelta(minutes=1),
    )
    values = answer["MetricDataResults"][0]["Values"]
    assert 1.0 in values, values
    assert 0.0 in values, values


def test_a_dead_cloudwatch_does_not_hold_the_wrapper_past_the_stop_grace(
    base_env: dict[str, str], moto_endpoint: str, tmp_path: Path
) -> None:
    """CloudWatch unreachable (a VPC without a monitoring endpoint): the last data point must not keep
    the wrapper past the grace, which would leave no time for the upload and end in SageMaker's SIGKILL."""
    import signal
    import subprocess
    import time

    from fault_proxy import FaultProxy

    resource_config = tmp_path / "resourceconfig.json"
    resource_config.write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1"]}))
    with FaultProxy(moto_endpoint, mode="blackhole") as dead:
        env = dict(
            base_env,
            TRAINING_JOB_NAME=f"sq-dead-cw-{uuid.uuid4().hex[:8]}",
            SAGEQUEUE_RESOURCE_CONFIG=str(resource_config),
            AWS_ENDPOINT_URL_CLOUDWATCH=dead.url,
        )
        started = tmp_path / "started"
        job = subprocess.Popen(
            [
                str(BIN / "sagequeue-job"),
                "run",
                "--metrics",
                "on",
                "--metrics-period",
                "1",
                "--grace",
                "12",
                "--cache-dir",
                str(tmp_path / "cache"),
                "--no-progress",
                "--",
                str(STANDINS / "standin-train"),
                "--graphs",
                f"g-{uuid.uuid4().hex[:8]}",
                "--steps",
                "600",
                "--step-seconds",
                "0.1",
                "--started",
                str(started),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        end = time.monotonic() + 60
        while not started.exists():
            assert job.poll() is None, job.communicate()[1]
            assert time.monotonic() < end
            time.sleep(0.05)
        time.sleep(2.5)  # a publish or two are in flight against the dead endpoint
        # WHEN SageMaker stops the job
        stopped_at = time.monotonic()
        job.send_signal(signal.SIGTERM)
        try:
            _, stderr = job.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            job.kill()
            job.communicate()
            raise AssertionError(
                "the wrapper still waits for CloudWatch 40 s after a stop with a 12 s grace"
            ) from None
        elapsed = time.monotonic() - stopped_at
        # THEN it leaves within the grace minus its exit margin, saying the data point was given up
        assert elapsed < 12 - 1.8, stderr
        assert "not waiting for it" in stderr, stderr
        assert dead.accepted >= 1  # the publisher did try the dead endpoint
