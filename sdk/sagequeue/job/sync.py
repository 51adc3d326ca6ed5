"""Restore a local compile cache from a remote one, and publish what a job compiled.

Restore downloads only complete remote entries that are not complete locally, many files at a time, into
a staging directory beside the cache root (outside it, so a tool that syncs the whole cache folder never
sees a `.part` file): each file is resumed from where an earlier attempt stopped, checked
against the checksum the remote recorded, and an entry is moved into the cache (one rename) only when all
its files are good. The compiler therefore never sees half an entry, and an entry a compiler is writing
right now (it holds a lock) is left alone.

A restore keeps a free-space floor (checked before it starts and every few MB while it writes), and can be
capped in bytes: what does not fit is left for the job to compile. On ENOSPC or below the floor it stops
and removes its staging directory, so the training's own compile finds the room. It can be called off at
any time (`Deadline.cancel`): every chunk checks the flag, and queued downloads never start.

Upload sends only complete entries (NEFF and done marker written, no lock, no failure log) that the remote
lacks, and removes failed entries from the local cache instead of sharing them.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sagequeue.job import neuron
from sagequeue.job.names import UnsafeNameError, check_name, path_inside
from sagequeue.job.remote import (
    OPTIMUM_REGISTRY_DIR,
    SDK_ORIGIN,
    Cancelled,
    Deadline,
    IntegrityError,
    PublishResult,
    RegistryRecord,
    RemoteCache,
    RemoteCacheError,
    RemoteEntry,
    RemoteFile,
    Trust,
    optimum_record_path,
)

log = logging.getLogger(__name__)

STAGING_DIR = ".sagequeue-staging"
PART_SUFFIX = ".part"
LEDGER_SUFFIX = ".ranges"
#: Files at least this large are fetched as ranges in parallel (the NEFFs of big graphs, hundreds of MB).
SPLIT_SIZE = 64 * 1024 * 1024
RANGE_SIZE = 16 * 1024 * 1024
_READ = 1024 * 1024
#: Attempts per file; each one resumes where the previous stopped.
FILE_ATTEMPTS = 3
#: Free space is measured again after this many bytes written.
SPACE_CHECK_BYTES = 4 * 1024 * 1024


def staging_dir(root: Path) -> Path:
    """Where restores stage files: beside the cache root, on the same file system (one rename installs)."""
    beside = root.parent / f".{root.name}{STAGING_DIR}"
    try:
        same = os.stat(root).st_dev == os.stat(root.parent).st_dev
    except OSError:
        same = True
    # a cache root that is a mount point of its own: renames cannot leave it, stage inside
    return beside if same else root / STAGING_DIR


class DiskFloorError(Cancelled):
    """The disk is full, or free space fell below the floor kept for the job's own compile."""


class _Guard:
    """Per-chunk checks shared by every download of one restore: cancel flag, activity, free space."""

    def __init__(self, control: Deadline, staging: Path, min_free: int) -> None:
        self.control = control
        self.staging = staging
        self.min_free = min_free
        self._lock = threading.Lock()
        self._unchecked = 0
        self.problem: str | None = None

    def check(self) -> None:
        if self.control.cancel.is_set():
            raise DiskFloorError(self.problem) if self.problem else Cancelled("restore called off")

    def wrote(self, size: int) -> None:
        self.control.touch()
        self.check()
        with self._lock:
            self._unchecked += size
            due = self._unchecked >= SPACE_CHECK_BYTES
            if due:
                self._unchecked = 0
        if due and self.min_free and free_bytes(self.staging) < self.min_free:
            self.stop(f"free space below the floor of {self.min_free} bytes")

    def stop(self, problem: str) -> None:
        with self._lock:
            self.problem = self.problem or problem
        self.control.cancel.set()
        raise DiskFloorError(problem)

    def failed(self, exc: BaseException) -> None:
        """Turn the end of the disk into a stop of the whole restore; other errors stay per file."""
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            self.stop(f"the disk is full ({exc.strerror})")
        if isinstance(exc, Cancelled):
            raise exc


def free_bytes(path: Path) -> int:
    """Free space on the file system of `path` (or of its nearest existing parent)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


@dataclass
class RestoreReport:
    version: str
    remote_entries: int = 0
    restored: list[str] = field(default_factory=list)
    already_local: list[str] = field(default_factory=list)
    #: Entries a compiler is writing right now: never overwritten.
    busy: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    bytes_downloaded: int = 0
    #: Entries left for the job to compile: over --restore-max-bytes or the free-space floor.
    over_budget: list[str] = field(default_factory=list)
    #: Why the restore stopped early (called off, disk full, below the floor), or None.
    stopped: str | None = None
    #: Entries refused because a name in them would write outside the cache (entry key -> the name).
    refused: dict[str, str] = field(default_factory=dict)
    #: Entries left out because their writer is not one the job trusts (entry key -> writer or "unknown").
    untrusted: dict[str, str] = field(default_factory=dict)


class _Hasher:
    """SHA-256, or the git blob SHA-1 the Hub records for files kept in git, or the MD5 of S3's ETag (a
    file the Neuron SDK wrote in one part); a file the SDK wrote in parts is checked by size alone. Its
    SHA-256 is measured whatever the recorded checksum (`sha256()`), for adopting the SDK's entries."""

    def __init__(self, file: RemoteFile) -> None:
        self.file = file
        self._sha256 = hashlib.sha256()
        self._digest: Any = None
        self._expected = file.sha256 or file.git_sha1 or file.md5
        if file.sha256:
            self._digest = self._sha256
        elif file.git_sha1:
            self._digest = hashlib.sha1(usedforsecurity=False)
            self._digest.update(b"blob %d\x00" % file.size)
        elif file.md5:
            self._digest = hashlib.md5(usedforsecurity=False)
        elif not file.size_only:
            raise IntegrityError(f"the remote recorded no checksum for {file.name}")

    def update(self, data: bytes) -> None:
        self._sha256.update(data)
        if self._digest is not None and self._digest is not self._sha256:
            self._digest.update(data)

    def matches(self) -> bool:
        # size_only: the caller compares the size, which is all there is to compare
        return self._digest is None or self._digest.hexdigest() == self._expected

    def sha256(self) -> str:
        return self._sha256.hexdigest()


def _progress(total: int, enabled: bool, description: str) -> Any:
    from tqdm import tqdm  # the [job] extra: imported here so `sagequeue cache --help` runs without it

    interactive = sys.stderr.isatty()
    # In CloudWatch logs a bar redrawn many times a second is noise: fewer, longer-spaced updates.
    return tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=description,
        disable=not enabled,
        mininterval=0.2 if interactive else 15.0,
        dynamic_ncols=interactive,
    )


class _Download:
    """One file into staging: a single resumable stream, or ranges fetched in parallel for large files."""

    def __init__(
        self, remote: RemoteCache, entry: RemoteEntry, file: RemoteFile, staging: Path, guard: _Guard
    ) -> None:
        self.remote = remote
        self.guard = guard
        self.entry = entry
        self.file = file
        # the name came from the remote: refused when it, or a link on its way, leads out of staging
        self.target = path_inside(staging, file.name, f"{entry.key}: file")
        self.part = self.target.with_name(self.target.name + PART_SUFFIX)
        #: Large files: indices of the ranges already written into .part, one per line.
        self.ledger = self.target.with_name(self.target.name + LEDGER_SUFFIX)
        self.ranged = file.size >= SPLIT_SIZE
        self._ledger_lock = threading.Lock()

    @property
    def label(self) -> str:
        return f"{self.entry.key}/{self.file.name}"

    def already_staged(self) -> bool:
        return self.target.exists() and self._verify(self.target)

    def run(self, advance: Callable[[int], None]) -> int:
        """Download (or resume) the file into staging; returns the bytes fetched over the network."""
        self.target.parent.mkdir(parents=True, exist_ok=True)
        fetched = 0
        last_error: Exception | None = None
        for _ in range(FILE_ATTEMPTS):
            self.guard.check()
            try:
                fetched += self._attempt(advance)
                return fetched
            except (Cancelled, OSError) as exc:
                self.guard.failed(exc)
                last_error = exc
            except IntegrityError as exc:
                # corrupt bytes are not resumable: start over
                self.part.unlink(missing_ok=True)
                last_error = exc
            except Exception as exc:  # noqa: BLE001 - HTTP client errors differ by backend; the attempt resumes
                last_error = exc
        raise RemoteCacheError(f"{self.label}: {last_error}") from last_error

    def _attempt(self, advance: Callable[[int], None]) -> int:
        hasher = _Hasher(self.file)
        offset = self.part.stat().st_size if self.part.exists() else 0
        if offset > self.file.size:
            self.part.unlink()
            offset = 0
        if offset:
            with self.part.open("rb") as stream:
                while block := stream.read(_READ):
                    hasher.update(block)
            advance(offset)
        fetched = 0
        try:
            if offset < self.file.size or self.file.size == 0:
                with (
                    self.remote.open_file(self.entry, self.file, offset) as chunks,
                    self.part.open("ab") as out,
                ):
                    for chunk in chunks:
                        out.write(chunk)
                        hasher.update(chunk)
                        fetched += len(chunk)
                        advance(len(chunk))
                        self.guard.wrote(len(chunk))
        except BaseException:
            advance(-(offset + fetched))  # the next attempt counts again what it re-reads
            raise
        size = self.part.stat().st_size
        if size != self.file.size:
            advance(-size)
            raise RemoteCacheError(
                f"{self.file.name}: got {size} bytes, the remote recorded {self.file.size}"
            )
        if not hasher.matches():
            advance(-size)
            raise IntegrityError(f"{self.label}: checksum mismatch")
        os.replace(self.part, self.target)
        return fetched

    # --- large files: ranges in parallel ---------------------------------------------------------------

    def pending_ranges(self, advance: Callable[[int], None]) -> list[int]:
        """Range indices still to fetch; prepares .part at full size and counts what earlier runs wrote."""
        self.target.parent.mkdir(parents=True, exist_ok=True)
        count = -(-self.file.size // RANGE_SIZE)
        done: set[int] = set()
        if self.part.exists() and self.ledger.exists() and self.part.stat().st_size == self.file.size:
            done = {int(line) for line in self.ledger.read_text().split() if line.isdigit()}
        else:
            self.ledger.unlink(missing_ok=True)
            with self.part.open("wb") as out:
                out.truncate(self.file.size)
        for index in done:
            advance(self._bounds(index)[1] - self._bounds(index)[0])
        return [i for i in range(count) if i not in done]

    def _bounds(self, index: int) -> tuple[int, int]:
        start = index * RANGE_SIZE
        return start, min(self.file.size, start + RANGE_SIZE)

    def fetch_range(self, index: int, advance: Callable[[int], None]) -> int:
        start, end = self._bounds(index)
        last_error: Exception | None = None
        for _ in range(FILE_ATTEMPTS):
            self.guard.check()
            written = 0
            try:
                with (
                    self.remote.open_file(self.entry, self.file, start, end) as chunks,
                    self.part.open("r+b") as out,
                ):
                    out.seek(start)
                    for chunk in chunks:
                        out.write(chunk)
                        written += len(chunk)
                        advance(len(chunk))
                        self.guard.wrote(len(chunk))
                if written != end - start:
                    raise RemoteCacheError(f"{self.label}: range {start}-{end} returned {written} bytes")
                with self._ledger_lock, self.ledger.open("a") as ledger:
                    ledger.write(f"{index}\n")
                return written
            except Exception as exc:  # noqa: BLE001 - retried; the last error is reported
                advance(-written)
                self.guard.failed(exc)
                last_error = exc
        raise RemoteCacheError(f"{self.label}: {last_error}") from last_error

    def finish_ranges(self) -> None:
        if not self._verify(self.part):
            self.part.unlink(missing_ok=True)
            self.ledger.unlink(missing_ok=True)
            raise IntegrityError(f"{self.label}: checksum mismatch")
        os.replace(self.part, self.target)
        self.ledger.unlink(missing_ok=True)

    def _verify(self, path: Path) -> bool:
        if path.stat().st_size != self.file.size:
            return False
        hasher = _Hasher(self.file)
        with path.open("rb") as stream:
            while block := stream.read(_READ):
                hasher.update(block)
        return hasher.matches()


def _install(staging: Path, target: Path) -> bool:
    """Move a fully downloaded entry into the cache unless a compiler produced or holds it meanwhile."""
    if target.exists():
        state = neuron.entry_state(target)
        if state in (neuron.EntryState.COMPLETE, neuron.EntryState.LOCKED):
            shutil.rmtree(staging, ignore_errors=True)
            return False
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staging, target)
    return True


def restore(
    remote: RemoteCache,
    root: Path,
    version: str,
    modules: Iterable[str] | None = None,
    *,
    workers: int = 16,
    progress: bool = True,
    control: Deadline | None = None,
    min_free_bytes: int = 0,
    max_bytes: int | None = None,
    trust: Trust | None = None,
) -> RestoreReport:
    """Bring the remote's complete entries of `version` (or only `modules`) into the local cache `root`.

    `control.cancel` calls the restore off (each download stops at its next chunk, queued ones never
    start); `control.touch()` is called on every answer and chunk. At most `max_bytes` are fetched, and
    never so much that less than `min_free_bytes` would stay free. Only entries of the writers `trust`
    names are restored (None: any writer).
    """
    control = control or Deadline(None)
    report = RestoreReport(version)
    available = remote.entries(version)
    control.touch()
    wanted = set(modules) if modules is not None else None
    if wanted is not None:
        available = {m: e for m, e in available.items() if m in wanted}
    report.remote_entries = len(available)
    local = {e.module: e for e in neuron.scan(root, version)}
    todo: list[RemoteEntry] = []
    for module, entry in sorted(available.items()):
        state = local[module].state if module in local else None
        if state is neuron.EntryState.COMPLETE:
            report.already_local.append(entry.key)
        elif state is neuron.EntryState.LOCKED:
            report.busy.append(entry.key)
        else:
            todo.append(entry)
    if todo and trust is not None and trust.restricted:
        todo = _trusted(remote, version, todo, trust, report)
        control.touch()
    if not todo or control.cancel.is_set():
        return report
    staging_top = staging_dir(root)
    staging_root = staging_top / neuron.version_dir(version)
    guard = _Guard(control, staging_top, min_free_bytes)
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="neff-restore")
    try:
        # S3 keeps checksums in per-entry manifests: fetch those in parallel too.
        described = dict(
            zip(
                [e.module for e in todo],
                pool.map(_describe(remote, control), todo),
                strict=True,
            )
        )
        ready: dict[str, tuple[RemoteFile, ...]] = {}
        for module, answer in described.items():
            if isinstance(answer, UnsafeNameError):
                _refuse(report, neuron.entry_key(version, module), answer)
            elif isinstance(answer, Exception):
                report.failed[neuron.entry_key(version, module)] = str(answer)
            else:
                ready[module] = answer
        ready = _within_budget(ready, version, staging_top, min_free_bytes, max_bytes, report)
        if control.cancel.is_set():
            report.stopped = "called off"
            return report
        _download_all(remote, root, version, ready, todo, staging_root, guard, pool, progress, report)
    finally:
        # queued downloads never start once the restore is over or called off
        pool.shutdown(wait=not control.cancel.is_set(), cancel_futures=True)
    if guard.problem is not None:
        report.stopped = guard.problem
        # the training's own compile needs the room more than a resumable half download does
        shutil.rmtree(staging_top, ignore_errors=True)
        log.warning("restore stopped: %s; staging removed, the job compiles the rest", guard.problem)
    elif control.cancel.is_set():
        report.stopped = "called off"
    else:
        _remove_empty_dirs(staging_top)
    for key, problem in report.failed.items():
        if report.stopped is None:
            log.warning("could not restore %s: %s", key, problem)
    return report


def _trusted(
    remote: RemoteCache, version: str, todo: list[RemoteEntry], trust: Trust, report: RestoreReport
) -> list[RemoteEntry]:
    writers = remote.writers(version, [e.module for e in todo])
    kept = []
    for entry in todo:
        writer = writers.get(entry.module)
        if trust.allows(writer):
            kept.append(entry)
        else:
            report.untrusted[entry.key] = writer or "unknown"
    if report.untrusted:
        log.warning(
            "not restoring %d entries of writers this job does not trust (it trusts %s): %s",
            len(report.untrusted),
            trust.describe(),
            ", ".join(f"{k} by {w}" for k, w in sorted(report.untrusted.items())[:10]),
        )
    return kept


def _refuse(report: RestoreReport, key: str, problem: UnsafeNameError) -> None:
    report.refused[key] = str(problem)
    log.warning("refusing the remote entry %s: %s (nothing of it is written)", key, problem)


def checked_files(entry: RemoteEntry, files: Sequence[RemoteFile]) -> tuple[RemoteFile, ...]:
    """`files` when every name is a safe relative path inside the entry, else UnsafeNameError naming it."""
    for file in files:
        check_name(file.name, f"{entry.key}: file")
    return tuple(files)


def _remove_empty_dirs(top: Path) -> None:
    """Remove `top` and its subdirectories when they hold no file (partial downloads stay for a resume)."""
    if not top.is_dir():
        return
    for path in sorted(top.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_dir():
            with contextlib.suppress(OSError):
                path.rmdir()
    with contextlib.suppress(OSError):
        top.rmdir()


def _within_budget(
    ready: dict[str, tuple[RemoteFile, ...]],
    version: str,
    staging: Path,
    min_free_bytes: int,
    max_bytes: int | None,
    report: RestoreReport,
) -> dict[str, tuple[RemoteFile, ...]]:
    """The entries that fit under `max_bytes` and above the free-space floor, smallest first."""
    budget = float("inf") if max_bytes is None else float(max_bytes)
    if min_free_bytes:
        budget = min(budget, float(free_bytes(staging) - min_free_bytes))
    if budget == float("inf"):
        return ready
    kept: dict[str, tuple[RemoteFile, ...]] = {}
    used = 0
    for module, files in sorted(ready.items(), key=lambda item: (sum(f.size for f in item[1]), item[0])):
        size = sum(f.size for f in files)
        if used + size <= budget:
            kept[module] = files
            used += size
        else:
            report.over_budget.append(neuron.entry_key(version, module))
    if report.over_budget:
        log.info(
            "restoring %d entries (%d bytes); %d more do not fit (--restore-max-bytes %s, free-space floor %d bytes)",
            len(kept),
            used,
            len(report.over_budget),
            "none" if max_bytes is None else max_bytes,
            min_free_bytes,
        )
    return kept


def _download_all(
    remote: RemoteCache,
    root: Path,
    version: str,
    ready: dict[str, tuple[RemoteFile, ...]],
    todo: list[RemoteEntry],
    staging_root: Path,
    guard: _Guard,
    pool: ThreadPoolExecutor,
    progress: bool,
    report: RestoreReport,
) -> None:
    total = sum(f.size for files in ready.values() for f in files)
    lock = threading.Lock()
    remaining = {m: len(files) for m, files in ready.items()}
    entry_of = {e.module: e for e in todo}
    with _progress(total, progress, f"restore {neuron.version_dir(version)}") as bar:

        def advance(n: int) -> None:
            with lock:
                bar.update(n)

        futures: dict[Any, tuple[str, _Download]] = {}
        ranges_left: dict[int, int] = {}

        def file_done(module: str) -> None:
            remaining[module] -= 1
            key = neuron.entry_key(version, module)
            if remaining[module] == 0 and key not in report.failed:
                if _install(staging_root / module, root / neuron.version_dir(version) / module):
                    report.restored.append(key)
                else:
                    report.busy.append(key)

        staged_already: list[str] = []
        for module, files in list(ready.items()):
            try:
                jobs = [_Download(remote, entry_of[module], f, staging_root / module, guard) for f in files]
            except UnsafeNameError as exc:
                _refuse(report, neuron.entry_key(version, module), exc)
                del remaining[module]
                continue
            for job in jobs:
                file = job.file
                if job.already_staged():
                    advance(file.size)
                    staged_already.append(module)
                elif job.ranged:
                    pending = job.pending_ranges(advance)
                    ranges_left[id(job)] = len(pending)
                    for index in pending:
                        futures[pool.submit(job.fetch_range, index, advance)] = (module, job)
                    if not pending:
                        futures[pool.submit(lambda: 0)] = (module, job)
                        ranges_left[id(job)] = 1
                else:
                    futures[pool.submit(job.run, advance)] = (module, job)
        for module in staged_already:
            file_done(module)
        for future in as_completed(futures):
            if guard.control.cancel.is_set():
                pool.shutdown(wait=False, cancel_futures=True)
                break
            module, job = futures[future]
            key = neuron.entry_key(version, module)
            try:
                report.bytes_downloaded += future.result()
            except Exception as exc:  # noqa: BLE001 - one bad entry must not stop the others
                report.failed.setdefault(key, str(exc))
            if job.ranged:
                ranges_left[id(job)] -= 1
                if ranges_left[id(job)] > 0:
                    continue
                if key not in report.failed:
                    try:
                        job.finish_ranges()
                    except IntegrityError as exc:
                        report.failed.setdefault(key, str(exc))
            file_done(module)


def _describe(
    remote: RemoteCache, control: Deadline
) -> Callable[[RemoteEntry], tuple[RemoteFile, ...] | Exception]:
    def describe(entry: RemoteEntry) -> tuple[RemoteFile, ...] | Exception:
        if control.cancel.is_set():
            return Cancelled("restore called off")
        try:
            files = checked_files(entry, entry.files if entry.verified else remote.verified_files(entry))
        except Exception as exc:  # noqa: BLE001 - reported per entry by the caller
            return exc
        control.touch()
        if any(f.name == neuron.FAILURE_LOG_FILE for f in files):
            return RemoteCacheError(
                f"{entry.key} holds {neuron.FAILURE_LOG_FILE}: a failed compile, not restored"
            )
        return files

    return describe


@dataclass
class UploadReport:
    version: str
    candidates: list[str] = field(default_factory=list)
    cleaned_failed: list[str] = field(default_factory=list)
    result: PublishResult = field(default_factory=PublishResult)


def shareable(root: Path, version: str) -> list[neuron.LocalEntry]:
    return [e for e in neuron.scan(root, version) if e.state is neuron.EntryState.COMPLETE]


def local_optimum_records(root: Path, version: str) -> dict[str, bytes]:
    """The record files optimum-neuron wrote into the local cache (`neuronxcc-<version>/0_REGISTRY/...`;
    its second copy of a record is a symbolic link, read through), by path from the cache root."""
    registry = root / neuron.version_dir(version) / OPTIMUM_REGISTRY_DIR
    found: dict[str, bytes] = {}
    if not registry.is_dir():
        return found
    inside = Path(os.path.realpath(registry))
    for path in sorted(registry.rglob("*.json")):
        relative = path.relative_to(root).as_posix()
        if optimum_record_path(relative) is None:
            continue
        if not Path(os.path.realpath(path)).is_relative_to(inside):
            continue  # a link out of the registry: its target's bytes are not a record to publish
        with contextlib.suppress(OSError):  # a dangling link, a file removed meanwhile
            found[relative] = path.read_bytes()
    return found


def upload(
    remote: RemoteCache,
    root: Path,
    version: str,
    *,
    records: Sequence[RegistryRecord] = (),
    only: Iterable[str] | None = None,
    deadline: Deadline | None = None,
) -> UploadReport:
    """Publish the complete local entries of `version` that the remote lacks, plus registry records."""
    report = UploadReport(version)
    report.cleaned_failed = [e.key for e in neuron.remove_failed(root, version)]
    local = shareable(root, version)
    if only is not None:
        keep = set(only)
        local = [e for e in local if e.module in keep]
    control = deadline or Deadline(None)
    present = set(remote.entries(version))
    control.touch()
    # smallest first: under a deadline, more entries make it
    new = sorted((e for e in local if e.module not in present), key=lambda e: e.size())
    report.candidates = [e.key for e in new]
    report.result.already_present = [e.key for e in local if e.module in present]
    # optimum-neuron's records go up as they are, with the entries compiled beside them
    foreign = local_optimum_records(root, version)
    if not new and not records and not foreign:
        return report
    published = remote.publish(new, records, control, foreign_records=foreign)
    published.already_present = sorted(set(published.already_present) | set(report.result.already_present))
    report.result = published
    return report


@dataclass
class VerifyReport:
    version: str
    checked: list[str] = field(default_factory=list)
    #: Entry key -> what is wrong (a file missing, of the wrong size, or with other bytes).
    broken: dict[str, str] = field(default_factory=dict)
    #: Entry key -> its writer ("unknown" when the cache cannot tell), for writers the trust list lacks.
    untrusted: dict[str, str] = field(default_factory=dict)
    #: Sound entries the Neuron SDK wrote without a manifest: entry key -> file name -> measured SHA-256.
    adoptable: dict[str, dict[str, str]] = field(default_factory=dict)


def verify(
    remote: RemoteCache, version: str, *, workers: int = 16, trust: Trust | None = None
) -> VerifyReport:
    """Download every file of every visible entry of `version` and check it against the recorded checksum.

    A broken entry is one no restore can install; deleting it (`remote.delete`) lets the next writer
    publish it again instead of skipping it as "already there".
    """
    report = VerifyReport(version)

    def check(entry: RemoteEntry) -> str | None:
        digests: dict[str, str] = {}
        try:
            files = checked_files(entry, entry.files if entry.verified else remote.verified_files(entry))
        except UnsafeNameError as exc:
            return f"refused: {exc}"
        try:
            for file in files:
                hasher = _Hasher(file)
                size = 0
                with remote.open_file(entry, file) as chunks:
                    for chunk in chunks:
                        hasher.update(chunk)
                        size += len(chunk)
                if size != file.size:
                    return f"{file.name}: {size} bytes, the manifest says {file.size}"
                if not hasher.matches():
                    return f"{file.name}: the bytes do not match the recorded checksum"
                digests[file.name] = hasher.sha256()
        except RemoteCacheError as exc:
            return str(exc)
        if entry.origin == SDK_ORIGIN:
            report.adoptable[entry.key] = digests
        return None

    entries = sorted(remote.entries(version).values(), key=lambda e: e.module)
    if trust is not None and trust.restricted and entries:
        writers = remote.writers(version, [e.module for e in entries])
        report.untrusted = {
            e.key: writers.get(e.module) or "unknown"
            for e in entries
            if not trust.allows(writers.get(e.module))
        }
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="neff-verify") as pool:
        for entry, problem in zip(entries, pool.map(check, entries), strict=True):
            report.checked.append(entry.key)
            if problem is not None:
                report.broken[entry.key] = problem
    return report
