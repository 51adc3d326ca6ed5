"""Events (to a subscriber and to moto's EventBridge) and NeuronCore utilization (to moto's CloudWatch)."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import datetime, timedelta
from typing import Any

import boto3
import pytest

from sagequeue.local import SageMakerEmulator, VirtualClock
from sagequeue_core.defaults import (
    HOST_DIMENSION,
    NEURON_METRIC_NAMESPACE,
    NEURONCORE_UTILIZATION_METRIC,
    SAGEMAKER_EVENT_SOURCE,
    TRAINING_JOB_STATE_CHANGE,
    host_dimension_value,
)

TIMINGS: dict[str, Any] = {
    "provisioning_seconds": 120,
    "download_seconds": 30,
    "upload_seconds": 20,
    "stop_grace_seconds": 30,
}


def millis(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def moto_client(service: str, endpoint: str) -> Any:
    return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1")


def test_every_change_is_one_event_in_order_with_the_real_envelope(
    clock: VirtualClock, make_request: Any, events: list[Any]
) -> None:
    # exactly_once_in_order: this checks each change's envelope and timing; harsh delivery is tested below
    emulator = SageMakerEmulator(clock=clock, on_event=events.append, exactly_once_in_order=True, **TIMINGS)
    emulator.start()
    sagemaker = emulator.client()
    created = clock.now()
    sagemaker.create_training_job(**make_request("evented", ResourceConfig={"KeepAlivePeriodInSeconds": 60}))
    assert len(events) == 1, "the InProgress/Starting event is delivered before CreateTrainingJob answers"
    emulator.advance(5000)

    assert [(e["detail"]["TrainingJobStatus"], e["detail"]["SecondaryStatus"]) for e in events] == [
        ("InProgress", "Starting"),
        ("InProgress", "Downloading"),
        ("InProgress", "Training"),
        ("InProgress", "Uploading"),
        ("Completed", "Completed"),
    ]
    offsets = [0, 120, 150, 750, 770]
    for event, offset in zip(events, offsets, strict=True):
        at = created + timedelta(seconds=offset)
        assert event["version"] == "0"
        uuid.UUID(event["id"])
        assert event["source"] == SAGEMAKER_EVENT_SOURCE
        assert event["detail-type"] == TRAINING_JOB_STATE_CHANGE
        assert event["account"] == "123456789012"
        assert event["region"] == "us-east-1"
        assert event["time"] == at.strftime("%Y-%m-%dT%H:%M:%SZ")
        assert event["resources"] == ["arn:aws:sagemaker:us-east-1:123456789012:training-job/evented"]
        assert event["detail"]["LastModifiedTime"] == millis(at)
        assert event["detail"]["Tags"] == {"team": "nlp"}
    assert len({e["id"] for e in events}) == len(events)

    last = events[-1]["detail"]
    described = sagemaker.describe_training_job(TrainingJobName="evented")
    # The detail mirrors DescribeTrainingJob, with times as epoch milliseconds.
    assert last["CreationTime"] == millis(described["CreationTime"])
    assert last["TrainingStartTime"] == millis(described["TrainingStartTime"])
    assert last["TrainingEndTime"] == millis(described["TrainingEndTime"])
    assert isinstance(last["CreationTime"], int)
    assert last["SecondaryStatusTransitions"] == [
        {**t, "StartTime": millis(t["StartTime"]), "EndTime": millis(t["EndTime"])}
        for t in described["SecondaryStatusTransitions"]
    ]
    for key in ("ResourceConfig", "RoleArn", "StoppingCondition", "HyperParameters", "TrainingJobArn"):
        assert last[key] == described[key]
    assert last["WarmPoolStatus"] == {"Status": "Available", "ResourceRetainedBillableTimeInSeconds": 0}
    assert last["BillableTimeInSeconds"] == described["BillableTimeInSeconds"]
    emulator.stop()


def test_failed_events_carry_the_failure_reason(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any, events: list[Any]
) -> None:
    sagemaker.create_training_job(
        **make_request("fails", Environment={"SAGEQUEUE_SIM_OUTCOME": "Failed:ClientError: bad input"})
    )
    emulator.advance(5000)
    assert events[-1]["detail"]["TrainingJobStatus"] == "Failed"
    assert events[-1]["detail"]["FailureReason"] == "ClientError: bad input"


def test_a_subscriber_may_call_the_emulator_back_and_sees_the_clock_at_the_event_time(
    clock: VirtualClock, make_request: Any
) -> None:
    # GIVEN a subscriber that, like a scheduler, queries and creates jobs when one completes
    seen: list[tuple[str, str, datetime, str]] = []
    holder: dict[str, Any] = {}

    def scheduler(event: dict[str, Any]) -> None:
        detail = event["detail"]
        client = holder["client"]
        described = client.describe_training_job(TrainingJobName=detail["TrainingJobName"])
        seen.append(
            (detail["TrainingJobName"], detail["SecondaryStatus"], clock.now(), described["SecondaryStatus"])
        )
        if detail["TrainingJobStatus"] == "Completed" and detail["TrainingJobName"] == "first":
            client.create_training_job(**make_request("second"))

    # exactly_once_in_order: checks that callbacks see the clock at each change's own time
    with SageMakerEmulator(
        clock=clock, on_event=scheduler, exactly_once_in_order=True, **TIMINGS
    ) as emulator:
        holder["client"] = emulator.client()
        start = clock.now()
        holder["client"].create_training_job(**make_request("first"))
        emulator.advance(2000)

    # THEN each event was handled with the clock at its own time, and the job created from a callback ran too
    assert [(name, status) for name, status, _, _ in seen] == [
        ("first", "Starting"),
        ("first", "Downloading"),
        ("first", "Training"),
        ("first", "Uploading"),
        ("first", "Completed"),
        ("second", "Starting"),
        ("second", "Downloading"),
        ("second", "Training"),
        ("second", "Uploading"),
        ("second", "Completed"),
    ]
    offsets = [0, 120, 150, 750, 770, 770, 890, 920, 1520, 1540]
    assert [at - start for _, _, at, _ in seen] == [timedelta(seconds=s) for s in offsets]
    assert all(event_status == described for _, event_status, _, described in seen)


def test_a_failing_subscriber_does_not_break_the_request_that_caused_the_event(
    clock: VirtualClock, make_request: Any
) -> None:
    def broken(event: dict[str, Any]) -> None:
        raise RuntimeError("subscriber bug")

    with SageMakerEmulator(clock=clock, on_event=broken, **TIMINGS) as emulator:
        client = emulator.client()
        client.create_training_job(**make_request("survives"))
        assert client.describe_training_job(TrainingJobName="survives")["TrainingJobStatus"] == "InProgress"
        with pytest.raises(RuntimeError, match="subscriber bug"):
            emulator.advance(200)


@pytest.fixture
def event_queue(moto_endpoint: str) -> tuple[Any, str, str]:
    """A custom bus on moto with a rule that sends SageMaker state changes to an SQS queue."""
    events_client = moto_client("events", moto_endpoint)
    sqs = moto_client("sqs", moto_endpoint)
    suffix = uuid.uuid4().hex[:8]
    bus = f"sagemaker-{suffix}"
    events_client.create_event_bus(Name=bus)
    queue_url = sqs.create_queue(QueueName=f"state-changes-{suffix}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    pattern = {"source": [SAGEMAKER_EVENT_SOURCE], "detail-type": [TRAINING_JOB_STATE_CHANGE]}
    events_client.put_rule(Name=f"to-queue-{suffix}", EventBusName=bus, EventPattern=json.dumps(pattern))
    events_client.put_targets(
        Rule=f"to-queue-{suffix}", EventBusName=bus, Targets=[{"Id": "q", "Arn": queue_arn}]
    )
    return events_client, bus, queue_url


def drain(sqs: Any, queue_url: str, expected: int) -> list[dict[str, Any]]:
    bodies: list[dict[str, Any]] = []
    for _ in range(20):
        answer = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0)
        for message in answer.get("Messages", []):
            bodies.append(json.loads(message["Body"]))
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
        if len(bodies) >= expected:
            break
    return bodies


def test_events_reach_an_eventbridge_bus_and_its_rules(
    moto_endpoint: str, event_queue: tuple[Any, str, str], clock: VirtualClock, make_request: Any
) -> None:
    events_client, bus, queue_url = event_queue
    with SageMakerEmulator(
        clock=clock, events_client=events_client, event_bus_name=bus, **TIMINGS
    ) as emulator:
        emulator.client().create_training_job(**make_request("to-bus"))
        emulator.advance(2000)

    delivered = emulator.event_log
    bodies = drain(moto_client("sqs", moto_endpoint), queue_url, expected=len(delivered))
    assert len(bodies) == len(delivered) >= 5, "every delivered copy reaches the bus"
    assert sorted({b["detail"]["SecondaryStatus"] for b in bodies}) == sorted(
        ["Starting", "Downloading", "Training", "Uploading", "Completed"]
    )
    completed = next(b for b in bodies if b["detail"]["SecondaryStatus"] == "Completed")
    assert completed["source"] == SAGEMAKER_EVENT_SOURCE
    assert completed["detail-type"] == TRAINING_JOB_STATE_CHANGE
    assert completed["resources"] == ["arn:aws:sagemaker:us-east-1:123456789012:training-job/to-bus"]
    assert completed["detail"]["Tags"] == {"team": "nlp"}
    assert completed["time"] == (clock.now() - timedelta(seconds=2000 - 770)).strftime("%Y-%m-%dT%H:%M:%SZ")


def utilization(cloudwatch: Any, job: str, host: int, start: datetime, end: datetime) -> list[dict[str, Any]]:
    answer = cloudwatch.get_metric_statistics(
        Namespace=NEURON_METRIC_NAMESPACE,
        MetricName=NEURONCORE_UTILIZATION_METRIC,
        Dimensions=[{"Name": HOST_DIMENSION, "Value": host_dimension_value(job, host)}],
        StartTime=start,
        EndTime=end,
        Period=60,
        Statistics=["Average", "SampleCount"],
    )
    return sorted(answer["Datapoints"], key=lambda d: d["Timestamp"])


def test_each_host_publishes_utilization_every_simulated_minute_while_training(
    moto_endpoint: str, clock: VirtualClock, make_request: Any
) -> None:
    cloudwatch = moto_client("cloudwatch", moto_endpoint)
    suffix = uuid.uuid4().hex[:6]
    busy, idle = f"busy-{suffix}", f"idle-{suffix}"
    start = clock.now()
    with SageMakerEmulator(clock=clock, cloudwatch_client=cloudwatch, **TIMINGS) as emulator:
        client = emulator.client()
        client.create_training_job(
            **make_request(
                busy,
                ResourceConfig={"InstanceCount": 2},
                Environment={"SAGEQUEUE_SIM_DURATION": "300", "SAGEQUEUE_SIM_UTILIZATION": "91.5"},
            )
        )
        client.create_training_job(
            **make_request(
                idle, Environment={"SAGEQUEUE_SIM_DURATION": "180", "SAGEQUEUE_SIM_OUTCOME": "Idle"}
            )
        )
        # Advance in uneven steps, so minute marks fall inside steps and on their edges.
        for step in (100, 70, 33, 200, 1000):
            emulator.advance(step)

    training_start = start + timedelta(seconds=150)
    window = (start, start + timedelta(hours=1))
    for host in (1, 2):
        points = utilization(cloudwatch, busy, host, *window)
        assert [p["Timestamp"] - training_start for p in points] == [
            timedelta(minutes=m) for m in range(1, 6)
        ]
        # the first two minutes compile (compile_seconds 120 by default): the NeuronCores sit idle
        assert [p["Average"] for p in points] == [0.0, 0.0, 91.5, 91.5, 91.5]
        assert all(p["SampleCount"] == 1 for p in points)
    assert utilization(cloudwatch, busy, 3, *window) == []
    idle_points = utilization(cloudwatch, idle, 1, *window)
    assert len(idle_points) == 3
    assert all(p["Average"] == 0 for p in idle_points)


def test_one_long_advance_publishes_a_datum_for_every_minute_crossed(
    moto_endpoint: str, clock: VirtualClock, make_request: Any
) -> None:
    cloudwatch = moto_client("cloudwatch", moto_endpoint)
    name = f"long-{uuid.uuid4().hex[:6]}"
    start = clock.now()
    with SageMakerEmulator(clock=clock, cloudwatch_client=cloudwatch, **TIMINGS) as emulator:
        emulator.client().create_training_job(
            **make_request(
                name, Environment={"SAGEQUEUE_SIM_DURATION": "1800", "SAGEQUEUE_SIM_COMPILE_SECONDS": "600"}
            )
        )
        emulator.advance(2 * 3600)
    points = utilization(cloudwatch, name, 1, start, start + timedelta(hours=3))
    assert len(points) == 30
    assert [p["Average"] for p in points[:10]] == [0.0] * 10, "a NEFF-cache miss: ten minutes of compile"
    assert all(p["Average"] == 85.0 for p in points[10:]), "SAGEQUEUE_SIM_UTILIZATION defaults to 85"


def test_a_stopped_job_stops_publishing(moto_endpoint: str, clock: VirtualClock, make_request: Any) -> None:
    cloudwatch = moto_client("cloudwatch", moto_endpoint)
    name = f"stopped-{uuid.uuid4().hex[:6]}"
    start = clock.now()
    with SageMakerEmulator(clock=clock, cloudwatch_client=cloudwatch, **TIMINGS) as emulator:
        client = emulator.client()
        client.create_training_job(**make_request(name))
        emulator.advance(150 + 150)  # two and a half minutes of training
        client.stop_training_job(TrainingJobName=name)
        emulator.advance(3600)
    assert len(utilization(cloudwatch, name, 1, start, start + timedelta(hours=2))) == 2


def test_concurrent_requests_and_advances_deliver_each_event_once(
    clock: VirtualClock, make_request: Any
) -> None:
    received: list[dict[str, Any]] = []
    lock = threading.Lock()

    def collect(event: dict[str, Any]) -> None:
        with lock:
            received.append(event)

    # exactly_once_in_order: checks that concurrent requests and advances lose and double nothing themselves
    with SageMakerEmulator(clock=clock, on_event=collect, exactly_once_in_order=True, **TIMINGS) as emulator:

        def submitter(index: int) -> None:
            client = emulator.client()
            for n in range(10):
                client.create_training_job(
                    **make_request(f"c{index}-{n}", Environment={"SAGEQUEUE_SIM_DURATION": "60"})
                )

        threads = [threading.Thread(target=submitter, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for _ in range(40):
            emulator.advance(10)
        for thread in threads:
            thread.join(timeout=30)
        emulator.advance(3600)

    ids = [e["id"] for e in received]
    assert len(ids) == len(set(ids))
    per_job: dict[str, list[str]] = {}
    for event in received:
        per_job.setdefault(event["detail"]["TrainingJobName"], []).append(event["detail"]["SecondaryStatus"])
    assert len(per_job) == 40
    assert all(
        statuses == ["Starting", "Downloading", "Training", "Uploading", "Completed"]
        for statuses in per_job.values()
    )


def test_duplicate_events_sends_each_change_twice_with_distinct_ids(
    clock: VirtualClock, make_request: Any
) -> None:
    received: list[dict[str, Any]] = []
    # exactly_once_in_order: the legacy duplicate_events switch alone, without EventBridge's own copies
    with SageMakerEmulator(
        clock=clock, on_event=received.append, duplicate_events=True, exactly_once_in_order=True, **TIMINGS
    ) as emulator:
        emulator.client().create_training_job(**make_request("twice"))
        emulator.advance(2000)
    statuses = [e["detail"]["SecondaryStatus"] for e in received]
    assert statuses == [
        s for s in ["Starting", "Downloading", "Training", "Uploading", "Completed"] for _ in (1, 2)
    ]
    for first, second in zip(received[::2], received[1::2], strict=True):
        assert first["id"] != second["id"]
        assert first["detail"] == second["detail"]
        assert first["detail"] is not second["detail"]
