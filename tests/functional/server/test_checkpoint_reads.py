"""The scheduler learns running attempts' checkpoints from their own checkpoint prefix (docs/adr/0025), on
the real handlers, moto's S3 and the SageMaker emulator. The markers are put where SageMaker's sync puts
them, by the test acting as the job image (or as a hostile tenant)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import boto3
import pytest
from conftest import QueueWorld, make_world

from sagequeue_core.checkpoint_marker import CheckpointReport, marker_key
from sagequeue_core.policy import Preempt
from sagequeue_core.service import schedule

BUCKET = "sagequeue-test"


@pytest.fixture
def world(moto_endpoint: str) -> Any:
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    for each in make_world(moto_endpoint):
        each.s3 = s3  # type: ignore[attr-defined]
        yield each


def _put_marker(world: QueueWorld, job: str, report: CheckpointReport) -> None:
    """What SageMaker's sync puts under the job's CheckpointConfig.S3Uri after the image writes the marker."""
    bucket, key = marker_key(f"s3://{BUCKET}/checkpoints/{job}")
    world.s3.put_object(Bucket=bucket, Key=key, Body=report.to_marker())  # type: ignore[attr-defined]


def _running(world: QueueWorld, *names: str) -> None:
    for name in names:
        world.submit(name, priority=1, duration=6 * 3600)
    world.run_until(lambda: all(world.state(n) == "running" for n in names), limit=1800)


def test_a_running_jobs_checkpoint_is_read_from_its_prefix_and_shown(world: QueueWorld) -> None:
    # GIVEN a running job whose image has written its second checkpoint 30 minutes after its first
    _running(world, "ck")
    now = world.clock.now()
    first = CheckpointReport("ck", now - timedelta(minutes=1), step=100)
    _put_marker(world, "ck", first.following(now, 200, "script"))
    # WHEN a pass runs
    world.run(60)
    # THEN GET /jobs/{name} gives its last checkpoint, step and interval
    checkpoint = world.job("ck")["checkpoint"]
    assert checkpoint == {"at": now.isoformat(), "step": 200, "count": 2, "interval_seconds": 60.0}
    # AND the list answers the same
    status, listed = world.api("GET", "/jobs", query={"state": "running"})
    assert status == 200
    assert [j["checkpoint"] for j in listed["jobs"] if j["name"] == "ck"] == [checkpoint]


def test_an_unchanged_marker_is_not_read_again_and_reads_stay_bounded(world: QueueWorld) -> None:
    # GIVEN a running job that checkpoints every 30 minutes
    _running(world, "ck")
    report = CheckpointReport("ck", world.clock.now(), step=1, interval_seconds=1800.0, count=2)
    _put_marker(world, "ck", report)
    calls: list[str] = []

    def note(params: dict[str, Any], **_: Any) -> None:
        calls.append(params.get("headers", {}).get("If-None-Match", ""))

    world.deps.client("s3").meta.events.register("before-call.s3.GetObject", note)
    passes = len(world.reports)
    # WHEN an hour of passes (one a minute, plus every event's) goes by, a checkpoint on time at 30 minutes
    world.run(1800)
    _put_marker(world, "ck", report.following(world.clock.now(), 2, "script"))
    world.run(1800)
    # THEN the marker was read about once per 10 minutes and when a checkpoint was due, not once per pass,
    # each time with the ETag it read last; and the checkpoint on time was seen
    assert len(world.reports) - passes >= 60
    assert 5 <= len(calls) <= 12, calls
    assert all(calls[1:])
    assert world.job("ck")["checkpoint"]["count"] == 3


def test_a_marker_naming_another_attempt_changes_nothing(world: QueueWorld) -> None:
    # GIVEN two tenants' running jobs; the victim checkpointed 20 minutes into its training
    _running(world, "victim", "hostile")
    now = world.clock.now()
    _put_marker(world, "victim", CheckpointReport("victim", now, step=10))
    world.run(60)
    before = world.job("victim")["checkpoint"]
    assert before is not None
    # WHEN the hostile job's image writes markers naming the victim's attempt, fresh and then stale, into
    # its own prefix (the only one it writes), for an hour
    for minutes in range(0, 60, 5):
        at = world.clock.now() - timedelta(hours=5 * (minutes % 2))
        _put_marker(world, "hostile", CheckpointReport("victim", at, step=10_000 + minutes))
        world.run(300)
    # THEN the victim's checkpoint is what its own prefix says, and the hostile job has none
    assert world.job("victim")["checkpoint"] == before
    assert world.job("hostile")["checkpoint"] is None
    stored = world.deps.store.get_job("hostile").checkpoint
    assert stored is not None
    assert stored.refused == "the marker names training job victim"


@pytest.mark.parametrize(
    "at",
    ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"],
    ids=["before-datetime-min", "after-datetime-max"],
)
def test_a_marker_at_the_edge_of_time_stops_no_pass_for_anyone(world: QueueWorld, at: str) -> None:
    # GIVEN two tenants' running jobs, the victim's checkpoint read
    _running(world, "victim", "hostile")
    _put_marker(world, "victim", CheckpointReport("victim", world.clock.now(), step=10))
    world.run(60)
    assert world.job("victim")["checkpoint"] is not None
    # WHEN the hostile job's image writes a marker of its own whose time overflows when read
    body = {"version": 1, "training_job_name": "hostile", "at": at, "step": 1}
    bucket, key = marker_key(f"s3://{BUCKET}/checkpoints/hostile")
    world.s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(body).encode())  # type: ignore[attr-defined]
    world.run(300)
    # THEN passes go on for everyone: a job submitted after it starts on the capacity a job frees
    world.submit("later", priority=9, duration=600)
    world.run_until(lambda: world.state("later") == "running", limit=1800)
    # AND the marker is refused, naming why, and the hostile job has no checkpoint
    stored = world.deps.store.get_job("hostile").checkpoint
    assert stored is not None
    assert stored.refused is not None
    assert "at" in stored.refused
    assert world.job("hostile")["checkpoint"] is None


def test_a_preemption_records_the_work_it_throws_away(world: QueueWorld) -> None:
    _running(world, "victim")
    job = world.deps.store.get_job("victim")
    assert job.training_job_name is not None
    world.audit()
    # WHEN the pass carries out a preemption that loses 25 minutes of training
    action = Preempt("victim", job.training_job_name, for_job="urgent", work_lost_seconds=1500.4)
    schedule._preempt(world.deps, action, schedule.PassReport())
    # THEN the event and the job's history say so
    preempted = [detail for kind, detail in world.audit() if kind == "JobPreempted"]
    assert [(d["name"], d["work_lost_seconds"]) for d in preempted] == [("victim", 1500)]
    history = world.job("victim")["history"]
    assert history[-1]["state"] == "preempting"
    assert history[-1]["work_lost_seconds"] == 1500
    assert history[-1]["reason"] == "preempted for urgent; loses 25m of training since its last checkpoint"


def test_a_new_attempt_counts_from_its_own_training_not_its_predecessors_checkpoint(
    world: QueueWorld,
) -> None:
    # GIVEN a job that checkpointed, then was preempted and resumed as attempt 2
    _running(world, "resumed")
    _put_marker(world, "resumed", CheckpointReport("resumed", world.clock.now(), step=50))
    world.run(60)
    assert world.job("resumed")["checkpoint"] is not None
    job = world.deps.store.get_job("resumed")
    assert job.training_job_name is not None
    schedule._preempt(world.deps, Preempt("resumed", job.training_job_name, "x"), schedule.PassReport())
    world.run_until(
        lambda: world.job("resumed")["attempt"] == 2 and world.state("resumed") == "running", limit=3600
    )
    # WHEN the resumed attempt has written nothing yet (its prefix still holds attempt 1's marker)
    world.run(300)
    # THEN it has no checkpoint of its own
    assert world.job("resumed")["checkpoint"] is None
    # AND once it writes one, that one counts
    _put_marker(world, "resumed", CheckpointReport("resumed--2", world.clock.now(), step=60))
    world.run(120)
    assert world.job("resumed")["checkpoint"]["step"] == 60
    assert json.dumps(world.job("resumed")["checkpoint"])  # the API answer is JSON
