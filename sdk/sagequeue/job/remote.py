"""A remote NEFF cache: what the Hub and S3 backends both offer, and how a URL picks one.

Both backends hold the same tree as a local cache (`neuronxcc-<version>/MODULE_<...>/<files>`) plus a
registry (`registry/neuronxcc-<version>/<model>/<config hash>.json`), and both guarantee that a reader
sees an entry only when it is whole: the Hub because one commit adds all of it, S3 because a manifest
object written after the entry's files is what makes it visible.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Protocol

from sagequeue.job.names import check_name
from sagequeue.job.neuron import (
    LocalEntry,
    entry_key,
    is_entry_dir,
    is_version_dir,
    version_dir,
    version_of_dir,
)

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
    #: MD5 of the bytes (S3's ETag of an object stored in one part): the only checksum of a file the Neuron
    #: SDK wrote itself; a file it stored in parts has none and is checked by size.
    md5: str | None = None
    #: A file without any checksum (the Neuron SDK's, stored in parts): its size is all that is checked.
    size_only: bool = False


@dataclass(frozen=True)
class RemoteEntry:
    version: str
    module: str
    files: tuple[RemoteFile, ...]
    #: Seconds since the epoch when the entry became visible, when the backend knows it.
    published_at: float | None = None
    #: Whether `files` carries checksums; when False, `RemoteCache.verified_files` fetches them.
    verified: bool = True
    #: Who laid the entry out: "sagequeue" (a manifest, or a Hub commit), or "neuron-sdk" (the Neuron
    #: compiler's own S3 cache wrote its files, with no manifest: `verify --repair` adopts it).
    origin: str = "sagequeue"

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
        # names that become paths (the record's own, the entries it lists) pass the restore's check
        model = check_name(str(data["model"]), "registry model")
        if not is_version_dir(version_dir(str(data["compiler_version"]))):
            raise ValueError(f"a registry record names no compiler version: {data['compiler_version']!r}")
        return cls(
            model=model,
            compiler_version=str(data["compiler_version"]),
            config={str(k): str(v) for k, v in dict(data["config"]).items()},
            entries=[str(e) for e in data.get("entries", []) if is_entry_dir(str(e))],
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


#: optimum-neuron's registry folder inside a version directory (`neuronxcc-<version>/0_REGISTRY/`). Under
#: it, `<optimum version>/` and then one of three layouts, by optimum-neuron release:
#:   `<arch digest>/<hash>.json`, with a copy at `<model type>/<model id>/<hash>.json` (since early 2026);
#:   `<model type>/<model id>/<hash>.json` (2025);
#:   `<training|inference>/<model type>/<model id>/<hash>.json` (before).
#: `<hash>` is the first 20 hex digits of the SHA-512 of the record's own text, so the two copies of a record
#: share it. The public precompiled cache (aws-neuron/optimum-neuron-cache) uses the same layouts.
OPTIMUM_REGISTRY_DIR = "0_REGISTRY"
_OPTIMUM_MODES = ("training", "inference")
_ARCH_DIGEST_RE = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class OptimumRecordPath:
    """Where an optimum-neuron record sits: its compiler version, optimum version, hash and, from the
    path alone, the model (None in the arch-digest layout, whose path does not name the model)."""

    path: str
    compiler_version: str
    optimum_version: str
    hash: str
    model: str | None
    model_type: str | None


def optimum_record_path(path: str) -> OptimumRecordPath | None:
    """Parse a path relative to the cache root as one of optimum-neuron's record paths, or None."""
    parts = path.split("/")
    if len(parts) < 5 or parts[1] != OPTIMUM_REGISTRY_DIR or not parts[-1].endswith(".json"):
        return None
    if not is_version_dir(parts[0]):
        return None
    rest = parts[3:-1]
    model: str | None = None
    model_type: str | None = None
    if len(rest) == 1 and _ARCH_DIGEST_RE.match(rest[0]):
        pass
    elif rest and rest[0] in _OPTIMUM_MODES and len(rest) >= 3:
        model_type, model = rest[1], "/".join(rest[2:])
    elif len(rest) >= 2:
        model_type, model = rest[0], "/".join(rest[1:])
    else:
        return None
    return OptimumRecordPath(
        path, version_of_dir(parts[0]), parts[2], parts[-1].removesuffix(".json"), model, model_type
    )


def optimum_record(path: str, raw: bytes | str) -> RegistryRecord | None:
    """A record optimum-neuron wrote, read as a configuration of its model; None when it is not one.

    The record describes a model configuration (its `neuron` settings: batch size, sequence length,
    tensor parallelism, dtype, target); it names no compile cache entry. Its entries are filled by the
    backend where it can tell which entries came with the record (`optimum_records`)."""
    where = optimum_record_path(path)
    if where is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    config = {"source": "optimum-neuron", "optimum_version": where.optimum_version}
    model_type = data.get("model_type") or where.model_type
    if model_type:
        config["model_type"] = str(model_type)
    if isinstance(data.get("_task"), str):
        config["task"] = data["_task"]
    neuron_config = data.get("neuron")
    if not isinstance(neuron_config, dict):
        # a pipeline (MultiModelCacheEntry) keeps the neuron settings in its main component
        main = data.get("unet") or data.get("transformer")
        neuron_config = main.get("neuron") if isinstance(main, dict) else None
    for key, value in sorted((neuron_config or {}).items()):
        if isinstance(value, str | int | float | bool):
            config.setdefault(str(key), str(value))
    model = data.get("_model_id") or where.model
    if not isinstance(model, str) or not model:
        return None
    return RegistryRecord(
        model, where.compiler_version, config, [], updated_at="", writer=f"optimum-neuron-{where.hash}"
    )


def optimum_records_from(files: Mapping[str, bytes]) -> dict[str, RegistryRecord]:
    """optimum-neuron's records among `files` (path relative to the cache root -> text), one per record:
    the two copies the newest layout keeps of each record count once. Keyed by the path of the copy kept."""
    found: dict[tuple[str, str], tuple[str, RegistryRecord]] = {}
    for path, raw in sorted(files.items()):
        where = optimum_record_path(path)
        record = optimum_record(path, raw) if where is not None else None
        if where is None or record is None:
            continue
        found.setdefault((where.compiler_version, where.hash), (path, record))
    return dict(found.values())


def matches_job(record: RegistryRecord, config: Mapping[str, str]) -> bool:
    """Whether an optimum-neuron record describes the job's configuration: at least one setting in common
    (batch_size, sequence_length, tp_degree, ...), and every setting in common has the same value."""
    shared = [k for k in config if k in record.config and k not in ("source", "optimum_version")]
    return bool(shared) and all(record.config[k] == config[k] for k in shared)


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
    #: optimum-neuron's own record files published with the entries (`0_REGISTRY/...`), paths from the root.
    foreign_records: list[str] = field(default_factory=list)
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

    def cut(self, at: float) -> None:
        """Bring the end forward to the monotonic time `at` (a stop's grace), never back."""
        self._at = at if self._at is None else min(self._at, at)

    def expired(self, reserve: float = 0.0) -> bool:
        return self.cancel.is_set() or self.remaining() <= reserve


#: A writer name: what names a team's `writers/<name>/` folder on S3 (and its IAM policy), or a Hub user.
_WRITER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
#: In a trust list: every writer, those the cache cannot name included (the behaviour without a list).
ANY_WRITER = "*"
#: RemoteEntry.origin of an entry the Neuron compiler's own S3 cache wrote.
SDK_ORIGIN = "neuron-sdk"


def check_writer(name: str) -> str:
    if not _WRITER_RE.match(name):
        raise ValueError(f"not a writer name: {name!r} (letters, digits, '.', '_' and '-', at most 96)")
    return name


@dataclass(frozen=True)
class Trust:
    """The writers a job restores from; None: any writer, unknown ones included."""

    writers: frozenset[str] | None = None

    @classmethod
    def parse(cls, text: str | None) -> Trust:
        """A comma-separated list of writer names; empty, unset or `*`: any writer."""
        names = [n.strip() for n in (text or "").split(",") if n.strip()]
        if not names or ANY_WRITER in names:
            return cls(None)
        return cls(frozenset(check_writer(n) for n in names))

    @property
    def restricted(self) -> bool:
        return self.writers is not None

    def allows(self, writer: str | None) -> bool:
        return self.writers is None or (writer is not None and writer in self.writers)

    def describe(self) -> str:
        return "any writer" if self.writers is None else ", ".join(sorted(self.writers))


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
        foreign_records: Mapping[str, bytes] | None = None,
    ) -> PublishResult:
        """Make complete local entries and registry records visible, each entry all at once or not at all.

        `foreign_records` (path from the cache root -> bytes) are optimum-neuron's record files found in the
        local cache: published as they are, at the same paths, never over an existing file."""
        ...

    def records(self, model: str | None = None) -> list[RegistryRecord]: ...

    def optimum_records(self, model: str | None = None, version: str | None = None) -> list[RegistryRecord]:
        """The configurations optimum-neuron recorded (`neuronxcc-<version>/0_REGISTRY/...`, of one compiler
        version or all), one per
        record, with the entries that came with each where the backend can tell (the Hub: the entry folders
        of the commit that added the record)."""
        ...

    def compiler_layout_problems(self, version: str) -> dict[str, str]:
        """Entry key -> why the Neuron compiler's own cache client could not read the entry at the path it
        looks at (`neuronxcc-<version>/MODULE_.../`); {} when every visible entry is there."""
        ...

    def repair_compiler_layout(self, version: str, modules: Sequence[str]) -> None:
        """Put the entries' files back where the Neuron compiler reads them."""
        ...

    def delete(self, entries: Sequence[RemoteEntry]) -> None: ...

    def writers(self, version: str, modules: Sequence[str]) -> dict[str, str | None]:
        """Who published each entry (module -> writer; None when the cache cannot tell: an entry written
        before writers were recorded, or by the Neuron SDK itself). The writer is what the storage's own
        access control binds, never what an entry says about itself: on S3 the `writers/<name>/` folder
        holding its bytes (IAM lets each team write only its own), on the Hub the user whose token made
        the commit that added it."""
        ...

    def adopt(self, entry: RemoteEntry, sha256: Mapping[str, str]) -> bool:
        """Record an entry the Neuron SDK wrote (its files, sizes and the SHA-256 `verify` measured) the way
        sagequeue records its own; False when someone recorded it first. Backends without such entries
        return False."""
        ...

    def server_time(self) -> float:
        """The remote's clock now (seconds since the epoch, from an answer's Date header): what entry times
        it recorded are compared with, never the local clock."""
        ...


def http_date(value: str | None) -> float | None:
    """Seconds since the epoch of an HTTP Date header, or None when there is none or it does not parse."""
    if not value:
        return None
    from email.utils import parsedate_to_datetime

    try:
        return parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
