"""`sagequeue-job`: the training container's entry point.

    sagequeue-job run [options] -- <training command>

In the sagequeue image it is the ENTRYPOINT, so SageMaker's `train` argument becomes the command.
"""

from __future__ import annotations

import logging
import os
import sys

import click

from sagequeue.job import settings
from sagequeue.job.flow import SAGEMAKER_STOP_GRACE_SECONDS, STALL_SECONDS, JobOptions
from sagequeue.job.runner import JobRunner
from sagequeue_core.defaults import METRIC_PERIOD_SECONDS, NEFF_CACHE_ENV


def _config_pairs(values: tuple[str, ...]) -> dict[str, str]:
    pairs = {}
    for value in values:
        key, sep, item = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, got {value!r}", param_hint="--config")
        pairs[key.strip()] = item.strip()
    return pairs


class SizeType(click.ParamType):
    name = "SIZE"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        from sagequeue.job.cache_cli import parse_size

        try:
            return parse_size(str(value))
        except click.BadParameter as exc:
            self.fail(exc.message, param, ctx)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Log debug details.")
def main(verbose: bool) -> None:
    """Run a Neuron training command with a shared NEFF cache and NeuronCore utilization metrics."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s sagequeue-job %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer", "httpx", "httpx2", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@main.command(context_settings={"ignore_unknown_options": True})
@click.option(
    "--cache",
    "cache_url",
    help=f"Remote cache, hf://<org>/<repo> or s3://<bucket>/<prefix> (env {NEFF_CACHE_ENV}).",
)
@click.option(
    "--cache-writer",
    help=f"S3: publish as this writer, under writers/<name>/ (env {settings.CACHE_WRITER_ENV}).",
)
@click.option(
    "--cache-trust",
    help=f"Restore only entries of these writers, comma-separated; '*' any (env {settings.CACHE_TRUST_ENV}).",
)
@click.option(
    "--cache-dir",
    help="Local compile cache (default: warm-pool cache, NEURON_CC_FLAGS --cache_dir, /var/tmp/neuron-compile-cache).",
)
@click.option("--compiler-version", help="Neuron compiler version (default: asked from neuronx-cc).")
@click.option(
    "--model",
    envvar="SAGEQUEUE_MODEL",
    show_envvar=True,
    help="Model id recorded in the cache registry (e.g. meta-llama/Llama-3.1-8B).",
)
@click.option(
    "--config",
    "config",
    multiple=True,
    envvar="SAGEQUEUE_JOB_CONFIG",
    show_envvar=True,
    metavar="KEY=VALUE",
    help="Job configuration for the registry (precision, batch_size, sequence_length, ...). Repeatable.",
)
@click.option(
    "--restore",
    envvar="SAGEQUEUE_RESTORE",
    show_envvar=True,
    type=click.Choice(["auto", "all", "registry", "none"]),
    default="auto",
    show_default=True,
    help="Which remote entries to restore.",
)
@click.option(
    "--upload/--no-upload",
    default=True,
    show_default=True,
    help="Publish new complete entries after the command.",
)
@click.option(
    "--precompile-steps",
    envvar="SAGEQUEUE_PRECOMPILE_ON_MISS",
    show_envvar=True,
    type=click.IntRange(min=1),
    help="On a cache miss, first run the command under neuron_parallel_compile with this step limit.",
)
@click.option(
    "--metrics",
    envvar="SAGEQUEUE_METRICS",
    show_envvar=True,
    type=click.Choice(["auto", "on", "off"]),
    default="auto",
    show_default=True,
    help="Publish NeuronCore utilization to CloudWatch (auto: where neuron-monitor and the SageMaker host "
    "are found; on: the same, with a warning where they are not; the command runs either way).",
)
@click.option(
    "--metrics-period",
    type=float,
    default=float(METRIC_PERIOD_SECONDS),
    show_default=True,
    help="Seconds between metric data points.",
)
@click.option(
    "--grace",
    "grace_seconds",
    type=float,
    default=SAGEMAKER_STOP_GRACE_SECONDS,
    show_default=True,
    help="Seconds between SIGTERM and the kill: the upload fits inside.",
)
@click.option(
    "--upload-timeout",
    type=float,
    default=1800.0,
    show_default=True,
    help="Bound on the upload after a normal end.",
)
@click.option(
    "--restore-timeout",
    type=click.FloatRange(min=0),
    default=1800.0,
    show_default=True,
    help="Bound on the restore before the command starts.",
)
@click.option(
    "--stall-timeout",
    "stall_seconds",
    type=click.FloatRange(min=1),
    default=STALL_SECONDS,
    show_default=True,
    help="Seconds without progress (no answer, no byte) after which a restore, or an upload the cache "
    "never answered, is called off.",
)
@click.option(
    "--restore-min-free",
    type=SizeType(),
    envvar="SAGEQUEUE_RESTORE_MIN_FREE",
    show_envvar=True,
    help="Free space the restore leaves for the job's own compile, e.g. 8G "
    "(default: 20% of the file system, at most 8G).",
)
@click.option(
    "--restore-max-bytes",
    type=SizeType(),
    envvar="SAGEQUEUE_RESTORE_MAX_BYTES",
    show_envvar=True,
    help="Restore at most this much, e.g. 50G (smallest entries first).",
)
@click.option(
    "--workers", type=click.IntRange(1, 128), default=16, show_default=True, help="Parallel transfers."
)
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option(
    "--cache-kind",
    envvar="SAGEQUEUE_CACHE_KIND",
    show_envvar=True,
    type=click.Choice(["auto", "xla", "torchneuron"]),
    default="auto",
    show_default=True,
    help="Which compile cache: xla (neuronx-cc's, PyTorch/XLA) or torchneuron (native PyTorch on "
    "trn2/trn3); auto: torchneuron where torch-neuronx is installed without torch-xla.",
)
@click.option("--torch-neuronx-version", help="TorchNeuron only: namespace version (default: installed).")
@click.option(
    "--platform",
    envvar="SAGEQUEUE_PLATFORM",
    type=click.Choice(["trn2", "trn3"]),
    help="TorchNeuron only (default: NEURON_PLATFORM_TARGET_OVERRIDE, --target, the instance type).",
)
@click.option("--cores", help="TorchNeuron only: NeuronCores (default: NEURON_RT_NUM_CORES / VISIBLE_CORES).")
@click.option(
    "--nki-sources",
    envvar="SAGEQUEUE_NKI_SOURCES",
    multiple=True,
    type=click.Path(),
    help="TorchNeuron only: the job's custom NKI kernel sources (files or directories); their digest "
    "is part of the namespace. Repeatable.",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run(
    cache_url: str | None,
    cache_writer: str | None,
    cache_trust: str | None,
    cache_dir: str | None,
    compiler_version: str | None,
    model: str | None,
    config: tuple[str, ...],
    restore: str,
    upload: bool,
    precompile_steps: int | None,
    metrics: str,
    metrics_period: float,
    grace_seconds: float,
    upload_timeout: float,
    restore_timeout: float,
    stall_seconds: float,
    restore_min_free: int | None,
    restore_max_bytes: int | None,
    workers: int,
    progress: bool,
    cache_kind: str,
    torch_neuronx_version: str | None,
    platform: str | None,
    cores: str | None,
    nki_sources: tuple[str, ...],
    command: tuple[str, ...],
) -> None:
    """Restore the NEFF cache, run COMMAND, publish what it compiled; exit with COMMAND's status."""
    if os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS") is None:
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    options = JobOptions(
        command=list(command),
        cache_url=settings.cache_url(cache_url),
        cache_writer=cache_writer or settings.cache_writer(),
        cache_trust=cache_trust or settings.cache_trust(),
        cache_dir=cache_dir,
        compiler_version=compiler_version,
        model=model,
        config=_config_pairs(config),
        restore=restore,
        upload=upload,
        precompile_steps=precompile_steps,
        metrics=metrics,
        metrics_period=metrics_period,
        grace_seconds=grace_seconds,
        upload_timeout=upload_timeout,
        restore_timeout=restore_timeout,
        stall_seconds=stall_seconds,
        restore_min_free=restore_min_free,
        restore_max_bytes=restore_max_bytes,
        workers=workers,
        progress=progress,
        cache_kind=cache_kind,
        torch_neuronx_version=torch_neuronx_version,
        platform=platform,
        cores=cores,
        nki_sources=list(nki_sources),
    )
    outcome = JobRunner(options).run()
    sys.stdout.flush()
    sys.stderr.flush()
    if outcome.abandoned:
        # transfer threads may still block on sockets (each for at most its read timeout); the
        # interpreter would wait for them at exit
        os._exit(outcome.status)
    sys.exit(outcome.status)
