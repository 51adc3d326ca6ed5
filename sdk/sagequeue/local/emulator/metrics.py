"""NeuronCore utilization, one datum per host per simulated minute, as the job image publishes it, and the
job image's checkpoint markers, put where SageMaker syncs them.

Namespace, metric name and Host dimension come from sagequeue_core.defaults, the constants the job image
and the idle alarm also use, so an alarm built for real jobs fires on emulated ones. Like the job image, a
job publishes to the namespace its Environment names (SAGEQUEUE_METRIC_NAMESPACE, which the scheduler sets
to its team's), else to the default one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from sagequeue_core.checkpoint_marker import CheckpointReport, marker_key
from sagequeue_core.defaults import (
    HOST_DIMENSION,
    METRIC_NAMESPACE_ENV,
    NEURON_METRIC_NAMESPACE,
    NEURONCORE_UTILIZATION_METRIC,
    host_dimension_value,
)

#: PutMetricData takes at most this many data per call.
PUT_METRIC_DATA_BATCH = 1000


#: Key of a datum naming the namespace it goes to; the publisher takes it out before PutMetricData.
NAMESPACE_KEY = "Namespace"


def namespace_of(environment: Any) -> str:
    """The namespace a job whose Environment is `environment` publishes to, as the job image chooses it."""
    chosen = environment.get(METRIC_NAMESPACE_ENV) if isinstance(environment, Mapping) else None
    return chosen.strip() if isinstance(chosen, str) and chosen.strip() else NEURON_METRIC_NAMESPACE


def utilization_data(
    training_job_name: str,
    hosts: int,
    marks: Iterable[datetime],
    utilization: float,
    namespace: str = NEURON_METRIC_NAMESPACE,
) -> list[dict[str, Any]]:
    """One datum per host per minute mark, at the mark's (simulated) time, each naming its namespace."""
    data: list[dict[str, Any]] = []
    for mark in marks:
        for host in range(1, hosts + 1):
            data.append(
                {
                    NAMESPACE_KEY: namespace,
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
        by_namespace: dict[str, list[dict[str, Any]]] = {}
        for datum in data:
            fields = {k: v for k, v in datum.items() if k != NAMESPACE_KEY}
            by_namespace.setdefault(str(datum.get(NAMESPACE_KEY) or self.namespace), []).append(fields)
        for namespace, batch in by_namespace.items():
            for start in range(0, len(batch), PUT_METRIC_DATA_BATCH):
                self._client.put_metric_data(
                    Namespace=namespace, MetricData=batch[start : start + PUT_METRIC_DATA_BATCH]
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
