"""`sagequeue cache ...` for the TorchNeuron kind (`--kind torchneuron`, or `SAGEQUEUE_CACHE_KIND`, or an
environment with torch-neuronx and no torch-xla): the same command names over namespaces and packs."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from sagequeue.job import torchneuron
from sagequeue.job.cache_options import cache_option as _cache_option
from sagequeue.job.cache_options import human, parse_size
from sagequeue.job.cache_options import open_cache as _remote
from sagequeue.job.cache_options import parse_trust as _trust
from sagequeue.job.cache_options import trust_option as _trust_option
from sagequeue.job.remote import Deadline, RemoteCacheError

_dir_option = click.option(
    "--cache-dir",
    type=click.Path(path_type=Path),
    help="Local NEFF cache (default: TORCH_NEURONX_NEFF_CACHE_DIR, then /tmp/neff_cache).",
)


def _namespace_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            click.option("--torch-neuronx-version", help="Default: the installed torch-neuronx."),
            click.option("--compiler-version", help="Default: asked from neuronx-cc."),
            click.option(
                "--platform",
                type=click.Choice(list(torchneuron.PLATFORMS)),
                help="Default: from the environment.",
            ),
            click.option("--cores", help="Default: NEURON_RT_NUM_CORES, NEURON_RT_VISIBLE_CORES, else all."),
            click.option(
                "--nki-sources", multiple=True, type=click.Path(), help="Custom NKI kernel sources."
            ),
        ]
    ):
        fn = option(fn)
    return fn


def _namespace(
    torch_neuronx_version: str | None,
    compiler_version: str | None,
    platform: str | None,
    cores: str | None,
    nki_sources: tuple[str, ...],
) -> torchneuron.Namespace:
    try:
        return torchneuron.namespace_for(
            os.environ,
            torch_neuronx=torch_neuronx_version,
            neuronx_cc=compiler_version,
            platform=platform,
            cores=cores,
            nki_sources=nki_sources,
        )
    except torchneuron.NamespaceError as exc:
        raise click.ClickException(str(exc)) from exc


def _root(cache_dir: Path | None) -> Path:
    return torchneuron.choose_cache_dir(os.environ, str(cache_dir) if cache_dir else None)[0]


def _store(url: str | None) -> torchneuron.PackStore:
    return torchneuron.pack_store(_remote(url))


def _chosen(
    store: torchneuron.PackStore, names: tuple[str, ...]
) -> dict[torchneuron.Namespace, dict[str, int]]:
    listed = torchneuron.namespaces(store)
    if not names:
        return listed
    try:
        wanted = {torchneuron.Namespace.parse(n) for n in names}
    except torchneuron.NamespaceError as exc:
        raise click.BadParameter(str(exc), param_hint="NAMESPACE") from exc
    return {ns: paths for ns, paths in listed.items() if ns in wanted}


@click.command(name="ls")
@_cache_option
def list_entries(cache_url: str | None) -> None:
    """Namespaces (torch-neuronx, neuronx-cc, platform, cores, NKI digest) with their packs and entries."""
    store = _store(cache_url)
    for namespace, paths in sorted(torchneuron.namespaces(store).items(), key=lambda item: item[0].name):
        indexes, problems = torchneuron.read_indexes(store, namespace, paths)
        entries = torchneuron.remote_entries(indexes)
        size = sum(entry.size for _, entry in entries.values())
        extra = f", {len(problems)} unreadable packs" if problems else ""
        click.echo(f"{namespace.name}  {len(indexes)} packs  {len(entries)} entries  {human(size)}{extra}")


@click.command()
@_cache_option
@click.argument("model")
def lookup(cache_url: str | None, model: str) -> None:
    """The namespaces holding NEFFs a job of MODEL (its --model) published."""
    store = _store(cache_url)
    found = 0
    for namespace, paths in sorted(torchneuron.namespaces(store).items(), key=lambda item: item[0].name):
        indexes, _ = torchneuron.read_indexes(store, namespace, paths)
        mine = [i for i in indexes if i.model == model]
        if mine:
            found += 1
            parts = namespace.describe()
            click.echo(
                f"{namespace.name}: torch-neuronx {parts['torch_neuronx']}, neuronx-cc {parts['neuronx_cc']}, "
                f"{parts['platform']}, cores {parts['cores']}, NKI {parts['nki']}: "
                f"{sum(len(i.entries) for i in mine)} entries in {len(mine)} packs"
            )
    if not found:
        click.echo(f"no NEFFs recorded for {model}")


@click.command(name="sync")
@_cache_option
@_dir_option
@_namespace_options
@click.option("--timeout", type=float, default=None, help="Stop starting new packs after this many seconds.")
@_trust_option
def sync_cmd(
    cache_url: str | None,
    cache_dir: Path | None,
    torch_neuronx_version: str | None,
    compiler_version: str | None,
    platform: str | None,
    cores: str | None,
    nki_sources: tuple[str, ...],
    timeout: float | None,
    trust: str | None,
) -> None:
    """Upload the complete local NEFFs the namespace lacks (never temporary or empty files); with a trust
    list, what only other writers hold is uploaded too."""
    trusted = _trust(trust)
    store = _store(cache_url)
    namespace = _namespace(torch_neuronx_version, compiler_version, platform, cores, nki_sources)
    try:
        report = torchneuron.upload(
            store, _root(cache_dir), namespace, deadline=Deadline(timeout), trust=trusted
        )
    except RemoteCacheError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"{namespace.name}: {len(report.published)} uploaded in {len(report.packs)} packs, "
        f"{len(report.already_present)} already there, {len(report.skipped)} left for later"
    )


@click.command()
@_cache_option
@_dir_option
@_namespace_options
@click.option("--workers", type=click.IntRange(1, 128), default=16, show_default=True, help="Parallel reads.")
@_trust_option
def restore(
    cache_url: str | None,
    cache_dir: Path | None,
    torch_neuronx_version: str | None,
    compiler_version: str | None,
    platform: str | None,
    cores: str | None,
    nki_sources: tuple[str, ...],
    workers: int,
    trust: str | None,
) -> None:
    """Fill the local NEFF cache with the entries of exactly this job's namespace, from trusted writers."""
    trusted = _trust(trust)
    store = _store(cache_url)
    namespace = _namespace(torch_neuronx_version, compiler_version, platform, cores, nki_sources)
    root = _root(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        report = torchneuron.restore(store, root, namespace, workers=workers, trust=trusted)
    except RemoteCacheError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"{namespace.name}: restored {len(report.restored)} entries ({human(report.bytes_downloaded)}, "
        f"{report.requests} requests) in {time.monotonic() - started:.1f}s; {report.already_local} already "
        f"local, {len(report.failed)} failed, {len(report.refused_packs)} packs refused"
        + (f", {len(report.untrusted)} packs of untrusted writers left out" if report.untrusted else "")
    )
    if report.failed:
        raise SystemExit(1)


@click.command()
@_cache_option
@click.argument("names", nargs=-1, metavar="[NAMESPACE]...")
@click.option("--repair", is_flag=True, help="Remove the broken packs (their entries are published again).")
@click.option("--workers", type=click.IntRange(1, 128), default=16, show_default=True)
@_trust_option
def verify(
    cache_url: str | None, names: tuple[str, ...], repair: bool, workers: int, trust: str | None
) -> None:
    """Read every pack and check each entry against its index's SHA-256. With a trust list, the packs of
    other writers are reported (`cache rm NAMESPACE --pack REF` removes one)."""
    trusted = _trust(trust)
    store = _store(cache_url)
    broken_total = 0
    untrusted_total = 0
    for namespace in sorted(_chosen(store, names), key=lambda n: n.name):
        untrusted: dict[str, str] = {}
        problems = torchneuron.verify(store, namespace, workers=workers, trust=trusted, untrusted=untrusted)
        broken_total += len(problems)
        untrusted_total += len(untrusted)
        for pack_id, why in sorted(problems.items()):
            click.echo(f"{namespace.name}/{pack_id}: {why}")
        for ref, writer in sorted(untrusted.items()):
            click.echo(
                f"untrusted {namespace.name}/{ref}: written by {writer}, not one of {trusted.describe()}"
            )
        if problems and repair:
            torchneuron.remove_packs(store, namespace, sorted(problems))
            click.echo(f"{namespace.name}: removed {len(problems)} broken packs")
        click.echo(
            f"{namespace.name}: {len(problems)} broken"
            + (f", {len(untrusted)} of untrusted writers" if trusted.restricted else "")
        )
    if (broken_total and not repair) or untrusted_total:
        raise SystemExit(1)


@click.command()
@_cache_option
@click.argument("names", nargs=-1, metavar="[NAMESPACE]...")
@click.option("--older-than", type=float, help="Remove packs published more than this many days ago.")
@click.option("--max-size", help="Remove the oldest packs until the rest fits, e.g. 200G.")
@click.option("--yes", is_flag=True, help="Remove; without it, only say what would go.")
def prune(
    cache_url: str | None, names: tuple[str, ...], older_than: float | None, max_size: str | None, yes: bool
) -> None:
    """Remove packs by age, or the oldest until a size fits (a dry run unless --yes)."""
    store = _store(cache_url)
    limit = parse_size(max_size) if max_size is not None else None
    if older_than is None and limit is None:
        raise click.UsageError("say what to prune: --older-than DAYS and/or --max-size SIZE")
    packs = []
    for namespace, paths in _chosen(store, names).items():
        indexes, _ = torchneuron.read_indexes(store, namespace, paths)
        times = torchneuron.pack_times(indexes)
        packs += [(times[i.ref], i.size, namespace, i.ref) for i in indexes]
    packs.sort(key=lambda p: (p[0], p[3]))
    doomed = []
    if older_than is not None:
        cutoff = time.time() - older_than * 86400
        doomed = [p for p in packs if p[0] < cutoff]
    if limit is not None:
        kept = [p for p in packs if p not in doomed]
        total = sum(p[1] for p in kept)
        for pack in kept:
            if total <= limit:
                break
            doomed.append(pack)
            total -= pack[1]
    size = human(sum(p[1] for p in doomed))
    if not yes:
        click.echo(f"would remove {len(doomed)} packs ({size}); pass --yes to remove them")
        return
    by_namespace: dict[torchneuron.Namespace, list[str]] = {}
    for _, _, namespace, pack_id in doomed:
        by_namespace.setdefault(namespace, []).append(pack_id)
    for namespace, ids in by_namespace.items():
        torchneuron.remove_packs(store, namespace, ids)
    click.echo(f"removed {len(doomed)} packs ({size})")


@click.command(name="rm")
@_cache_option
@click.argument("names", nargs=-1, required=True, metavar="NAMESPACE...")
@click.option(
    "--pack",
    "packs",
    multiple=True,
    help="Only this pack of the namespace, as verify names it: ID or writers/<writer>/ID (repeatable).",
)
@click.option("--yes", is_flag=True, help="Remove; without it, only say what would go.")
def remove(cache_url: str | None, names: tuple[str, ...], packs: tuple[str, ...], yes: bool) -> None:
    """Remove whole namespaces (or some of their packs) from the remote cache."""
    store = _store(cache_url)
    chosen = _chosen(store, names)
    if not chosen:
        raise click.ClickException(f"no such namespace in {store.url}: {', '.join(names)}")
    for namespace, paths in chosen.items():
        if packs:
            known = {
                ref
                for path in paths
                for suffix in (torchneuron.INDEX_SUFFIX, torchneuron.PACK_SUFFIX)
                if (ref := torchneuron.pack_ref(namespace, path, suffix))
            }
            unknown = sorted(set(packs) - known)
            if unknown:
                raise click.ClickException(f"no such pack in {namespace.name}: {', '.join(unknown)}")
            if yes:
                torchneuron.remove_packs(store, namespace, list(packs))
            click.echo(f"{'removed' if yes else 'would remove'} {len(packs)} packs of {namespace.name}")
            continue
        indexes = [p for p in paths if p.endswith(torchneuron.INDEX_SUFFIX)]
        if yes:
            # the indexes first: a reader meanwhile sees whole packs or none
            store.delete(indexes)
            store.delete([p for p in paths if p not in indexes])
        click.echo(
            f"{'removed' if yes else 'would remove'} {namespace.name} ({len(indexes)} packs, "
            f"{human(sum(paths.values()))})" + ("" if yes else "; pass --yes to remove it")
        )
    sys.stdout.flush()


COMMANDS: dict[str, click.Command] = {
    "ls": list_entries,
    "lookup": lookup,
    "sync": sync_cmd,
    "restore": restore,
    "verify": verify,
    "prune": prune,
    "rm": remove,
}
