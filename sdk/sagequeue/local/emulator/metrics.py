"""NeuronCore utilization, one datum per host per simulated minute, as the job image publishes it, and the
job image's checkpoint markers, put where SageMaker syncs them.

Namespace, metric name and Host dimension come from sagequeue_core.defaults, the constants the job image
and the idle alarm also use, so an alarm built for real jobs fires on emulated ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from sagequeue_core.checkpoint_marker import CheckpointReport, marker_key
from sagequeue_core.defaults import (
    HOST_DIMENSION,
    NEURON_METRIC_NAMESPACE,
    NEURONCORE_UTILIZATION_METRIC,
    host_dimension_value,
)

#: PutMetricData takes at most this many data per call.
PUT_METRIC_DATA_BATCH = 1000


def utilization_data(
    training_job_name: str, hosts: int, marks: Iterable[datetime], utilization: float
) -> list[dict[str, Any]]:
    """One datum per host per minute mark, at the mark's (simulated) time."""
    data: list[dict[str, Any]] = []
    for mark in marks:
        for host in range(1, hosts + 1):
            data.append(
                {
                    "MetricName": NEURONCORE_UTILIZATION_METRIC,
                    "Dimensions": [
                        {"Name": HOST_DIMENSION, "Value": host_dimension_value(training_job_name, host)}
                    ],
                    "Timestamp": mark,
                    "Value": utilization,
                    "Unit": "Percent",
                }
            )
    return data


class CloudWatchPublisher:
    """Sends utilization data to CloudWatch (moto's, in the embedded stack), batched."""

    def __init__(self, client: Any, namespace: str = NEURON_METRIC_NAMESPACE) -> None:
        self._client = client
        self.namespace = namespace

    def put(self, data: Sequence[dict[str, Any]]) -> None:
        for start in range(0, len(data), PUT_METRIC_DATA_BATCH):
            self._client.put_metric_data(
                Namespace=self.namespace, MetricData=list(data[start : start + PUT_METRIC_DATA_BATCH])
            )


class CheckpointSync:
    """Puts the checkpoint markers jobs write under their CheckpointConfig.S3Uri, as SageMaker's checkpoint
    sync does (S3, moto's in the embedded stack); a bucket that does not exist yet is created."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def put(self, written: Sequence[tuple[str, CheckpointReport]]) -> None:
        for uri, report in written:
            bucket, key = marker_key(uri)
            try:
                self._client.put_object(Bucket=bucket, Key=key, Body=report.to_marker())
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "NoSuchBucket":
                    raise
                self._client.create_bucket(Bucket=bucket)
                self._client.put_object(Bucket=bucket, Key=key, Body=report.to_marker())
