"""The utilization publisher's arithmetic and CloudWatch payload; signal forwarding to a real child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sagequeue.job.host import HostIdentity
from sagequeue.job.metrics import UtilizationPublisher, metric_datum, metric_namespace, summarize
from sagequeue.job.process import SignalForwarder, StopWatch, group_alive, wait_for_group
from sagequeue_core.defaults import (
    HOST_DIMENSION,
    NEURON_COMPILING_METRIC,
    NEURON_METRIC_NAMESPACE,
    NEURONCORE_UTILIZATION_METRIC,
)


class RecordingCloudWatch:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def put_metric_data(self, **kwargs: Any) -> None:
        self.calls.append(kwargs)


def test_a_period_summarizes_its_reports() -> None:
    stats = summarize([0.0, 50.0, 100.0])
    assert stats is not None
    assert (stats.count, stats.total, stats.minimum, stats.maximum, stats.average) == (
        3,
        150.0,
        0.0,
        100.0,
        50.0,
    )
    assert summarize([]) is None


def test_the_datum_carries_the_shared_name_and_host_dimension() -> None:
    identity = HostIdentity("job-1", 2)
    stats = summarize([10.0, 30.0])
    assert stats is not None
    datum = metric_datum(identity, stats, datetime(2026, 1, 1, tzinfo=UTC))
    assert datum["MetricName"] == NEURONCORE_UTILIZATION_METRIC
    assert datum["Dimensions"] == [{"Name": HOST_DIMENSION, "Value": "job-1/algo-2"}]
    assert datum["StatisticValues"] == {"SampleCount": 2.0, "Sum": 40.0, "Minimum": 10.0, "Maximum": 30.0}
    assert datum["Unit"] == "Percent"


def test_a_period_without_reports_publishes_nothing() -> None:
    cloudwatch = RecordingCloudWatch()
    publisher = UtilizationPublisher(HostIdentity("job-1", 1), cloudwatch=cloudwatch)
    publisher.flush()
    assert cloudwatch.calls == []
    publisher._samples.extend([20.0, 40.0])
    publisher.flush()
    assert cloudwatch.calls[0]["Namespace"] == NEURON_METRIC_NAMESPACE
    assert cloudwatch.calls[0]["MetricData"][0]["StatisticValues"]["Sum"] == 60.0


def test_the_job_publishes_to_the_namespace_its_environment_names_else_the_default() -> None:
    assert metric_namespace({"SAGEQUEUE_METRIC_NAMESPACE": "SageQueue/TrainingJobs/vision"}) == (
        "SageQueue/TrainingJobs/vision"
    )
    assert metric_namespace({"SAGEQUEUE_METRIC_NAMESPACE": "  "}) == NEURON_METRIC_NAMESPACE
    assert metric_namespace({}) == NEURON_METRIC_NAMESPACE
    cloudwatch = RecordingCloudWatch()
    publisher = UtilizationPublisher(
        HostIdentity("job-1", 1), cloudwatch=cloudwatch, namespace="SageQueue/TrainingJobs/vision"
    )
    publisher._samples.append(30.0)
    publisher._compiling.append(1.0)
    publisher.flush()
    assert [c["Namespace"] for c in cloudwatch.calls] == ["SageQueue/TrainingJobs/vision"]
    assert {d["MetricName"] for d in cloudwatch.calls[0]["MetricData"]} == {
        NEURONCORE_UTILIZATION_METRIC,
        NEURON_COMPILING_METRIC,
    }


CHILD = """
import signal, sys, time, pathlib
def on(sig, frame):
    pathlib.Path(sys.argv[1]).write_text(str(sig))
    sys.exit(7)
signal.signal(signal.SIGTERM, on)
pathlib.Path(sys.argv[2]).touch()
time.sleep(30)
"""


def test_sigterm_to_the_wrapper_reaches_the_child_and_its_status_is_kept(tmp_path: Path) -> None:
    watch = StopWatch()
    forwarder = SignalForwarder(watch)
    got, ready = tmp_path / "got", tmp_path / "ready"
    forwarder.install()
    try:

        def stop_when_ready() -> None:
            while not ready.exists():
                time.sleep(0.02)
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=stop_when_ready, daemon=True).start()
        status = forwarder.run([sys.executable, "-c", CHILD, str(got), str(ready)], {})
    finally:
        forwarder.restore()
    assert status == 7
    assert got.read_text() == str(int(signal.SIGTERM))
    assert watch.signal == signal.SIGTERM


SLOW_CHECKPOINT = """
import signal, sys, time, pathlib
def on(sig, frame):
    time.sleep(1.5)
    pathlib.Path(sys.argv[1]).write_text(str(sig))
    sys.exit(7)
signal.signal(signal.SIGTERM, on)
pathlib.Path(sys.argv[2]).touch()
time.sleep(30)
"""


def test_the_stop_hook_runs_once_while_the_child_still_checkpoints(tmp_path: Path) -> None:
    watch = StopWatch()
    forwarder = SignalForwarder(watch)
    got, ready = tmp_path / "got", tmp_path / "ready"
    calls: list[tuple[float, bool]] = []
    forwarder.install()
    try:

        def stop_when_ready() -> None:
            while not ready.exists():
                time.sleep(0.02)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGTERM)  # a second stop signal calls nothing again

        threading.Thread(target=stop_when_ready, daemon=True).start()
        status = forwarder.run(
            [sys.executable, "-c", SLOW_CHECKPOINT, str(got), str(ready)],
            {},
            stop_end=lambda: time.monotonic() + 60,
            on_stop=lambda: calls.append((watch.seconds_since(), got.exists())),
        )
    finally:
        forwarder.restore()
    assert status == 7
    # called once, within a fifth of a second of the stop, before the checkpoint was written
    assert len(calls) == 1
    since, checkpointed = calls[0]
    assert since < 0.5
    assert not checkpointed


def test_a_child_killed_by_a_signal_reports_128_plus_the_signal() -> None:
    forwarder = SignalForwarder(StopWatch())
    assert (
        forwarder.run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], {})
        == 137
    )


def test_a_running_compiler_is_published_as_compiling(tmp_path: Path) -> None:
    # GIVEN a process that runs a script named neuronx-cc, the way an interpreter runs the real one
    script = tmp_path / "neuronx-cc"
    script.write_text("import time\ntime.sleep(30)\n")
    cloudwatch = RecordingCloudWatch()
    publisher = UtilizationPublisher(HostIdentity("job-1", 1), cloudwatch=cloudwatch)
    compiler = subprocess.Popen([sys.executable, str(script), "compile"])
    try:
        # the process is visible under its script's name once the interpreter has started it
        cmdline = Path(f"/proc/{compiler.pid}/cmdline")
        deadline = time.monotonic() + 10
        while b"neuronx-cc" not in cmdline.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.02)
        publisher.sample_compiling()
    finally:
        compiler.kill()
        compiler.wait()
    publisher._samples.append(0.0)  # the NeuronCores read idle meanwhile
    publisher.flush()
    # THEN the period carries both: 0% utilization, and a compile running
    data = {d["MetricName"]: d for d in cloudwatch.calls[0]["MetricData"]}
    assert data[NEURONCORE_UTILIZATION_METRIC]["StatisticValues"]["Maximum"] == 0.0
    assert data[NEURON_COMPILING_METRIC]["StatisticValues"]["Maximum"] == 1.0
    assert data[NEURON_COMPILING_METRIC]["Dimensions"] == [{"Name": HOST_DIMENSION, "Value": "job-1/algo-1"}]
    # AND once the compiler is gone, the next period says so
    publisher.sample_compiling()
    publisher.flush()
    (datum,) = cloudwatch.calls[1]["MetricData"]
    assert (datum["MetricName"], datum["StatisticValues"]["Maximum"]) == (NEURON_COMPILING_METRIC, 0.0)


def test_the_process_group_wait_sees_grandchildren_and_ignores_zombies(tmp_path: Path) -> None:
    # a launcher that exits at once, leaving a worker in its process group
    launcher = subprocess.Popen(
        ["bash", "-c", f"{sys.executable} -c 'import time; time.sleep(1.5)' & echo $! > {tmp_path}/pid"],
        start_new_session=True,
    )
    launcher.wait()
    assert group_alive(launcher.pid)
    started = time.monotonic()
    assert not wait_for_group(launcher.pid, time.monotonic() + 0.3)
    assert wait_for_group(launcher.pid, time.monotonic() + 10)
    assert 1.0 <= time.monotonic() - started < 5
    assert not group_alive(launcher.pid)
