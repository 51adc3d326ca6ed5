"""Governance tests on real parts: moto's server over HTTP (table, CloudWatch, SNS, SQS) and the
SageMaker emulator on a virtual clock; SageMaker's events are collected and handed to governance by hand."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest

from sagequeue.local import SageMakerEmulator, VirtualClock
from sagequeue.local.emulator import aws_options
from sagequeue_core import runtime
from sagequeue_core.config import Settings
from sagequeue_core.events import RecordingPublisher
from sagequeue_core.service.govern import Governance, governance_from
from sagequeue_core.service.stop_idle import IdleStop, idle_stop_from

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support.cfn_template import create_table

START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
ROLE = "arn:aws:iam::123456789012:role/SageMakerTraining"
TRN1 = "ml.trn1.32xlarge"
TIMINGS: dict[str, Any] = {
    "provisioning_seconds": 120,
    "warm_start_seconds": 10,
    "download_seconds": 30,
    "upload_seconds": 20,
    "default_duration_seconds": 600,
    "capacity_error_after_seconds": 900,
    "spot_interruption_seconds": 60,
}


def unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:6]}"


def training_request(
    name: str,
    *,
    env: dict[str, str] | None = None,
    tags: dict[str, str] | None = None,
    count: int = 1,
    **extra: Any,
) -> dict[str, Any]:
    request: dict[str, Any] = {
        "TrainingJobName": name,
        "RoleArn": ROLE,
        "AlgorithmSpecification": {
            "TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/sagequeue-job:1",
            "TrainingInputMode": "File",
        },
        "OutputDataConfig": {"S3OutputPath": "s3://bucket/output"},
        "ResourceConfig": {"InstanceType": TRN1, "InstanceCount": count, "VolumeSizeInGB": 512},
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
        "CheckpointConfig": {"S3Uri": f"s3://bucket/checkpoints/{name}"},
        "Environment": {"SAGEQUEUE_SIM_DURATION": "3600", **(env or {})},
        "Tags": [{"Key": k, "Value": v} for k, v in (tags if tags is not None else {"team": "nlp"}).items()],
    }
    request.update(extra)
    return request


@dataclass
class World:
    """Everything a governance test touches, over the same clock."""

    clock: VirtualClock
    emulator: SageMakerEmulator
    sagemaker: Any  # boto3 client on the emulator
    cloudwatch: Any
    sqs: Any
    inbox: str  # SQS queue subscribed to the notification topic
    deps: runtime.Dependencies
    publisher: RecordingPublisher
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def governance(self) -> Governance:
        return governance_from(self.deps)

    @property
    def idle_stop(self) -> IdleStop:
        return idle_stop_from(self.deps)

    def advance(self, seconds: float) -> None:
        self.emulator.advance(seconds)

    def take_events(self, name: str | None = None) -> list[dict[str, Any]]:
        self.emulator.deliver_pending()  # late, repeated, reordered: only the wait is cut short
        taken = [e for e in self.events if name is None or e["detail"]["TrainingJobName"] == name]
        self.events[:] = [e for e in self.events if e not in taken]
        return taken

    def govern_pending(self, name: str | None = None) -> list[Any]:
        return [self.governance.on_event(event) for event in self.take_events(name)]

    def status(self, name: str) -> tuple[str, str]:
        job = self.sagemaker.describe_training_job(TrainingJobName=name)
        return job["TrainingJobStatus"], job["SecondaryStatus"]

    def alarm_names(self, prefix: str = "sagequeue-idle-") -> list[str]:
        pages = self.cloudwatch.get_paginator("describe_alarms").paginate(AlarmNamePrefix=prefix)
        return sorted(a["AlarmName"] for page in pages for a in page["MetricAlarms"])

    def notifications(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            messages = self.sqs.receive_message(QueueUrl=self.inbox, MaxNumberOfMessages=10).get(
                "Messages", []
            )
            if not messages:
                return out
            for message in messages:
                out.append(json.loads(message["Body"]))
                self.sqs.delete_message(QueueUrl=self.inbox, ReceiptHandle=message["ReceiptHandle"])


@pytest.fixture
def world_factory(moto_endpoint: str) -> Iterator[Callable[..., World]]:
    made: list[World] = []

    def make(**settings: Any) -> World:
        region = "us-east-1"
        dynamodb = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name=region)
        sns = boto3.client("sns", endpoint_url=moto_endpoint, region_name=region)
        sqs = boto3.client("sqs", endpoint_url=moto_endpoint, region_name=region)
        cloudwatch = boto3.client("cloudwatch", endpoint_url=moto_endpoint, region_name=region)
        table = create_table(dynamodb, unique("sagequeue"))
        alarm_topic = sns.create_topic(Name=unique("idle-alarms"))["TopicArn"]
        notes = sns.create_topic(Name=unique("notes"))["TopicArn"]
        inbox = sqs.create_queue(QueueName=unique("inbox"))["QueueUrl"]
        inbox_arn = sqs.get_queue_attributes(QueueUrl=inbox, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        sns.subscribe(TopicArn=notes, Protocol="sqs", Endpoint=inbox_arn)
        clock = VirtualClock(START)
        world_events: list[dict[str, Any]] = []
        # SageMaker as AWS documents it: 120 s stop grace, events late, repeated and sometimes lost, 5xx
        emulator = SageMakerEmulator(
            **aws_options(
                region_capacity={TRN1: 8},
                clock=clock,
                on_event=world_events.append,
                cloudwatch_client=cloudwatch,
                **TIMINGS,
            )
        ).start()
        values = {
            "table_name": table,
            "required_tags": "team",
            "alarm_topic_arn": alarm_topic,
            "notification_topic_arn": notes,
            "capacity": {TRN1: 8},
            **settings,
        }
        publisher = RecordingPublisher()
        deps = runtime.build(
            Settings.build(**values),
            clock=clock,
            endpoints={
                "dynamodb": moto_endpoint,
                "cloudwatch": moto_endpoint,
                "sns": moto_endpoint,
                "sqs": moto_endpoint,
                "sagemaker": emulator.endpoint_url,
            },
            region=region,
            publisher=publisher,
        )
        world = World(
            clock, emulator, emulator.client(), cloudwatch, sqs, inbox, deps, publisher, world_events
        )
        made.append(world)
        return world

    yield make
    for world in made:
        world.emulator.stop()


@pytest.fixture
def world(world_factory: Callable[..., World]) -> World:
    return world_factory()
