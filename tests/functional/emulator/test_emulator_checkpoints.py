"""Jobs that checkpoint: the emulator puts the job image's marker where SageMaker's sync would, at the
simulated times the job's Environment asks for (docs/adr/0025-checkpoint-reports.md)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import boto3
import pytest

from sagequeue.local import SageMakerEmulator, VirtualClock
from sagequeue_core.checkpoint_marker import CHECKPOINT_MARKER, CheckpointReport

#: provisioning 120 s, download 30 s: training starts 150 s after the create
TIMINGS: dict[str, Any] = {
    "provisioning_seconds": 120,
    "download_seconds": 30,
    "upload_seconds": 10,
    "compile_seconds": 0,
}


@pytest.fixture
def s3(moto_endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")


def _markers(s3: Any, bucket: str, job: str) -> CheckpointReport | None:
    try:
        body = s3.get_object(Bucket=bucket, Key=f"ckpt/{job}/{CHECKPOINT_MARKER}")["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None
    return CheckpointReport.from_marker(body)


def test_a_job_checkpoints_at_its_drifting_interval_and_stops_when_stopped(
    s3: Any, clock: VirtualClock, make_request: Any
) -> None:
    bucket = f"ckpt-{uuid.uuid4().hex[:8]}"  # created by the emulator's first put, as a sync target exists
    name, silent = "drifts", "no-config"
    start = clock.now()
    training = start + timedelta(seconds=150)
    with SageMakerEmulator(clock=clock, cloudwatch_client=None, s3_client=s3, **TIMINGS) as emulator:
        client = emulator.client()
        client.create_training_job(
            **make_request(
                name,
                CheckpointConfig={"S3Uri": f"s3://{bucket}/ckpt/{name}"},
                Environment={
                    "SAGEQUEUE_SIM_DURATION": "7200",
                    "SAGEQUEUE_SIM_CHECKPOINT_SECONDS": "600,600,900",
                },
            )
        )
        client.create_training_job(
            **make_request(
                silent,
                Environment={"SAGEQUEUE_SIM_DURATION": "7200", "SAGEQUEUE_SIM_CHECKPOINT_SECONDS": "60"},
            )
        )
        # WHEN 35 minutes of training pass: checkpoints at 10, 20 and 35 minutes (the interval drifted)
        emulator.advance(150 + 35 * 60)
        marker = _markers(s3, bucket, name)
        assert marker is not None
        assert (marker.training_job_name, marker.count, marker.step) == (name, 3, 35 * 60)
        assert (marker.at, marker.interval_seconds) == (training + timedelta(minutes=35), 900.0)
        # THEN after a stop no more come
        client.stop_training_job(TrainingJobName=name)
        emulator.advance(3600)
        assert _markers(s3, bucket, name) == marker
        # AND a job without CheckpointConfig syncs nothing (no prefix to sync to)
        assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 1


def test_a_lying_image_names_another_training_job(s3: Any, clock: VirtualClock, make_request: Any) -> None:
    bucket = f"ckpt-{uuid.uuid4().hex[:8]}"
    with SageMakerEmulator(clock=clock, s3_client=s3, **TIMINGS) as emulator:
        emulator.client().create_training_job(
            **make_request(
                "liar",
                CheckpointConfig={"S3Uri": f"s3://{bucket}/ckpt/liar"},
                Environment={
                    "SAGEQUEUE_SIM_CHECKPOINT_SECONDS": "300",
                    "SAGEQUEUE_SIM_CHECKPOINT_AS": "victim",
                },
            )
        )
        emulator.advance(150 + 310)
    marker = _markers(s3, bucket, "liar")
    assert marker is not None
    assert (marker.training_job_name, marker.count) == ("victim", 1)
