"""The S3 adapter of checkpoint markers: one GetObject of one key, errors by S3's code (docs/adr/0025).

The scheduler's role may call s3:GetObject on `arn:aws:s3:::*/sagequeue-checkpoint.json` only: the marker,
never the checkpoint files. A bucket policy or a KMS key of the job's owner must let it (docs/deploy.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from sagequeue_core.checkpoint_marker import MAX_MARKER_BYTES, CheckpointReport, marker_key


class CheckpointReadError(Exception):
    """The marker could not be read (access denied, no such bucket, S3 unavailable); `code` is S3's."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class MarkerRead:
    """One read: the marker's bytes and ETag, or that it is unchanged since `etag`, or that it is missing."""

    body: bytes | None = None
    etag: str | None = None
    unchanged: bool = False


_NOT_MODIFIED = frozenset({"304", "NotModified"})
_MISSING = frozenset({"404", "NoSuchKey"})


class MarkerReader:
    """GetObject of the marker under a CheckpointConfig.S3Uri (s3:GetObject on `*/sagequeue-checkpoint.json`)."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def read(self, s3_uri: str, etag: str | None = None) -> MarkerRead:
        try:
            bucket, key = marker_key(s3_uri)
        except ValueError as exc:
            raise CheckpointReadError(str(exc), "InvalidUri") from None
        request: dict[str, Any] = {"Bucket": bucket, "Key": key}
        if etag:
            request["IfNoneMatch"] = etag
        try:
            answer = self._client.get_object(**request)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in _NOT_MODIFIED:
                return MarkerRead(etag=etag, unchanged=True)
            if code in _MISSING:
                return MarkerRead()
            raise CheckpointReadError(f"s3://{bucket}/{key}: {code or exc}", code) from None
        except BotoCoreError as exc:  # S3 unreachable or too slow: read again at the next due time
            raise CheckpointReadError(f"s3://{bucket}/{key}: {exc}", type(exc).__name__) from None
        stream = answer["Body"]
        try:
            body = stream.read(_READ_LIMIT)
        except BotoCoreError as exc:
            raise CheckpointReadError(f"s3://{bucket}/{key}: {exc}", type(exc).__name__) from None
        finally:
            stream.close()
        return MarkerRead(body=body, etag=answer.get("ETag"))


#: Read one byte more than a marker may have, so an oversized object is told from a marker.
_READ_LIMIT = MAX_MARKER_BYTES + 1


def read_report(
    reader: MarkerReader, s3_uri: str, etag: str | None
) -> tuple[MarkerRead, CheckpointReport | None]:
    """The read and the report in it (None: unchanged, missing); MarkerError when it is not a marker."""
    read = reader.read(s3_uri, etag)
    if read.body is None:
        return read, None
    return read, CheckpointReport.from_marker(read.body)


__all__ = ["CheckpointReadError", "MarkerRead", "MarkerReader", "read_report"]
