"""The checkpoint marker: what an attempt says about its last checkpoint (docs/adr/0025-checkpoint-reports.md).

The job image writes `sagequeue-checkpoint.json` into the local checkpoint directory (by default
/opt/ml/checkpoints) after each checkpoint is complete; SageMaker syncs it to the job's
`CheckpointConfig.S3Uri` with the checkpoint files, and the scheduler reads that one object by key. The job
image and the scheduler both read and write the format here, so it cannot drift between them.

Standard library only: the job image imports it without the Lambda layer's dependencies.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

#: The marker's file name, in the checkpoint directory and under CheckpointConfig.S3Uri.
CHECKPOINT_MARKER = "sagequeue-checkpoint.json"
#: The marker's format version; a marker of another version is not read.
MARKER_VERSION = 1
#: A marker is a few hundred bytes; anything longer is not one.
MAX_MARKER_BYTES = 4096
#: Longest interval between checkpoints a marker may state (a week): beyond it the value is not believed.
MAX_INTERVAL_SECONDS = 7 * 86_400
#: Largest step or count a marker may state (a signed 64-bit integer, what any training loop counts in).
MAX_COUNTER = 2**63 - 1
#: Years a marker's time may fall in: outside them it is not a checkpoint's time (and near datetime's own
#: bounds, time arithmetic would overflow).
MARKER_YEARS = (2000, 2999)


class MarkerError(ValueError):
    """The bytes are not a checkpoint marker this version reads; the message names what is wrong."""


@dataclass(frozen=True)
class CheckpointReport:
    """One attempt's last complete checkpoint, as the attempt states it."""

    #: the attempt (SageMaker training job) that wrote the checkpoint
    training_job_name: str
    #: when the checkpoint was complete
    at: datetime
    #: the training step it holds, where the script says or its file names tell; None: unknown
    step: int | None = None
    #: checkpoints this attempt has written so far, this one included
    count: int = 1
    #: seconds between this checkpoint and the one before; None: the first of the attempt
    interval_seconds: float | None = None
    #: "script": the training called the job image's report (exact); "watched": the job image saw files
    #: appear in the checkpoint directory and settle
    source: str = "script"

    def to_marker(self) -> bytes:
        body: dict[str, Any] = {
            "version": MARKER_VERSION,
            "training_job_name": self.training_job_name,
            "at": self.at.astimezone(UTC).isoformat(),
            "step": self.step,
            "count": self.count,
            "interval_seconds": self.interval_seconds,
            "source": self.source,
        }
        return json.dumps(body, separators=(",", ":")).encode()

    def following(self, at: datetime, step: int | None, source: str) -> CheckpointReport:
        """The report of the attempt's next checkpoint, written at `at`: the interval is the gap since this
        one (the latest gap, so a drifting interval is followed)."""
        gap = (at - self.at).total_seconds()
        return CheckpointReport(
            training_job_name=self.training_job_name,
            at=at,
            step=step,
            count=self.count + 1,
            interval_seconds=gap if gap > 0 else self.interval_seconds,
            source=source,
        )

    @classmethod
    def from_marker(cls, body: bytes) -> CheckpointReport:
        if len(body) > MAX_MARKER_BYTES:
            raise MarkerError(f"the marker has {len(body)} bytes, more than {MAX_MARKER_BYTES}")
        try:
            data = json.loads(body.decode())
        except (UnicodeDecodeError, ValueError) as exc:
            raise MarkerError(f"the marker is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise MarkerError("the marker is not a JSON object")
        if data.get("version") != MARKER_VERSION:
            raise MarkerError(f"marker version {data.get('version')!r}, this reader knows {MARKER_VERSION}")
        name = data.get("training_job_name")
        if not isinstance(name, str) or not name:
            raise MarkerError("the marker names no training job")
        at = _time(data.get("at"))
        step = data.get("step")
        if step is not None and (
            not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_COUNTER
        ):
            raise MarkerError(f"step {_short(step)} is not an integer within [0, {MAX_COUNTER}]")
        count = data.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_COUNTER:
            raise MarkerError(f"count {_short(count)} is not an integer within [1, {MAX_COUNTER}]")
        interval = data.get("interval_seconds")
        if interval is not None:
            if not isinstance(interval, int | float) or isinstance(interval, bool):
                raise MarkerError(f"interval_seconds {_short(interval)} is not a number")
            # the range first: math.isfinite overflows on an integer too large for a float
            if not 0 < interval <= MAX_INTERVAL_SECONDS or not math.isfinite(interval):
                raise MarkerError(
                    f"interval_seconds {_short(interval)} is not within (0, {MAX_INTERVAL_SECONDS}]"
                )
        source = data.get("source", "script")
        return cls(
            training_job_name=name,
            at=at,
            step=step,
            count=count,
            interval_seconds=float(interval) if interval is not None else None,
            source=source if source in ("script", "watched") else "script",
        )


def _short(value: Any) -> str:
    """A value for an error message, cut short: a marker's author chooses it."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _time(value: Any) -> datetime:
    if not isinstance(value, str):
        raise MarkerError(f"at {_short(value)} is not an ISO 8601 time")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        if parsed.tzinfo is None:
            raise MarkerError(f"at {_short(value)} has no time zone")
        utc = parsed.astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        if isinstance(exc, MarkerError):
            raise
        raise MarkerError(f"at {_short(value)} is not an ISO 8601 time within datetime's range") from None
    if not MARKER_YEARS[0] <= utc.year <= MARKER_YEARS[1]:
        raise MarkerError(f"at {_short(value)} is not within the years {MARKER_YEARS[0]}-{MARKER_YEARS[1]}")
    return utc


def marker_key(s3_uri: str) -> tuple[str, str]:
    """(bucket, key) of the marker under a CheckpointConfig.S3Uri; ValueError if it is not an s3:// URI."""
    if not s3_uri.startswith("s3://"):
        raise ValueError(f"CheckpointConfig.S3Uri {s3_uri!r} is not an s3:// URI")
    bucket, _, prefix = s3_uri[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"CheckpointConfig.S3Uri {s3_uri!r} names no bucket")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/{CHECKPOINT_MARKER}" if prefix else CHECKPOINT_MARKER


__all__ = [
    "CHECKPOINT_MARKER",
    "MARKER_VERSION",
    "MAX_MARKER_BYTES",
    "CheckpointReport",
    "MarkerError",
    "marker_key",
]
