"""NeuronCore utilization from neuron-monitor to CloudWatch, once a period per host.

SageMaker publishes no NeuronCore metric, so an idle alarm on a Trainium job needs this one. Each period
carries the statistics of the reports neuron-monitor printed in it (each report: the mean utilization of
the cores in use, 0 when no runtime holds a core). A period without any report publishes nothing, so a
dead monitor shows as missing data rather than as an idle host.

Beside it, `NeuronCompiling` says whether a neuronx-cc or neuron_parallel_compile process ran in the period
(1 or 0, sampled every few seconds; its Maximum is what the idle alarm reads): a cold compile takes 30-60
minutes at ~0% utilization, and the idle alarm's metric math counts such a period as busy.

Both go to the namespace the job's environment names (SAGEQUEUE_METRIC_NAMESPACE: the scheduler sets its
team's, `SageQueue/TrainingJobs/<team>`, where only that team's execution roles may publish), else to
`SageQueue/TrainingJobs`.
"""

from __future__ import annotations

import json
import logging
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from sagequeue.job import neuron
from sagequeue.job.host import HostIdentity
from sagequeue_core.defaults import (
    HOST_DIMENSION,
    METRIC_NAMESPACE_ENV,
    METRIC_PERIOD_SECONDS,
    NEURON_COMPILING_METRIC,
    NEURON_METRIC_NAMESPACE,
    NEURONCORE_UTILIZATION_METRIC,
)
from sagequeue_core.retry import botocore_config

log = logging.getLogger(__name__)

#: Tries of one PutMetricData, and the connect and read timeout of each, in seconds.
PUBLISH_ATTEMPTS = 2
PUBLISH_TIMEOUT_SECONDS = 5.0
#: How long stop() waits for the last data point.
LAST_FLUSH_SECONDS = 3.0


@dataclass(frozen=True)
class PeriodStatistics:
    count: int
    total: float
    minimum: float
    maximum: float

    @property
    def average(self) -> float:
        return self.total / self.count


def summarize(samples: list[float]) -> PeriodStatistics | None:
    if not samples:
        return None
    return PeriodStatistics(len(samples), sum(samples), min(samples), max(samples))


def metric_datum(
    identity: HostIdentity,
    stats: PeriodStatistics,
    at: datetime,
    metric: str = NEURONCORE_UTILIZATION_METRIC,
    unit: str = "Percent",
) -> dict[str, Any]:
    return {
        "MetricName": metric,
        "Dimensions": [{"Name": HOST_DIMENSION, "Value": identity.dimension_value}],
        "Timestamp": at,
        "StatisticValues": {
            "SampleCount": float(stats.count),
            "Sum": stats.total,
            "Minimum": stats.minimum,
            "Maximum": stats.maximum,
        },
        "Unit": unit,
    }


def metric_namespace(env: Mapping[str, str]) -> str:
    """The namespace this job's utilization goes to: the one the scheduler set in its environment (the one
    its idle alarms read), else the default namespace of jobs without a team."""
    return env.get(METRIC_NAMESPACE_ENV, "").strip() or NEURON_METRIC_NAMESPACE


class UtilizationPublisher:
    """Runs neuron-monitor for the life of the training command and publishes its utilization."""

    def __init__(
        self,
        identity: HostIdentity,
        *,
        period: float = METRIC_PERIOD_SECONDS,
        cloudwatch: Any = None,
        monitor_executable: str = neuron.MONITOR_EXECUTABLE,
        namespace: str = NEURON_METRIC_NAMESPACE,
    ) -> None:
        self.identity = identity
        self.namespace = namespace
        self.period = period
        self.monitor_executable = monitor_executable
        self._cloudwatch = cloudwatch
        self._samples: list[float] = []
        #: 1.0 or 0.0 per look at the process table: was a compiler running?
        self._compiling: list[float] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._monitor: subprocess.Popen[str] | None = None
        self._threads: list[threading.Thread] = []
        self._config_dir: tempfile.TemporaryDirectory[str] | None = None
        self.published = 0

    @property
    def cloudwatch(self) -> Any:
        if self._cloudwatch is None:
            # short bounds: a data point lost is better than a wrapper held by an unreachable CloudWatch
            self._cloudwatch = boto3.client(
                "cloudwatch",
                config=botocore_config(
                    attempts=PUBLISH_ATTEMPTS,
                    connect_timeout=PUBLISH_TIMEOUT_SECONDS,
                    read_timeout=PUBLISH_TIMEOUT_SECONDS,
                ),
            )
        return self._cloudwatch

    def start(self) -> None:
        self._config_dir = tempfile.TemporaryDirectory(prefix="neuron-monitor-")
        config = Path(self._config_dir.name) / "monitor.json"
        config.write_text(json.dumps(neuron.monitor_config(min(self.period, 5.0))))
        self._monitor = subprocess.Popen(
            neuron.monitor_command(config, self.monitor_executable),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._threads = [
            threading.Thread(target=self._read, name="neuron-monitor-reader", daemon=True),
            threading.Thread(target=self._publish_loop, name="neuroncore-publisher", daemon=True),
            threading.Thread(target=self._watch_compilers, name="compile-watch", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _read(self) -> None:
        assert self._monitor is not None
        assert self._monitor.stdout is not None
        for line in self._monitor.stdout:
            values = neuron.utilization_from_report(line)
            if values is None:
                continue
            sample = sum(values) / len(values) if values else 0.0
            with self._lock:
                self._samples.append(sample)
        if not self._stop.is_set():
            # the idle alarm will see missing data, not an idle host: say why
            log.warning(
                "neuron-monitor exited (status %s): no NeuronCore utilization from now on",
                self._monitor.wait(),
            )

    def sample_compiling(self) -> None:
        compiling = 1.0 if neuron.compiling_processes() else 0.0
        with self._lock:
            self._compiling.append(compiling)

    def _watch_compilers(self) -> None:
        interval = min(self.period, 5.0) / 2
        while not self._stop.is_set():
            self.sample_compiling()
            self._stop.wait(interval)

    def _publish_loop(self) -> None:
        while not self._stop.wait(self.period):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            samples, self._samples = self._samples, []
            compiling, self._compiling = self._compiling, []
        now = datetime.now(UTC)
        data = []
        stats = summarize(samples)
        if stats is not None:
            data.append(metric_datum(self.identity, stats, now))
        compile_stats = summarize(compiling)
        if compile_stats is not None:
            data.append(metric_datum(self.identity, compile_stats, now, NEURON_COMPILING_METRIC, "None"))
        if not data:
            return
        try:
            self.cloudwatch.put_metric_data(Namespace=self.namespace, MetricData=data)
            self.published += 1
        except (BotoCoreError, ClientError) as exc:
            # a metric lost is better than a training job failed
            log.warning("could not publish NeuronCore utilization: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        if self._monitor is not None and self._monitor.poll() is None:
            self._monitor.terminate()
            try:
                self._monitor.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._monitor.kill()
                self._monitor.wait()
        for thread in self._threads:
            thread.join(timeout=5)
        # the last data point is sent on a thread of its own: the wrapper waits for it only so long, since
        # after a stop the upload and the exit still have to fit in the grace
        last = threading.Thread(target=self.flush, name="neuroncore-last-flush", daemon=True)
        last.start()
        last.join(timeout=LAST_FLUSH_SECONDS)
        if last.is_alive():
            log.warning(
                "CloudWatch did not take the last utilization data point in %.0fs; not waiting for it",
                LAST_FLUSH_SECONDS,
            )
        if self._config_dir is not None:
            self._config_dir.cleanup()
