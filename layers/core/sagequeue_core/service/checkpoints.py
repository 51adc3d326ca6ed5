"""Learning live attempts' checkpoints before a pass plans (docs/adr/0025-checkpoint-reports.md).

Each running attempt of a job with a `CheckpointConfig` has its marker read from the job's own
`CheckpointConfig.S3Uri` when it is worth it (`CheckpointRecord.next_read`), at most
`CHECKPOINT_READS_PER_PASS` per pass, the longest unread first. What was read is stored with the job
(`Repository.note_checkpoints`) so the next pass, `show` and `ls` have it without reading S3 again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime

from sagequeue_core.checkpoint_marker import MarkerError
from sagequeue_core.checkpoints import CHECKPOINT_READS_PER_PASS, CheckpointRecord, believe
from sagequeue_core.domain import Job, JobState, has_checkpoints, is_attempt_name
from sagequeue_core.markers import CheckpointReadError, MarkerReader, read_report
from sagequeue_core.observability import logger
from sagequeue_core.runtime import Dependencies


def _record_of(job: Job) -> CheckpointRecord:
    """The job's record for its current attempt (a new one when the stored one is of another attempt)."""
    name = job.training_job_name or job.name
    record = job.checkpoint
    if record is None or record.training_job_name != name:
        return CheckpointRecord(training_job_name=name)
    return record


def due_for_a_read(live: Iterable[Job], now: datetime) -> list[Job]:
    """The running attempts whose marker is worth reading now, the longest unread first, at most
    CHECKPOINT_READS_PER_PASS. Only attempts in SageMaker's Training phase write checkpoints."""
    due: list[tuple[datetime, str, Job]] = []
    for job in live:
        if (
            job.state is not JobState.RUNNING
            or job.training_started_at is None
            or not has_checkpoints(job.request)
        ):
            continue
        record = _record_of(job)
        next_read = record.next_read()
        if next_read is None or next_read <= now:
            due.append((record.checked_at or job.training_started_at, job.name, job))
    due.sort(key=lambda entry: (entry[0], entry[1]))
    return [job for _, _, job in due[:CHECKPOINT_READS_PER_PASS]]


def read_checkpoints(deps: Dependencies, live: Iterable[Job]) -> list[str]:
    """Read the markers that are due and store what they say with the jobs; the names written. A marker
    that cannot be read or is not believed leaves the last checkpoint as it was: never fresher."""
    now = deps.now()
    jobs = due_for_a_read(live, now)
    if not jobs:
        return []
    reader = MarkerReader(deps.client("s3"))
    updates: list[tuple[Job, CheckpointRecord]] = []
    for job in jobs:
        record = _record_of(job)
        uri = job.request["CheckpointConfig"]["S3Uri"]
        try:
            read, report = read_report(reader, uri, record.etag)
        except (CheckpointReadError, MarkerError) as exc:
            if str(exc) != record.refused:  # once per attempt and cause, not every minute
                logger.warning(
                    "checkpoint marker not read", extra={"job": job.name, "s3_uri": uri, "error": str(exc)}
                )
            updates.append((job, _checked(record, now, etag=None, refused=str(exc))))
            continue
        except Exception as exc:  # noqa: BLE001 - the marker's author chooses its bytes: one job's marker
            # must never stop the pass for every job (nor be read first again in every pass)
            refused = f"the marker could not be read: {type(exc).__name__}"
            logger.exception("checkpoint marker not read", extra={"job": job.name, "s3_uri": uri})
            updates.append((job, _checked(record, now, etag=None, refused=refused)))
            continue
        checked = _checked(record, now, etag=read.etag, refused=record.refused if read.unchanged else None)
        if report is not None and job.training_started_at is not None:
            try:
                checked = believe(checked, report, training_started_at=job.training_started_at, read_at=now)
            except Exception as exc:  # noqa: BLE001 - as above: one marker never stops the pass
                logger.exception("checkpoint marker not believed", extra={"job": job.name})
                updates.append((job, replace(checked, refused=f"the marker was not believed: {exc}")))
                continue
            if (
                checked.refused
                and checked.refused != record.refused
                and not _earlier_attempt(job, report.training_job_name)
            ):
                logger.warning(
                    "checkpoint marker not believed",
                    extra={
                        "job": job.name,
                        "training_job_name": record.training_job_name,
                        "why": checked.refused,
                    },
                )
        updates.append((job, checked))
    return deps.store.note_checkpoints(updates)


def _checked(
    record: CheckpointRecord, now: datetime, *, etag: str | None, refused: str | None
) -> CheckpointRecord:
    return replace(record, checked_at=now, etag=etag, refused=refused)


def _earlier_attempt(job: Job, training_job_name: str) -> bool:
    """Whether the marker is one an earlier attempt of the job left (SageMaker downloads the prefix into a
    resumed attempt's checkpoint directory and syncs it back): expected, not a forgery."""
    return any(is_attempt_name(training_job_name, job.name, n) for n in range(1, job.attempt))
