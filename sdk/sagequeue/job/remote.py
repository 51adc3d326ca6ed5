"""A remote NEFF cache: what the Hub and S3 backends both offer, and how a URL picks one.

Both backends hold the same tree as a local cache (`neuronxcc-<version>/MODULE_<...>/<files>`) plus a
registry (`registry/neuronxcc-<version>/<model>/<config hash>.json`), and both guarantee that a reader
sees an entry only when it is whole: the Hub because one commit adds all of it, S3 because a manifest
object written after the entry's files is what makes it visible.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from sagequeue.job.neuron import LocalEntry, entry_key, version_dir

REGISTRY_DIR = "registry"


class RemoteCacheError(RuntimeError):
    """The remote cache refused or failed an operation; the message names the cache and the operation."""


class RemoteCacheNotFoundError(RemoteCacheError):
    """The repository or bucket does not exist (or this identity may not see it)."""


class ConflictError(RemoteCacheError):
    """Someone else changed the remote cache between our read and our write."""


class IntegrityError(RemoteCacheError):
    """Downloaded bytes do not match the checksum the remote cache recorded."""


@dataclass(frozen=True)
class RemoteFile:
    #: Path relative to the entry directory.
    name: str
    size: int
    sha256: str | None = None
    #: Git blob id (sha1 of "blob <size>\\0<content>"), what the Hub records for files kept in git.
    git_sha1: str | None = None
    #: Where the bytes are, relative to the cache root, when not at `<entry key>/<name>` (S3: the
    #: writer-unique prefix the manifest names).
    location: str | None = None


@dataclass(frozen=True)
class RemoteEntry:
    version: str
    module: str
    files: tuple[RemoteFile, ...]
    #: Seconds since the epoch when the entry became visible, when the backend knows it.
    published_at: float | None = None
    #: Whether `files` carries checksums; when False, `RemoteCache.verified_files` fetches them.
    verified: bool = True

    @property
    def key(self) -> str:
        return entry_key(self.version, self.module)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


@dataclass
class RegistryRecord:
    """Which job configuration produced which entries: what `lookup` searches and `restore` narrows by."""

    model: str
    compiler_version: str
    #: instance type, core count, precision, shapes, compiler flags, and whatever the user adds.
    config: dict[str, str]
    entries: list[str] = field(default_factory=list)
    updated_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    training_job: str | None = None
    #: Each writer has its own file, so writers never read-modify-write one another's records.
    writer: str = field(default_factory=lambda: uuid.uuid4().hex[:16])

    @property
    def config_hash(self) -> str:
        canonical = json.dumps(
            {"model": self.model, "compiler_version": self.compiler_version, "config": self.config},
            sort_keys=True,
            separators=(",", ":"),
        )
        return hashlib.sha256(canonical.encode()).hexdigest()[:20]

    @property
    def path(self) -> str:
        """Where the record lives, relative to the cache root."""
        return f"{REGISTRY_DIR}/{version_dir(self.compiler_version)}/{self.model}/{self.config_hash}/{self.writer}.json"

    def to_json(self) -> bytes:
        body = {
            "model": self.model,
            "compiler_version": self.compiler_version,
            "config": self.config,
            "entries": sorted(set(self.entries)),
            "updated_at": self.updated_at,
            "training_job": self.training_job,
            "writer": self.writer,
        }
        return json.dumps(body, indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> RegistryRecord:
        data = json.loads(raw)
        if not isinstance(data, dict) or not {"model", "compiler_version", "config"} <= data.keys():
            raise ValueError("a registry record needs model, compiler_version and config")
        return cls(
            model=str(data["model"]),
            compiler_version=str(data["compiler_version"]),
            config={str(k): str(v) for k, v in dict(data["config"]).items()},
            entries=[str(e) for e in data.get("entries", [])],
            updated_at=str(data.get("updated_at", "")),
            training_job=data.get("training_job"),
            writer=str(data.get("writer") or uuid.uuid4().hex[:16]),
        )


def registry_path_parts(path: str) -> tuple[str, str] | None:
    """(version directory, model) of a registry record path, or None when it is not one."""
    parts = path.split("/")
    if len(parts) < 5 or parts[0] != REGISTRY_DIR or not parts[-1].endswith(".json"):
        return None
    return parts[1], "/".join(parts[2:-2])


#: optimum-neuron's registry folder inside a version directory:
#: `neuronxcc-<version>/0_REGISTRY/<optimum version>/<training|inference>/<model type>/<model id>/<hash>.json`.
OPTIMUM_REGISTRY_DIR = "0_REGISTRY"


def optimum_record(path: str, raw: bytes | str) -> RegistryRecord | None:
    """A record optimum-neuron wrote, read as a configuration of its model (it names no entries: optimum's
    records describe model configurations, not compile cache entries); None when it is not one."""
    parts = path.split("/")
    if len(parts) < 7 or parts[1] != OPTIMUM_REGISTRY_DIR or not parts[-1].endswith(".json"):
        return None
    try:
        version = parts[0][len("neuronxcc-") :] if parts[0].startswith("neuronxcc-") else None
        data = json.loads(raw)
    except ValueError:
        return None
    if version is None or not isinstance(data, dict):
        return None
    config = {
        "source": "optimum-neuron",
        "optimum_version": parts[2],
        "mode": parts[3],
        "model_type": parts[4],
    }
    nested = data.get("neuron")
    neuron: dict[str, Any] = nested if isinstance(nested, dict) else {}
    for key, value in sorted({**data, **neuron}.items()):
        if not key.startswith("_") and isinstance(value, str | int | float | bool):
            config.setdefault(key, str(value))
    model = str(data.get("_model_id") or "/".join(parts[5:-1]))
    return RegistryRecord(model, version, config, [], updated_at="", writer="optimum-neuron")


def combine_records(records: Sequence[RegistryRecord]) -> list[RegistryRecord]:
    """One record per job configuration: the entries every writer recorded for it, the latest writer's
    details."""
    combined: dict[str, RegistryRecord] = {}
    for record in sorted(records, key=lambda r: r.updated_at):
        known = combined.get(record.config_hash)
        entries = sorted(set(record.entries) | set(known.entries if known else ()))
        combined[record.config_hash] = replace(record, entries=entries)
    return list(combined.values())


@dataclass
class PublishResult:
    published: list[str] = field(default_factory=list)
    #: Entries someone else published first: nothing to do.
    already_present: list[str] = field(default_factory=list)
    #: Entries left out because the deadline came first (they stay local and go next time).
    skipped: list[str] = field(default_factory=list)
    records: list[str] = field(default_factory=list)
    conflicts_retried: int = 0
    #: Backend-specific identifier of what was written (Hub commit id).
    revision: str | None = None


class Activity:
    """When a transfer last made progress (an answer, a chunk): what a no-progress cut-off watches."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.last = self.started
        #: Whether the remote answered anything yet (a dead cache never does).
        self.answered = False

    def touch(self) -> None:
        self.last = time.monotonic()
        self.answered = True

    def idle_for(self) -> float:
        return time.monotonic() - self.last


class Cancelled(RemoteCacheError):
    """The transfer was called off (a stop, a timeout, no progress, the disk floor)."""


class Deadline:
    """A point in monotonic time after which no new transfer starts.

    It also carries the transfer's `activity` (backends call `touch()` after each file or batch) and a
    cancel flag the caller sets to call the transfer off.
    """

    def __init__(self, seconds: float | None, activity: Activity | None = None) -> None:
        self.total = float("inf") if seconds is None else seconds
        self._at = None if seconds is None else time.monotonic() + seconds
        self.activity = activity or Activity()
        self.cancel = threading.Event()

    def touch(self) -> None:
        self.activity.touch()

    def remaining(self) -> float:
        return float("inf") if self._at is None else self._at - time.monotonic()

    def expired(self, reserve: float = 0.0) -> bool:
        return self.cancel.is_set() or self.remaining() <= reserve


class RemoteCache(Protocol):
    """A NEFF cache another host can read; one implementation per URL scheme."""

    url: str

    def exists(self) -> bool: ...

    def create(self, private: bool = True) -> None: ...

    def versions(self) -> list[str]: ...

    def entries(self, version: str) -> dict[str, RemoteEntry]:
        """Complete entries of one compiler version, by module name."""
        ...

    def verified_files(self, entry: RemoteEntry) -> tuple[RemoteFile, ...]:
        """The entry's files with checksums."""
        ...

    def open_file(
        self, entry: RemoteEntry, file: RemoteFile, offset: int = 0, end: int | None = None
    ) -> AbstractContextManager[Iterator[bytes]]:
        """The file's bytes from `offset` up to `end` (exclusive; None: the end of the file)."""
        ...

    def publish(
        self,
        entries: Sequence[LocalEntry],
        records: Sequence[RegistryRecord],
        deadline: Deadline,
    ) -> PublishResult:
        """Make complete local entries and registry records visible, each entry all at once or not at all."""
        ...

    def records(self, model: str | None = None) -> list[RegistryRecord]: ...

    def delete(self, entries: Sequence[RemoteEntry]) -> None: ...


def open_remote(url: str, **options: Any) -> RemoteCache:
    """The backend for `hf://<org>/<repo>` or `s3://<bucket>/<prefix>`."""
    if url.startswith("hf://"):
        from sagequeue.job.hub import HubCache

        return HubCache(url, **options)
    if url.startswith("s3://"):
        from sagequeue.job.s3 import S3Cache

        return S3Cache(url, **options)
    raise ValueError(f"unknown NEFF cache URL {url!r}: expected hf://<org>/<repo> or s3://<bucket>/<prefix>")
