"""A TCP proxy on 127.0.0.1 that injects the faults a remote cache shows in the wild.

Modes (read when a connection is accepted, switchable at any time):
    pass       forward both ways
    blackhole  accept, read whatever comes, never answer (a dead load balancer, a dropped route)
    slow       forward, but answers trickle at `rate` bytes per second (and requests at `up_rate`, if set)
    reset      accept and reset the connection at once
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from urllib.parse import urlparse


class FaultProxy:
    def __init__(
        self, upstream_url: str, mode: str = "pass", rate: int = 64 * 1024, up_rate: int | None = None
    ) -> None:
        parsed = urlparse(upstream_url)
        self.upstream = (parsed.hostname or "127.0.0.1", parsed.port or 80)
        self.mode = mode
        self.rate = rate
        self.up_rate = up_rate
        #: Bytes sent to clients so far (answers).
        self.sent = 0
        self.accepted = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._closing = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._next_free = {True: 0.0, False: 0.0}
        self._thread = threading.Thread(target=self._serve, name="fault-proxy", daemon=True)

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self._thread.join(timeout=5)
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def _track(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._sockets.append(sock)
        return sock

    def _serve(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            mode = self.mode
            self._track(client)
            if mode == "reset":
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()
            elif mode == "blackhole":
                threading.Thread(target=self._swallow, args=(client,), daemon=True).start()
            else:
                threading.Thread(target=self._forward, args=(client, mode), daemon=True).start()

    def _pace(self, size: int, rate: int, answers: bool) -> None:
        """Share one rate per direction among all connections (a slow link, not a slow socket)."""
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next_free[answers])
            self._next_free[answers] = start + size / rate
        time.sleep(max(0.0, start + size / rate - now))

    def _swallow(self, client: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while not self._closing.is_set() and client.recv(65536):
                pass

    def _forward(self, client: socket.socket, mode: str) -> None:
        try:
            upstream = self._track(socket.create_connection(self.upstream, timeout=10))
        except OSError:
            client.close()
            return
        upstream.settimeout(None)

        def pipe(source: socket.socket, sink: socket.socket, answers: bool) -> None:
            try:
                while True:
                    throttle = None if mode != "slow" else (self.rate if answers else self.up_rate)
                    data = source.recv(16384 if throttle else 65536)
                    if not data:
                        break
                    if throttle:
                        self._pace(len(data), throttle, answers)
                    sink.sendall(data)
                    if answers:
                        self.sent += len(data)
            except OSError:
                pass
            finally:
                with contextlib.suppress(OSError):
                    sink.shutdown(socket.SHUT_WR)

        threading.Thread(target=pipe, args=(client, upstream, False), daemon=True).start()
        pipe(upstream, client, True)
