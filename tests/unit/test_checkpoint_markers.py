"""What the scheduler believes of a checkpoint marker, and when it reads one (docs/adr/0025)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sagequeue_core.checkpoint_marker import (
    CHECKPOINT_MARKER,
    MAX_MARKER_BYTES,
    CheckpointReport,
    MarkerError,
    marker_key,
)
from sagequeue_core.checkpoints import (
    CHECKPOINT_READ_MAX_SECONDS,
    CHECKPOINT_READ_MIN_SECONDS,
    CHECKPOINT_READ_UNKNOWN_SECONDS,
    CHECKPOINT_READS_PER_PASS,
    CheckpointRecord,
    believe,
)
from sagequeue_core.domain import Job, JobState
from sagequeue_core.service.checkpoints import due_for_a_read
from sagequeue_core.snapshot import build_snapshot

T0 = datetime(2026, 6, 1, 12, tzinfo=UTC)
TRAINING = T0 + timedelta(minutes=10)


def _report(**kw: object) -> CheckpointReport:
    values: dict[str, object] = {
        "training_job_name": "victim",
        "at": TRAINING + timedelta(minutes=30),
        "step": 300,
    }
    values.update(kw)
    return CheckpointReport(**values)  # type: ignore[arg-type]


def test_a_marker_round_trips_and_names_its_attempt() -> None:
    report = _report(count=3, interval_seconds=1800.0, source="watched")
    assert CheckpointReport.from_marker(report.to_marker()) == report


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"\xff", "not JSON"),
        (b"[]", "not a JSON object"),
        (json.dumps({"version": 2}).encode(), "version"),
        (json.dumps({"version": 1, "at": "2026-06-01T12:00:00+00:00"}).encode(), "names no training job"),
        (
            json.dumps({"version": 1, "training_job_name": "j", "at": "2026-06-01T12:00:00"}).encode(),
            "time zone",
        ),
        (json.dumps({"version": 1, "training_job_name": "j", "at": "yesterday"}).encode(), "ISO 8601"),
        (
            json.dumps(
                {"version": 1, "training_job_name": "j", "at": "2026-06-01T12:00:00Z", "step": -1}
            ).encode(),
            "step",
        ),
        (
            json.dumps(
                {"version": 1, "training_job_name": "j", "at": "2026-06-01T12:00:00Z", "interval_seconds": 0}
            ).encode(),
            "interval_seconds",
        ),
        (b" " * (MAX_MARKER_BYTES + 1), "bytes"),
        # times and numbers at the edge of what Python can hold: refused, never an OverflowError that
        # would end the pass for every job
        (
            json.dumps({"version": 1, "training_job_name": "j", "at": "0001-01-01T00:00:00+01:00"}).encode(),
            "at",
        ),
        (
            json.dumps({"version": 1, "training_job_name": "j", "at": "9999-12-31T23:59:59-01:00"}).encode(),
            "at",
        ),
        (
            json.dumps({"version": 1, "training_job_name": "j", "at": "1970-01-01T00:00:00Z"}).encode(),
            "years",
        ),
        (
            b'{"version":1,"training_job_name":"j","at":"2026-06-01T12:00:00Z","interval_seconds":1'
            + b"0" * 400
            + b"}",
            "interval_seconds",
        ),
        (
            json.dumps(
                {"version": 1, "training_job_name": "j", "at": "2026-06-01T12:00:00Z", "step": 2**64}
            ).encode(),
            "step",
        ),
        (
            json.dumps(
                {"version": 1, "training_job_name": "j", "at": "2026-06-01T12:00:00Z", "count": 2**64}
            ).encode(),
            "count",
        ),
    ],
)
def test_what_is_not_a_marker_is_refused_naming_the_problem(body: bytes, problem: str) -> None:
    with pytest.raises(MarkerError, match=problem):
        CheckpointReport.from_marker(body)


def test_the_marker_sits_under_the_checkpoint_prefix() -> None:
    assert marker_key("s3://b/checkpoints/j1/") == ("b", f"checkpoints/j1/{CHECKPOINT_MARKER}")
    assert marker_key("s3://b") == ("b", CHECKPOINT_MARKER)
    with pytest.raises(ValueError, match="s3://"):
        marker_key("https://b/x")


def test_a_marker_naming_another_training_job_changes_nothing() -> None:
    # GIVEN the victim's record with a checkpoint 40 minutes old
    record = CheckpointRecord("victim", at=TRAINING, count=1)
    # WHEN a marker under its prefix names another training job (another tenant's, or a forgery)
    after = believe(
        record,
        _report(training_job_name="other"),
        training_started_at=TRAINING,
        read_at=T0 + timedelta(hours=1),
    )
    # THEN the record keeps its checkpoint and says why it did not believe it
    assert (after.at, after.count, after.step) == (record.at, record.count, record.step)
    assert after.refused == "the marker names training job other"


def test_a_checkpoint_from_before_the_attempt_trained_is_not_its() -> None:
    record = CheckpointRecord("victim")
    stale = _report(at=TRAINING - timedelta(minutes=5))
    after = believe(record, stale, training_started_at=TRAINING, read_at=TRAINING + timedelta(minutes=1))
    assert after.at is None
    assert after.refused is not None


def test_a_checkpoint_in_the_future_counts_from_when_it_was_read() -> None:
    read_at = TRAINING + timedelta(minutes=20)
    after = believe(
        CheckpointRecord("victim"),
        _report(at=read_at + timedelta(hours=5)),
        training_started_at=TRAINING,
        read_at=read_at,
    )
    assert after.at == read_at


def test_an_older_marker_never_moves_the_checkpoint_back() -> None:
    record = CheckpointRecord("victim", at=TRAINING + timedelta(minutes=30), step=300, count=2)
    older = _report(at=TRAINING + timedelta(minutes=15), step=150)
    after = believe(record, older, training_started_at=TRAINING, read_at=TRAINING + timedelta(hours=1))
    assert (after.at, after.step) == (record.at, 300)


@settings(max_examples=200, deadline=None)
@given(
    at=st.integers(min_value=-7200, max_value=7200),
    read=st.integers(min_value=0, max_value=7200),
    named=st.sampled_from(["victim", "other", "victim--2"]),
)
def test_a_read_never_makes_a_checkpoint_later_than_the_read_or_of_another_attempt(
    at: int, read: int, named: str
) -> None:
    record = CheckpointRecord("victim", at=TRAINING + timedelta(seconds=60), count=1)
    read_at = TRAINING + timedelta(seconds=read)
    after = believe(
        record,
        _report(training_job_name=named, at=TRAINING + timedelta(seconds=at)),
        training_started_at=TRAINING,
        read_at=read_at,
    )
    assert after.at is not None
    assert after.at <= max(read_at, record.at)  # type: ignore[type-var]
    if named != "victim":
        assert after.at == record.at


def test_reads_wait_for_the_next_checkpoint_within_bounds() -> None:
    checked = TRAINING + timedelta(minutes=31)
    # no interval known yet: every few minutes
    assert CheckpointRecord("j", checked_at=checked).next_read() == checked + timedelta(
        seconds=CHECKPOINT_READ_UNKNOWN_SECONDS
    )
    # the next checkpoint is due in 29 minutes: not before it (at most the longest gap)
    record = CheckpointRecord(
        "j", at=TRAINING + timedelta(minutes=30), interval_seconds=1800, checked_at=checked
    )
    assert record.next_read() == checked + timedelta(seconds=CHECKPOINT_READ_MAX_SECONDS)
    short = CheckpointRecord(
        "j", at=TRAINING + timedelta(minutes=30), interval_seconds=300, checked_at=checked
    )
    assert short.next_read() == TRAINING + timedelta(minutes=35)
    # due: once a minute while it is expected
    due = CheckpointRecord("j", at=TRAINING + timedelta(minutes=28), interval_seconds=180, checked_at=checked)
    assert due.next_read() == checked + timedelta(seconds=CHECKPOINT_READ_MIN_SECONDS)
    # late by more than another interval: back to the longest gap
    late = CheckpointRecord("j", at=TRAINING, interval_seconds=300, checked_at=checked)
    assert late.next_read() == checked + timedelta(seconds=CHECKPOINT_READ_MAX_SECONDS)
    # a record round-trips through the table's JSON
    assert CheckpointRecord.from_dict(json.loads(json.dumps(short.to_dict()))) == short


def _running(
    name: str,
    *,
    checkpoint: CheckpointRecord | None = None,
    config: bool = True,
    state: JobState = JobState.RUNNING,
) -> Job:
    request: dict[str, object] = {"ResourceConfig": {"InstanceType": "ml.trn1.32xlarge", "InstanceCount": 1}}
    if config:
        request["CheckpointConfig"] = {"S3Uri": f"s3://b/{name}"}
    return Job(
        name=name,
        request=request,
        priority=5,
        owner="arn:aws:iam::1:role/u",
        submitted_at=T0,
        state=state,
        attempt=1,
        training_job_name=name,
        started_at=T0,
        training_started_at=TRAINING,
        checkpoint=checkpoint,
    )


def test_a_pass_reads_only_what_is_due_and_at_most_its_bound_longest_unread_first() -> None:
    now = TRAINING + timedelta(hours=1)
    jobs = [
        _running(
            f"j{i:03d}", checkpoint=CheckpointRecord(f"j{i:03d}", checked_at=now - timedelta(seconds=300 + i))
        )
        for i in range(CHECKPOINT_READS_PER_PASS + 10)
    ]
    fresh = _running("fresh", checkpoint=CheckpointRecord("fresh", checked_at=now - timedelta(seconds=5)))
    no_config = _running("no-config", config=False)
    starting = _running("starting", state=JobState.STARTING)
    due = due_for_a_read([fresh, no_config, starting, *jobs], now)
    assert len(due) == CHECKPOINT_READS_PER_PASS
    assert [j.name for j in due] == [f"j{i:03d}" for i in range(CHECKPOINT_READS_PER_PASS + 9, 9, -1)]


def test_the_snapshot_carries_the_current_attempts_checkpoint_only() -> None:
    at = TRAINING + timedelta(minutes=30)
    current = _running("a", checkpoint=CheckpointRecord("a", at=at, interval_seconds=1800, count=2))
    # a record of the previous attempt (a stored job read before a start cleared it) says nothing
    resumed = _running("b", checkpoint=CheckpointRecord("b-previous", at=at, interval_seconds=600, count=4))
    snapshot = build_snapshot(now=at, capacity={"ml.trn1.32xlarge": 2}, queued=[], live=[current, resumed])
    by_name = {r.job_name: r for r in snapshot.running}
    assert (by_name["a"].last_checkpoint_at, by_name["a"].checkpoint_interval_seconds) == (at, 1800)
    assert (by_name["b"].last_checkpoint_at, by_name["b"].checkpoint_interval_seconds) == (None, None)
    assert current.to_api()["checkpoint"] == {
        "at": at.isoformat(),
        "step": None,
        "count": 2,
        "interval_seconds": 1800,
    }
    assert resumed.to_api()["checkpoint"] is None
