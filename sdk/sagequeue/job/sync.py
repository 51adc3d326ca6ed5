"""Restore a local compile cache from a remote one, and publish what a job compiled.

Restore downloads only complete remote entries that are not complete locally, many files at a time, into
a staging directory beside the cache: each file is resumed from where an earlier attempt stopped, checked
against the checksum the remote recorded, and an entry is moved into the cache (one rename) only when all
its files are good. The compiler therefore never sees half an entry, and an entry a compiler is writing
right now (it holds a lock) is left alone.

Upload sends only complete entries (NEFF and done marker written, no lock, no failure log) that the remote
lacks, and removes failed entries from the local cache instead of sharing them.
"""

from __future__ import annotations

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

from tqdm import tqdm

from sagequeue.job import neuron
from sagequeue.job.remote import (
    Deadline,
    IntegrityError,
    PublishResult,
    RegistryRecord,
    RemoteCache,
    RemoteCacheError,
    RemoteEntry,
    RemoteFile,
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


class _Hasher:
    """SHA-256, or the git blob SHA-1 the Hub records for files kept in git."""

    def __init__(self, file: RemoteFile) -> None:
        self.file = file
        if file.sha256:
            self._digest = hashlib.sha256()
        elif file.git_sha1:
            self._digest = hashlib.sha1(usedforsecurity=False)
            self._digest.update(b"blob %d\x00" % file.size)
        else:
            raise IntegrityError(f"the remote recorded no checksum for {file.name}")

    def update(self, data: bytes) -> None:
        self._digest.update(data)

    def matches(self) -> bool:
        return self._digest.hexdigest() == (self.file.sha256 or self.file.git_sha1)


def _progress(total: int, enabled: bool, description: str) -> Any:
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

    def __init__(self, remote: RemoteCache, entry: RemoteEntry, file: RemoteFile, staging: Path) -> None:
        self.remote = remote
        self.entry = entry
        self.file = file
        self.target = staging / file.name
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
            try:
                fetched += self._attempt(advance)
                return fetched
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
                if written != end - start:
                    raise RemoteCacheError(f"{self.label}: range {start}-{end} returned {written} bytes")
                with self._ledger_lock, self.ledger.open("a") as ledger:
                    ledger.write(f"{index}\n")
                return written
            except Exception as exc:  # noqa: BLE001 - retried; the last error is reported
                advance(-written)
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
) -> RestoreReport:
    """Bring the remote's complete entries of `version` (or only `modules`) into the local cache `root`."""
    report = RestoreReport(version)
    available = remote.entries(version)
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
    if not todo:
        return report
    staging_root = root / STAGING_DIR / neuron.version_dir(version)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="neff-restore") as pool:
        # S3 keeps checksums in per-entry manifests: fetch those in parallel too.
        described = dict(
            zip(
                [e.module for e in todo],
                pool.map(_describe(remote), todo),
                strict=True,
            )
        )
        ready: dict[str, tuple[RemoteFile, ...]] = {}
        for module, answer in described.items():
            if isinstance(answer, Exception):
                report.failed[neuron.entry_key(version, module)] = str(answer)
            else:
                ready[module] = answer
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
            for module, files in ready.items():
                for file in files:
                    job = _Download(remote, entry_of[module], file, staging_root / module)
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
    for key, problem in report.failed.items():
        log.warning("could not restore %s: %s", key, problem)
    return report


def _describe(remote: RemoteCache) -> Callable[[RemoteEntry], tuple[RemoteFile, ...] | Exception]:
    def describe(entry: RemoteEntry) -> tuple[RemoteFile, ...] | Exception:
        try:
            return entry.files if entry.verified else remote.verified_files(entry)
        except Exception as exc:  # noqa: BLE001 - reported per entry by the caller
            return exc

    return describe


@dataclass
class UploadReport:
    version: str
    candidates: list[str] = field(default_factory=list)
    cleaned_failed: list[str] = field(default_factory=list)
    result: PublishResult = field(default_factory=PublishResult)


def shareable(root: Path, version: str) -> list[neuron.LocalEntry]:
    return [e for e in neuron.scan(root, version) if e.state is neuron.EntryState.COMPLETE]


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
    present = set(remote.entries(version))
    # smallest first: under a deadline, more entries make it
    new = sorted((e for e in local if e.module not in present), key=lambda e: e.size())
    report.candidates = [e.key for e in new]
    report.result.already_present = [e.key for e in local if e.module in present]
    if not new and not records:
        return report
    published = remote.publish(new, records, deadline or Deadline(None))
    published.already_present = sorted(set(published.already_present) | set(report.result.already_present))
    report.result = published
    return report
