"""What every `sagequeue cache` command of either cache kind shares: the cache and trust options, opening
the remote cache, sizes. Kept apart from `cache_cli`, so the TorchNeuron kind's commands import it and
`cache_cli` imports them, with no circle."""

from __future__ import annotations

import re

import click

from sagequeue.job import settings
from sagequeue.job.backends import open_remote
from sagequeue.job.remote import RemoteCache, Trust
from sagequeue_core.defaults import NEFF_CACHE_ENV

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_size(text: str) -> int:
    match = _SIZE_RE.match(text)
    if match is None:
        raise click.BadParameter(f"expected a size like 500M or 20G, got {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def open_cache(url: str | None) -> RemoteCache:
    resolved = settings.cache_url(url)
    if not resolved:
        raise click.UsageError(
            f"no NEFF cache: pass --cache, set {NEFF_CACHE_ENV}, or run `sagequeue cache set <url>`"
        )
    try:
        writer = settings.cache_writer()
        return open_remote(resolved, **({"writer": writer} if writer else {}))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc


cache_option = click.option(
    "--cache",
    "cache_url",
    help=f"hf://<org>/<repo> or s3://<bucket>/<prefix> (default: {NEFF_CACHE_ENV}, then `cache set`).",
)
trust_option = click.option(
    "--trust",
    help="Writers whose entries count as trusted, comma-separated; '*' any "
    f"(default: {settings.CACHE_TRUST_ENV}, else any).",
)


def parse_trust(text: str | None) -> Trust:
    try:
        return Trust.parse(text or settings.cache_trust())
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
