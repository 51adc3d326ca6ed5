"""`sagequeue-job run` for a TorchNeuron image: restore, run, publish, with the XLA cache's fault bounds.

1. choose the local cache (the warm pool's persistent directory first, then TORCH_NEURONX_NEFF_CACHE_DIR,
   then torch-neuronx's default) and the namespace (torch-neuronx and neuronx-cc versions, platform, cores,
   NKI sources);
2. restore that namespace's entries, bounded like the XLA restore (stall cut-off, timeout, disk floor);
3. run the command with the cache variables in its environment: they are set before its interpreter
   starts, so before it imports torch;
4. publish the complete entries the namespace lacks; after SIGTERM within the stop grace, starting at the
   stop (what is complete then) and again after the command exits (what completed meanwhile).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol, TypeVar

from sagequeue.job import torchneuron
from sagequeue.job.flow import CACHE_DIR_ENV, JobOptions, JobOutcome, StopUploads
from sagequeue.job.process import StopWatch
from sagequeue.job.remote import Deadline, RemoteCache, Trust

log = logging.getLogger("sagequeue.job")
T = TypeVar("T")


class JobRunner(Protocol):
    """What this flow uses of `runner.JobRunner`, which calls it (named here, so nothing imports back)."""

    options: JobOptions
    env: dict[str, str]
    watch: StopWatch
    _trust: Trust

    def _remote(self) -> RemoteCache | None: ...

    def run_command(
        self,
        child_env: Mapping[str, str],
        uploads: StopUploads | None = None,
        before: Callable[[], None] | None = None,
    ) -> int: ...

    def bounded_upload(self, work: Callable[[Deadline], T], outcome: JobOutcome, left: str) -> T | None: ...


def run_job(runner: JobRunner) -> JobOutcome:

    options = runner.options
    root, source = torchneuron.choose_cache_dir(runner.env, options.cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    log.info("TorchNeuron NEFF cache: %s (%s)", root, source)
    child_env = torchneuron.child_environment(runner.env, root)
    child_env[CACHE_DIR_ENV] = str(root)
    outcome = JobOutcome(status=0)
    namespace: torchneuron.Namespace | None = None
    try:
        namespace = torchneuron.namespace_for(
            runner.env,
            torch_neuronx=options.torch_neuronx_version,
            neuronx_cc=options.compiler_version,
            platform=options.platform,
            cores=options.cores,
            nki_sources=options.nki_sources,
        )
        log.info("cache namespace %s", namespace.name)
    except torchneuron.NamespaceError as exc:
        # entries of an unknown namespace could be restored into the wrong job: share nothing
        log.warning("NEFF cache sharing disabled: %s", exc)
    remote = runner._remote() if namespace is not None else None
    store = torchneuron.pack_store(remote) if remote is not None else None
    if store is not None and namespace is not None and options.restore != "none":
        _restore(runner, store, root, namespace, outcome)
    outcome.status = runner.run_command(child_env, _Uploads(runner, store, root, namespace, outcome))
    return outcome


def _restore(
    runner: JobRunner,
    store: torchneuron.PackStore,
    root: Path,
    namespace: torchneuron.Namespace,
    outcome: JobOutcome,
) -> None:
    from sagequeue.job.flow import bounded as _bounded
    from sagequeue.job.flow import default_min_free

    options = runner.options
    control = Deadline(options.restore_timeout)
    min_free = options.restore_min_free if options.restore_min_free is not None else default_min_free(root)
    started = time.monotonic()
    try:
        finished, report = _bounded(
            lambda: torchneuron.restore(
                store,
                root,
                namespace,
                workers=options.workers,
                control=control,
                min_free_bytes=min_free,
                max_bytes=options.restore_max_bytes,
                trust=runner._trust,
            ),
            options.restore_timeout,
            runner.watch,
            control=control,
            stall=options.stall_seconds,
            what="restore",
        )
    except Exception as exc:  # noqa: BLE001 - a broken cache costs a compile, never the job
        log.warning("restore failed, the job will compile what it needs: %s", exc)
        return
    if not finished or report is None:
        outcome.abandoned = True
        log.warning(
            "restore did not finish (stopped, over %.0fs, or no progress); continuing",
            options.restore_timeout,
        )
        return
    outcome.restored = report.restored
    log.info(
        "restored %d entries (%d bytes, %d requests) in %.1fs; %d already local, %d failed, %d over budget, "
        "%d packs of untrusted writers%s",
        len(report.restored),
        report.bytes_downloaded,
        report.requests,
        time.monotonic() - started,
        report.already_local,
        len(report.failed),
        len(report.over_budget),
        len(report.untrusted),
        f"; stopped: {report.stopped}" if report.stopped else "",
    )


class _Uploads(StopUploads):
    """The final upload (see `flow.StopUploads`): the complete `.neff` files the namespace lacks, in packs."""

    thread_name = "tnx-stop-upload"

    def __init__(
        self,
        runner: JobRunner,
        store: torchneuron.PackStore | None,
        root: Path,
        namespace: torchneuron.Namespace | None,
        outcome: JobOutcome,
    ) -> None:
        super().__init__(outcome)
        self.runner = runner
        self.store = store
        self.root = root
        self.namespace = namespace

    @property
    def enabled(self) -> bool:
        return self.store is not None and self.namespace is not None and self.runner.options.upload

    def complete(self) -> set[str]:
        return set(torchneuron.local_entries(self.root))

    def publish(self, complete: set[str] | None, taken: set[str]) -> None:
        assert self.store is not None
        assert self.namespace is not None
        runner = self.runner
        options = runner.options
        store, root, namespace = self.store, self.root, self.namespace
        only = None if complete is None else complete - taken
        started = time.monotonic()
        job = runner.env.get("TRAINING_JOB_NAME")

        def work(deadline: Deadline) -> torchneuron.UploadReport:
            return torchneuron.upload(
                store,
                root,
                namespace,
                deadline=deadline,
                only=only,
                training_job=job,
                model=options.model,
                trust=runner._trust,
            )

        report = runner.bounded_upload(work, self.outcome, "packs not finished are invisible remotely")
        if report is None:
            return
        self.outcome.published = sorted(set(self.outcome.published) | set(report.published))
        log.info(
            "uploaded %d entries in %d packs in %.1fs (%d already there, %d left for later)",
            len(report.published),
            len(report.packs),
            time.monotonic() - started,
            len(report.already_present),
            len(report.skipped),
        )
