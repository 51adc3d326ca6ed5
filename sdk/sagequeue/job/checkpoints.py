"""Checkpoint reports from inside the training container (docs/adr/0025-checkpoint-reports.md).

The scheduler chooses whom to preempt by the training a stop would throw away: the time since each
victim's last checkpoint. It learns that time from one small file, the marker
`<checkpoint dir>/sagequeue-checkpoint.json`, which SageMaker syncs to the job's `CheckpointConfig.S3Uri`
with the checkpoint files. The marker names the training job, the time the checkpoint was complete, its step
and the interval between the last two checkpoints.

Two writers, one file:

- **exact**: the training script calls `report_checkpoint(step)` once a checkpoint is completely written
  (the files closed), on the process that writes it. The marker is written last, replaced atomically.
- **watched**: without such a call, `sagequeue-job run` watches the checkpoint directory (host 1 only) and,
  when files appear or change there and then stop changing for a poll interval, writes the marker with the
  newest file's time and the step it reads in the files' names (`checkpoint-1200`, `step_1200`, ...),
  None when none says. Once the script has reported itself, the watcher leaves the marker to it.

Without either (another image, `SAGEQUEUE_CHECKPOINT_REPORTS=off`), the scheduler knows no checkpoint of the
job: a preemption is counted as losing everything since the attempt began to train.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path

from sagequeue_core.checkpoint_marker import CHECKPOINT_MARKER, CheckpointReport, MarkerError

log = logging.getLogger("sagequeue.job")

#: Where SageMaker keeps (and syncs to S3) the checkpoints a resumed job loads.
CHECKPOINT_DIR_ENV = "SAGEQUEUE_CHECKPOINT_DIR"
DEFAULT_CHECKPOINT_DIR = "/opt/ml/checkpoints"
#: "off": `sagequeue-job run` does not watch the checkpoint directory.
CHECKPOINT_REPORTS_ENV = "SAGEQUEUE_CHECKPOINT_REPORTS"
#: SageMaker sets the training job's name in the container's environment.
TRAINING_JOB_NAME_ENV = "TRAINING_JOB_NAME"
#: Seconds between two looks at the checkpoint directory; a checkpoint counts once a look sees no change.
DEFAULT_POLL_SECONDS = 10.0
#: Overrides DEFAULT_POLL_SECONDS.
CHECKPOINT_POLL_ENV = "SAGEQUEUE_CHECKPOINT_POLL_SECONDS"

#: Files a checkpoint writer leaves while it works (and the marker itself): not a checkpoint.
_IGNORED = re.compile(r"(^\.|\.(tmp|temp|partial|lock|swp)$|^" + re.escape(CHECKPOINT_MARKER) + "$)", re.I)
#: A step in a checkpoint's path: checkpoint-1200, step_1200, global_step1200, iter=1200, ckpt-1200.
_STEP = re.compile(r"(?:global_step|checkpoint|ckpt|step|iteration|iter)[-_=]?(\d+)", re.I)


class CheckpointReportError(RuntimeError):
    """A report cannot be written: no training job name, or no checkpoint directory."""


def checkpoint_dir(env: Mapping[str, str] | None = None) -> Path:
    environment = os.environ if env is None else env
    return Path(environment.get(CHECKPOINT_DIR_ENV) or DEFAULT_CHECKPOINT_DIR)


def read_marker(directory: Path) -> CheckpointReport | None:
    """The marker in `directory`, or None when there is none or it is not one."""
    try:
        return CheckpointReport.from_marker((directory / CHECKPOINT_MARKER).read_bytes())
    except (OSError, MarkerError):
        return None


def write_marker(directory: Path, report: CheckpointReport) -> None:
    """Replace the marker atomically: SageMaker's sync never uploads half of it. The temporary file is made
    beside the directory when possible, so the sync does not upload it either."""
    target = directory / CHECKPOINT_MARKER
    for where in (directory.parent, directory):
        try:
            handle, temporary = tempfile.mkstemp(prefix=".sagequeue-checkpoint.", dir=where)
        except OSError:
            continue
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(report.to_marker())
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, target)
            return
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            if where == directory:
                raise
    raise CheckpointReportError(f"cannot write {target}")


def report_checkpoint(
    step: int | None = None,
    *,
    directory: str | os.PathLike[str] | None = None,
    at: datetime | None = None,
    env: Mapping[str, str] | None = None,
) -> CheckpointReport:
    """Tell sagequeue a checkpoint is complete: call it after the checkpoint's files are written and closed.

    `step`: the training step it holds (None: unknown). `directory`: the checkpoint directory
    (default `$SAGEQUEUE_CHECKPOINT_DIR` or /opt/ml/checkpoints, the one SageMaker syncs). Returns the report
    written; the interval is the gap since the attempt's previous report.
    """
    environment = os.environ if env is None else env
    name = environment.get(TRAINING_JOB_NAME_ENV)
    if not name:
        raise CheckpointReportError(
            f"{TRAINING_JOB_NAME_ENV} is not set: not running in a SageMaker training job"
        )
    folder = Path(directory) if directory is not None else checkpoint_dir(environment)
    if not folder.is_dir():
        raise CheckpointReportError(f"{folder} is not a directory: the job has no CheckpointConfig?")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    report = _next(read_marker(folder), name, at or datetime.now(UTC), step, "script")
    write_marker(folder, report)
    return report


def _next(
    previous: CheckpointReport | None, name: str, at: datetime, step: int | None, source: str
) -> CheckpointReport:
    if previous is None or previous.training_job_name != name:
        # the marker an earlier attempt left (SageMaker restores the prefix) says nothing of this one
        return CheckpointReport(training_job_name=name, at=at, step=step, source=source)
    return previous.following(at, step, source)


def step_of(paths: list[str]) -> int | None:
    """The highest step the checkpoint files' paths name, or None."""
    steps = [int(match) for path in paths for match in _STEP.findall(path)]
    return max(steps) if steps else None


class CheckpointWatcher:
    """Watches the checkpoint directory and writes the marker for each checkpoint that settles.

    Files already there when it starts (the checkpoint a resumed attempt loads) are not a checkpoint of
    this attempt. A checkpoint is complete when a look finds the files that appeared or changed since the
    last one unchanged a poll interval later.
    """

    def __init__(
        self,
        directory: Path,
        training_job_name: str,
        *,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = directory
        self.training_job_name = training_job_name
        self.poll_seconds = poll_seconds
        self._clock = clock
        self._seen = self._files()
        self._changed: dict[str, tuple[int, int]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.reports: list[CheckpointReport] = []

    def _files(self) -> dict[str, tuple[int, int]]:
        found: dict[str, tuple[int, int]] = {}
        for top, dirs, files in os.walk(self.directory):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for name in files:
                if _IGNORED.search(name):
                    continue
                path = Path(top) / name
                with contextlib.suppress(OSError):
                    stat = path.lstat()
                    found[str(path.relative_to(self.directory))] = (stat.st_size, stat.st_mtime_ns)
        return found

    def look(self) -> CheckpointReport | None:
        """One look at the directory; the report written when a checkpoint has just settled."""
        now = self._files()
        fresh = {path: sig for path, sig in now.items() if self._seen.get(path) != sig}
        self._seen = now
        if fresh:
            self._changed.update(fresh)
            return (
                None  # still being written (or just finished): settled only if the next look sees no change
            )
        if not self._changed:
            return None
        changed, self._changed = self._changed, {}
        marker = read_marker(self.directory)
        if (
            marker is not None
            and marker.training_job_name == self.training_job_name
            and marker.source == "script"
        ):
            return None  # the script reports its checkpoints itself, exactly
        newest = max(mtime for _, mtime in changed.values()) / 1e9
        at = datetime.fromtimestamp(min(newest, self._clock()), UTC)
        report = _next(marker, self.training_job_name, at, step_of(sorted(changed)), "watched")
        try:
            write_marker(self.directory, report)
        except (OSError, CheckpointReportError) as exc:
            log.warning("could not write the checkpoint marker: %s", exc)
            return None
        self.reports.append(report)
        log.info("checkpoint %d complete (step %s)", report.count, report.step)
        return report

    def start(self) -> CheckpointWatcher:
        def run() -> None:
            while not self._stop.wait(self.poll_seconds):
                try:
                    self.look()
                except Exception:  # the watch never costs the training
                    log.exception("checkpoint watch failed; reports stop")
                    return

        self._thread = threading.Thread(target=run, name="checkpoint-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching once the command has exited: what it wrote last is complete, so it is reported."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.poll_seconds + 5)
        try:
            self.look()
            self.look()
        except Exception:
            log.exception("checkpoint watch failed at the end")


def start_watch(env: Mapping[str, str], host_index: int | None) -> CheckpointWatcher | None:
    """The watcher `sagequeue-job run` starts, or None: reports off, outside SageMaker, not host 1 (every
    host syncs to the same prefix; one marker is enough), or no checkpoint directory (no CheckpointConfig)."""
    if env.get(CHECKPOINT_REPORTS_ENV, "").strip().lower() == "off":
        return None
    name = env.get(TRAINING_JOB_NAME_ENV)
    directory = checkpoint_dir(env)
    if not name or (host_index is not None and host_index != 1) or not directory.is_dir():
        return None
    try:
        poll = float(env.get(CHECKPOINT_POLL_ENV) or DEFAULT_POLL_SECONDS)
    except ValueError:
        poll = DEFAULT_POLL_SECONDS
    log.info("reporting checkpoints written under %s", directory)
    return CheckpointWatcher(directory, name, poll_seconds=poll if poll > 0 else DEFAULT_POLL_SECONDS).start()


__all__ = [
    "CHECKPOINT_DIR_ENV",
    "CHECKPOINT_REPORTS_ENV",
    "DEFAULT_CHECKPOINT_DIR",
    "CheckpointReportError",
    "CheckpointWatcher",
    "read_marker",
    "report_checkpoint",
    "start_watch",
    "step_of",
    "write_marker",
]
