"""What both compile-cache flows of the job image (the XLA cache in `runner`, the TorchNeuron cache in
`torchneuron_job`) share: a run's outcome, the bound on a transfer, the free-space floor of a restore, the
final upload that a stop starts early.
Kept apart from `runner`, so the TorchNeuron flow imports it and `runner` imports that flow, with no circle."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sagequeue.job.process import StopWatch
from sagequeue.job.remote import Deadline
from sagequeue_core.defaults import METRIC_PERIOD_SECONDS

log = logging.getLogger("sagequeue.job")

#: SageMaker waits this long after SIGTERM before it kills the container.
SAGEMAKER_STOP_GRACE_SECONDS = 120.0
#: No progress for this long (no answer, no byte) calls a restore off: a dead cache delays training by
#: about this much, well under a minute.
STALL_SECONDS = 20.0
UPLOAD_STALL_SECONDS = 300.0

#: Set for the training command: the local cache the wrapper chose.
CACHE_DIR_ENV = "SAGEQUEUE_NEURON_CACHE_DIR"
#: A restore that got no first answer after this long says so in the log.
SLOW_FIRST_ANSWER_SECONDS = 5.0
#: The default free-space floor: this share of the file system, at most MAX_DEFAULT_MIN_FREE.
DEFAULT_MIN_FREE_SHARE = 0.2
MAX_DEFAULT_MIN_FREE = 8 * 1024**3


def default_min_free(path: Path) -> int:
    """Free space a restore keeps for the job's own compile: 20% of the file system, at most 8 GiB."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return min(MAX_DEFAULT_MIN_FREE, int(shutil.disk_usage(probe).total * DEFAULT_MIN_FREE_SHARE))


T = TypeVar("T")


@dataclass
class JobOptions:
    command: list[str]
    cache_url: str | None = None
    #: S3: the writer folder this job publishes under (its team's); the Hub: the token's user.
    cache_writer: str | None = None
    #: The writers whose entries this job restores, comma-separated; None or "*": any.
    cache_trust: str | None = None
    cache_dir: str | None = None
    compiler_version: str | None = None
    model: str | None = None
    config: dict[str, str] = field(default_factory=dict)
    #: auto (the registry's entries when it knows this configuration, else all), all, registry, none
    restore: str = "auto"
    upload: bool = True
    precompile_steps: int | None = None
    #: auto (when neuron-monitor is on PATH and the host is known), on (the same, with a warning when they
    #: are not: the command runs regardless), off
    metrics: str = "auto"
    metrics_period: float = METRIC_PERIOD_SECONDS
    grace_seconds: float = SAGEMAKER_STOP_GRACE_SECONDS
    #: Seconds kept free at the end of the grace for the wrapper to exit (less for a short grace).
    exit_margin: float = 10.0
    upload_timeout: float = 1800.0
    restore_timeout: float = 1800.0
    #: A restore (or the first answer of an upload) with no progress for this long is called off.
    stall_seconds: float = STALL_SECONDS
    #: After the remote answered, an upload with no finished file or batch for this long is abandoned.
    upload_stall_seconds: float = UPLOAD_STALL_SECONDS
    #: Free space the restore leaves for the job's own compile (None: `default_min_free`).
    restore_min_free: int | None = None
    restore_max_bytes: int | None = None
    workers: int = 16
    progress: bool = True
    remote_options: dict[str, Any] = field(default_factory=dict)
    #: auto (what the image has installed), xla, or torchneuron (see sagequeue.job.torchneuron)
    cache_kind: str = "auto"
    #: TorchNeuron namespace parts the environment does not give (None: discovered)
    torch_neuronx_version: str | None = None
    platform: str | None = None
    cores: str | None = None
    nki_sources: list[str] = field(default_factory=list)


@dataclass
class JobOutcome:
    status: int
    #: The upload did not finish within its bound: worker threads may still hold connections.
    abandoned: bool = False
    restored: list[str] = field(default_factory=list)
    published: list[str] = field(default_factory=list)
    precompiled: bool = False


def bounded(
    fn: Callable[[], T],
    timeout: float,
    watch: StopWatch | None = None,
    stop_end: Callable[[], float] | None = None,
    control: Deadline | None = None,
    stall: float | None = None,
    first_answer_stall: float | None = None,
    what: str = "transfer",
) -> tuple[bool, T | None]:
    """Run `fn` in a daemon thread for at most `timeout` seconds.

    When a stop arrives meanwhile, waiting ends at once (`watch`), or at the monotonic time `stop_end()`
    gives (a stop's grace), whichever the caller chose. With a `control`, waiting also ends when it shows
    no activity for `stall` seconds (`first_answer_stall` before the remote's first answer), and the
    control is cancelled whenever waiting ends early, so the transfer's workers stop at their next chunk.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="neff-cache-transfer", daemon=True)
    thread.start()
    started = time.monotonic()
    end = started + timeout
    said_slow = False
    while thread.is_alive():
        limit = end
        if watch is not None and watch.stopped:
            if stop_end is None:
                break
            limit = min(end, stop_end())
            if control is not None:
                # the transfer sizes what it starts next, and when it commits, to the stop's grace
                control.cut(limit)
        if time.monotonic() >= limit:
            break
        if control is not None:
            activity = control.activity
            allowed = stall if activity.answered else (first_answer_stall or stall)
            if allowed is not None and activity.idle_for() >= allowed:
                log.warning("the remote cache made no progress for %.0fs: %s called off", allowed, what)
                break
            if (
                not activity.answered
                and not said_slow
                and time.monotonic() - started >= SLOW_FIRST_ANSWER_SECONDS
            ):
                said_slow = True
                log.warning(
                    "the remote cache has not answered for %.0fs; the %s gives up %.0fs from now",
                    time.monotonic() - started,
                    what,
                    max(0.0, (allowed or timeout) - activity.idle_for()),
                )
        thread.join(timeout=0.2)
    if thread.is_alive():
        if control is not None:
            control.cancel.set()
        return False, None
    if "error" in box:
        raise box["error"]
    return True, box.get("value")


class StopUploads:
    """The final upload, started as soon as a stop is seen rather than when the command exits.

    A launcher that waits for its workers' checkpoints (torchrun) outlives the stop by as long as they take;
    uploading only after it would leave the upload what remains of the grace. Started at the stop, the
    upload takes the entries complete at that moment (an entry a compiler still writes is not complete yet)
    while the command checkpoints; once the command has exited, a second pass takes the entries completed
    meanwhile, unless the first pass was abandoned. Each flow says what is complete (`complete`) and how a
    pass publishes (`publish`); `JobRunner.run_command` calls `start` and `finish`.
    """

    thread_name = "neff-cache-stop-upload"

    def __init__(self, outcome: JobOutcome) -> None:
        self.outcome = outcome
        self._early: threading.Thread | None = None
        #: The complete entries the early pass saw.
        self._seen: set[str] = set()
        self._abandoned_before = False

    @property
    def enabled(self) -> bool:
        raise NotImplementedError

    def complete(self) -> set[str]:
        """The names of the local entries complete now (may raise OSError)."""
        raise NotImplementedError

    def publish(self, complete: set[str] | None, taken: set[str]) -> None:
        """One bounded pass: `complete` is what is complete now (None: read it when needed), `taken` what
        an earlier pass already took (empty for the first)."""
        raise NotImplementedError

    def start(self) -> None:
        """On a stop while the command runs: upload what is complete now, in a thread."""
        if not self.enabled or self._early is not None:
            return
        log.info("stopping: uploading the complete entries while the command finishes")
        try:
            self._seen = self.complete()
        except OSError as exc:
            # called while the command is waited for: nothing here may cost its exit status
            log.warning("cannot read the local cache at the stop; uploading when the command exits: %s", exc)
            return
        self._abandoned_before = self.outcome.abandoned
        self._early = threading.Thread(
            target=self.publish, args=(self._seen, set()), name=self.thread_name, daemon=True
        )
        self._early.start()

    def finish(self) -> None:
        """After the command: the whole upload, or what the early pass could not have seen."""
        if not self.enabled:
            return
        if self._early is None:
            self.publish(None, set())
            return
        # the early pass is bounded by the stop's grace itself
        self._early.join()
        complete = self.complete()
        early_abandoned = self.outcome.abandoned and not self._abandoned_before
        if complete - self._seen and not early_abandoned:
            log.info("%d entries completed during the stop: uploading them too", len(complete - self._seen))
            self.publish(complete, self._seen)
