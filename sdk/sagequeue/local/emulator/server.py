"""SageMaker's wire protocol (awsJson1_1) over a threaded stdlib HTTP server on localhost.

botocore sends `POST /` with `X-Amz-Target: SageMaker.<Operation>` and a JSON body, and reads a JSON body
back; errors are `{"__type": code, "message": text}` with status 400, which botocore turns into a
ClientError carrying that code. Whatever a client sends, the server answers; nothing it sends stops it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import uuid
from collections.abc import Callable
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sagequeue.local.emulator.errors import (
    InternalFailure,
    SageMakerError,
    SerializationError,
    UnknownOperation,
)

logger = logging.getLogger("sagequeue.local.emulator")

TARGET_PREFIX = "SageMaker."
CONTENT_TYPE = "application/x-amz-json-1.1"
MAX_BODY_BYTES = 16 * 1024 * 1024

#: (operation, request) -> answer; raises SageMakerError for refusals.
Dispatch = Callable[[str, Any], dict[str, Any]]


def _encode_default(value: Any) -> Any:
    # botocore parses epoch seconds (numbers) as timestamps for JSON protocols.
    if isinstance(value, datetime):
        return value.timestamp()
    raise TypeError(f"cannot encode {type(value).__name__} in a SageMaker answer")


def encode(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, default=_encode_default, separators=(",", ":")).encode()


def answer(dispatch: Dispatch, target: str, body: bytes) -> tuple[int, dict[str, Any]]:
    """The status and JSON answer to one request: its X-Amz-Target header and body. What the HTTP server
    and the in-process transport (`sagequeue.local.emulator.SageMakerEmulator.attach`) both answer."""
    if not target.startswith(TARGET_PREFIX):
        error: SageMakerError = UnknownOperation(
            f"Missing or foreign X-Amz-Target header {target!r}: expected {TARGET_PREFIX}<Operation>"
        )
        return error.status, error.to_wire()
    operation = target[len(TARGET_PREFIX) :]
    try:
        request = json.loads(body.decode("utf-8")) if body.strip() else {}
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError and over-long integers; RecursionError, absurd nesting.
        refusal = SerializationError(f"The request body is not valid JSON: {exc}")
        return refusal.status, refusal.to_wire()
    try:
        return 200, dispatch(operation, request)
    except SageMakerError as refused:
        return refused.status, refused.to_wire()
    except Exception:  # the last line of defence: a bug answers 500 instead of killing the caller's thread
        logger.exception("SageMaker emulator failed on a request")
        error = InternalFailure("The emulator failed while handling the request; see its log.")
        return error.status, error.to_wire()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle on, each answer waits for a delayed ACK (~40 ms).
    disable_nagle_algorithm = True
    server: EmulatorHTTPServer

    def do_POST(self) -> None:
        try:
            status, payload = self._handle_post()
        except Exception:  # the last line of defence: a bug answers 500 instead of killing the thread
            logger.exception("SageMaker emulator failed on a request")
            error = InternalFailure("The emulator failed while handling the request; see its log.")
            status, payload = error.status, error.to_wire()
        self._answer(status, payload)

    def _handle_post(self) -> tuple[int, dict[str, Any]]:
        body = self._read_body()
        if isinstance(body, SageMakerError):
            return body.status, body.to_wire()
        return answer(self.server.dispatch, self.headers.get("X-Amz-Target", ""), body)

    def _read_body(self) -> bytes | SageMakerError:
        length_header = self.headers.get("Content-Length")
        if length_header is None:
            self.close_connection = True
            return SerializationError("The request has no Content-Length; send the JSON body with a length.")
        try:
            length = int(length_header)
        except ValueError:
            self.close_connection = True
            return SerializationError(f"Content-Length {length_header!r} is not a number")
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True
            return SerializationError(
                f"The request body must be at most {MAX_BODY_BYTES} bytes, got {length}"
            )
        return self.rfile.read(length)

    def _refuse_method(self) -> None:
        # Drain any body so the connection stays usable, then answer in SageMaker's error shape.
        length = self.headers.get("Content-Length")
        if length and length.isdigit() and int(length) <= MAX_BODY_BYTES:
            self.rfile.read(int(length))
        else:
            self.close_connection = True
        error = UnknownOperation(f"SageMaker answers POST / only, not {self.command} {self.path}")
        self._answer(error.status, error.to_wire())

    do_GET = do_PUT = do_DELETE = do_PATCH = do_HEAD = _refuse_method

    def _answer(self, status: int, payload: dict[str, Any]) -> None:
        data = encode(payload)
        try:
            self.send_response(status)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        except OSError:
            self.close_connection = True  # the client went away; nothing to answer to

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s " + format, self.address_string(), *args)


class EmulatorHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, host: str, port: int, dispatch: Dispatch) -> None:
        super().__init__((host, port), _Handler)
        self.dispatch = dispatch
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """Ends kept-alive connections too, so a stopped emulator answers no one."""
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("connection from %s ended abruptly", client_address, exc_info=True)


class ServerThread:
    """Runs an EmulatorHTTPServer in a daemon thread until `close()`."""

    def __init__(self, host: str, port: int, dispatch: Dispatch) -> None:
        self.server = EmulatorHTTPServer(host, port, dispatch)
        self._thread = threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="sagemaker-emulator",
            daemon=True,
        )
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.server.close_connections()
        self._thread.join(timeout=5)
