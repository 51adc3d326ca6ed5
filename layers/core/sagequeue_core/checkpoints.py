"""What the scheduler knows of a live attempt's checkpoints, and how it learns it (docs/adr/0025).

Writer of the input: the marker object under the job's own `CheckpointConfig.S3Uri`, which the job's
owner chose at submission. Whoever can write there (the job's execution role, through SageMaker's
checkpoint sync, or anyone the bucket lets write) can already overwrite or delete the checkpoint itself,
so reading it gives nobody a power they did not have. A marker is believed only for the attempt it names,
at the prefix of the job that attempt belongs to: a marker naming another training job (another tenant's
attempt, or this job's previous attempt, which SageMaker downloaded and synced back) changes nothing; a time
later than the read is taken as the read's time, one before the attempt began to train is not believed.

Pure: no AWS (`sagequeue_core.markers` reads the marker from S3). The reads are bounded: one GetObject of one key (no listing), with the ETag of the last read so an
unchanged marker costs a 304; an attempt is read at most once per `CHECKPOINT_READ_MIN_SECONDS` (and that
often only while a checkpoint is due), every `CHECKPOINT_READ_UNKNOWN_SECONDS` while its interval is not
known, not again before its next checkpoint is due (at most `CHECKPOINT_READ_MAX_SECONDS` later), and a
pass reads at most `CHECKPOINT_READS_PER_PASS` attempts, the longest unread first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sagequeue_core.checkpoint_marker import CheckpointReport

#: An attempt's marker is read at most this often.
CHECKPOINT_READ_MIN_SECONDS = 60
#: ... and at least this often while it trains, even when its next checkpoint is not due yet.
CHECKPOINT_READ_MAX_SECONDS = 600
#: How often an attempt whose interval is not known yet (fewer than two checkpoints seen) is read: a first
#: checkpoint seen late only makes the attempt look as if it would lose more than it would.
CHECKPOINT_READ_UNKNOWN_SECONDS = 300
#: Markers one pass reads at most; the rest wait for the next pass, longest unread first.
CHECKPOINT_READS_PER_PASS = 25
#: A marker may say its checkpoint was complete this long before SageMaker's TrainingStartTime (clocks of
#: the instance and of SageMaker differ a little); earlier, it is not this attempt's.
CLOCK_SKEW_SECONDS = 60


@dataclass(frozen=True)
class CheckpointRecord:
    """The last checkpoint of one attempt, kept with its queue entry (the table's job item)."""

    #: the attempt the record is about; a record of another attempt says nothing of the current one
    training_job_name: str
    #: when its last checkpoint was complete; None: none seen yet
    at: datetime | None = None
    step: int | None = None
    count: int = 0
    #: seconds between its checkpoints, as the attempt observed them (the latest gap); None: fewer than two
    interval_seconds: float | None = None
    #: when the scheduler last read the marker, and the ETag it read (a 304 next time if unchanged)
    checked_at: datetime | None = None
    etag: str | None = None
    #: why the last marker read was not believed (None: it was, or there was none)
    refused: str | None = None

    def next_read(self) -> datetime | None:
        """When the marker is worth reading again; None: now. Before the next checkpoint is due: when it is
        (at most CHECKPOINT_READ_MAX_SECONDS on); once due: every CHECKPOINT_READ_MIN_SECONDS, so a
        preemption waiting for it learns it soon; when it is late by another interval (the job checkpoints
        less often now, or has stopped): every CHECKPOINT_READ_MAX_SECONDS again."""
        if self.checked_at is None:
            return None
        if self.at is None or self.interval_seconds is None:
            return self.checked_at + timedelta(seconds=CHECKPOINT_READ_UNKNOWN_SECONDS)
        soonest = self.checked_at + timedelta(seconds=CHECKPOINT_READ_MIN_SECONDS)
        interval = timedelta(seconds=self.interval_seconds)
        due = self.at + interval
        latest = self.checked_at + timedelta(seconds=CHECKPOINT_READ_MAX_SECONDS)
        if self.checked_at < due:
            return max(soonest, min(due, latest))
        if self.checked_at < due + min(interval, timedelta(seconds=CHECKPOINT_READ_MAX_SECONDS)):
            return soonest
        return latest

    def to_dict(self) -> dict[str, Any]:
        return {
            "training_job_name": self.training_job_name,
            "at": self.at.isoformat() if self.at else None,
            "step": self.step,
            "count": self.count,
            "interval_seconds": self.interval_seconds,
            "checked_at": self.checked_at.isoformat() if self.checked_at else None,
            "etag": self.etag,
            "refused": self.refused,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CheckpointRecord:
        def when(key: str) -> datetime | None:
            value = data.get(key)
            return datetime.fromisoformat(value) if value else None

        interval = data.get("interval_seconds")
        return cls(
            training_job_name=str(data["training_job_name"]),
            at=when("at"),
            step=data.get("step"),
            count=int(data.get("count") or 0),
            interval_seconds=float(interval) if interval is not None else None,
            checked_at=when("checked_at"),
            etag=data.get("etag"),
            refused=data.get("refused"),
        )


def believe(
    record: CheckpointRecord, report: CheckpointReport, *, training_started_at: datetime, read_at: datetime
) -> CheckpointRecord:
    """The record after reading `report` from the attempt's own prefix at `read_at`: the report's
    checkpoint if it is this attempt's and newer than the one recorded, else the record unchanged (with why
    the report was not believed)."""
    if report.training_job_name != record.training_job_name:
        return replace(record, refused=f"the marker names training job {report.training_job_name}")
    if report.at < training_started_at - timedelta(seconds=CLOCK_SKEW_SECONDS):
        return replace(record, refused="the marker's checkpoint is older than the attempt's training")
    at = min(report.at, read_at)  # a time to come is no checkpoint yet: it counts from when it was seen
    if record.at is not None and at <= record.at:
        return replace(record, refused=None)
    return replace(
        record,
        at=at,
        step=report.step,
        count=max(report.count, record.count + 1),
        interval_seconds=report.interval_seconds or record.interval_seconds,
        refused=None,
    )


__all__ = [
    "CHECKPOINT_READS_PER_PASS",
    "CHECKPOINT_READ_MAX_SECONDS",
    "CHECKPOINT_READ_MIN_SECONDS",
    "CHECKPOINT_READ_UNKNOWN_SECONDS",
    "CheckpointRecord",
    "believe",
]
