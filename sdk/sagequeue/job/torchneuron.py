"""The compile cache of native PyTorch on Neuron (TorchNeuron: torch-neuronx's `neuron` device, eager mode
and `torch.compile(backend="neuron")`, Trn2 and Trn3), shared through the same S3 prefix or Hub repository
as the XLA flow's cache.

What torch-neuronx writes (its `PersistentCacheBackend` and `CompilationCache`): one file per compiled
graph or op, `<TORCH_NEURONX_NEFF_CACHE_DIR>/ab/cd/<32 hex>.neff` (the key's first two and next two hex
digits shard it), written to a temporary file in the same directory and renamed, so a visible non-empty
`.neff` is whole; lock files live apart, under `TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR`. The key hashes the graph
(its HLO) and its compile settings, not the versions of torch-neuronx or neuronx-cc: two versions can map
the same key to different NEFFs. There is no remote tier.

What sagequeue adds: a remote tier, namespaced by what the key lacks. Each namespace
(`torchneuron/<torch-neuronx version>__<neuronx-cc version>__<platform>__<cores>__<NKI digest>/`) holds packs:

    packs/<pack id>.pack   the NEFFs of one upload, concatenated
    packs/<pack id>.json   the index: each entry's name, offset, size and SHA-256; written last

An index makes its pack visible (S3: written with If-None-Match after the pack; the Hub: one commit adds
both), so an upload cut short leaves nothing a reader follows. A restore reads the indexes of its exact
namespace only, fetches the byte ranges of the entries it lacks (neighbouring entries of a pack in one
ranged GET, many ranges in parallel), checks each entry's SHA-256 and installs it with one rename: thousands
of eager-mode NEFFs cost tens of requests, not thousands.

Every name a restore writes is checked first: the two layouts above only, and no component of the path may
be a symbolic link, so nothing lands outside the cache root.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

from sagequeue.job import neuron
from sagequeue.job.names import UnsafeNameError, check_name, path_inside
from sagequeue.job.remote import Cancelled, Deadline, RemoteCacheError, Trust, check_writer
from sagequeue_core.defaults import WARMPOOL_CACHE_ENV

log = logging.getLogger(__name__)

KIND = "torchneuron"
XLA_KIND = "xla"
KINDS = ("auto", XLA_KIND, KIND)
KIND_ENV = "SAGEQUEUE_CACHE_KIND"

# --- what torch-neuronx defines ----------------------------------------------------------------------------

#: Python distribution of TorchNeuron (and, in older releases, of the XLA flow's torch-neuronx).
TORCH_NEURONX_DISTRIBUTION = "torch-neuronx"
#: The XLA flow needs torch-xla; TorchNeuron does not.
TORCH_XLA_DISTRIBUTION = "torch-xla"
NEFF_CACHE_DIR_ENV = "TORCH_NEURONX_NEFF_CACHE_DIR"
NEFF_LOCAL_CACHE_DIR_ENV = "TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"
DEFAULT_NEFF_CACHE_DIR = "/tmp/neff_cache"  # noqa: S108 - torch-neuronx's own default
DEFAULT_LOCAL_CACHE_DIR = "/tmp/local_cache"  # noqa: S108 - torch-neuronx's own default (locks)
PLATFORM_ENV = "NEURON_PLATFORM_TARGET_OVERRIDE"
CORES_ENV = "NEURON_RT_NUM_CORES"
VISIBLE_CORES_ENV = "NEURON_RT_VISIBLE_CORES"
INSTANCE_TYPE_ENV = "SM_CURRENT_INSTANCE_TYPE"
#: Subdirectory of the warm pool's persistent directory for this kind's cache.
WARMPOOL_SUBDIR = "torchneuron-neff-cache"
PLATFORMS = ("trn2", "trn3")

#: `ab/cd/abcd<28 hex>.neff` (torch-neuronx's sharded layout) or `<64 hex>/<64 hex>.neff`.
_SHARDED_RE = re.compile(r"^([0-9a-f]{2})/([0-9a-f]{2})/\1\2[0-9a-f]{28}\.neff$")
_WIDE_RE = re.compile(r"^[0-9a-f]{64}/[0-9a-f]{64}\.neff$")
_FIELD_RE = re.compile(r"^[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}$")
_PACK_ID_RE = re.compile(r"^[0-9A-Za-z_-]{8,64}$")

REMOTE_DIR = "torchneuron"
PACKS_DIR = "packs"
PACK_SUFFIX = ".pack"
INDEX_SUFFIX = ".json"
INDEX_FORMAT = 1
#: An upload's NEFFs go in packs of at most this size (a NEFF larger than this is a pack of its own): two
#: ranged reads of a pack, so a store that reads the whole object to serve a range (as moto does, and some
#: S3-compatible stores) reads a byte at most twice; one PUT each (under the multipart threshold), and a
#: deadline that cuts an upload loses at most this much of it.
PACK_BYTES = 16 * 1024 * 1024
#: A restore fetches at most this many bytes of one pack in one ranged GET.
RUN_BYTES = 8 * 1024 * 1024
#: Bytes between two wanted entries of a pack that one GET still reads through rather than split.
GAP_BYTES = 256 * 1024
ATTEMPTS = 3
#: LISTs of writer folders a lookup runs at once.
LIST_WORKERS = 8
_READ = 1024 * 1024


class NamespaceError(ValueError):
    """The job's namespace cannot be determined (a version, the platform or the core count is unknown)."""


def is_entry_name(name: str) -> bool:
    return bool(_SHARDED_RE.match(name) or _WIDE_RE.match(name))


def safe_target(root: Path, name: str) -> Path:
    """Where entry `name` goes under `root`: a name outside the two layouts is refused, then the shared name
    check (`names.path_inside`) refuses a path that leaves `root`, through a symbolic link or otherwise."""
    if not is_entry_name(name):
        raise UnsafeNameError(f"not a TorchNeuron NEFF entry name: {name!r}")
    return path_inside(root, name, "TorchNeuron entry")


# --- which flow the image runs ------------------------------------------------------------------------------


def _installed(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def detect_kind() -> str:
    """`torchneuron` where torch-neuronx is installed without torch-xla (the native backend), else `xla`."""
    if _installed(TORCH_NEURONX_DISTRIBUTION) and not _installed(TORCH_XLA_DISTRIBUTION):
        return KIND
    return XLA_KIND


def resolve_kind(explicit: str | None, env: Mapping[str, str] | None = None) -> str:
    environment = os.environ if env is None else env
    chosen = (explicit or environment.get(KIND_ENV) or "auto").strip().lower()
    if chosen not in KINDS:
        raise ValueError(f"unknown cache kind {chosen!r}: expected one of {', '.join(KINDS)}")
    return detect_kind() if chosen == "auto" else chosen


# --- the namespace ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Namespace:
    torch_neuronx: str
    neuronx_cc: str
    platform: str
    cores: str
    #: SHA-256 (first 16 hex digits) of the job's custom NKI kernel sources, or "none".
    nki: str = "none"

    def __post_init__(self) -> None:
        for name in ("torch_neuronx", "neuronx_cc", "platform", "cores", "nki"):
            value = getattr(self, name)
            if not _FIELD_RE.match(value) or "__" in value:
                raise NamespaceError(f"{name} {value!r} cannot name a cache namespace")

    @property
    def name(self) -> str:
        return f"{self.torch_neuronx}__{self.neuronx_cc}__{self.platform}__{self.cores}__nki-{self.nki}"

    @property
    def prefix(self) -> str:
        return f"{REMOTE_DIR}/{self.name}"

    def describe(self) -> dict[str, str]:
        return {
            "torch_neuronx": self.torch_neuronx,
            "neuronx_cc": self.neuronx_cc,
            "platform": self.platform,
            "cores": self.cores,
            "nki": self.nki,
        }

    @classmethod
    def parse(cls, name: str) -> Namespace:
        parts = name.split("__")
        if len(parts) != 5 or not parts[4].startswith("nki-"):
            raise NamespaceError(f"not a TorchNeuron cache namespace: {name!r}")
        return cls(parts[0], parts[1], parts[2], parts[3], parts[4][len("nki-") :])


def platform_of(env: Mapping[str, str], explicit: str | None = None) -> str:
    """trn2 or trn3: the option, NEURON_PLATFORM_TARGET_OVERRIDE, `--target` in NEURON_CC_FLAGS, then the
    instance type (ml.trn2.48xlarge, ml.trn2u.48xlarge, ml.trn3...)."""
    candidates = [explicit, env.get(PLATFORM_ENV)]
    flags = env.get(neuron.CC_FLAGS_ENV, "").split()
    for i, arg in enumerate(flags):
        if arg.startswith("--target="):
            candidates.append(arg.split("=", 1)[1])
        elif arg == "--target" and i + 1 < len(flags):
            candidates.append(flags[i + 1])
    instance = env.get(INSTANCE_TYPE_ENV, "")
    match = re.match(r"^(?:ml\.)?(trn\d)", instance)
    candidates.append(match.group(1) if match else None)
    for value in candidates:
        if value:
            value = value.strip().lower()
            if value not in PLATFORMS:
                raise NamespaceError(f"platform {value!r}: TorchNeuron runs on {' and '.join(PLATFORMS)}")
            return value
    raise NamespaceError(
        f"unknown platform: set --platform, {PLATFORM_ENV} or {INSTANCE_TYPE_ENV} (trn2 or trn3)"
    )


def cores_of(env: Mapping[str, str], explicit: str | None = None) -> str:
    """The NeuronCores the job uses: the option, NEURON_RT_NUM_CORES, the count of NEURON_RT_VISIBLE_CORES
    ("0-3,8" is 5), else "all" (every core of the instance type)."""
    if explicit:
        return str(explicit)
    if env.get(CORES_ENV, "").strip():
        return env[CORES_ENV].strip()
    visible = env.get(VISIBLE_CORES_ENV, "").strip()
    if visible:
        count = 0
        for part in visible.split(","):
            low, sep, high = part.strip().partition("-")
            try:
                count += int(high) - int(low) + 1 if sep else 1
            except ValueError as exc:
                raise NamespaceError(f"{VISIBLE_CORES_ENV}={visible!r} is not a core list") from exc
        return str(count)
    return "all"


def nki_digest(sources: Iterable[str | Path]) -> str:
    """A digest of custom NKI kernel sources (files, or directories whose .py files count), "none" for none.
    A change of one kernel changes the namespace: its NEFFs are never restored for the other code."""
    files: list[tuple[str, Path]] = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            files += [(p.relative_to(path).as_posix(), p) for p in sorted(path.rglob("*.py")) if p.is_file()]
        elif path.is_file():
            files.append((path.name, path))
        else:
            raise NamespaceError(f"NKI kernel source {path} does not exist")
    if not files:
        return "none"
    digest = hashlib.sha256()
    for name, path in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def namespace_for(
    env: Mapping[str, str],
    *,
    torch_neuronx: str | None = None,
    neuronx_cc: str | None = None,
    platform: str | None = None,
    cores: str | None = None,
    nki_sources: Sequence[str] = (),
) -> Namespace:
    """The namespace of a job: versions from the options, else from the image (the torch-neuronx
    distribution, the neuronx-cc on PATH), platform and cores from the options or the environment."""
    version = torch_neuronx or _installed(TORCH_NEURONX_DISTRIBUTION)
    if not version:
        raise NamespaceError("torch-neuronx is not installed here: pass --torch-neuronx-version")
    try:
        compiler = neuron.discover_compiler_version(env, explicit=neuronx_cc)
    except neuron.CompilerNotFoundError as exc:
        raise NamespaceError(str(exc)) from exc
    return Namespace(
        version, compiler, platform_of(env, platform), cores_of(env, cores), nki_digest(nki_sources)
    )


# --- the local cache ----------------------------------------------------------------------------------------


def choose_cache_dir(env: Mapping[str, str], explicit: str | None = None) -> tuple[Path, str]:
    """(directory, why): the option, the warm pool's persistent directory, TORCH_NEURONX_NEFF_CACHE_DIR, then
    torch-neuronx's default."""
    if explicit:
        return Path(explicit), "option"
    warm = env.get(WARMPOOL_CACHE_ENV)
    if warm:
        return Path(warm) / WARMPOOL_SUBDIR, "warm-pool"
    if env.get(NEFF_CACHE_DIR_ENV):
        return Path(env[NEFF_CACHE_DIR_ENV]), NEFF_CACHE_DIR_ENV
    return Path(DEFAULT_NEFF_CACHE_DIR), "default"


def child_environment(env: Mapping[str, str], root: Path) -> dict[str, str]:
    """The command's environment: torch-neuronx reads these when `torch` is imported, so they are set for
    the process, before any Python code of the job runs. Locks stay out of the shared directory."""
    child = dict(env)
    child[NEFF_CACHE_DIR_ENV] = str(root)
    local = child.get(NEFF_LOCAL_CACHE_DIR_ENV) or DEFAULT_LOCAL_CACHE_DIR
    with contextlib.suppress(OSError, ValueError):
        if Path(local).resolve().is_relative_to(root.resolve()):
            local = str(root.parent / f".{root.name}.locks")
    child[NEFF_LOCAL_CACHE_DIR_ENV] = local
    return child


def local_entries(root: Path) -> dict[str, int]:
    """Name -> size of every complete entry under `root`: regular, non-empty files named as torch-neuronx
    names them. A writer's temporary file (`tmpXXXX.tmp` beside the entry) never matches."""
    found: dict[str, int] = {}
    if not root.is_dir():
        return found
    for path in root.rglob("*.neff"):
        name = path.relative_to(root).as_posix()
        if not is_entry_name(name):
            continue
        try:
            info = path.lstat()
        except OSError:
            continue
        if path.is_symlink() or not path.is_file() or info.st_size == 0:
            continue
        # a shard directory that is a link would make this file another tree's
        if any((root / part).is_symlink() for part in _parents(name)):
            continue
        found[name] = info.st_size
    return found


def _parents(name: str) -> list[str]:
    parts = name.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


# --- the remote store ---------------------------------------------------------------------------------------


class PackStore(Protocol):
    """What this kind needs of a remote cache: paths under its root, read whole or by range, an atomic put
    of a pack and its index, deletes, and who wrote a file. Paths are relative to the cache root; on S3 a
    named writer's packs sit under `writers/<writer>/` (`base`), the folder IAM gives that team alone."""

    url: str
    #: Where this handle publishes: "" or `writers/<writer>/`.
    base: str

    def list_paths(self, prefix: str) -> dict[str, int]: ...

    def namespace_paths(self, prefix: str) -> dict[str, int]:
        """`list_paths(prefix)` and the same prefix in every writer's folder."""
        ...

    def writers(self, paths: Sequence[str]) -> dict[str, str | None]:
        """Path -> who wrote it, as the storage's own access control binds it (S3: the writer folder it
        is in; the Hub: the author of the commit that last changed it); None when it cannot tell."""
        ...

    def read_bytes(self, path: str) -> bytes: ...

    def open_range(self, path: str, start: int, end: int) -> AbstractContextManager[Iterator[bytes]]: ...

    def put_pack(
        self, pack_path: str, pack: Path, index_path: str, index: bytes, touch: Callable[[], None]
    ) -> bool: ...

    def delete(self, paths: Sequence[str]) -> None: ...


class S3PackStore:
    def __init__(self, cache: Any) -> None:
        from botocore.exceptions import ClientError

        from sagequeue.job.s3 import WRITERS_DIR

        self.cache = cache
        self.url = cache.url
        self.base = f"{WRITERS_DIR}/{cache.writer}/" if cache.writer else ""
        self._client_error = ClientError

    def list_paths(self, prefix: str) -> dict[str, int]:
        return {
            self.cache._relative(item["Key"]): int(item["Size"])
            for item in self.cache._list(prefix.rstrip("/") + "/")
            if "Key" in item
        }

    def namespace_paths(self, prefix: str) -> dict[str, int]:
        """One LIST per folder, all at once: the shared folder's while the writer folders are found, each
        writer folder's as soon as its name comes (S3 lists no pattern, so a LIST per writer remains)."""
        from sagequeue.job.s3 import WRITERS_DIR

        with ThreadPoolExecutor(max_workers=LIST_WORKERS, thread_name_prefix="tnx-list") as pool:
            shared = pool.submit(self.list_paths, prefix)
            folders = []
            for item in self.cache._list(WRITERS_DIR + "/", delimiter="/"):
                if "CommonPrefix" not in item:
                    continue
                base, writer = writer_base(self.cache._relative(item["CommonPrefix"]) + prefix)
                if writer is not None:
                    folders.append(pool.submit(self.list_paths, base + prefix))
            out = shared.result()
            for folder in folders:
                out.update(folder.result())
        return out

    def writers(self, paths: Sequence[str]) -> dict[str, str | None]:
        return {path: writer_base(path)[1] for path in paths}

    def read_bytes(self, path: str) -> bytes:
        try:
            return bytes(
                self.cache._client.get_object(Bucket=self.cache.bucket, Key=self.cache._key(path))[
                    "Body"
                ].read()
            )
        except self._client_error as exc:
            raise self.cache._error(f"read {path}", exc) from exc

    @contextlib.contextmanager
    def open_range(self, path: str, start: int, end: int) -> Iterator[Iterator[bytes]]:
        try:
            body = self.cache._client.get_object(
                Bucket=self.cache.bucket, Key=self.cache._key(path), Range=f"bytes={start}-{end - 1}"
            )["Body"]
        except self._client_error as exc:
            raise self.cache._error(f"download {path}", exc) from exc
        try:
            yield body.iter_chunks(256 * 1024)
        finally:
            body.close()

    def put_pack(
        self, pack_path: str, pack: Path, index_path: str, index: bytes, touch: Callable[[], None]
    ) -> bool:
        self.cache._put_file(pack_path, pack, touch)
        touch()
        try:
            self.cache._client.put_object(
                Bucket=self.cache.bucket,
                Key=self.cache._key(index_path),
                Body=index,
                ContentType="application/json",
                IfNoneMatch="*",
            )
        except self._client_error as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                self.delete([pack_path])
                return False
            raise self.cache._error(f"write {index_path}", exc) from exc
        return True

    def delete(self, paths: Sequence[str]) -> None:
        keys = [self.cache._key(p) for p in paths]
        for start in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[start : start + 1000]]
            try:
                self.cache._client.delete_objects(
                    Bucket=self.cache.bucket, Delete={"Objects": batch, "Quiet": True}
                )
            except self._client_error as exc:
                raise self.cache._error("delete", exc) from exc


class HubPackStore:
    def __init__(self, cache: Any) -> None:
        self.cache = cache
        self.url = cache.url
        # the Hub records who made each commit: a writer needs no folder of its own
        self.base = ""

    def namespace_paths(self, prefix: str) -> dict[str, int]:
        return self.list_paths(prefix)

    def writers(self, paths: Sequence[str]) -> dict[str, str | None]:
        folders = sorted({p.rsplit("/", 1)[0] for p in paths})
        authors: dict[str, str | None] = {}
        for folder in folders:
            authors.update(self.cache.file_authors(folder))
        return {path: authors.get(path) for path in paths}

    def list_paths(self, prefix: str) -> dict[str, int]:
        from huggingface_hub.hf_api import RepoFile

        self.cache.head()
        return {
            item.path: int(item.size)
            for item in self.cache._tree(prefix.rstrip("/"), recursive=True)
            if isinstance(item, RepoFile)
        }

    def read_bytes(self, path: str) -> bytes:
        return bytes(self.cache.read_text(path))

    @contextlib.contextmanager
    def open_range(self, path: str, start: int, end: int) -> Iterator[Iterator[bytes]]:
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        headers = build_hf_headers(token=self.cache.api.token)
        headers["Range"] = f"bytes={start}-{end - 1}"
        url = self.cache.file_url(path)
        with get_session().stream("GET", url, headers=headers, follow_redirects=True) as response:
            hf_raise_for_status(response)
            if response.status_code != 206 and not (start == 0 and end >= _content_length(response)):
                raise RemoteCacheError(f"{url}: asked for bytes {start}-{end - 1}, the server sent the file")
            yield response.iter_bytes(256 * 1024)

    def put_pack(
        self, pack_path: str, pack: Path, index_path: str, index: bytes, touch: Callable[[], None]
    ) -> bool:
        from huggingface_hub import CommitOperationAdd

        # one commit: the pack and its index appear together or not at all
        self.cache.api.create_commit(
            self.cache.repo_id,
            operations=[
                CommitOperationAdd(path_in_repo=pack_path, path_or_fileobj=str(pack)),
                CommitOperationAdd(path_in_repo=index_path, path_or_fileobj=index),
            ],
            commit_message=f"Add {index_path}",
        )
        touch()
        return True

    def delete(self, paths: Sequence[str]) -> None:
        from huggingface_hub import CommitOperationDelete

        if paths:
            self.cache.api.create_commit(
                self.cache.repo_id,
                operations=[CommitOperationDelete(path_in_repo=p) for p in paths],
                commit_message=f"Remove {len(paths)} TorchNeuron cache files",
            )


def _content_length(response: Any) -> int:
    try:
        return int(response.headers.get("content-length", "-1"))
    except ValueError:
        return -1


def pack_store(remote: Any) -> PackStore:
    """This kind's view of a remote cache opened with `backends.open_remote`."""
    if remote.url.startswith("s3://"):
        return S3PackStore(remote)
    if remote.url.startswith("hf://"):
        return HubPackStore(remote)
    raise ValueError(f"no TorchNeuron cache over {remote.url}")


# --- indexes --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IndexEntry:
    name: str
    offset: int
    size: int
    sha256: str


@dataclass
class PackIndex:
    pack_id: str
    namespace: Namespace
    entries: list[IndexEntry]
    created_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    writer: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    training_job: str | None = None
    model: str | None = None
    #: The writer folder the pack is in ("" or `writers/<writer>/`); not part of the index's own text.
    base: str = ""

    @property
    def ref(self) -> str:
        """What names the pack in a namespace: its id, after its writer folder if it has one."""
        return self.base + self.pack_id

    @property
    def size(self) -> int:
        return max((e.offset + e.size for e in self.entries), default=0)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "format": INDEX_FORMAT,
                "pack": self.pack_id,
                "namespace": self.namespace.describe(),
                "created_at": self.created_at,
                "writer": self.writer,
                "training_job": self.training_job,
                "model": self.model,
                "entries": [[e.name, e.offset, e.size, e.sha256] for e in self.entries],
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes, pack_id: str, namespace: Namespace) -> PackIndex:
        """Read an index; anything wrong in it (an unsafe name, overlapping ranges, another namespace)
        refuses the whole pack."""
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT or data.get("pack") != pack_id:
            raise ValueError(f"pack {pack_id}: not an index of format {INDEX_FORMAT} for this pack")
        if data.get("namespace") != namespace.describe():
            raise ValueError(f"pack {pack_id}: its index names another namespace")
        entries = []
        end = 0
        for item in data.get("entries", []):
            name, offset, size, digest = item
            if not isinstance(name, str) or not is_entry_name(check_name(name, f"pack {pack_id}: entry")):
                raise UnsafeNameError(f"pack {pack_id}: refused entry name {name!r}")
            if not (isinstance(offset, int) and isinstance(size, int) and offset >= end and size > 0):
                raise ValueError(f"pack {pack_id}: entry {name} has a bad range")
            if not re.match(r"^[0-9a-f]{64}$", str(digest)):
                raise ValueError(f"pack {pack_id}: entry {name} has no SHA-256")
            end = offset + size
            entries.append(IndexEntry(str(name), offset, size, str(digest)))
        return cls(
            pack_id,
            namespace,
            entries,
            created_at=str(data.get("created_at", "")),
            writer=str(data.get("writer", "")),
            training_job=data.get("training_job"),
            model=data.get("model"),
        )


def writer_base(path: str) -> tuple[str, str | None]:
    """(the `writers/<writer>/` folder a path is in, or "", that writer or None). Only S3 keys are read
    this way: on S3 the folder is what IAM lets a team write; on the Hub anyone could name any folder."""
    from sagequeue.job.s3 import WRITERS_DIR

    parts = path.split("/", 2)
    if len(parts) == 3 and parts[0] == WRITERS_DIR:
        try:
            return f"{parts[0]}/{check_writer(parts[1])}/", parts[1]
        except ValueError:
            return "", None
    return "", None


def split_ref(ref: str) -> tuple[str, str]:
    """A pack's reference (`<pack id>` or `writers/<writer>/<pack id>`) as (its writer folder, its id)."""
    folder, _, pack_id = ref.rpartition("/")
    base = folder + "/" if folder else ""
    if base and writer_base(ref)[0] != base:
        raise ValueError(f"not a pack reference: {ref!r} (a pack id, or writers/<writer>/<pack id>)")
    if not _PACK_ID_RE.match(pack_id):
        raise ValueError(f"not a pack id: {pack_id!r}")
    return base, pack_id


def pack_paths(namespace: Namespace, ref: str) -> tuple[str, str]:
    """(pack, index) paths of the pack `ref` (see `split_ref`) of a namespace."""
    base, pack_id = split_ref(ref)
    stem = f"{base}{namespace.prefix}/{PACKS_DIR}/{pack_id}"
    return stem + PACK_SUFFIX, stem + INDEX_SUFFIX


def namespaces(store: PackStore) -> dict[Namespace, dict[str, int]]:
    """Every namespace of the remote with its paths (relative to the cache root) and sizes."""
    out: dict[Namespace, dict[str, int]] = {}
    for path, size in store.namespace_paths(REMOTE_DIR).items():
        base, _ = writer_base(path)
        parts = path[len(base) :].split("/")
        if len(parts) < 3 or parts[0] != REMOTE_DIR:
            continue
        try:
            namespace = Namespace.parse(parts[1])
        except NamespaceError:
            continue
        out.setdefault(namespace, {})[path] = size
    return out


def read_indexes(
    store: PackStore,
    namespace: Namespace,
    listing: Mapping[str, int] | None = None,
    control: Deadline | None = None,
    workers: int = 16,
) -> tuple[list[PackIndex], dict[str, str]]:
    """(the namespace's readable indexes whose pack is there and long enough, in every writer's folder;
    pack reference -> why one was refused)."""
    paths = dict(listing) if listing is not None else store.namespace_paths(namespace.prefix)
    if control is not None:
        control.touch()
    refs = sorted(r for r in (pack_ref(namespace, p, INDEX_SUFFIX) for p in paths) if r is not None)
    problems: dict[str, str] = {}

    def read(ref: str) -> PackIndex | None:
        if control is not None and control.cancel.is_set():
            raise Cancelled("restore called off")
        base, pack_id = split_ref(ref)
        pack_path, index_path = pack_paths(namespace, ref)
        try:
            index = PackIndex.from_json(store.read_bytes(index_path), pack_id, namespace)
        except (ValueError, TypeError, KeyError) as exc:
            problems[ref] = str(exc)
            return None
        finally:
            if control is not None:
                control.touch()
        index.base = base
        if paths.get(pack_path, -1) < index.size:
            problems[ref] = f"pack {ref}: its pack file is missing or shorter than its index says"
            return None
        return index

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        indexes = [i for i in pool.map(read, refs) if i is not None]
    indexes.sort(key=lambda i: (i.created_at, i.ref))
    return indexes, problems


def pack_ref(namespace: Namespace, path: str, suffix: str) -> str | None:
    """The reference of the pack whose file (ending in `suffix`) `path` is, else None."""
    base, _ = writer_base(path)
    rest = path[len(base) :]
    prefix = f"{namespace.prefix}/{PACKS_DIR}/"
    if not (rest.startswith(prefix) and rest.endswith(suffix)):
        return None
    pack_id = rest[len(prefix) : -len(suffix)]
    return base + pack_id if _PACK_ID_RE.match(pack_id) else None


def trusted(
    store: PackStore, namespace: Namespace, indexes: Sequence[PackIndex], trust: Trust | None
) -> tuple[list[PackIndex], dict[str, str]]:
    """(the packs of writers `trust` allows, pack reference -> the writer of each other one or "unknown").
    The writer is the storage's (`PackStore.writers`), never what an index says of itself."""
    if trust is None or not trust.restricted or not indexes:
        return list(indexes), {}
    writers = store.writers([pack_paths(namespace, i.ref)[1] for i in indexes])
    kept: list[PackIndex] = []
    untrusted: dict[str, str] = {}
    for index in indexes:
        writer = writers.get(pack_paths(namespace, index.ref)[1])
        if trust.allows(writer):
            kept.append(index)
        else:
            untrusted[index.ref] = writer or "unknown"
    return kept, untrusted


def remote_entries(indexes: Sequence[PackIndex]) -> dict[str, tuple[PackIndex, IndexEntry]]:
    """Name -> where it is; the earliest pack holding a name serves it."""
    out: dict[str, tuple[PackIndex, IndexEntry]] = {}
    for index in indexes:
        for entry in index.entries:
            out.setdefault(entry.name, (index, entry))
    return out


# --- restore ---------------------------------------------------------------------------------------------------


@dataclass
class RestoreReport:
    namespace: str
    remote_entries: int = 0
    restored: list[str] = field(default_factory=list)
    already_local: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    refused_packs: dict[str, str] = field(default_factory=dict)
    bytes_downloaded: int = 0
    over_budget: list[str] = field(default_factory=list)
    requests: int = 0
    stopped: str | None = None
    #: Packs left out because their writer is not one the job trusts (pack reference -> writer or "unknown").
    untrusted: dict[str, str] = field(default_factory=dict)


@dataclass
class _Run:
    """Neighbouring wanted entries of one pack, fetched with one ranged GET."""

    pack_path: str
    entries: list[IndexEntry]

    @property
    def start(self) -> int:
        return self.entries[0].offset

    @property
    def end(self) -> int:
        return self.entries[-1].offset + self.entries[-1].size


def plan_runs(wanted: Sequence[tuple[str, IndexEntry]]) -> list[_Run]:
    """Group (pack path, entry) pairs into ranged reads: sorted by offset, a new read when the gap or the
    read's size grows too large. The order: each pack's largest read, then each pack's second largest, and
    so on (largest first within each round), so the parallel reads spread over the packs rather than queue
    on one object, and the tail of the restore is the small reads."""
    by_pack: dict[str, list[IndexEntry]] = {}
    for pack_path, entry in wanted:
        by_pack.setdefault(pack_path, []).append(entry)
    rounds: list[tuple[int, int, _Run]] = []
    for pack_path, entries in sorted(by_pack.items()):
        runs: list[_Run] = []
        current: list[IndexEntry] = []
        for entry in sorted(entries, key=lambda e: e.offset):
            if current:
                start = current[0].offset
                gap = entry.offset - (current[-1].offset + current[-1].size)
                if gap > GAP_BYTES or entry.offset + entry.size - start > RUN_BYTES:
                    runs.append(_Run(pack_path, current))
                    current = []
            current.append(entry)
        if current:
            runs.append(_Run(pack_path, current))
        runs.sort(key=lambda r: r.end - r.start, reverse=True)
        rounds += [(turn, -(run.end - run.start), run) for turn, run in enumerate(runs)]
    rounds.sort(key=lambda item: item[:2])
    return [run for _, _, run in rounds]


class _Installer:
    def __init__(self, root: Path, staging: Path, report: RestoreReport) -> None:
        self.root = root
        self.staging = staging
        self.report = report
        self.lock = threading.Lock()

    def install(self, entry: IndexEntry, part: Path) -> None:
        target = safe_target(self.root, entry.name)
        target.parent.mkdir(parents=True, exist_ok=True)
        safe_target(self.root, entry.name)  # a link made while we created the directories
        try:
            present = target.stat().st_size > 0
        except FileNotFoundError:
            present = False
        if present:
            # the job's compiler (or another restore) wrote it meanwhile: same key, keep theirs
            part.unlink(missing_ok=True)
            return
        os.replace(part, target)
        with self.lock:
            self.report.restored.append(entry.name)


def _fetch_run(store: PackStore, run: _Run, installer: _Installer, guard: Any) -> None:
    """One ranged GET; each entry streams into its own staging file, is checked and installed."""
    pending = list(run.entries)
    last: Exception | None = None
    for _ in range(ATTEMPTS):
        guard.check()
        if not pending:
            return
        current = _Run(run.pack_path, pending)
        try:
            _stream_run(store, current, installer, guard, pending)
            return
        except Cancelled:
            raise
        except Exception as exc:  # noqa: BLE001 - retried from the first entry not yet installed
            guard.failed(exc)
            last = exc
    for entry in pending:
        installer.report.failed[entry.name] = str(last)


def _stream_run(
    store: PackStore, run: _Run, installer: _Installer, guard: Any, pending: list[IndexEntry]
) -> None:
    position = run.start
    queue = list(run.entries)
    out: Any = None
    part: Path | None = None
    hasher: Any = None
    with installer.lock:
        installer.report.requests += 1
    try:
        with store.open_range(run.pack_path, run.start, run.end) as chunks:
            for chunk in chunks:
                guard.wrote(len(chunk))
                with installer.lock:
                    installer.report.bytes_downloaded += len(chunk)
                view = memoryview(chunk)
                i = 0
                while i < len(view) and queue:
                    entry = queue[0]
                    if position < entry.offset:
                        skip = min(entry.offset - position, len(view) - i)
                        i += skip
                        position += skip
                        continue
                    if out is None:
                        part = installer.staging / f"{uuid.uuid4().hex}.part"
                        out = part.open("wb")
                        hasher = hashlib.sha256()
                    take = min(entry.offset + entry.size - position, len(view) - i)
                    out.write(view[i : i + take])
                    hasher.update(view[i : i + take])
                    i += take
                    position += take
                    if position == entry.offset + entry.size:
                        out.close()
                        out = None
                        queue.pop(0)
                        assert part is not None
                        if hasher.hexdigest() != entry.sha256:
                            part.unlink(missing_ok=True)
                            installer.report.failed[entry.name] = "checksum mismatch"
                        else:
                            try:
                                installer.install(entry, part)
                            except UnsafeNameError as exc:
                                part.unlink(missing_ok=True)
                                installer.report.failed[entry.name] = str(exc)
                        pending.remove(entry)
    finally:
        if out is not None:
            out.close()
            if part is not None:
                part.unlink(missing_ok=True)
    if queue:
        raise RemoteCacheError(f"{run.pack_path}: the read ended {run.end - position} bytes early")


def restore(
    store: PackStore,
    root: Path,
    namespace: Namespace,
    *,
    workers: int = 16,
    control: Deadline | None = None,
    min_free_bytes: int = 0,
    max_bytes: int | None = None,
    trust: Trust | None = None,
) -> RestoreReport:
    """Bring the remote entries of exactly `namespace` that `root` lacks into `root`, from the packs of the
    writers `trust` allows (None: any writer)."""
    from sagequeue.job import sync  # the shared guard: cancel flag, disk floor, activity

    control = control or Deadline(None)
    report = RestoreReport(namespace.name)
    try:
        indexes, report.refused_packs = read_indexes(store, namespace, control=control, workers=workers)
    except Cancelled as exc:
        report.stopped = str(exc)
        return report
    for pack_id, why in report.refused_packs.items():
        log.warning("ignoring pack %s: %s", pack_id, why)
    try:
        indexes, report.untrusted = trusted(store, namespace, indexes, trust)
    except Cancelled as exc:
        report.stopped = str(exc)
        return report
    if report.untrusted and trust is not None:
        log.warning(
            "not restoring %d packs of writers this job does not trust (it trusts %s): %s",
            len(report.untrusted),
            trust.describe(),
            ", ".join(f"{k} by {w}" for k, w in sorted(report.untrusted.items())[:10]),
        )
    available = remote_entries(indexes)
    report.remote_entries = len(available)
    local = local_entries(root)
    report.already_local = sum(1 for name in available if name in local)
    missing = sorted(
        ((index, entry) for name, (index, entry) in available.items() if name not in local),
        key=lambda pair: pair[1].size,
    )
    staging = sync.staging_dir(root)
    allowance = sync.free_bytes(root) - min_free_bytes if min_free_bytes else None
    limits = [b for b in (max_bytes, allowance) if b is not None]
    budget = min(limits) if limits else None
    chosen: list[tuple[str, IndexEntry]] = []
    used = 0
    for index, entry in missing:
        if budget is not None and used + entry.size > budget:
            report.over_budget.append(entry.name)
            continue
        used += entry.size
        chosen.append((pack_paths(namespace, index.ref)[0], entry))
    if not chosen:
        return report
    staging.mkdir(parents=True, exist_ok=True)
    guard = sync._Guard(control, staging, min_free_bytes)
    installer = _Installer(root, staging, report)
    runs = plan_runs(chosen)
    try:
        with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="tnx-restore") as pool:
            futures = [pool.submit(_fetch_run, store, run, installer, guard) for run in runs]
            for future in as_completed(futures):
                try:
                    future.result()
                except Cancelled as exc:
                    report.stopped = report.stopped or str(exc)
                    control.cancel.set()
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report


# --- upload ------------------------------------------------------------------------------------------------------


@dataclass
class UploadReport:
    namespace: str
    published: list[str] = field(default_factory=list)
    already_present: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    packs: list[str] = field(default_factory=list)
    bytes_uploaded: int = 0


def _build_pack(root: Path, names: Sequence[str], target: Path) -> list[IndexEntry]:
    """Concatenate entries into `target`; an entry that vanished or is empty is left out."""
    entries: list[IndexEntry] = []
    offset = 0
    with target.open("wb") as out:
        for name in names:
            path = root / name
            if path.is_symlink():
                continue
            digest = hashlib.sha256()
            size = 0
            try:
                with path.open("rb") as stream:
                    while block := stream.read(_READ):
                        out.write(block)
                        digest.update(block)
                        size += len(block)
            except OSError:
                out.truncate(offset)
                out.seek(offset)
                continue
            if size == 0:
                continue
            entries.append(IndexEntry(name, offset, size, digest.hexdigest()))
            offset += size
    return entries


def upload(
    store: PackStore,
    root: Path,
    namespace: Namespace,
    *,
    deadline: Deadline | None = None,
    only: Iterable[str] | None = None,
    training_job: str | None = None,
    model: str | None = None,
    pack_bytes: int = PACK_BYTES,
    trust: Trust | None = None,
) -> UploadReport:
    """Publish the complete local entries the namespace lacks, smallest first, in packs under the store's
    writer folder; a pack becomes visible whole or not at all, so a deadline that cuts the upload leaves
    only whole packs behind. An entry only untrusted writers (by `trust`) hold counts as lacking: the
    jobs that trust this one would not restore theirs."""
    deadline = deadline or Deadline(None)
    report = UploadReport(namespace.name)
    local = local_entries(root)
    if only is not None:
        wanted = set(only)
        local = {n: s for n, s in local.items() if n in wanted}
    if not local:
        return report
    indexes, _ = read_indexes(store, namespace, control=deadline)
    indexes, _ = trusted(store, namespace, indexes, trust)
    deadline.touch()
    present = remote_entries(indexes)
    report.already_present = sorted(n for n in local if n in present)
    new = sorted((n for n in local if n not in present), key=lambda n: (local[n], n))
    batches: list[list[str]] = []
    size = 0
    for name in new:
        if not batches or size + local[name] > pack_bytes:
            batches.append([])
            size = 0
        batches[-1].append(name)
        size += local[name]
    from sagequeue.job import sync

    work = sync.staging_dir(root).with_name(sync.staging_dir(root).name + "-packs")
    work.mkdir(parents=True, exist_ok=True)
    try:
        for position, batch in enumerate(batches):
            if deadline.expired():
                report.skipped += [n for b in batches[position:] for n in b]
                break
            pack_id = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:12]}"
            pack_file = work / f"{pack_id}{PACK_SUFFIX}"
            entries = _build_pack(root, batch, pack_file)
            if not entries:
                pack_file.unlink(missing_ok=True)
                continue
            index = PackIndex(pack_id, namespace, entries, training_job=training_job, model=model)
            pack_path, index_path = pack_paths(namespace, store.base + pack_id)
            if store.put_pack(pack_path, pack_file, index_path, index.to_json(), deadline.touch):
                report.published += [e.name for e in entries]
                report.packs.append(store.base + pack_id)
                report.bytes_uploaded += index.size
            pack_file.unlink(missing_ok=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report


# --- verify, prune, remove ------------------------------------------------------------------------------------


def verify(
    store: PackStore,
    namespace: Namespace,
    workers: int = 16,
    trust: Trust | None = None,
    untrusted: dict[str, str] | None = None,
) -> dict[str, str]:
    """Pack reference -> what is wrong with it: an unreadable index, a missing or short pack, an entry whose
    bytes do not match its checksum. With a restricting `trust`, the packs of other writers go into
    `untrusted` (reference -> writer or "unknown")."""
    listing = store.namespace_paths(namespace.prefix)
    indexes, problems = read_indexes(store, namespace, listing, workers=workers)
    indexed = {i.ref for i in indexes} | set(problems)
    for path in listing:
        ref = pack_ref(namespace, path, PACK_SUFFIX)
        if ref is not None and ref not in indexed:
            problems[ref] = "a pack no index names (an upload cut short)"
    if untrusted is not None:
        untrusted.update(trusted(store, namespace, indexes, trust)[1])

    def check(index: PackIndex) -> tuple[str, str | None]:
        pack_path = pack_paths(namespace, index.ref)[0]
        entries = iter(index.entries)
        entry = next(entries, None)
        position = 0
        digest = hashlib.sha256()
        with store.open_range(pack_path, 0, index.size) as chunks:
            for chunk in chunks:
                view = memoryview(chunk)
                i = 0
                while i < len(view) and entry is not None:
                    if position < entry.offset:
                        skip = min(entry.offset - position, len(view) - i)
                        i += skip
                        position += skip
                        continue
                    take = min(entry.offset + entry.size - position, len(view) - i)
                    digest.update(view[i : i + take])
                    i += take
                    position += take
                    if position == entry.offset + entry.size:
                        if digest.hexdigest() != entry.sha256:
                            return index.ref, f"entry {entry.name}: checksum mismatch"
                        digest = hashlib.sha256()
                        entry = next(entries, None)
        return index.ref, None if entry is None else "the pack ends early"

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for pack_id, problem in pool.map(check, indexes):
            if problem:
                problems[pack_id] = problem
    return problems


def remove_packs(store: PackStore, namespace: Namespace, pack_ids: Sequence[str]) -> None:
    """Indexes first (the packs become invisible), then the packs. `pack_ids` are references (`split_ref`)."""
    paths = [pack_paths(namespace, p) for p in pack_ids]
    store.delete([index for _, index in paths])
    store.delete([pack for pack, _ in paths])


def pack_times(indexes: Sequence[PackIndex]) -> dict[str, float]:
    out = {}
    for index in indexes:
        try:
            out[index.ref] = datetime.fromisoformat(index.created_at).timestamp()
        except ValueError:
            out[index.ref] = 0.0
    return out
