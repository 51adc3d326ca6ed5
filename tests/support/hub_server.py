"""A small Hugging Face Hub API server for tests and benchmarks: real HTTP, the routes huggingface_hub uses.

It speaks what `HfApi` and `hf_hub_download`/`snapshot_download` send: repository creation and info,
tree listing with cursor pagination (Link header), `resolve` downloads with HEAD and byte ranges,
`preupload`, the LFS batch API with the basic transfer (PUT to an href), and the NDJSON `commit` endpoint
with `parentCommit` checks (412 when the parent is no longer the head). It offers no Xet transfer, so
clients run with HF_HUB_DISABLE_XET=1. Storage: commits in memory, LFS objects on disk.

Test hooks: `fail_next_commits` (statuses to answer the next commits with), `commit_barrier` (hold
commits until N have arrived, to force a race), `commit_gate` and `lfs_gate` (Events that commits and LFS
uploads wait for), counters, a request log, and an optional required token.

Run standalone: `PYTHONPATH=tests python -m support.hub_server --port 8080 --storage /tmp/hub`.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

PAGE_SIZE = 1000
EXPANDED_PAGE_SIZE = 50
#: Files at least this large, or binary, or with these suffixes, are stored through LFS (the Hub decides).
LFS_THRESHOLD = 64 * 1024
LFS_SUFFIXES = (".neff", ".pb", ".bin", ".safetensors")
_RANGE_RE = re.compile(r"bytes=(\d*)-(\d*)$")


def hub_date(moment: datetime) -> str:
    """The Hub's timestamp format: milliseconds, UTC, a trailing Z."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\x00" % len(data) + data, usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class Blob:
    size: int
    sha1: str
    sha256: str | None  # set for LFS files
    data: bytes | None  # regular files live in memory; LFS content lives in the object store


@dataclass
class Commit:
    oid: str
    parent: str | None
    title: str
    date: datetime
    files: dict[str, Blob]
    #: path -> commit that last changed it (for expanded tree listings)
    last_change: dict[str, tuple[str, str, datetime]]
    #: The user whose token made the commit (the Hub records it; a client cannot choose it).
    author: str = ""


@dataclass
class Repo:
    repo_id: str
    private: bool
    commits: list[Commit] = field(default_factory=list)

    @property
    def head(self) -> Commit:
        return self.commits[-1]

    def resolve(self, revision: str) -> Commit | None:
        if revision in ("main", "HEAD"):
            return self.head
        for commit in self.commits:
            if commit.oid == revision:
                return commit
        return None


#: The user of the token the server is started with.
DEFAULT_USER = "sq-bot"


class HubState:
    def __init__(self, storage: Path, token: str | None = None) -> None:
        self.storage = storage
        (storage / "lfs").mkdir(parents=True, exist_ok=True)
        self.repos: dict[str, Repo] = {}
        self.lock = threading.RLock()
        self.token = token
        self.requests: list[tuple[str, str, int]] = []
        self.fail_next_commits: list[int] = []
        self.commit_barrier: threading.Barrier | None = None
        self.barrier_commits = 0
        self.commit_gate: threading.Event | None = None
        self.lfs_gate: threading.Event | None = None
        self.lfs_arrivals = 0
        #: Seconds each LFS upload takes (a slow link to the Hub).
        self.lfs_delay = 0.0
        self.lfs_puts = 0
        self.commit_statuses: list[int] = []
        #: token -> user: the main token is DEFAULT_USER's; more users (other teams' machine users) are added
        self.users: dict[str, str] = {token: DEFAULT_USER} if token else {}

    def race_next_commits(self, count: int) -> None:
        """Hold the next `count` commits until all have arrived, then let them through together."""
        with self.lock:
            self.commit_barrier = threading.Barrier(count)
            self.barrier_commits = count

    def lfs_path(self, oid: str) -> Path:
        return self.storage / "lfs" / oid

    def create_repo(self, repo_id: str, private: bool) -> Repo:
        attributes = b"*.neff filter=lfs diff=lfs merge=lfs -text\n*.pb filter=lfs diff=lfs merge=lfs -text\n"
        now = datetime.now(UTC)
        oid = uuid.uuid4().hex + "00000000"
        first = Commit(
            oid,
            None,
            "initial commit",
            now,
            {".gitattributes": Blob(len(attributes), git_blob_sha1(attributes), None, attributes)},
            {".gitattributes": (oid, "initial commit", now)},
        )
        repo = Repo(repo_id, private, [first])
        self.repos[repo_id] = repo
        return repo


class HubServer:
    """Owns the HTTP server thread; `url` is the endpoint to give HfApi (HF_ENDPOINT)."""

    def __init__(
        self, storage: Path | None = None, token: str | None = None, host: str = "127.0.0.1", port: int = 0
    ):
        self._own_storage = storage is None
        self.storage = storage or Path(tempfile.mkdtemp(prefix="hub-server-"))
        self.state = HubState(self.storage, token)
        handler = type("BoundHubHandler", (HubHandler,), {"state": self.state})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="hub-server", daemon=True)

    def start(self) -> HubServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._own_storage:
            shutil.rmtree(self.storage, ignore_errors=True)

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # helpers for assertions
    def head(self, repo_id: str) -> Commit:
        with self.state.lock:
            return self.state.repos[repo_id].head

    def files(self, repo_id: str) -> dict[str, Blob]:
        return dict(self.head(repo_id).files)

    def add_user(self, user: str) -> str:
        """A new user of the server (another team's machine user, say); returns its token."""
        token = f"hf_{user}_{uuid.uuid4().hex[:12]}"
        with self.state.lock:
            self.state.users[token] = user
        return token

    def plant(
        self, repo_id: str, files: dict[str, bytes], title: str = "planted", author: str = "planter"
    ) -> str:
        """Commit `files` (path -> bytes, kept in git) as they are, paths unchecked: what a writer that
        talks to the commit API directly, past huggingface_hub's checks, can put in a repository."""
        with self.state.lock:
            repo = self.state.repos[repo_id]
            now = datetime.now(UTC)
            oid = hashlib.sha1(f"{repo.head.oid}{time.time_ns()}".encode(), usedforsecurity=False).hexdigest()
            tree = dict(repo.head.files)
            changes = dict(repo.head.last_change)
            for path, data in files.items():
                tree[path] = Blob(len(data), git_blob_sha1(data), None, data)
                changes[path] = (oid, title, now)
            repo.commits.append(Commit(oid, repo.head.oid, title, now, tree, changes, author))
            return oid

    def read(self, repo_id: str, path: str) -> bytes:
        blob = self.files(repo_id)[path]
        if blob.data is not None:
            return blob.data
        assert blob.sha256 is not None
        return self.state.lfs_path(blob.sha256).read_bytes()


class HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: HubState

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def handle(self) -> None:
        # clients that tests kill on purpose hang up mid-request
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            super().handle()

    # --- plumbing --------------------------------------------------------------------------------------

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(
        self,
        status: int,
        body: bytes = b"",
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        with self.state.lock:
            self.state.requests.append((self.command, self.path, status))

    def _json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(payload).encode(), headers=headers)

    def _error(self, status: int, message: str, code: str | None = None) -> None:
        headers = {"X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._json(status, {"error": message}, headers)

    def _user(self) -> str:
        header = self.headers.get("Authorization") or ""
        return self.state.users.get(header.removeprefix("Bearer "), "")

    def _authorized(self) -> bool:
        if self.state.token is None:
            return True
        if self._user():
            return True
        self._error(401, "Invalid credentials in Authorization header")
        return False

    def _repo(self, repo_id: str) -> Repo | None:
        repo = self.state.repos.get(repo_id)
        if repo is None:
            self._error(404, "Repository not found", "RepoNotFound")
        return repo

    def _endpoint(self) -> str:
        return f"http://{self.headers.get('Host')}"

    # --- routing ---------------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._route()

    def do_HEAD(self) -> None:
        self._route()

    def do_POST(self) -> None:
        self._route()

    def do_PUT(self) -> None:
        self._route()

    def _route(self) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        body = self._body() if self.command in ("POST", "PUT") else b""
        if self.command == "PUT" and path.startswith("/lfs-upload/"):
            # the upload href stands for a presigned URL: no Hub token is sent there
            self._lfs_put(path[len("/lfs-upload/") :], body)
            return
        if not self._authorized():
            return
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/(.+))?", path)
        if m and self.command == "GET":
            self._model_info(m.group(1), m.group(2) or "main")
            return
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path)
        if m and self.command == "GET":
            self._tree(m.group(1), m.group(2), (m.group(3) or "").strip("/"), query)
            return
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/commits/(.+)", path)
        if m and self.command == "GET":
            self._commits(m.group(1), m.group(2))
            return
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/preupload/(.+)", path)
        if m and self.command == "POST":
            self._preupload(m.group(1), body)
            return
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/commit/(.+)", path)
        if m and self.command == "POST":
            self._commit(m.group(1), m.group(2), body)
            return
        if path == "/api/repos/create" and self.command == "POST":
            self._create(json.loads(body or b"{}"))
            return
        m = re.fullmatch(r"/([^/]+/[^/]+)\.git/info/lfs/objects/batch", path)
        if m and self.command == "POST":
            self._lfs_batch(m.group(1), json.loads(body))
            return
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m and self.command in ("GET", "HEAD"):
            self._resolve(m.group(1), m.group(2), m.group(3))
            return
        if path == "/api/whoami-v2":
            self._json(200, {"type": "user", "name": "tester", "orgs": []})
            return
        self._error(404, f"no route for {self.command} {path}")

    # --- repositories ----------------------------------------------------------------------------------

    def _create(self, payload: dict[str, Any]) -> None:
        name = payload.get("name")
        organization = payload.get("organization") or "tester"
        if not name:
            self._error(400, "name is required")
            return
        repo_id = f"{organization}/{name}"
        with self.state.lock:
            if repo_id in self.state.repos:
                message = "You already created this model repo"
                self._json(
                    409,
                    {"error": message, "url": f"{self._endpoint()}/{repo_id}"},
                    {"X-Error-Message": message},
                )
                return
            private = payload.get("visibility") == "private" or bool(payload.get("private"))
            self.state.create_repo(repo_id, private)
        self._json(200, {"url": f"{self._endpoint()}/{repo_id}", "name": repo_id})

    def _model_info(self, repo_id: str, revision: str) -> None:
        with self.state.lock:
            repo = self._repo(repo_id)
            if repo is None:
                return
            commit = repo.resolve(revision)
            if commit is None:
                self._error(404, f"Invalid rev id: {revision}", "RevisionNotFound")
                return
            siblings = []
            for path, blob in sorted(commit.files.items()):
                sibling: dict[str, Any] = {"rfilename": path, "size": blob.size, "blobId": blob.sha1}
                if blob.sha256:
                    sibling["lfs"] = {"sha256": blob.sha256, "size": blob.size, "pointerSize": 134}
                siblings.append(sibling)
            payload = {
                "_id": repo.repo_id,
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "private": repo.private,
                "sha": commit.oid,
                "lastModified": hub_date(commit.date),
                "siblings": siblings,
                "tags": [],
                "downloads": 0,
                "likes": 0,
            }
        self._json(200, payload)

    def _tree(self, repo_id: str, revision: str, folder: str, query: dict[str, str]) -> None:
        recursive = query.get("recursive", "false").lower() == "true"
        expand = query.get("expand", "false").lower() == "true"
        cursor = int(query.get("cursor", "0"))
        with self.state.lock:
            repo = self._repo(repo_id)
            if repo is None:
                return
            commit = repo.resolve(unquote(revision))
            if commit is None:
                self._error(404, f"Invalid rev id: {revision}", "RevisionNotFound")
                return
            prefix = f"{folder}/" if folder else ""
            items: dict[str, dict[str, Any]] = {}
            for path, blob in commit.files.items():
                if not path.startswith(prefix):
                    continue
                rest = path[len(prefix) :].split("/")
                # folders on the way down
                for depth in range(1, len(rest)):
                    if not recursive and depth > 1:
                        break
                    folder_path = prefix + "/".join(rest[:depth])
                    items.setdefault(
                        folder_path, {"type": "directory", "oid": "0" * 40, "size": 0, "path": folder_path}
                    )
                    if expand:
                        self._note_last_commit(items[folder_path], commit.last_change[path])
                if len(rest) == 1 or recursive:
                    item: dict[str, Any] = {"type": "file", "oid": blob.sha1, "size": blob.size, "path": path}
                    if blob.sha256:
                        item["lfs"] = {"oid": blob.sha256, "size": blob.size, "pointerSize": 134}
                    if expand:
                        self._note_last_commit(item, commit.last_change[path])
                    items[path] = item
            if folder and not items:
                self._error(404, f"{folder} does not exist on {revision}", "EntryNotFound")
                return
        ordered = [items[k] for k in sorted(items)]
        size = EXPANDED_PAGE_SIZE if expand else PAGE_SIZE
        page = ordered[cursor : cursor + size]
        headers = {}
        if cursor + size < len(ordered):
            query["cursor"] = str(cursor + size)
            next_url = f"{self._endpoint()}{urlsplit(self.path).path}?" + "&".join(
                f"{k}={quote(v)}" for k, v in query.items()
            )
            headers["Link"] = f'<{next_url}>; rel="next"'
        self._json(200, page, headers)

    @staticmethod
    def _note_last_commit(item: dict[str, Any], change: tuple[str, str, datetime]) -> None:
        oid, title, date = change
        current = item.get("lastCommit")
        if current is None or current["date"] < hub_date(date):
            item["lastCommit"] = {"id": oid, "title": title, "date": hub_date(date)}

    # --- downloads -------------------------------------------------------------------------------------

    def _resolve(self, repo_id: str, revision: str, path: str) -> None:
        with self.state.lock:
            repo = self._repo(repo_id)
            if repo is None:
                return
            commit = repo.resolve(unquote(revision))
            if commit is None:
                self._error(404, f"Invalid rev id: {revision}", "RevisionNotFound")
                return
            blob = commit.files.get(path)
            if blob is None:
                self._error(404, f"{path} does not exist", "EntryNotFound")
                return
        etag = blob.sha256 or blob.sha1
        headers = {
            "X-Repo-Commit": commit.oid,
            "ETag": f'"{etag}"',
            "Accept-Ranges": "bytes",
        }
        if blob.sha256:
            headers["X-Linked-Etag"] = f'"{blob.sha256}"'
            headers["X-Linked-Size"] = str(blob.size)
        start, end = 0, blob.size - 1
        status = 200
        requested = self.headers.get("Range")
        if requested and blob.size:
            m = _RANGE_RE.match(requested.strip())
            if m is None or (m.group(1) == "" and m.group(2) == ""):
                self._error(416, f"bad range {requested}")
                return
            if m.group(1) == "":
                start = max(0, blob.size - int(m.group(2)))
            else:
                start = int(m.group(1))
                end = min(end, int(m.group(2))) if m.group(2) else end
            if start > end:
                self._send(416, b"", headers={"Content-Range": f"bytes */{blob.size}"})
                return
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{blob.size}"
        length = end - start + 1 if blob.size else 0
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        with self.state.lock:
            self.state.requests.append((self.command, self.path, status))
        if self.command == "HEAD" or length == 0:
            return
        if blob.data is not None:
            self.wfile.write(blob.data[start : end + 1])
            return
        assert blob.sha256 is not None
        with self.state.lfs_path(blob.sha256).open("rb") as stream:
            stream.seek(start)
            remaining = length
            while remaining:
                chunk = stream.read(min(1024 * 1024, remaining))
                if not chunk:
                    break
                self.wfile.write(chunk)
                remaining -= len(chunk)

    # --- uploads ---------------------------------------------------------------------------------------

    def _preupload(self, repo_id: str, body: bytes) -> None:
        with self.state.lock:
            if self._repo(repo_id) is None:
                return
        answers = []
        for item in json.loads(body).get("files", []):
            sample = base64.b64decode(item.get("sample", ""))
            try:
                sample.decode("utf-8")
                binary = b"\x00" in sample
            except UnicodeDecodeError:
                binary = True
            lfs = binary or int(item.get("size", 0)) >= LFS_THRESHOLD or item["path"].endswith(LFS_SUFFIXES)
            answers.append(
                {"path": item["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False}
            )
        self._json(200, {"files": answers, "commitOid": None})

    def _lfs_batch(self, repo_id: str, payload: dict[str, Any]) -> None:
        with self.state.lock:
            if self._repo(repo_id) is None:
                return
        if payload.get("operation") != "upload":
            self._error(400, "only uploads are served by this LFS endpoint")
            return
        transfers = payload.get("transfers") or ["basic"]
        if "basic" not in transfers:
            self._error(400, f"no supported transfer in {transfers}: this server offers basic only")
            return
        objects = []
        for obj in payload.get("objects", []):
            oid, size = obj["oid"], int(obj["size"])
            answer: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
            if not self.state.lfs_path(oid).exists():
                answer["actions"] = {"upload": {"href": f"{self._endpoint()}/lfs-upload/{oid}?size={size}"}}
            objects.append(answer)
        self._json(200, {"transfer": "basic", "objects": objects, "hash_algo": "sha256"})

    def _lfs_put(self, tail: str, body: bytes) -> None:
        with self.state.lock:
            self.state.lfs_arrivals += 1
        if self.state.lfs_gate is not None:
            self.state.lfs_gate.wait(timeout=60)
        if self.state.lfs_delay:
            time.sleep(self.state.lfs_delay)
        oid = tail.split("?", 1)[0]
        if hashlib.sha256(body).hexdigest() != oid:
            self._error(400, f"content does not match oid {oid}")
            return
        target = self.state.lfs_path(oid)
        partial = target.with_name(f"{oid}.{uuid.uuid4().hex}.part")
        partial.write_bytes(body)
        partial.replace(target)
        with self.state.lock:
            self.state.lfs_puts += 1
        self._send(200, b"")

    def _commit(self, repo_id: str, revision: str, body: bytes) -> None:
        with self.state.lock:
            barrier = self.state.commit_barrier if self.state.barrier_commits > 0 else None
            self.state.barrier_commits -= 1
        if barrier is not None:
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=30)
        if self.state.commit_gate is not None:
            self.state.commit_gate.wait(timeout=60)
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        header = next((line["value"] for line in lines if line.get("key") == "header"), None)
        if header is None:
            self._commit_answer(400, "the commit payload has no header line")
            return
        with self.state.lock:
            if self.state.fail_next_commits:
                status = self.state.fail_next_commits.pop(0)
                self._commit_answer(status, "injected failure")
                return
            repo = self._repo(repo_id)
            if repo is None:
                return
            if unquote(revision) not in ("main",):
                self._commit_answer(400, f"commits go to main, not {revision}")
                return
            parent = header.get("parentCommit")
            if parent is not None and parent != repo.head.oid:
                self._commit_answer(412, "A commit has happened since. Please refresh and try again.")
                return
            files = dict(repo.head.files)
            changed: list[str] = []
            for line in lines:
                key, value = line.get("key"), line.get("value", {})
                if key == "file":
                    data = (
                        base64.b64decode(value["content"])
                        if value.get("encoding") == "base64"
                        else value["content"].encode()
                    )
                    files[value["path"]] = Blob(len(data), git_blob_sha1(data), None, data)
                    changed.append(value["path"])
                elif key == "lfsFile":
                    oid = value["oid"]
                    if not self.state.lfs_path(oid).exists():
                        self._commit_answer(400, f"LFS object {oid} for {value['path']} was never uploaded")
                        return
                    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {value['size']}\n".encode()
                    files[value["path"]] = Blob(int(value["size"]), git_blob_sha1(pointer), oid, None)
                    changed.append(value["path"])
                elif key == "deletedFile":
                    files.pop(value["path"], None)
                elif key == "deletedFolder":
                    prefix = value["path"].rstrip("/") + "/"
                    for path in [p for p in files if p.startswith(prefix)]:
                        del files[path]
            now = datetime.now(UTC)
            oid = hashlib.sha1(
                f"{repo.head.oid}{time.time_ns()}{uuid.uuid4()}".encode(), usedforsecurity=False
            ).hexdigest()
            title = header.get("summary", "")
            last_change = {p: c for p, c in repo.head.last_change.items() if p in files}
            for path in changed:
                last_change[path] = (oid, title, now)
            repo.commits.append(Commit(oid, repo.head.oid, title, now, files, last_change, self._user()))
            self.state.commit_statuses.append(200)
        self._json(
            200,
            {
                "commitUrl": f"{self._endpoint()}/{repo_id}/commit/{oid}",
                "commitOid": oid,
                "pullRequestUrl": None,
            },
        )

    def _commits(self, repo_id: str, revision: str) -> None:
        """The commits reachable from `revision`, newest first, with their authors (one page)."""
        with self.state.lock:
            repo = self._repo(repo_id)
            if repo is None:
                return
            head = repo.resolve(unquote(revision))
            if head is None:
                self._error(404, f"Revision Not Found: {revision}", "RevisionNotFound")
                return
            by_oid = {c.oid: c for c in repo.commits}
            listed = []
            current: Commit | None = head
            while current is not None:
                listed.append(
                    {
                        "id": current.oid,
                        "title": current.title,
                        "message": "",
                        "authors": [{"user": current.author}] if current.author else [],
                        "date": hub_date(current.date),
                    }
                )
                current = by_oid.get(current.parent) if current.parent else None
        self._json(200, listed)

    def _commit_answer(self, status: int, message: str) -> None:
        with self.state.lock:
            self.state.commit_statuses.append(status)
        self._error(status, message)


def main() -> None:  # pragma: no cover - manual use
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--storage", type=Path, default=None)
    args = parser.parse_args()
    server = HubServer(args.storage, host=args.host, port=args.port)
    print(server.url, flush=True)
    server.httpd.serve_forever()


if __name__ == "__main__":  # pragma: no cover
    main()
