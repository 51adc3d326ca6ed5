"""Run a command so that a stop reaches it: SIGTERM and SIGINT forwarded, its exit status kept.

In a SageMaker container the wrapper is PID 1 and `StopTrainingJob` sends SIGTERM to it alone; the
training command must get the signal to write its checkpoint within the 120-second grace. The child runs
in its own session so a terminal's Ctrl-C is not delivered twice, and signals go to its whole process
group, so a shell or torchrun in between does not swallow them.

A stop is over only when the whole process group is gone, not when the direct child exits: a launcher
without a SIGTERM handler (the SageMaker training toolkit's `train`, `bash -c "a & b & wait"`) dies at once
while its workers are still writing their checkpoints. `wait_for_group` waits for them. A worker that
leaves the group (`setsid`, `start_new_session=True`) is not covered: it gets no signal from us and we do
not wait for it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType

log = logging.getLogger(__name__)

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopWatch:
    """Remembers the first stop signal the wrapper received, and when."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.received_at: float | None = None
        self.event = threading.Event()

    def note(self, signum: int) -> None:
        if self.signal is None:
            self.signal = signum
            self.received_at = time.monotonic()
        self.event.set()

    @property
    def stopped(self) -> bool:
        return self.signal is not None

    def seconds_since(self) -> float:
        return 0.0 if self.received_at is None else time.monotonic() - self.received_at


def _group_members(pgid: int) -> list[int] | None:
    """Live (not zombie) processes of process group `pgid` from /proc; None when /proc cannot tell."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    members = []
    for stat in proc.glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # the process ended while we looked
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses
        fields = text[text.rfind(")") + 2 :].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(text.split(" ", 1)[0]))
    return members


def group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` still runs (zombies waiting for a reaper do not count)."""
    members = _group_members(pgid)
    if members is not None:
        return bool(members)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wait_for_group(pgid: int, until: float, poll: float = 0.05) -> bool:
    """Wait until process group `pgid` is gone or the monotonic time `until`; True when it is gone."""
    while group_alive(pgid):
        if time.monotonic() >= until:
            return False
        time.sleep(poll)
    return True


class SignalForwarder:
    """Installs handlers once for the wrapper's lifetime; forwards to whichever child runs now."""

    def __init__(self, watch: StopWatch) -> None:
        self.watch = watch
        self._child: subprocess.Popen[bytes] | None = None
        self._previous: dict[int, object] = {}
        self._lock = threading.Lock()
        #: Process group of the last command run: what a stop still has to wait for after it exits.
        self.last_group: int | None = None

    def install(self) -> None:
        for signum in FORWARDED_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.watch.note(signum)
        with self._lock:
            child = self._child
        group = child.pid if child is not None else self.last_group
        if group is not None:
            # also when the direct child is gone: its workers may still run in its group
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signum)

    def run(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        stop_end: Callable[[], float] | None = None,
        on_stop: Callable[[], None] | None = None,
    ) -> int:
        """Run `command` to its end; returns its exit status (128+N when a signal N ended it). After a
        stop, a command still running at the monotonic time `stop_end()` has its process group killed.

        `on_stop` (with a `stop_end`) is called once, from this thread, as soon as a stop is seen while the
        command still runs: what the wrapper does meanwhile (the upload) need not wait for the command's
        checkpoint."""
        child = subprocess.Popen(list(command), env=dict(env), start_new_session=True)
        with self._lock:
            self._child = child
            self.last_group = child.pid
        try:
            if self.watch.stopped:
                # the stop arrived while the child was being started
                os.killpg(child.pid, self.watch.signal or signal.SIGTERM)
            status = child.wait() if stop_end is None else self._wait(child, stop_end, on_stop)
        finally:
            with self._lock:
                self._child = None
        return 128 - status if status < 0 else status

    def _wait(
        self,
        child: subprocess.Popen[bytes],
        stop_end: Callable[[], float],
        on_stop: Callable[[], None] | None = None,
    ) -> int:
        """Wait for `child`; once stopped, only until `stop_end()`, then kill its group and reap it."""
        while True:
            # short waits: a stop is acted on within a fifth of a second
            timeout = 0.2
            if self.watch.stopped:
                if on_stop is not None:
                    on_stop()
                    on_stop = None
                timeout = min(timeout, stop_end() - time.monotonic())
                if timeout <= 0:
                    log.warning(
                        "the command still runs at the end of the stop grace: killing its process group"
                    )
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(child.pid, signal.SIGKILL)
                    return child.wait()
            try:
                return child.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                continue
