"""`sagequeue cache`: create, choose, inspect, fill and trim a NEFF cache."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from sagequeue.job import neuron, settings, sync
from sagequeue.job.cache_options import cache_option as _cache_option
from sagequeue.job.cache_options import human, parse_size
from sagequeue.job.cache_options import open_cache as _remote
from sagequeue.job.cache_options import parse_trust as _trust
from sagequeue.job.cache_options import trust_option as _trust_option
from sagequeue.job.remote import Deadline, RemoteCache, RemoteCacheError, RemoteEntry, RemoteFile


def _with_files(remote: RemoteCache, entries: dict[str, RemoteEntry]) -> dict[str, RemoteEntry]:
    """Entries with their file lists (S3 keeps them in per-entry manifests: fetched in parallel)."""
    unknown = [e for e in entries.values() if not e.verified]
    if not unknown:
        return entries
    with ThreadPoolExecutor(max_workers=16) as pool:
        described = list(pool.map(remote.verified_files, unknown))
    out = dict(entries)
    for entry, files in zip(unknown, described, strict=True):
        out[entry.module] = replace(entry, files=files, verified=True)
    return out


def _versions(remote: RemoteCache, chosen: Iterable[str]) -> list[str]:
    picked = list(chosen)
    return picked or remote.versions()


_dir_option = click.option(
    "--cache-dir",
    type=click.Path(path_type=Path),
    help="Local compile cache (default: as the compiler would choose).",
)


def _local_root(cache_dir: Path | None) -> Path:
    return neuron.choose_cache_dir(os.environ, str(cache_dir) if cache_dir else None).path


class CacheError(click.ClickException):
    """A failed `sagequeue cache` command: one line on stderr, exit 1 (2 for bad usage, as click's)."""

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


def one_line(exc: BaseException, limit: int = 300) -> str:
    """What went wrong, in one line: the exception and, when it has one, the cause underneath it (an
    offline Hub client's connection error, a missing credential), never a traceback."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(parts) < 3:
        seen.add(id(current))
        text = " ".join(str(current).split()) or type(current).__name__
        if not any(text in part for part in parts):
            parts.append(
                text
                if isinstance(current, (RemoteCacheError, click.ClickException))
                else f"{type(current).__name__}: {text}"
            )
        current = current.__cause__ or current.__context__
    message = "; ".join(parts)
    return message if len(message) <= limit else message[: limit - 3] + "..."


class _OneLineErrors(click.Group):
    """Every error of a cache command is one line and an exit code; a traceback is never shown."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        # the TorchNeuron kind has its own commands of the same names (sagequeue.job.torchneuron_cli)
        kind = ctx.params.get("kind")
        if kind is not None:
            from sagequeue.job import torchneuron

            try:
                resolved = torchneuron.resolve_kind(kind)
            except ValueError as exc:
                raise click.BadParameter(str(exc), param_hint="--kind") from exc
            if resolved == torchneuron.KIND:
                from sagequeue.job.torchneuron_cli import COMMANDS

                if cmd_name in COMMANDS:
                    return COMMANDS[cmd_name]
        return super().get_command(ctx, cmd_name)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError:
            raise  # one line too: the `sagequeue` command prints it
        except click.ClickException as exc:
            if isinstance(exc, CacheError):
                raise
            raise CacheError(exc.format_message()) from None
        except (click.exceptions.Exit, click.Abort, SystemExit, KeyboardInterrupt):
            raise
        except BrokenPipeError:
            raise  # the reader of the output went away: the command group ends quietly
        except ModuleNotFoundError as exc:
            from sagequeue.cli import missing_extra

            if missing_extra(exc) is not None:
                raise  # the `sagequeue` command names the extra to install
            command = ctx.invoked_subcommand or "cache"
            raise CacheError(f"sagequeue cache {command}: {one_line(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - a CLI says what failed in one line, never a traceback
            command = ctx.invoked_subcommand or "cache"
            raise CacheError(f"sagequeue cache {command}: {one_line(exc)}") from None


def _bar(items: Any, label: str, length: int | None = None) -> Any:
    """A progress bar on stderr (shown only on a terminal, like `hf`'s)."""
    return click.progressbar(items, length=length, label=label, file=sys.stderr, show_pos=True)


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--kind",
    envvar="SAGEQUEUE_CACHE_KIND",
    show_envvar=True,
    type=click.Choice(["auto", "xla", "torchneuron"]),
    default="auto",
    show_default=True,
    help="xla: neuronx-cc's cache of the PyTorch/XLA flow; torchneuron: native PyTorch on trn2/trn3; "
    "auto: torchneuron where torch-neuronx is installed without torch-xla.",
)
def cache(kind: str) -> None:
    """Share compiled Neuron graphs (NEFFs) between jobs through the Hugging Face Hub or S3."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


@cache.command()
@click.argument("url")
@click.option("--public", is_flag=True, help="Hub only: make the repository public (default private).")
@click.option(
    "--set/--no-set", "make_default", default=True, show_default=True, help="Make it the default cache."
)
def create(url: str, public: bool, make_default: bool) -> None:
    """Create the cache repository or bucket at URL."""
    remote = _remote(url)
    try:
        remote.create(private=not public)
    except RemoteCacheError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"created {url}")
    if make_default:
        click.echo(f"default cache saved in {settings.save_cache_url(url)}")


@cache.command(name="set")
@click.argument("url")
def set_default(url: str) -> None:
    """Make URL the default cache for this user."""
    remote = _remote(url)
    try:
        present = remote.exists()
    except RemoteCacheError as exc:
        raise click.ClickException(str(exc)) from exc
    if not present:
        raise click.ClickException(f"{url} does not exist (create it with `sagequeue cache create {url}`)")
    click.echo(f"default cache {url} saved in {settings.save_cache_url(url)}")


@cache.command(name="ls")
@_cache_option
@click.option(
    "--compiler-version", "versions", multiple=True, help="Only this compiler version (repeatable)."
)
@click.option("--model", help="Only entries the registry attributes to this model.")
def list_entries(cache_url: str | None, versions: tuple[str, ...], model: str | None) -> None:
    """Entries by compiler version, with the models that produced them."""
    remote = _remote(cache_url)
    try:
        owners: dict[str, set[str]] = {}
        for record in remote.records(model) + (remote.optimum_records(model) if model else []):
            for module in record.entries:
                owners.setdefault(neuron.entry_key(record.compiler_version, module), set()).add(record.model)
        for version in _versions(remote, versions):
            entries = _with_files(remote, remote.entries(version))
            shown = [e for e in entries.values() if model is None or e.key in owners]
            total = sum(e.size for e in shown)
            click.echo(f"{neuron.version_dir(version)}: {len(shown)} entries, {human(total)}")
            for entry in sorted(shown, key=lambda e: e.module):
                models = ", ".join(sorted(owners.get(entry.key, set()))) or "-"
                click.echo(f"  {entry.module}  {human(entry.size):>10}  {models}")
    except RemoteCacheError as exc:
        raise click.ClickException(str(exc)) from exc


@cache.command()
@_cache_option
@click.argument("model")
def lookup(cache_url: str | None, model: str) -> None:
    """Job configurations recorded for MODEL, and their entries."""
    remote = _remote(cache_url)
    try:
        # a cache optimum-neuron wrote (the public precompiled one, for instance) has its registry too
        records = remote.records(model) + remote.optimum_records(model)
    except RemoteCacheError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{len(records)} configurations of {model} in {remote.url}")
    for record in sorted(records, key=lambda r: (r.compiler_version, r.config_hash)):
        click.echo(
            f"- compiler {record.compiler_version}  ({len(record.entries)} entries, updated {record.updated_at})"
        )
        for key, value in sorted(record.config.items()):
            click.echo(f"    {key}: {value}")


@cache.command()
@_cache_option
@_dir_option
@click.option(
    "--compiler-version",
    "versions",
    multiple=True,
    help="Only this compiler version (default: all local ones).",
)
@click.option(
    "--timeout", type=float, default=None, help="Stop starting new entries after this many seconds."
)
def sync_cmd(
    cache_url: str | None, cache_dir: Path | None, versions: tuple[str, ...], timeout: float | None
) -> None:
    """Upload the complete entries of a local cache that the remote lacks (failed ones are removed)."""
    remote = _remote(cache_url)
    root = _local_root(cache_dir)
    deadline = Deadline(timeout)
    try:
        chosen = list(versions) or neuron.local_versions(root)
        # the bar counts complete local entries (what sync uploads, or finds there), a version's at a time:
        # a backend publishes a version's entries together (the Hub in one commit)
        counts = {version: len(sync.shareable(root, version)) for version in chosen}
        reports = []
        with _bar(None, f"sync to {remote.url}", length=sum(counts.values())) as bar:
            for version in chosen:
                reports.append((version, sync.upload(remote, root, version, deadline=deadline)))
                bar.update(counts[version])
        for version, report in reports:
            result = report.result
            click.echo(
                f"{neuron.version_dir(version)}: {len(result.published)} uploaded, {len(result.already_present)} already there, "
                f"{len(result.skipped)} left for later, {len(report.cleaned_failed)} failed entries removed"
            )
    except RemoteCacheError as exc:
        raise click.ClickException(str(exc)) from exc


cache.add_command(sync_cmd, name="sync")


@cache.command()
@_cache_option
@_dir_option
@click.option(
    "--compiler-version", "version", help="Compiler version to restore (default: asked from neuronx-cc)."
)
@click.option("--model", help="Restore only the entries the registry records for this model.")
@click.option(
    "--workers", type=click.IntRange(1, 128), default=16, show_default=True, help="Parallel downloads."
)
@click.option("--progress/--no-progress", default=True, show_default=True)
@_trust_option
def restore(
    cache_url: str | None,
    cache_dir: Path | None,
    version: str | None,
    model: str | None,
    workers: int,
    progress: bool,
    trust: str | None,
) -> None:
    """Download the remote's complete entries for a compiler version into the local cache."""
    trusted = _trust(trust)
    remote = _remote(cache_url)
    root = _local_root(cache_dir)
    try:
        resolved = neuron.discover_compiler_version(explicit=version)
    except neuron.CompilerNotFoundError as exc:
        raise click.ClickException(str(exc)) from exc
    started = time.monotonic()
    try:
        modules = None
        if model:
            records = remote.records(model) + remote.optimum_records(model, resolved)
            modules = {m for r in records if r.compiler_version == resolved for m in r.entries}
        # like the other commands' bars, only on a terminal (the job wrapper's restore logs its own)
        shown = progress and sys.stderr.isatty()
        report = sync.restore(remote, root, resolved, modules, workers=workers, progress=shown, trust=trusted)
    except RemoteCacheError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(
        f"{neuron.version_dir(resolved)}: restored {len(report.restored)} entries ({human(report.bytes_downloaded)}) "
        f"in {time.monotonic() - started:.1f}s; {len(report.already_local)} already local, "
        f"{len(report.busy)} busy, {len(report.failed)} failed"
        + (f", {len(report.refused)} refused (names leading out of the cache)" if report.refused else "")
        + (f", {len(report.untrusted)} of untrusted writers left out" if report.untrusted else "")
    )
    for key, problem in sorted(report.refused.items()):
        click.echo(f"refused {key}: {problem}", err=True)
    if report.failed or report.refused:
        raise SystemExit(1)


@cache.command()
@_cache_option
@click.option(
    "--compiler-version", "versions", multiple=True, help="Check only this compiler version (repeatable)."
)
@click.option(
    "--repair",
    is_flag=True,
    help="Delete broken entries so the next writer publishes them again; copy sound ones the Neuron "
    "compiler cannot read to where it reads them.",
)
@click.option(
    "--workers", type=click.IntRange(1, 128), default=16, show_default=True, help="Parallel downloads."
)
@_trust_option
def verify(
    cache_url: str | None, versions: tuple[str, ...], repair: bool, workers: int, trust: str | None
) -> None:
    """Download every remote entry and check its files against the recorded checksums, and that the Neuron
    compiler's own cache client finds it (S3: its files at `neuronxcc-<version>/MODULE_.../`). With a trust
    list, entries of other writers are reported (`cache rm` removes one)."""
    trusted = _trust(trust)
    remote = _remote(cache_url)
    untrusted = 0
    #: entries the Neuron SDK wrote, sound, with the SHA-256 verify measured
    adoptable: list[tuple[RemoteEntry, dict[str, str]]] = []
    broken: list[RemoteEntry] = []
    #: (version, module) of entries sound for sagequeue but not where the Neuron compiler reads them
    unreadable: list[tuple[str, str]] = []
    try:
        for version in _versions(remote, versions):
            report = sync.verify(remote, version, workers=workers, trust=trusted)
            entries = remote.entries(version)
            for key, writer in sorted(report.untrusted.items()):
                click.echo(f"untrusted {key}: written by {writer}, not one of {trusted.describe()}")
            untrusted += len(report.untrusted)
            for key, digests in sorted(report.adoptable.items()):
                click.echo(f"adoptable {key}: written by the Neuron SDK, not recorded by sagequeue")
                adoptable.append((entries[key.split("/", 1)[1]], digests))
            for key, problem in sorted(report.broken.items()):
                click.echo(f"broken {key}: {problem}")
                broken.append(entries[key.split("/", 1)[1]])
            layout = {
                key: problem
                for key, problem in remote.compiler_layout_problems(version).items()
                if key not in report.broken
            }
            for key, problem in sorted(layout.items()):
                click.echo(f"not readable by the Neuron compiler {key}: {problem}")
                unreadable.append((version, key.split("/", 1)[1]))
            click.echo(
                f"{neuron.version_dir(version)}: {len(report.checked)} entries checked, {len(report.broken)} broken, "
                f"{len(layout)} not readable by the Neuron compiler"
                + (f", {len(report.untrusted)} of untrusted writers" if trusted.restricted else "")
            )
        if broken and repair:
            remote.delete(broken)
            click.echo(f"removed {len(broken)} broken entries: the next upload publishes them again")
        if adoptable and repair:
            taken = sum(remote.adopt(entry, digests) for entry, digests in adoptable)
            click.echo(f"adopted {taken} entries the Neuron SDK wrote (manifests with their SHA-256)")
        if unreadable and repair:
            for version in sorted({v for v, _ in unreadable}):
                remote.repair_compiler_layout(version, [m for v, m in unreadable if v == version])
            click.echo(f"copied {len(unreadable)} entries to where the Neuron compiler reads them")
    except RemoteCacheError as exc:
        raise click.ClickException(str(exc)) from exc
    if ((broken or unreadable or adoptable) and not repair) or untrusted:
        raise SystemExit(1)


@cache.command(name="rm")
@_cache_option
@click.argument("keys", nargs=-1, required=True)
@click.option("--yes", is_flag=True, help="Delete for real (the default is a dry run).")
def remove(cache_url: str | None, keys: tuple[str, ...], yes: bool) -> None:
    """Remove entries, each named KEY = neuronxcc-<version>/MODULE_... (as `verify` and `ls` print them)."""
    wanted: dict[str, list[str]] = {}
    for key in keys:
        folder, _, module = key.strip("/").partition("/")
        if not neuron.is_version_dir(folder) or not neuron.is_entry_dir(module):
            raise click.UsageError(f"not an entry: {key!r} (expected neuronxcc-<version>/MODULE_<...>)")
        wanted.setdefault(neuron.version_of_dir(folder), []).append(module)
    remote = _remote(cache_url)
    try:
        doomed: list[RemoteEntry] = []
        for version, modules in sorted(wanted.items()):
            present = remote.entries(version)
            missing = [m for m in modules if m not in present]
            if missing:
                raise click.ClickException(
                    f"no such entry in {remote.url}: {', '.join(neuron.entry_key(version, m) for m in missing)}"
                )
            doomed += [present[m] for m in sorted(set(modules))]
        for entry in doomed:
            click.echo(f"{'removing' if yes else 'would remove'} {entry.key}")
        if not yes:
            click.echo("dry run: pass --yes to delete")
            return
        remote.delete(doomed)
        click.echo(f"removed {len(doomed)} entries from {remote.url}")
    except RemoteCacheError as exc:
        raise click.ClickException(str(exc)) from exc


def _published_times(remote: RemoteCache, version: str, entries: dict[str, RemoteEntry]) -> dict[str, float]:
    times = {m: e.published_at for m, e in entries.items() if e.published_at is not None}
    if len(times) < len(entries):
        published = getattr(remote, "published_times", None)
        if callable(published):
            times.update(published(version))
    return times


@cache.command()
@_cache_option
@click.option("--older-than", type=float, metavar="DAYS", help="Remove entries published more than DAYS ago.")
@click.option("--max-size", help="Remove the oldest entries until the cache fits (e.g. 200G).")
@click.option(
    "--compiler-version",
    "versions",
    multiple=True,
    help="Remove every entry of this compiler version (repeatable).",
)
@click.option("--local", "local", is_flag=True, help="Prune the local cache instead of the remote one.")
@_dir_option
@click.option("--yes", is_flag=True, help="Delete for real (the default is a dry run).")
def prune(
    cache_url: str | None,
    older_than: float | None,
    max_size: str | None,
    versions: tuple[str, ...],
    local: bool,
    cache_dir: Path | None,
    yes: bool,
) -> None:
    """Remove entries by age, total size or compiler version. Dry run unless --yes."""
    if older_than is None and max_size is None and not versions:
        raise click.UsageError("say what to prune: --older-than, --max-size or --compiler-version")
    limit = parse_size(max_size) if max_size else None
    now = time.time()
    if local:
        _prune_local(_local_root(cache_dir), older_than, limit, versions, now, yes)
        return
    remote = _remote(cache_url)
    try:
        # entry times are the server's (S3's LastModified, the Hub's commit dates): so is "now"
        now = remote.server_time()
        candidates: list[tuple[float, RemoteEntry]] = []
        for version in remote.versions():
            entries = _with_files(remote, remote.entries(version))
            times = _published_times(remote, version, entries)
            candidates += [(times.get(m, now), e) for m, e in entries.items()]
        doomed = _choose(candidates, older_than, limit, versions, now)
        _report(doomed, yes)
        if yes and doomed:
            # in batches, so the bar moves; each batch is one request (S3) or one commit (the Hub)
            batch = max(len(doomed) // 20, 50)
            with _bar(range(0, len(doomed), batch), f"prune {remote.url}") as bar:
                for start in bar:
                    remote.delete([e for _, e in doomed[start : start + batch]])
            click.echo(f"removed {len(doomed)} entries from {remote.url}")
    except RemoteCacheError as exc:
        raise click.ClickException(str(exc)) from exc


def _choose(
    candidates: list[tuple[float, RemoteEntry]],
    older_than: float | None,
    limit: int | None,
    versions: tuple[str, ...],
    now: float,
) -> list[tuple[float, RemoteEntry]]:
    doomed: dict[str, tuple[float, RemoteEntry]] = {}
    for when, entry in candidates:
        if entry.version in versions or (older_than is not None and now - when > older_than * 86400):
            doomed[entry.key] = (when, entry)
    if limit is not None:
        kept = sorted((c for c in candidates if c[1].key not in doomed), key=lambda c: c[0])
        total = sum(e.size for _, e in kept)
        for when, entry in kept:
            if total <= limit:
                break
            doomed[entry.key] = (when, entry)
            total -= entry.size
    return sorted(doomed.values(), key=lambda c: c[0])


def _report(doomed: list[tuple[float, RemoteEntry]], yes: bool) -> None:
    verb = "removing" if yes else "would remove"
    total = sum(e.size for _, e in doomed)
    click.echo(f"{verb} {len(doomed)} entries ({human(total)})")
    for when, entry in doomed:
        stamp = datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%d")
        click.echo(f"  {entry.key}  {human(entry.size):>10}  {stamp}")
    if not yes and doomed:
        click.echo("dry run: pass --yes to delete")


def _prune_local(
    root: Path, older_than: float | None, limit: int | None, versions: tuple[str, ...], now: float, yes: bool
) -> None:
    local = [e for e in neuron.scan(root) if e.state is not neuron.EntryState.LOCKED]
    candidates = [(e.mtime(), RemoteEntry(e.version, e.module, tuple(_local_files(e)))) for e in local]
    doomed = _choose(candidates, older_than, limit, versions, now)
    _report(doomed, yes)
    if yes and doomed:
        with _bar(doomed, f"prune {root}") as bar:
            for _, entry in bar:
                shutil.rmtree(root / entry.key, ignore_errors=True)


def _local_files(entry: neuron.LocalEntry) -> list[RemoteFile]:
    return [RemoteFile(name, path.stat().st_size) for name, path in neuron.iter_entry_files(entry.path)]


@cache.command()
@_dir_option
@click.option(
    "--clean", is_flag=True, help="Remove failed entries (so they compile again) and partial downloads."
)
def status(cache_dir: Path | None, clean: bool) -> None:
    """Local entries by compiler version: complete, failed, locked (compiling), incomplete."""
    root = _local_root(cache_dir)
    click.echo(f"local cache {root}")
    versions = neuron.local_versions(root)
    if not versions:
        click.echo("  no entries")
    for version in versions:
        entries = neuron.scan(root, version)
        counts = dict.fromkeys(neuron.EntryState, 0)
        for entry in entries:
            counts[entry.state] += 1
        size = sum(e.size() for e in entries if e.state is neuron.EntryState.COMPLETE)
        summary = ", ".join(f"{counts[s]} {s.value}" for s in neuron.EntryState)
        click.echo(f"  {neuron.version_dir(version)}: {summary}; {human(size)} complete")
        for entry in entries:
            if entry.state is not neuron.EntryState.COMPLETE:
                click.echo(f"    {entry.state.value:<10} {entry.module}")
    staging = sync.staging_dir(root)
    if staging.exists():
        click.echo(f"  partial downloads kept for resuming: {human(_tree_size(staging))}")
    if clean:
        removed = neuron.remove_failed(root)
        click.echo(f"removed {len(removed)} failed entries")
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
            click.echo("removed partial downloads")


def _tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
