"""The NEFF cache in an S3 bucket: `s3://<bucket>/<prefix>`.

Each writer stores an entry's files under a prefix of its own, `neuronxcc-<version>/MODULE_<...>/.w-<writer>/`,
then writes `manifests/neuronxcc-<version>/MODULE_<...>.json` (files, sizes, SHA-256, and that prefix) with
`If-None-Match: *`: the first complete writer wins, a later one finds the manifest taken, deletes its own
objects and counts the entry as already there. A reader therefore never sees a manifest over another
writer's bytes, and an uploader that dies half-way leaves objects no manifest names. Manifests written
before writer prefixes existed (no `prefix`) name files at `neuronxcc-<version>/MODULE_<...>/<name>`;
`sagequeue cache verify --repair` finds and removes such entries if a race broke them.

Once its manifest is in, the winner copies the entry's files (server-side) to
`neuronxcc-<version>/MODULE_<...>/<name>`, the keys the Neuron compiler's own S3 cache reads, the done marker
last; sagequeue's readers never use those keys (they follow the manifest and its checksums).

boto3 reads `AWS_ENDPOINT_URL` (and `AWS_ENDPOINT_URL_S3`) itself, so the same code talks to S3 or to a
compatible server. Every request has a connect and a read timeout and is tried at most twice, so a
blackholed endpoint fails a call within about 2 x (connect + read) instead of boto3's 60 s x 3 attempts.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.exceptions import ClientError

from sagequeue.job import neuron
from sagequeue.job.names import UnsafeNameError, check_name
from sagequeue.job.remote import (
    OPTIMUM_REGISTRY_DIR,
    REGISTRY_DIR,
    SDK_ORIGIN,
    Deadline,
    PublishResult,
    RegistryRecord,
    RemoteCacheError,
    RemoteCacheNotFoundError,
    RemoteEntry,
    RemoteFile,
    check_writer,
    combine_records,
    http_date,
    optimum_record_path,
    optimum_records_from,
    registry_path_parts,
)
from sagequeue_core.retry import botocore_config

MANIFEST_DIR = "manifests"
#: Writer-unique object prefix inside an entry's folder (a job that names no writer).
WRITER_PREFIX = ".w-"
#: Where a named writer's objects go: `writers/<writer>/neuronxcc-<version>/MODULE_.../<unique id>/`. The
#: writer comes first in the key, so an IAM policy can give each team `writers/<team>/*` and nothing else
#: under this folder, and the folder an entry's bytes sit in says which team wrote them.
WRITERS_DIR = "writers"
_MISSING_CODES = {"NoSuchBucket", "404", "NotFound"}
#: The manifest already exists (If-None-Match: *), or a concurrent conditional write is in flight.
_TAKEN_CODES = {"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
_CHUNK = 1024 * 1024
#: Downloads are read in pieces this small so a cancel or a stop is seen within a fraction of a second.
_READ_CHUNK = 256 * 1024
#: Files at least this large are copied in parts (CopyObject takes at most 5 GB in one request).
_COPY_LIMIT = 5 * 1024**3
CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 15.0
ATTEMPTS = 2


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


class S3Cache:
    def __init__(
        self,
        url: str,
        *,
        client: Any = None,
        max_workers: int = 16,
        region: str | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
        read_timeout: float = READ_TIMEOUT,
        writer: str | None = None,
    ) -> None:
        if not url.startswith("s3://"):
            raise ValueError(f"not an S3 URL: {url!r}")
        bucket, _, prefix = url[len("s3://") :].partition("/")
        if not bucket:
            raise ValueError(f"no bucket in {url!r} (expected s3://<bucket>/<prefix>)")
        self.url = url
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.max_workers = max_workers
        self._region = region
        #: The writer this handle publishes as (None: in the entry's own folder, writer unknown).
        self.writer = check_writer(writer) if writer else None
        #: Manifests read by `writers`, kept for the `verified_files` call that follows in a restore.
        self._manifests: dict[tuple[str, str], dict[str, Any]] = {}
        self._client = client or boto3.client(
            "s3",
            region_name=region,
            config=botocore_config(
                attempts=ATTEMPTS,
                max_pool_connections=max(10, max_workers * 2),
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
            ),
        )
        self._transfer = TransferConfig(
            multipart_threshold=64 * _CHUNK, multipart_chunksize=32 * _CHUNK, max_concurrency=4
        )

    # --- keys ------------------------------------------------------------------------------------------

    def _key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}" if self.prefix else relative

    def _relative(self, key: str) -> str:
        return key[len(self.prefix) + 1 :] if self.prefix else key

    def _manifest_key(self, version: str, module: str) -> str:
        return self._key(f"{MANIFEST_DIR}/{neuron.version_dir(version)}/{module}.json")

    def _list(self, relative_prefix: str, delimiter: str | None = None) -> Iterator[dict[str, Any]]:
        paginator = self._client.get_paginator("list_objects_v2")
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._key(relative_prefix)}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        try:
            for page in paginator.paginate(**kwargs):
                yield from page.get("Contents", [])
                for common in page.get("CommonPrefixes", []):
                    yield {"CommonPrefix": common["Prefix"]}
        except ClientError as exc:
            raise self._error("list", exc) from exc

    def _error(self, operation: str, exc: ClientError) -> RemoteCacheError:
        code = exc.response.get("Error", {}).get("Code", "")
        if code in _MISSING_CODES:
            return RemoteCacheNotFoundError(f"{self.url}: bucket {self.bucket} does not exist ({operation})")
        return RemoteCacheError(f"{self.url}: {operation} failed with {code or 'an error'}: {exc}")

    # --- the RemoteCache interface ---------------------------------------------------------------------

    def exists(self) -> bool:
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code", "") in _MISSING_CODES:
                return False
            raise self._error("head bucket", exc) from exc
        return True

    def create(self, private: bool = True) -> None:
        # An S3 bucket is private unless a policy says otherwise; `private` matters only for the Hub.
        kwargs: dict[str, Any] = {"Bucket": self.bucket}
        region = self._client.meta.region_name
        if region and region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            self._client.create_bucket(**kwargs)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "BucketAlreadyOwnedByYou":
                raise self._error("create bucket", exc) from exc

    def versions(self) -> list[str]:
        """Versions with manifests, and those the Neuron compiler's own S3 cache wrote folders of."""
        found = set()
        for folder in (f"{MANIFEST_DIR}/", ""):
            for item in self._list(folder, delimiter="/"):
                name = item.get("CommonPrefix", "").rstrip("/").rsplit("/", 1)[-1]
                if neuron.is_version_dir(name):
                    found.add(neuron.version_of_dir(name))
        return sorted(found)

    def entries(self, version: str) -> dict[str, RemoteEntry]:
        """Entries with a manifest (their file lists come from it, `verified_files`), and the complete
        entries the Neuron compiler's own S3 cache wrote at `neuronxcc-<version>/MODULE_.../` with none.

        The compiler's folders are listed one level deep (one key per entry, not per file); only a folder
        without a manifest, rare in a cache sagequeue writes, is listed further."""
        vdir = neuron.version_dir(version)
        found: dict[str, RemoteEntry] = {}
        with ThreadPoolExecutor(max_workers=2) as pool:
            folders = pool.submit(self._entry_folders, version)
            for item in self._list(f"{MANIFEST_DIR}/{vdir}/"):
                name = item["Key"].rsplit("/", 1)[-1]
                module = name.removesuffix(".json")
                if name.endswith(".json") and neuron.is_entry_dir(module):
                    found[module] = RemoteEntry(
                        version, module, (), item["LastModified"].timestamp(), verified=False
                    )
            unrecorded = sorted(folders.result() - set(found))
        if unrecorded:
            with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
                listed = list(pool.map(lambda m: self._folder_files(version, m), unrecorded))
            for module, (names, when) in zip(unrecorded, listed, strict=True):
                if neuron.is_complete_file_set(names):
                    found[module] = RemoteEntry(version, module, (), when, verified=False, origin=SDK_ORIGIN)
        return found

    def _entry_folders(self, version: str) -> set[str]:
        """The entry folders at `neuronxcc-<version>/MODULE_.../`: the Neuron compiler's own S3 cache's
        entries, and sagequeue's copies for it."""
        vdir = neuron.version_dir(version)
        return {
            name
            for item in self._list(f"{vdir}/", delimiter="/")
            if neuron.is_entry_dir(name := item.get("CommonPrefix", "").rstrip("/").rsplit("/", 1)[-1])
        }

    def _folder_files(self, version: str, module: str) -> tuple[list[str], float]:
        """(file names, latest write) directly in one entry folder (a writer's folder inside is not)."""
        key = neuron.entry_key(version, module)
        names, when = [], 0.0
        for item in self._list(f"{key}/", delimiter="/"):
            if "Key" in item:
                names.append(self._relative(item["Key"])[len(key) + 1 :])
                when = max(when, item["LastModified"].timestamp())
        return names, when

    def verified_files(self, entry: RemoteEntry) -> tuple[RemoteFile, ...]:
        if entry.origin == SDK_ORIGIN:
            return self._sdk_files(entry)
        manifest = self._manifests.pop((entry.version, entry.module), None) or self._manifest(
            entry.version, entry.module
        )
        prefix = self._manifest_prefix(entry.key, manifest)
        return tuple(
            RemoteFile(
                check_name(name, f"{entry.key}: file"),
                int(info["size"]),
                sha256=str(info["sha256"]),
                location=f"{prefix}/{name}",
            )
            for name, info in sorted(manifest["files"].items())
        )

    def _sdk_files(self, entry: RemoteEntry) -> tuple[RemoteFile, ...]:
        """An SDK-written entry's files, from the listing: S3's ETag is the MD5 of an object stored in one
        part; for one stored in parts there is no checksum of the bytes, only the size."""
        files = []
        for item in self._list(f"{entry.key}/", delimiter="/"):
            if "Key" not in item:
                continue
            name = self._relative(item["Key"])[len(entry.key) + 1 :]
            etag = str(item.get("ETag", "")).strip('"')
            whole = bool(re.fullmatch(r"[0-9a-f]{32}", etag))
            files.append(
                RemoteFile(
                    check_name(name, f"{entry.key}: file"),
                    int(item.get("Size", 0)),
                    location=f"{entry.key}/{name}",
                    md5=etag if whole else None,
                    size_only=not whole,
                )
            )
        return tuple(sorted(files, key=lambda f: f.name))

    def adopt(self, entry: RemoteEntry, sha256: Mapping[str, str]) -> bool:
        files = self._sdk_files(entry)
        if {f.name for f in files} != set(sha256):
            raise RemoteCacheError(f"{self.url}: {entry.key} changed while it was checked; verify it again")
        manifest = {
            "version": entry.version,
            "module": entry.module,
            # the bytes stay where the Neuron SDK put them, the path its own cache reads
            "prefix": entry.key,
            "files": {f.name: {"size": f.size, "sha256": sha256[f.name]} for f in files},
            "adopted_from": SDK_ORIGIN,
        }
        try:
            self._client.put_object(
                Bucket=self.bucket,
                Key=self._manifest_key(entry.version, entry.module),
                Body=json.dumps(manifest, sort_keys=True).encode(),
                ContentType="application/json",
                IfNoneMatch="*",
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code", "") in _TAKEN_CODES:
                return False
            raise self._error(f"write manifest of {entry.key}", exc) from exc
        return True

    @staticmethod
    def _manifest_prefix(key: str, manifest: Mapping[str, Any]) -> str:
        """Where a manifest says the entry's objects are: the entry's own folder or a writer prefix in it,
        never another entry's objects or a key outside the cache."""
        prefix = str(manifest.get("prefix") or key)
        check_name(prefix, f"{key}: manifest prefix")
        if prefix == key or _writer_of_prefix(key, prefix) is not None:
            return prefix
        rest = prefix[len(key) :] if prefix.startswith(key) else ""
        if rest.startswith(f"/{WRITER_PREFIX}") and rest.count("/") == 1:
            return prefix
        raise UnsafeNameError(
            f"{key}: manifest prefix {prefix!r} is neither {key}/{WRITER_PREFIX}<id> nor "
            f"{WRITERS_DIR}/<writer>/{key}/<id>"
        )

    def writers(self, version: str, modules: Sequence[str]) -> dict[str, str | None]:
        def one(module: str) -> str | None:
            try:
                manifest = self._manifest(version, module)
            except RemoteCacheError:
                return None  # no manifest (the Neuron SDK's entry) or none readable: the writer is unknown
            self._manifests[(version, module)] = manifest
            return _writer_of_prefix(neuron.entry_key(version, module), str(manifest.get("prefix") or ""))

        with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
            return dict(zip(modules, pool.map(one, modules), strict=True))

    @contextmanager
    def open_file(
        self, entry: RemoteEntry, file: RemoteFile, offset: int = 0, end: int | None = None
    ) -> Iterator[Iterator[bytes]]:
        kwargs: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self._key(file.location or f"{entry.key}/{file.name}"),
        }
        if offset or end is not None:
            kwargs["Range"] = f"bytes={offset}-{'' if end is None else end - 1}"
        try:
            body = self._client.get_object(**kwargs)["Body"]
        except ClientError as exc:
            raise self._error(f"download {entry.key}/{file.name}", exc) from exc
        try:
            yield body.iter_chunks(_READ_CHUNK)
        finally:
            body.close()

    def publish(
        self,
        entries: Sequence[neuron.LocalEntry],
        records: Sequence[RegistryRecord],
        deadline: Deadline,
        foreign_records: Mapping[str, bytes] | None = None,
    ) -> PublishResult:
        result = PublishResult()
        with ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="neff-upload") as pool:
            outcomes = list(pool.map(lambda entry: self._publish_entry(entry, deadline), entries))
        for entry, outcome in zip(entries, outcomes, strict=True):
            {"published": result.published, "taken": result.already_present, "skipped": result.skipped}[
                outcome
            ].append(entry.key)
        if records and not deadline.expired():
            for record in records:
                self._put_bytes(self._key(record.path), record.to_json())
                result.records.append(record.path)
        if foreign_records and not deadline.expired():
            result.foreign_records = self._put_foreign(foreign_records)
        return result

    def _put_foreign(self, foreign_records: Mapping[str, bytes]) -> list[str]:
        """optimum-neuron's record files, each written only if no object has its name (its name is the
        hash of its text, so an existing one is the same record)."""
        present: set[str] = set()
        for folder in sorted({path.split("/", 1)[0] for path in foreign_records}):
            present.update(
                self._relative(item["Key"]) for item in self._list(f"{folder}/{OPTIMUM_REGISTRY_DIR}/")
            )
        written = []
        for path, body in sorted(foreign_records.items()):
            if path in present:
                continue
            try:
                self._client.put_object(
                    Bucket=self.bucket,
                    Key=self._key(path),
                    Body=body,
                    ContentType="application/json",
                    IfNoneMatch="*",
                )
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code", "") not in _TAKEN_CODES:
                    raise self._error(f"write {path}", exc) from exc
                continue
            written.append(path)
        return written

    def _publish_entry(self, entry: neuron.LocalEntry, deadline: Deadline) -> str:
        """Upload one entry whole under a prefix of its own, its manifest last and only if none exists.

        Returns "published", "taken" (another writer's manifest came first: our objects are removed) or
        "skipped" (the deadline came before it started).
        """
        if deadline.expired():
            return "skipped"
        unique = uuid.uuid4().hex[:16]
        prefix = (
            f"{WRITERS_DIR}/{self.writer}/{entry.key}/{unique}"
            if self.writer
            else f"{entry.key}/{WRITER_PREFIX}{unique}"
        )
        listed: dict[str, dict[str, Any]] = {}
        for name, path in neuron.iter_entry_files(entry.path):
            listed[name] = {
                "size": path.stat().st_size,
                "sha256": self._put_file(f"{prefix}/{name}", path, deadline.touch),
            }
            deadline.touch()
        manifest = {"version": entry.version, "module": entry.module, "prefix": prefix, "files": listed}
        body = json.dumps(manifest, sort_keys=True).encode()
        try:
            self._client.put_object(
                Bucket=self.bucket,
                Key=self._manifest_key(entry.version, entry.module),
                Body=body,
                ContentType="application/json",
                IfNoneMatch="*",
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code", "") not in _TAKEN_CODES:
                raise self._error(f"write manifest of {entry.key}", exc) from exc
            # another writer published this entry first: its manifest names its own objects
            self._delete_prefix(f"{prefix}/")
            # the winner may have died before its copies for the compiler: complete them from its objects
            self._copy_for_compiler(entry.version, entry.module, only_missing=True)
            return "taken"
        self._copy_for_compiler(entry.version, entry.module, prefix=prefix, sizes=listed)
        deadline.touch()
        return "published"

    def _copy_for_compiler(
        self,
        version: str,
        module: str,
        *,
        prefix: str | None = None,
        sizes: Mapping[str, Mapping[str, Any]] | None = None,
        only_missing: bool = False,
        replace_wrong_size: bool = False,
    ) -> list[str]:
        """Copy a published entry's files (server-side) from the prefix its manifest names to
        `neuronxcc-<version>/MODULE_.../<name>`, where the Neuron compiler's own S3 cache reads them.

        `model.done` goes last, so a compiler that finds it finds the NEFF too. Each object is whole, and
        every copy at these paths, whichever writer it came from, holds a complete compile of the same graph
        with the same flags (the entry's name hashes both): a reader cannot mix halves of two compiles the way
        a manifest over another writer's files could. With `only_missing`, what is already there stays,
        unless `replace_wrong_size` and its size is not the manifest's (a file cut short). Returns the names
        copied."""
        key = neuron.entry_key(version, module)
        if prefix is None or sizes is None:
            try:
                manifest = self._manifest(version, module)
            except RemoteCacheError:
                return []  # no manifest, nothing published to copy
            try:
                prefix = self._manifest_prefix(key, manifest)
                for name in manifest["files"]:
                    check_name(name, f"{key}: file")
            except UnsafeNameError:
                return []  # a hostile manifest: `verify` reports it, nothing is copied from it
            sizes = manifest["files"]
        if prefix == key:
            return []  # written before writer prefixes: the files are already there
        #: path -> size of what is already where the compiler reads
        present: dict[str, int] = {}
        if only_missing:
            present = {
                self._relative(item["Key"]): int(item.get("Size", -1))
                for item in self._list(f"{key}/", delimiter="/")
                if "Key" in item
            }
        names = sorted(sizes, key=lambda name: (name == neuron.DONE_FILE, name))
        copied = []
        for name in names:
            size = int(sizes[name]["size"])
            there = present.get(f"{key}/{name}")
            if there is not None and (there == size or not replace_wrong_size):
                continue
            source = {"Bucket": self.bucket, "Key": self._key(f"{prefix}/{name}")}
            try:
                if there is not None:
                    # of the wrong size (cut short): the published file, whole, replaces it
                    self._client.copy(source, self.bucket, self._key(f"{key}/{name}"), Config=self._transfer)
                elif size < _COPY_LIMIT:
                    # a file another writer (or the compiler itself) put there first stays
                    self._client.copy_object(
                        Bucket=self.bucket, Key=self._key(f"{key}/{name}"), CopySource=source, IfNoneMatch="*"
                    )
                else:
                    # a multipart copy takes no condition on its target: a whole object replaces a whole one
                    self._client.copy(source, self.bucket, self._key(f"{key}/{name}"), Config=self._transfer)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code", "") in _TAKEN_CODES:
                    continue
                raise self._error(f"copy {key}/{name} for the Neuron compiler", exc) from exc
            copied.append(name)
        return copied

    def _manifest(self, version: str, module: str) -> dict[str, Any]:
        try:
            body = self._client.get_object(Bucket=self.bucket, Key=self._manifest_key(version, module))[
                "Body"
            ].read()
        except ClientError as exc:
            raise self._error(f"read manifest of {neuron.entry_key(version, module)}", exc) from exc
        manifest = json.loads(body)
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
            raise RemoteCacheError(
                f"{self.url}: the manifest of {neuron.entry_key(version, module)} is not valid"
            )
        return manifest

    def compiler_layout_problems(self, version: str) -> dict[str, str]:
        vdir = neuron.version_dir(version)
        #: module -> file name -> size of the object where the compiler reads it
        canonical: dict[str, dict[str, int]] = {}
        for item in self._list(f"{vdir}/"):
            parts = self._relative(item.get("Key", "")).split("/")
            if len(parts) == 3 and neuron.is_entry_dir(parts[1]):
                canonical.setdefault(parts[1], {})[parts[2]] = int(item.get("Size", -1))
        problems: dict[str, str] = {}
        # an entry the Neuron SDK wrote is where its compiler reads it by definition
        modules = sorted(m for m, e in self.entries(version).items() if e.origin != SDK_ORIGIN)
        with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
            manifests = list(pool.map(lambda m: self._manifest(version, m), modules))
        for module, manifest in zip(modules, manifests, strict=True):
            present = canonical.get(module, {})
            found = []
            missing = sorted(set(manifest["files"]) - set(present))
            if missing:
                found.append(f"{', '.join(missing)} missing where the Neuron compiler reads the entry")
            # a file cut short there (an interrupted writer) is present all the same: its size tells
            found += [
                f"{name}: {present[name]} bytes, the manifest says {info['size']}"
                for name, info in sorted(manifest["files"].items())
                if name in present and present[name] != int(info["size"])
            ]
            if found:
                problems[neuron.entry_key(version, module)] = "; ".join(found)
        return problems

    def repair_compiler_layout(self, version: str, modules: Sequence[str]) -> None:
        with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
            list(
                pool.map(
                    lambda m: self._copy_for_compiler(version, m, only_missing=True, replace_wrong_size=True),
                    modules,
                )
            )

    def _delete_prefix(self, relative_prefix: str) -> None:
        keys = [item["Key"] for item in self._list(relative_prefix)]
        for start in range(0, len(keys), 1000):
            batch = [{"Key": k} for k in keys[start : start + 1000]]
            try:
                self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            except ClientError as exc:
                raise self._error(f"delete {relative_prefix}", exc) from exc

    def _put_file(self, relative: str, path: Path, touch: Callable[[], None] | None = None) -> str:
        """Store one file; `touch` is called as parts of a large file go up (progress for the stall cut-off)."""
        checksum = sha256_of(path)
        try:
            if path.stat().st_size < self._transfer.multipart_threshold:
                # one request; the managed transfer would start a thread pool per file
                with path.open("rb") as body:
                    self._client.put_object(Bucket=self.bucket, Key=self._key(relative), Body=body)
            else:
                self._client.upload_file(
                    str(path),
                    self.bucket,
                    self._key(relative),
                    Config=self._transfer,
                    Callback=(lambda _sent: touch()) if touch is not None else None,
                )
        except ClientError as exc:
            raise self._error(f"upload {relative}", exc) from exc
        return checksum

    def _put_bytes(self, key: str, body: bytes) -> None:
        try:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/json")
        except ClientError as exc:
            raise self._error(f"write {key}", exc) from exc

    def records(self, model: str | None = None) -> list[RegistryRecord]:
        keys = [
            item["Key"]
            for item in self._list(f"{REGISTRY_DIR}/")
            if (parts := registry_path_parts(self._relative(item.get("Key", "")))) is not None
            and (model is None or parts[1] == model)
        ]

        def read(key: str) -> RegistryRecord | None:
            try:
                body = self._client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
            except ClientError as exc:
                raise self._error(f"read {key}", exc) from exc
            try:
                return RegistryRecord.from_json(body)
            except ValueError:
                return None  # a record someone wrote by hand and broke: not ours to fail on

        with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
            found = [r for r in pool.map(read, keys) if r is not None]
        return combine_records([r for r in found if model is None or r.model == model])

    def optimum_records(self, model: str | None = None, version: str | None = None) -> list[RegistryRecord]:
        """optimum-neuron's records under `neuronxcc-<version>/0_REGISTRY/` (optimum-neuron writes none to
        S3 itself; they come from a local cache the wrapper published, or one copied here). S3 keeps no
        commits, so a record's entries are not known: they come back empty."""
        wanted = []
        for one in [version] if version else self.versions():
            parsed = [
                where
                for item in self._list(f"{neuron.version_dir(one)}/{OPTIMUM_REGISTRY_DIR}/")
                if (where := optimum_record_path(self._relative(item.get("Key", "")))) is not None
            ]
            named = {w.hash for w in parsed if w.model is not None}
            wanted += [
                w.path
                for w in parsed
                if (w.model is None and w.hash not in named)
                or (w.model is not None and (model is None or w.model == model))
            ]

        def read(path: str) -> bytes:
            try:
                return bytes(self._client.get_object(Bucket=self.bucket, Key=self._key(path))["Body"].read())
            except ClientError as exc:
                raise self._error(f"read {path}", exc) from exc

        with ThreadPoolExecutor(max_workers=self.max_workers) as pool:
            texts = dict(zip(wanted, pool.map(read, wanted), strict=True))
        return [r for r in optimum_records_from(texts).values() if model is None or r.model == model]

    def server_time(self) -> float:
        try:
            answer = self._client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            raise self._error("head bucket", exc) from exc
        when = http_date(answer.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date"))
        if when is None:
            raise RemoteCacheError(f"{self.url}: the answer carries no Date header to tell the server's time")
        return when

    def delete(self, entries: Sequence[RemoteEntry]) -> None:
        for entry in entries:
            # a named writer's objects are outside the entry's folder: found through the manifest
            elsewhere: str | None = None
            try:
                prefix = str(self._manifest(entry.version, entry.module).get("prefix") or "")
                if _writer_of_prefix(entry.key, prefix) is not None:
                    elsewhere = prefix
            except RemoteCacheError:
                pass  # no manifest (already gone, or an entry the Neuron SDK wrote)
            # The manifest goes first so readers stop seeing the entry before its files disappear.
            try:
                self._client.delete_object(
                    Bucket=self.bucket, Key=self._manifest_key(entry.version, entry.module)
                )
            except ClientError as exc:
                raise self._error(f"delete manifest of {entry.key}", exc) from exc
            self._delete_prefix(f"{entry.key}/")
            if elsewhere is not None:
                self._delete_prefix(f"{elsewhere}/")
        self._drop_from_records({(e.version, e.module) for e in entries})

    def _drop_from_records(self, gone: set[tuple[str, str]]) -> None:
        """Records stop naming deleted entries; a record left with none is deleted."""
        if not gone:
            return
        for item in self._list(f"{REGISTRY_DIR}/"):
            key = item.get("Key", "")
            if registry_path_parts(self._relative(key)) is None:
                continue
            try:
                record = RegistryRecord.from_json(
                    self._client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
                )
            except ClientError as exc:
                raise self._error(f"read {key}", exc) from exc
            except ValueError:
                continue
            kept = [m for m in record.entries if (record.compiler_version, m) not in gone]
            if kept == record.entries:
                continue
            try:
                if kept:
                    record.entries = kept
                    self._put_bytes(key, record.to_json())
                else:
                    self._client.delete_object(Bucket=self.bucket, Key=key)
            except ClientError as exc:
                raise self._error(f"update {key}", exc) from exc


def _writer_of_prefix(key: str, prefix: str) -> str | None:
    """The writer of a `writers/<writer>/<entry key>/<id>` prefix of the entry `key`, else None."""
    parts = prefix.split("/")
    key_parts = key.split("/")
    if len(parts) != 3 + len(key_parts) or parts[0] != WRITERS_DIR or parts[2:-1] != key_parts:
        return None
    try:
        check_writer(parts[1])
        check_name(parts[-1])
    except ValueError:
        return None
    return parts[1]
