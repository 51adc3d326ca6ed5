"""Run a command so that a stop reaches it: SIGTERM and SIGINT forwarded, its exit status kept.

In a SageMaker container the wrapper is PID 1 and `StopTrainingJob` sends SIGTERM to it alone; the
training command must get the signal to write its checkpoint within the 120-second grace. The child runs
in its own session so a terminal's Ctrl-C is not delivered twice, and signals go to its whole process
group, so a shell or torchrun in between does not swallow them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
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


class SignalForwarder:
    """Installs handlers once for the wrapper's lifetime; forwards to whichever child runs now."""

    def __init__(self, watch: StopWatch) -> None:
        self.watch = watch
        self._child: subprocess.Popen[bytes] | None = None
        self._previous: dict[int, object] = {}
        self._lock = threading.Lock()

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
        if child is not None and child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signum)

    def run(self, command: Sequence[str], env: Mapping[str, str]) -> int:
        """Run `command` to its end; returns its exit status (128+N when a signal N ended it)."""
        child = subprocess.Popen(list(command), env=dict(env), start_new_session=True)
        with self._lock:
            self._child = child
        try:
            if self.watch.stopped:
                # the stop arrived while the child was being started
                os.killpg(child.pid, self.watch.signal or signal.SIGTERM)
            status = child.wait()
        finally:
            with self._lock:
                self._child = None
        return 128 - status if status < 0 else status
