"""`sagequeue-job run`: the training container's entry point, step by step.

1. choose the local compile cache (the warm pool's persistent directory first);
2. restore this compiler version's entries from the remote cache (only the registry's entries for this
   job configuration when it has them);
3. on a miss, optionally precompile under neuron_parallel_compile with a step limit;
4. run the training command, forwarding SIGTERM/SIGINT, while neuron-monitor's utilization goes to
   CloudWatch;
5. publish the new complete entries and the registry record, within SageMaker's stop grace when stopping.

Nothing in the cache path may fail the training: a remote that is down, slow or refusing costs a compile,
never the job. The exit status is the training command's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from sagequeue.job import checkpoints, neuron, settings, sync, torchneuron
from sagequeue.job.backends import open_remote
from sagequeue.job.flow import (
    CACHE_DIR_ENV,
    JobOptions,
    JobOutcome,
    StopUploads,
    default_min_free,
)
from sagequeue.job.flow import bounded as _bounded
from sagequeue.job.host import INSTANCE_TYPE_ENV, HostIdentityError
from sagequeue.job.host import resolve as resolve_host
from sagequeue.job.process import SignalForwarder, StopWatch, group_alive, wait_for_group
from sagequeue.job.remote import Deadline, RegistryRecord, RemoteCache, Trust, matches_job

log = logging.getLogger("sagequeue.job")

#: Environment the precompile run gets: the step limit a training script should honour.
PRECOMPILE_STEPS_ENV = "SAGEQUEUE_PRECOMPILE_STEPS"
#: Set to "1" for the precompile run: under neuron_parallel_compile nothing really executes and every output
#: is invalid, so the script must skip every save (checkpoints, the model, metrics) when it sees it.
PRECOMPILE_ENV = "SAGEQUEUE_PRECOMPILE"
#: SageMaker's output directories a script finds in its environment: a scratch directory stands in for each
#: during the precompile run, so a script that writes where they point writes nothing that is kept.
SAGEMAKER_OUTPUT_ENVS = ("SM_MODEL_DIR", "SM_OUTPUT_DATA_DIR", "SM_OUTPUT_DIR", "SM_CHECKPOINT_DIR")
#: Where SageMaker keeps (and syncs to S3) the checkpoints a resumed job loads; watched during a precompile,
#: and for checkpoint reports (sagequeue.job.checkpoints).
CHECKPOINT_DIR_ENV = checkpoints.CHECKPOINT_DIR_ENV
DEFAULT_CHECKPOINT_DIR = checkpoints.DEFAULT_CHECKPOINT_DIR
_CORES_ENV = "NEURON_RT_NUM_CORES"
T = TypeVar("T")


def _snapshot(folders: list[Path]) -> dict[Path, tuple[int, int]]:
    """(size, mtime in ns) of every file under `folders`, links not followed."""
    found: dict[Path, tuple[int, int]] = {}
    for folder in folders:
        for top, _dirs, files in os.walk(folder):
            for name in files:
                path = Path(top) / name
                with contextlib.suppress(OSError):
                    stat = path.lstat()
                    found[path] = (stat.st_size, stat.st_mtime_ns)
    return found


def job_record(options: JobOptions, env: Mapping[str, str], version: str) -> RegistryRecord | None:
    """The registry record this job writes and looks up, or None when no model is named."""
    if not options.model:
        return None
    config = {
        "compiler_flags": neuron.flags_without_cache_dir(env.get(neuron.CC_FLAGS_ENV, "")),
        "instance_type": env.get(INSTANCE_TYPE_ENV, ""),
        "num_cores": env.get(_CORES_ENV, ""),
    }
    config.update(options.config)
    return RegistryRecord(
        model=options.model,
        compiler_version=version,
        config={k: v for k, v in config.items() if v != ""},
        training_job=env.get("TRAINING_JOB_NAME"),
    )


class JobRunner:
    def __init__(self, options: JobOptions, env: Mapping[str, str] | None = None) -> None:
        self.options = options
        self.env = dict(os.environ if env is None else env)
        self.watch = StopWatch()
        self.forwarder = SignalForwarder(self.watch)
        self._trust = Trust()
        #: The remote is the Neuron SDK's own S3 cache, which the compiler searched whole.
        self._adopted_sdk = False

    def run(self) -> JobOutcome:
        self.forwarder.install()
        try:
            return self._run()
        finally:
            self.forwarder.restore()

    def _run(self) -> JobOutcome:
        options = self.options
        if torchneuron.resolve_kind(options.cache_kind, self.env) == torchneuron.KIND:
            from sagequeue.job.torchneuron_job import run_job

            return run_job(self)
        location = neuron.choose_cache_dir(self.env, options.cache_dir)
        root = location.path
        root.mkdir(parents=True, exist_ok=True)
        log.info("compile cache: %s (%s)", root, location.source)
        try:
            version = neuron.discover_compiler_version(self.env, explicit=options.compiler_version)
        except neuron.CompilerNotFoundError as exc:
            # without a version there is no cache directory to share; the command still runs
            log.warning("NEFF cache disabled: %s", exc)
            return self._run_command_only(root)
        log.info("Neuron compiler %s", version)
        cleaned = neuron.remove_failed(root, version)
        if cleaned:
            log.info("removed %d failed entries so they compile again", len(cleaned))
        record = job_record(options, self.env, version)
        remote = self._remote()
        before = {e.module for e in sync.shareable(root, version)}
        outcome = JobOutcome(status=0)
        registry_entries: set[str] = set()
        if remote is not None and options.restore != "none":
            registry_entries = self._restore(remote, root, version, record, outcome)
        # a hit is what the compiler will find on disk, not what the registry says
        present = {e.module for e in sync.shareable(root, version)}
        hit = registry_entries <= present if registry_entries else (record is None and bool(present))
        child_env = neuron.child_environment(self.env, root)
        child_env[CACHE_DIR_ENV] = str(root)
        uploads = _StopUploads(self, remote, root, version, before, registry_entries, record, outcome)

        def precompile() -> None:
            outcome.precompiled = True
            self._precompile(child_env, uploads.start)

        outcome.status = self.run_command(
            child_env, uploads, precompile if options.precompile_steps and not hit else None
        )
        return outcome

    def run_command(
        self,
        child_env: Mapping[str, str],
        uploads: StopUploads | None = None,
        before: Callable[[], None] | None = None,
    ) -> int:
        """Run the training command with `child_env` and return its exit status (128 + the signal when a
        stop came before it started), SIGTERM/SIGINT passed on to it, utilization published meanwhile.
        `before` (the precompile run) runs first unless a stop came. A stop while either runs starts
        `uploads`; after the command, `uploads.finish()` runs while the rest of its process group (after a
        stop) gets until the end of the grace."""
        publisher = self._start_metrics()
        on_stop = uploads.start if uploads is not None else None
        watcher = None
        try:
            if before is not None and not self.watch.stopped:
                before()
            if self.watch.stopped:
                status = 128 + (self.watch.signal or 15)
            else:
                watcher = self._start_checkpoint_watch()
                log.info("running %s", " ".join(self.options.command))
                status = self.forwarder.run(self.options.command, child_env, self._stop_end, on_stop)
                log.info("command exited with status %d", status)
        finally:
            if watcher is not None:
                watcher.stop()
            if publisher is not None:
                publisher.stop()
        # after a stop, the command's workers may outlive it (a launcher without a SIGTERM handler):
        # they checkpoint while the upload runs, and the wrapper leaves only when they are gone
        group = self._group_waiter()
        try:
            if uploads is not None:
                uploads.finish()
        finally:
            if group is not None:
                group.join()
        return status

    def bounded_upload(self, work: Callable[[Deadline], T], outcome: JobOutcome, left: str) -> T | None:
        """Run `work` (an upload that stops starting new pieces at the deadline it gets) within the upload's
        bound: what remains of the stop's grace after a stop (a stop that comes meanwhile shortens it to
        that), else --upload-timeout; called off on a stall. Its report, or None when it failed or was
        abandoned (then `outcome.abandoned` is set and the log says `left`, what the remote holds of it)."""
        options = self.options
        budget = self._stop_end() - time.monotonic() if self.watch.stopped else options.upload_timeout
        if budget <= 1:
            log.warning("no time left to upload (%.0fs of the stop grace remain)", budget)
            return None
        # the transfer stops starting new entries a little before the hard bound
        deadline = Deadline(budget * 0.85)
        started = time.monotonic()
        try:
            finished, report = _bounded(
                lambda: work(deadline),
                budget,
                self.watch,
                self._stop_end,
                control=deadline,
                stall=options.upload_stall_seconds,
                first_answer_stall=options.stall_seconds,
                what="upload",
            )
        except Exception as exc:  # noqa: BLE001 - the training result matters more than the cache
            log.warning("upload failed; entries stay local and go next time: %s", exc)
            return None
        if not finished or report is None:
            outcome.abandoned = True
            log.warning("upload abandoned after %.0fs; %s", time.monotonic() - started, left)
            return None
        return report

    def _stop_end(self) -> float:
        """Monotonic time by which the wrapper must have left after a stop (the grace minus a margin)."""
        options = self.options
        margin = min(options.exit_margin, max(2.0, 0.15 * options.grace_seconds))
        return (self.watch.received_at or time.monotonic()) + options.grace_seconds - margin

    def _group_waiter(self) -> threading.Thread | None:
        """After a stop, a thread that waits for the command's whole process group, up to the grace."""
        group = self.forwarder.last_group
        if not self.watch.stopped or group is None or not group_alive(group):
            return None
        log.info("the command exited; waiting for the rest of its process group to finish")

        def wait() -> None:
            if wait_for_group(group, self._stop_end()):
                log.info("the command's process group has exited")
            else:
                # SageMaker kills the container next; outside one, nothing of the command may outlive us
                log.warning(
                    "processes of the command's group still run at the end of the stop grace: killing them"
                )
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(group, signal.SIGKILL)

        thread = threading.Thread(target=wait, name="process-group-wait", daemon=True)
        thread.start()
        return thread

    def _run_command_only(self, root: Path) -> JobOutcome:
        if not self.options.cache_url and neuron.sdk_remote_cache(self.env) is not None:
            # nothing to restore or publish without a version: the compiler's own S3 cache is left alone
            child_env = dict(self.env)
        else:
            child_env = neuron.child_environment(self.env, root)
        return JobOutcome(status=self.run_command(child_env))

    def _remote(self) -> RemoteCache | None:
        sdk = neuron.sdk_remote_cache(self.env)
        if not self.options.cache_url and sdk is not None:
            # the team's Neuron SDK cache on S3 becomes the remote: restored before the command, published
            # to after it, and still where the compiler's own S3 client finds the entries (both ways)
            self.options.cache_url = sdk[0]
            self._adopted_sdk = True
            log.info(
                "adopting the Neuron SDK's S3 cache %s (from %s) as the remote NEFF cache", sdk[0], sdk[1]
            )
        elif sdk is not None and sdk[0].rstrip("/") != (self.options.cache_url or "").rstrip("/"):
            log.warning(
                "%s names the S3 cache %s; the command compiles into the local cache and %s is the remote",
                sdk[1],
                sdk[0],
                self.options.cache_url,
            )
        if not self.options.cache_url:
            log.info("no remote NEFF cache configured: compiling locally only")
            return None
        options = dict(self.options.remote_options)
        if self.options.cache_writer:
            options.setdefault("writer", self.options.cache_writer)
        secret = self.env.get(settings.HF_TOKEN_SECRET_ENV)
        if self.options.cache_url.startswith("hf://") and secret and "token" not in options:
            try:
                options["token"] = settings.hub_token_from_secret(secret)
            except settings.SecretError as exc:
                log.warning("using the default Hub credentials: %s", exc)
        try:
            self._trust = Trust.parse(self.options.cache_trust)
            remote = open_remote(self.options.cache_url, **options)
        except ValueError as exc:
            log.warning("ignoring the remote cache: %s", exc)
            return None
        if self._trust.restricted:
            log.info("restoring only entries written by %s", self._trust.describe())
        else:
            log.info(
                "restoring entries of any writer of %s (%s names the trusted ones)",
                remote.url,
                settings.CACHE_TRUST_ENV,
            )
        return remote

    def _restore(
        self,
        remote: RemoteCache,
        root: Path,
        version: str,
        record: RegistryRecord | None,
        outcome: JobOutcome,
    ) -> set[str]:
        options = self.options
        control = Deadline(options.restore_timeout)
        min_free = options.restore_min_free
        if min_free is None:
            min_free = default_min_free(root)

        def work() -> tuple[set[str], sync.RestoreReport | None]:
            known: set[str] = set()
            modules: set[str] | None = None
            if options.restore in ("auto", "registry") and record is not None:
                records = remote.records(record.model)
                control.touch()
                for other in records:
                    if other.config_hash == record.config_hash:
                        known |= set(other.entries)
                if not known:
                    # a cache optimum-neuron wrote (the public precompiled one, for instance): its records
                    # of this model, those that agree with the job's settings first
                    optimum = remote.optimum_records(record.model, version)
                    control.touch()
                    matching = [r for r in optimum if matches_job(r, record.config)]
                    known = {e for r in matching for e in r.entries}
                    records += optimum
                    if known:
                        log.info(
                            "restoring the entries of %d optimum-neuron configurations of %s that match this job",
                            len(matching),
                            record.model,
                        )
                if known:
                    modules = known
                elif options.restore == "auto":
                    # a new configuration of a known model: that model's graphs, not the whole version
                    modules = {e for other in records for e in other.entries}
                    if modules:
                        log.info(
                            "no registry record for this configuration: restoring %s's entries", record.model
                        )
            if options.restore == "auto" and not modules and self._adopted_sdk:
                # the compiler would have looked every graph up in its S3 cache: so does the restore
                modules = None
                log.info("restoring every entry of the adopted Neuron SDK cache (its registry knows none)")
            elif options.restore in ("auto", "registry") and not modules:
                log.info(
                    "the registry knows no entries for %s: restoring nothing (--restore all takes the whole version)",
                    record.model if record is not None else "a job without --model",
                )
                return known, None
            report = sync.restore(
                remote,
                root,
                version,
                modules,
                workers=options.workers,
                progress=options.progress,
                control=control,
                min_free_bytes=min_free,
                max_bytes=options.restore_max_bytes,
                trust=self._trust,
            )
            return known, report

        started = time.monotonic()
        try:
            finished, value = _bounded(
                work,
                options.restore_timeout,
                self.watch,
                control=control,
                stall=options.stall_seconds,
                what="restore",
            )
        except Exception as exc:  # noqa: BLE001 - a broken cache costs a compile, never the job
            log.warning("restore failed, the job will compile what it needs: %s", exc)
            return set()
        if not finished or value is None:
            if not finished:
                # its workers stop at their next chunk; a socket read ends within its timeout
                outcome.abandoned = True
                log.warning(
                    "restore did not finish (stopped, over %.0fs, or no progress); continuing",
                    options.restore_timeout,
                )
            return set()
        known, report = value
        if report is not None:
            outcome.restored = report.restored
            log.info(
                "restored %d entries (%d bytes) in %.1fs; %d already local, %d busy, %d failed, %d over budget, "
                "%d refused, %d of untrusted writers",
                len(report.restored),
                report.bytes_downloaded,
                time.monotonic() - started,
                len(report.already_local),
                len(report.busy),
                len(report.failed),
                len(report.over_budget),
                len(report.refused),
                len(report.untrusted),
            )
        return known

    def _precompile(self, child_env: dict[str, str], on_stop: Callable[[], None] | None = None) -> None:
        steps = self.options.precompile_steps
        env = dict(child_env)
        env[PRECOMPILE_STEPS_ENV] = str(steps)
        env[PRECOMPILE_ENV] = "1"
        scratch = Path(tempfile.mkdtemp(prefix="sagequeue-precompile-"))
        for name in SAGEMAKER_OUTPUT_ENVS:
            if name in env:
                env[name] = str(scratch / name.lower())
                Path(env[name]).mkdir(parents=True, exist_ok=True)
        watched = [Path(self.env.get(CHECKPOINT_DIR_ENV) or DEFAULT_CHECKPOINT_DIR)]
        watched += [Path(child_env[n]) for n in SAGEMAKER_OUTPUT_ENVS if child_env.get(n)]
        before = _snapshot(watched)
        try:
            self._run_precompile(env, steps, on_stop)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        changed = sorted(path for path, stamp in _snapshot(watched).items() if before.get(path) != stamp)
        if changed:
            log.error(
                "the precompile run wrote %s although its outputs are invalid (%s=1 asks the script to skip "
                "every save); the training run may resume from them",
                ", ".join(str(p) for p in changed[:10]),
                PRECOMPILE_ENV,
            )

    def _run_precompile(
        self, env: dict[str, str], steps: int | None, on_stop: Callable[[], None] | None
    ) -> None:
        env.setdefault(neuron.PARALLEL_COMPILE_MAX_RETRIES_ENV, "1")
        executable = shutil.which(neuron.PARALLEL_COMPILE_EXECUTABLE, path=env.get("PATH"))
        if executable is None:
            log.warning("%s is not on PATH: skipping the precompile run", neuron.PARALLEL_COMPILE_EXECUTABLE)
            return
        command = neuron.parallel_compile_command(self.options.command, executable)
        log.info("cache miss: precompiling with a %s-step run", steps)
        status = self.forwarder.run(command, env, self._stop_end, on_stop)
        if status != 0:
            # the real run compiles whatever the precompile run could not
            log.warning("precompile run exited with status %d; training compiles the rest", status)

    def _start_checkpoint_watch(self) -> checkpoints.CheckpointWatcher | None:
        """Report the training's checkpoints to the scheduler (docs/adr/0025); never costs the training."""
        try:
            host: int | None = resolve_host(self.env).host_index
        except HostIdentityError:
            host = None  # one host, or not on SageMaker: the watcher still needs the training job's name
        try:
            return checkpoints.start_watch(self.env, host)
        except OSError as exc:
            log.warning("not reporting checkpoints: %s", exc)
            return None

    def _start_metrics(self) -> Any:
        mode = self.options.metrics
        if mode == "off":
            return None
        # metrics never cost the job: asked for ("on") and impossible here, they are a warning, not an error
        say = log.warning if mode == "on" else log.info
        executable = shutil.which(neuron.MONITOR_EXECUTABLE, path=self.env.get("PATH"))
        try:
            identity = resolve_host(self.env)
        except HostIdentityError as exc:
            say("not publishing NeuronCore utilization: %s", exc)
            return None
        if executable is None:
            say("not publishing NeuronCore utilization: %s is not on PATH", neuron.MONITOR_EXECUTABLE)
            return None
        # boto3 is imported only when there is something to publish
        from sagequeue.job.metrics import UtilizationPublisher, metric_namespace

        publisher = UtilizationPublisher(
            identity,
            period=self.options.metrics_period,
            monitor_executable=executable,
            namespace=metric_namespace(self.env),
        )
        publisher.start()
        log.info(
            "publishing NeuronCore utilization to %s as Host=%s",
            publisher.namespace,
            identity.dimension_value,
        )
        return publisher

    def _upload(
        self,
        remote: RemoteCache,
        root: Path,
        version: str,
        record: RegistryRecord | None,
        outcome: JobOutcome,
    ) -> None:
        records = [record] if record is not None else []
        started = time.monotonic()
        report = self.bounded_upload(
            lambda deadline: sync.upload(remote, root, version, records=records, deadline=deadline),
            outcome,
            "unfinished entries are invisible remotely",
        )
        if report is None:
            return
        outcome.published = sorted(set(outcome.published) | set(report.result.published))
        log.info(
            "uploaded %d entries in %.1fs (%d already there, %d left for later, %d failed entries cleaned)",
            len(report.result.published),
            time.monotonic() - started,
            len(report.result.already_present),
            len(report.result.skipped),
            len(report.cleaned_failed),
        )


class _StopUploads(StopUploads):
    """The XLA flow's final upload (see `flow.StopUploads`): entries complete by their done marker and
    lock, with the registry record of what this run compiled."""

    def __init__(
        self,
        runner: JobRunner,
        remote: RemoteCache | None,
        root: Path,
        version: str,
        before: set[str],
        registry_entries: set[str],
        record: RegistryRecord | None,
        outcome: JobOutcome,
    ) -> None:
        super().__init__(outcome)
        self.runner = runner
        self.remote = remote
        self.root = root
        self.version = version
        self.before = before
        self.registry_entries = registry_entries
        self.record = record

    @property
    def enabled(self) -> bool:
        return self.remote is not None and self.runner.options.upload

    def complete(self) -> set[str]:
        return {e.module for e in sync.shareable(self.root, self.version)}

    def publish(self, complete: set[str] | None, taken: set[str]) -> None:
        if complete is None:
            complete = self.complete()
        assert self.remote is not None
        record = None
        if self.record is not None:
            new = complete - self.before
            # a run that compiled nothing has nothing to add to what the registry already says; a second
            # pass rewrites the same record (same writer, same path) with the longer list
            entries = sorted(self.registry_entries | new) if new else []
            record = dataclasses.replace(self.record, entries=entries) if entries else None
        self.runner._upload(self.remote, self.root, self.version, record, self.outcome)
