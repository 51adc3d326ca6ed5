"""The NEFF cache in a Hugging Face Hub model repository: `hf://<org>/<repo>`.

Reads are pinned to one commit (the head when the listing starts), so a restore sees one consistent tree
even while others publish. A publish is one commit whose parent is the head we listed: if someone else
committed in between, the Hub answers 409 or 412, and we list again, drop what they already published and
retry with backoff. LFS objects uploaded before a lost race are not lost: the Hub keeps them, and the
retry's LFS batch call finds them already stored.

The token comes from the usual places (HF_TOKEN, the token file of `hf auth login`), the endpoint from
HF_ENDPOINT.

huggingface_hub's HTTP client waits forever for an answer by default; a HubCache gives it per-request
connect/read/write timeouts (`configure_timeouts`), so a blackholed Hub fails a request instead of
stalling the job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime
from typing import Any
from urllib.parse import quote

from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
from huggingface_hub.hf_api import RepoFile, RepoFolder
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status, set_client_factory

from sagequeue.job import neuron
from sagequeue.job.remote import (
    OPTIMUM_REGISTRY_DIR,
    REGISTRY_DIR,
    ConflictError,
    Deadline,
    PublishResult,
    RegistryRecord,
    RemoteCacheError,
    RemoteCacheNotFoundError,
    RemoteEntry,
    RemoteFile,
    combine_records,
    http_date,
    optimum_record_path,
    optimum_records_from,
    registry_path_parts,
)
from sagequeue_core.retry import backoff_seconds

#: Per-request bounds on Hub calls (seconds): connecting, waiting for bytes of an answer, sending a body.
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 15.0
WRITE_TIMEOUT = 60.0
_timeouts_lock = threading.Lock()
_timeouts: tuple[float, float, float] | None = None


def configure_timeouts(
    connect: float = CONNECT_TIMEOUT, read: float = READ_TIMEOUT, write: float = WRITE_TIMEOUT
) -> None:
    """Give huggingface_hub's shared HTTP client per-request timeouts (it has none by default)."""
    global _timeouts
    import httpx2
    from huggingface_hub.utils._http import hf_request_event_hook

    wanted = (connect, read, write)
    with _timeouts_lock:
        if _timeouts == wanted:
            return
        _timeouts = wanted

    def factory() -> httpx2.Client:
        return httpx2.Client(
            event_hooks={"request": [hf_request_event_hook]},
            follow_redirects=True,
            timeout=httpx2.Timeout(connect=connect, read=read, write=write, pool=connect),
        )

    set_client_factory(factory)


#: Status codes the Hub uses when the parent commit is no longer the head.
CONFLICT_STATUSES = (409, 412)
_CHUNK = 1024 * 1024
#: Downloads are read in pieces this small so a cancel or a stop is seen within a fraction of a second.
_READ_CHUNK = 256 * 1024


#: Registry record files read at once.
REGISTRY_READERS = 16
#: Writer name of the one record a configuration keeps after compaction.
COMPACT_WRITER = "compacted"

#: A batch of entries uploaded together: at most this many entries or bytes.
BATCH_ENTRIES = 32
BATCH_BYTES = 512 * 1024 * 1024
#: Under a deadline, a batch is sized to take at most this long at the measured throughput: a stop that
#: comes while it is in flight (its grace shortens the deadline) still finds time to commit what is up.
BATCH_SECONDS = 20.0


def _status(exc: HfHubHTTPError) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


class HubCache:
    def __init__(
        self,
        url: str,
        *,
        endpoint: str | None = None,
        token: str | None = None,
        max_attempts: int = 6,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
        commit_reserve: float = 10.0,
        upload_threads: int = 8,
        batch_seconds: float = BATCH_SECONDS,
        connect_timeout: float = CONNECT_TIMEOUT,
        read_timeout: float = READ_TIMEOUT,
        writer: str | None = None,
    ) -> None:
        # `writer` is S3's: on the Hub the writer is the user of the token, which the Hub records
        del writer
        if not url.startswith("hf://"):
            raise ValueError(f"not a Hub URL: {url!r}")
        repo_id = url[len("hf://") :].strip("/")
        if repo_id.count("/") != 1:
            raise ValueError(f"expected hf://<org>/<repo>, got {url!r}")
        self.url = url
        self.repo_id = repo_id
        configure_timeouts(connect_timeout, read_timeout)
        self.api = HfApi(endpoint=endpoint, token=token)
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        #: Seconds kept free before the deadline for the commit call itself.
        self.commit_reserve = commit_reserve
        self.upload_threads = upload_threads
        self.batch_seconds = batch_seconds
        self._revision: str | None = None
        #: Measured upload throughput (bytes per second), None before the first batch.
        self._rate: float | None = None

    # --- reading ---------------------------------------------------------------------------------------

    def _error(self, operation: str, exc: HfHubHTTPError) -> RemoteCacheError:
        if isinstance(exc, RepositoryNotFoundError):
            return RemoteCacheNotFoundError(
                f"{self.url}: repository {self.repo_id} does not exist or this token cannot read it ({operation})"
            )
        return RemoteCacheError(f"{self.url}: {operation} failed (HTTP {_status(exc)}): {exc}")

    def head(self) -> str:
        """The current head commit; later reads use it until `refresh()`."""
        try:
            info = self.api.model_info(self.repo_id)
        except HfHubHTTPError as exc:
            raise self._error("read repository", exc) from exc
        if not info.sha:
            raise RemoteCacheError(f"{self.url}: the Hub returned no head commit")
        self._revision = info.sha
        return info.sha

    def revision(self) -> str:
        """The commit reads are pinned to: the head seen by the last listing."""
        return self._revision or self.head()

    def _tree(self, path: str, recursive: bool, expand: bool = False) -> list[RepoFile | RepoFolder]:
        try:
            return list(
                self.api.list_repo_tree(
                    self.repo_id,
                    path_in_repo=path,
                    recursive=recursive,
                    expand=expand,
                    revision=self.revision(),
                )
            )
        except (RevisionNotFoundError, HfHubHTTPError) as exc:
            if _status(exc) == 404 and not isinstance(exc, RepositoryNotFoundError):
                return []  # the folder does not exist yet
            raise self._error(f"list {path or '/'}", exc) from exc

    def exists(self) -> bool:
        try:
            self.head()
        except RemoteCacheNotFoundError:
            return False
        return True

    def create(self, private: bool = True) -> None:
        try:
            self.api.create_repo(self.repo_id, private=private, exist_ok=True, repo_type="model")
        except HfHubHTTPError as exc:
            raise self._error("create repository", exc) from exc

    def versions(self) -> list[str]:
        self.head()
        return sorted(
            neuron.version_of_dir(item.path)
            for item in self._tree("", recursive=False)
            if isinstance(item, RepoFolder) and neuron.is_version_dir(item.path)
        )

    def entries(self, version: str) -> dict[str, RemoteEntry]:
        self.head()
        return self._entries_at_revision(version)

    def _entries_at_revision(self, version: str) -> dict[str, RemoteEntry]:
        vdir = neuron.version_dir(version)
        files: dict[str, list[RemoteFile]] = {}
        for item in self._tree(vdir, recursive=True):
            if not isinstance(item, RepoFile):
                continue
            parts = item.path.split("/", 2)
            if len(parts) != 3 or not neuron.is_entry_dir(parts[1]):
                continue
            sha256 = item.lfs.sha256 if item.lfs else None
            git_sha1 = None if item.lfs else item.blob_id
            files.setdefault(parts[1], []).append(RemoteFile(parts[2], int(item.size), sha256, git_sha1))
        return {
            module: RemoteEntry(version, module, tuple(sorted(fs, key=lambda f: f.name)))
            for module, fs in files.items()
            # a commit is atomic, but a hand-made commit could still carry half an entry
            if neuron.is_complete_file_set([f.name for f in fs])
        }

    def published_times(self, version: str) -> dict[str, float]:
        """When each entry folder last changed (slower: the Hub pages expanded listings by 50)."""
        out: dict[str, float] = {}
        for item in self._tree(neuron.version_dir(version), recursive=False, expand=True):
            commit = getattr(item, "last_commit", None)
            date = getattr(commit, "date", None)
            if isinstance(item, RepoFolder) and isinstance(date, datetime):
                out[item.path.rsplit("/", 1)[-1]] = date.timestamp()
        return out

    def verified_files(self, entry: RemoteEntry) -> tuple[RemoteFile, ...]:
        return entry.files

    def file_url(self, path: str) -> str:
        return f"{self.api.endpoint}/{self.repo_id}/resolve/{self.revision()}/{quote(path)}"

    @contextmanager
    def open_file(
        self, entry: RemoteEntry, file: RemoteFile, offset: int = 0, end: int | None = None
    ) -> Iterator[Iterator[bytes]]:
        headers = build_hf_headers(token=self.api.token)
        ranged = bool(offset) or end is not None
        if ranged:
            headers["Range"] = f"bytes={offset}-{'' if end is None else end - 1}"
        url = self.file_url(f"{entry.key}/{file.name}")
        with get_session().stream("GET", url, headers=headers, follow_redirects=True) as response:
            try:
                hf_raise_for_status(response)
            except HfHubHTTPError as exc:
                raise self._error(f"download {entry.key}/{file.name}", exc) from exc
            if ranged and response.status_code != 206:
                raise RemoteCacheError(
                    f"{url}: asked for bytes from {offset}, the server sent the whole file"
                )
            yield response.iter_bytes(_READ_CHUNK)

    def read_text(self, path: str) -> bytes:
        response = get_session().get(
            self.file_url(path), headers=build_hf_headers(token=self.api.token), follow_redirects=True
        )
        try:
            hf_raise_for_status(response)
        except HfHubHTTPError as exc:
            raise self._error(f"read {path}", exc) from exc
        return response.content

    def records(self, model: str | None = None) -> list[RegistryRecord]:
        self.head()
        return self._records_at_revision(model)

    def _records_at_revision(self, model: str | None = None) -> list[RegistryRecord]:
        return combine_records(list(self._record_files(model).values()))

    def _record_files(self, model: str | set[str] | None = None) -> dict[str, RegistryRecord]:
        """Every registry record file at the pinned revision (of one model or some), read many at a time."""
        models = {model} if isinstance(model, str) else model
        paths = []
        for item in self._tree(REGISTRY_DIR, recursive=True):
            if not isinstance(item, RepoFile):
                continue
            parts = registry_path_parts(item.path)
            if parts is not None and (models is None or parts[1] in models):
                paths.append(item.path)

        def read(path: str) -> RegistryRecord | None:
            try:
                return RegistryRecord.from_json(self.read_text(path))
            except ValueError:
                return None  # a broken record is skipped, not fatal to a lookup

        with ThreadPoolExecutor(max_workers=REGISTRY_READERS, thread_name_prefix="hub-registry") as pool:
            found = dict(zip(paths, pool.map(read, paths), strict=True))
        return {p: r for p, r in found.items() if r is not None and (models is None or r.model in models)}

    def optimum_records(self, model: str | None = None, version: str | None = None) -> list[RegistryRecord]:
        """Configurations optimum-neuron recorded in this repository, each with the entries of the commit
        that added it.

        optimum-neuron publishes a session's whole local cache in one commit (`upload_folder`, which
        leaves out files already there): the record of a model it compiled and the entry folders of that
        compile arrive together. An entry folder is never changed afterwards, so its last commit is the one
        that added it, and the entries of a record are the folders whose last commit is the record's."""
        self.head()
        records: dict[str, RegistryRecord] = {}
        for one in [version] if version else self.versions():
            registry = f"{neuron.version_dir(one)}/{OPTIMUM_REGISTRY_DIR}"
            parsed = [
                where
                for item in self._tree(registry, recursive=True)
                if isinstance(item, RepoFile) and (where := optimum_record_path(item.path)) is not None
            ]
            # the path names the model except in the arch-digest layout, whose records have a named copy
            named = {w.hash for w in parsed if w.model is not None}
            wanted = [
                w.path
                for w in parsed
                if (w.model is None and w.hash not in named)
                or (w.model is not None and (model is None or w.model == model))
            ]
            with ThreadPoolExecutor(max_workers=REGISTRY_READERS, thread_name_prefix="hub-registry") as pool:
                texts = dict(zip(wanted, pool.map(self.read_text, wanted), strict=True))
            found = {
                path: record
                for path, record in optimum_records_from(texts).items()
                if model is None or record.model == model
            }
            if found:
                self._link_optimum_entries(one, found)
            records.update(found)
        return list(records.values())

    def _link_optimum_entries(self, version: str, records: dict[str, RegistryRecord]) -> None:
        """Fill each record's entries: the entry folders added by the commit that added the record."""
        commit_of: dict[str, str] = {}
        for folder in sorted({path.rsplit("/", 1)[0] for path in records}):
            for item in self._tree(folder, recursive=False, expand=True):
                commit = getattr(item, "last_commit", None)
                if isinstance(item, RepoFile) and commit is not None:
                    commit_of[item.path] = commit.oid
        by_commit: dict[str, list[str]] = {}
        for module, oid in self._folder_commits(version).items():
            by_commit.setdefault(oid, []).append(module)
        for path, record in records.items():
            record.entries = sorted(by_commit.get(commit_of.get(path, ""), []))

    def _folder_commits(self, version: str) -> dict[str, str]:
        """The last commit of each entry folder of a version (the Hub pages expanded listings by 50)."""
        out: dict[str, str] = {}
        for item in self._tree(neuron.version_dir(version), recursive=False, expand=True):
            commit = getattr(item, "last_commit", None)
            name = item.path.rsplit("/", 1)[-1]
            if isinstance(item, RepoFolder) and commit is not None and neuron.is_entry_dir(name):
                out[name] = commit.oid
        return out

    def writers(self, version: str, modules: Sequence[str]) -> dict[str, str | None]:
        """The author the Hub recorded for the commit that added each entry folder (an entry folder is
        never changed afterwards, so its last commit is that one)."""
        folders = self._folder_commits(version)
        author = self._commit_authors()
        return {m: author.get(folders.get(m, "")) for m in modules}

    def _commit_authors(self) -> dict[str, str | None]:
        """Commit id -> the first author the Hub recorded for it."""
        try:
            commits = self.api.list_repo_commits(self.repo_id, revision=self.revision())
        except HfHubHTTPError as exc:
            raise self._error("list commits", exc) from exc
        return {c.commit_id: (c.authors[0] if c.authors else None) for c in commits}

    def file_authors(self, folder: str) -> dict[str, str | None]:
        """Path -> the author of the commit that last changed each file directly in `folder` (what the Hub
        binds to the token that made it, unlike anything a file says of itself)."""
        last = {
            item.path: item.last_commit.oid
            for item in self._tree(folder, recursive=False, expand=True)
            if isinstance(item, RepoFile) and item.last_commit is not None
        }
        if not last:
            return {}
        author = self._commit_authors()
        return {path: author.get(oid) for path, oid in last.items()}

    def adopt(self, entry: RemoteEntry, sha256: Mapping[str, str]) -> bool:
        return False  # the Neuron SDK writes no cache to the Hub: every entry came by a commit

    def compiler_layout_problems(self, version: str) -> dict[str, str]:
        # entries are kept at the Neuron layout's own paths, the paths optimum-neuron's Hub proxy reads
        return {}

    def repair_compiler_layout(self, version: str, modules: Sequence[str]) -> None:
        return None

    def _compaction(
        self, files: dict[str, RegistryRecord], folders: set[str], extra: Sequence[RegistryRecord] = ()
    ) -> list[Any]:
        """Commit operations that leave one record per configuration folder in `folders`: the union of the
        entries its files (and `extra`) name, minus nothing; an empty union leaves no file."""
        ops: list[Any] = []
        for folder in sorted(folders):
            inside = {p: r for p, r in files.items() if p.rsplit("/", 1)[0] == folder}
            mine = [r for r in extra if r.path.rsplit("/", 1)[0] == folder]
            combined = combine_records([*inside.values(), *mine])
            keep: str | None = None
            if combined and combined[0].entries:
                record = replace(combined[0], writer=COMPACT_WRITER)
                keep = record.path
                ops.append(CommitOperationAdd(path_in_repo=record.path, path_or_fileobj=record.to_json()))
            ops += [CommitOperationDelete(path_in_repo=p) for p in inside if p != keep]
        return ops

    # --- writing ---------------------------------------------------------------------------------------

    def _measure(self, size: int, seconds: float) -> None:
        """Fold one batch's upload throughput into the estimate the next batch is sized from."""
        if seconds <= 0 or size <= 0:
            return
        rate = size / seconds
        self._rate = rate if self._rate is None else 0.5 * self._rate + 0.5 * rate

    def _next_batch(
        self, pending: Sequence[neuron.LocalEntry], deadline: Deadline, reserve: float
    ) -> list[neuron.LocalEntry]:
        """The next entries to upload together: as many as fit BATCH_ENTRIES, BATCH_BYTES and, under a
        deadline, half the time left and at most `batch_seconds` at the measured throughput (the first batch,
        unmeasured, is one entry): a batch in flight when a stop shortens the deadline ends in time to commit."""
        if deadline.expired(reserve):
            return []
        limit = float(BATCH_BYTES)
        if deadline.remaining() != float("inf"):
            if self._rate is None:
                return [pending[0]]  # the smallest entry first: it measures the throughput
            limit = min(limit, self._rate * min((deadline.remaining() - reserve) * 0.5, self.batch_seconds))
        batch: list[neuron.LocalEntry] = []
        size = 0
        for entry in pending:
            entry_size = entry.size()
            if len(batch) >= BATCH_ENTRIES or size + entry_size > limit:
                break
            batch.append(entry)
            size += entry_size
        return batch

    def _foreign_ops(self, foreign_records: Mapping[str, bytes]) -> list[CommitOperationAdd]:
        """optimum-neuron record files the repository lacks, as additions (an existing one is never
        replaced: its name is the hash of its text)."""
        present: set[str] = set()
        for folder in sorted({path.split("/", 1)[0] for path in foreign_records}):
            present.update(
                item.path for item in self._tree(f"{folder}/{OPTIMUM_REGISTRY_DIR}", recursive=True)
            )
        return [
            CommitOperationAdd(path_in_repo=path, path_or_fileobj=body)
            for path, body in sorted(foreign_records.items())
            if path not in present
        ]

    def publish(
        self,
        entries: Sequence[neuron.LocalEntry],
        records: Sequence[RegistryRecord],
        deadline: Deadline,
        foreign_records: Mapping[str, bytes] | None = None,
    ) -> PublishResult:
        result = PublishResult()
        # a short deadline (a stop's grace) keeps a proportionate share for the commit call
        reserve = min(self.commit_reserve, 0.2 * deadline.total)
        # Operations survive a lost race: their LFS content is uploaded once and reused by the retry.
        operations: dict[str, list[CommitOperationAdd]] = {}
        for attempt in range(1, self.max_attempts + 1):
            parent = self.head()
            deadline.touch()
            remote: dict[str, set[str]] = {}
            todo = []
            for entry in entries:
                present = remote.setdefault(entry.version, set(self._entries_at_revision(entry.version)))
                if entry.module in present:
                    if entry.key not in result.already_present:
                        result.already_present.append(entry.key)
                else:
                    todo.append(entry)
            staged = [entry.key for entry in todo if entry.key in operations]
            fresh = [entry for entry in todo if entry.key not in operations]
            # LFS content goes up a batch of entries at a time, many files in parallel; the deadline is
            # checked between batches so a stop's grace still leaves time for the commit
            pending = list(fresh)
            while pending:
                batch = self._next_batch(pending, deadline, reserve)
                if not batch:
                    # the deadline (or the time the next entry would take) leaves no room: commit what is up
                    result.skipped += [e.key for e in pending if e.key not in result.skipped]
                    break
                pending = pending[len(batch) :]
                batch_ops = {
                    entry.key: [
                        CommitOperationAdd(path_in_repo=f"{entry.key}/{name}", path_or_fileobj=str(path))
                        for name, path in neuron.iter_entry_files(entry.path)
                    ]
                    for entry in batch
                }
                started = time.monotonic()
                try:
                    self.api.preupload_lfs_files(
                        self.repo_id,
                        additions=[op for ops in batch_ops.values() for op in ops],
                        num_threads=self.upload_threads,
                    )
                except Exception as exc:
                    if not staged:
                        if isinstance(exc, HfHubHTTPError):
                            raise self._error(
                                f"upload {batch[0].key} and {len(batch) - 1} more", exc
                            ) from exc
                        raise
                    # what is already up is worth a commit; the rest goes next time
                    result.skipped += [e.key for e in [*batch, *pending] if e.key not in result.skipped]
                    break
                self._measure(sum(e.size() for e in batch), time.monotonic() - started)
                operations.update(batch_ops)
                staged += list(batch_ops)
                deadline.touch()
            result.skipped = [k for k in result.skipped if k not in staged]
            # each record folds into its configuration's one compacted record, in the same commit
            record_ops = (
                self._compaction(
                    self._record_files({r.model for r in records}),
                    {r.path.rsplit("/", 1)[0] for r in records},
                    records,
                )
                if records
                else []
            )
            # optimum-neuron's records go in the same commit as the entries compiled with them
            foreign_ops = self._foreign_ops(foreign_records) if foreign_records else []
            if not staged and not record_ops and not foreign_ops:
                result.revision = parent
                return result
            versions = sorted({key.split("/", 1)[0] for key in staged})
            try:
                info = self.api.create_commit(
                    self.repo_id,
                    operations=[op for key in staged for op in operations[key]] + record_ops + foreign_ops,
                    commit_message=f"Add {len(staged)} compiled graphs ({', '.join(versions) or 'registry only'})",
                    commit_description="Published by sagequeue-job: complete NEFF cache entries only.",
                    parent_commit=parent,
                )
            except HfHubHTTPError as exc:
                if _status(exc) not in CONFLICT_STATUSES:
                    raise self._error("commit", exc) from exc
                result.conflicts_retried += 1
                pause = backoff_seconds(attempt, base=self.backoff_base, cap=self.backoff_max)
                if attempt == self.max_attempts or deadline.remaining() < pause + reserve:
                    raise ConflictError(
                        f"{self.url}: the repository kept moving; gave up after {attempt} commit attempts"
                    ) from exc
                time.sleep(pause)
                continue
            result.published = staged
            result.records = [op.path_in_repo for op in record_ops if isinstance(op, CommitOperationAdd)]
            result.foreign_records = [op.path_in_repo for op in foreign_ops]
            result.revision = info.oid
            self._revision = info.oid
            return result
        raise ConflictError(f"{self.url}: no commit after {self.max_attempts} attempts")

    def server_time(self) -> float:
        response = get_session().head(
            f"{self.api.endpoint}/api/models/{self.repo_id}", headers=build_hf_headers(token=self.api.token)
        )
        when = http_date(response.headers.get("date"))
        if when is None:
            raise RemoteCacheError(f"{self.url}: the answer carries no Date header to tell the server's time")
        return when

    def delete(self, entries: Sequence[RemoteEntry]) -> None:
        if not entries:
            return
        gone = {(e.version, e.module) for e in entries}
        for attempt in range(1, self.max_attempts + 1):
            parent = self.head()
            ops: list[Any] = [
                CommitOperationDelete(path_in_repo=f"{e.key}/", is_folder=True) for e in entries
            ]
            # records stop naming what is gone; a configuration left with nothing loses its record
            files = self._record_files()
            trimmed = {
                path: replace(r, entries=[m for m in r.entries if (r.compiler_version, m) not in gone])
                for path, r in files.items()
            }
            touched = {p.rsplit("/", 1)[0] for p, r in files.items() if trimmed[p].entries != r.entries}
            ops += self._compaction(trimmed, touched)
            try:
                self.api.create_commit(
                    self.repo_id,
                    operations=ops,
                    commit_message=f"Prune {len(entries)} compiled graphs",
                    parent_commit=parent,
                )
                return
            except HfHubHTTPError as exc:
                if _status(exc) not in CONFLICT_STATUSES or attempt == self.max_attempts:
                    raise self._error("prune commit", exc) from exc
                time.sleep(backoff_seconds(attempt, base=self.backoff_base, cap=self.backoff_max))
