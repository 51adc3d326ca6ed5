"""Everything that depends on how the Neuron SDK behaves, in one place.

The rest of sagequeue.job sees a compile cache as versions holding entries, each entry a directory of files
in one of a few states, and a monitor as a stream of utilization samples. Only this module knows the names
the Neuron tools use (`neuronxcc-<version>/MODULE_<graph hash>+<flags hash>/`, `model.neff`, `model.done`,
`*.lock`, the `NEURON_CC_FLAGS` syntax, neuron-monitor's JSON report, neuron_parallel_compile's command
line). When the Neuron SDK changes its layout, a new layout is added here and nowhere else.
"""

from __future__ import annotations

import enum
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from sagequeue_core.defaults import DEFAULT_NEURON_CACHE_DIR, WARMPOOL_CACHE_ENV

# --- executables and environment the Neuron SDK defines ------------------------------------------------------

COMPILER_EXECUTABLE = "neuronx-cc"
PARALLEL_COMPILE_EXECUTABLE = "neuron_parallel_compile"
MONITOR_EXECUTABLE = "neuron-monitor"
#: Python distribution of the compiler: its version is the cache's version directory.
COMPILER_DISTRIBUTION = "neuronx-cc"

CC_FLAGS_ENV = "NEURON_CC_FLAGS"
CACHE_URL_ENV = "NEURON_COMPILE_CACHE_URL"
PARALLEL_COMPILE_MAX_RETRIES_ENV = "NEURON_PARALLEL_COMPILE_MAX_RETRIES"

#: Subdirectory of the warm pool's persistent directory that holds the compile cache.
WARMPOOL_CACHE_SUBDIR = "neuron-compile-cache"

# --- cache layout ------------------------------------------------------------------------------------------

VERSION_DIR_PREFIX = "neuronxcc-"
ENTRY_DIR_PREFIX = "MODULE_"
NEFF_FILE = "model.neff"
DONE_FILE = "model.done"
FAILURE_LOG_FILE = "model.log"
LOCK_SUFFIX = ".lock"

_VERSION_RE = re.compile(r"(\d+\.\d+\.\d+\.\d+(?:\+[0-9A-Za-z.]+)?)")
_ENTRY_RE = re.compile(r"^MODULE_[0-9A-Za-z_]+\+[0-9A-Za-z]+$")
_VERSION_DIR_RE = re.compile(r"^neuronxcc-\d+\.\d+\.\d+\.\d+(?:\+[0-9A-Za-z.]+)?$")


class CompilerNotFoundError(RuntimeError):
    """No Neuron compiler version could be determined."""


class EntryState(enum.StrEnum):
    #: model.neff and model.done written, no lock: safe to share.
    COMPLETE = "complete"
    #: The compiler left a log (`model.log`), whatever else is there: the Neuron stack would answer "cached
    #: failed neff" forever.
    FAILED = "failed"
    #: A compiler holds a lock file in the entry: it is being written now.
    LOCKED = "locked"
    #: Anything else (the compiler was killed, or the entry is being restored): not shareable, not harmful.
    INCOMPLETE = "incomplete"


@dataclass(frozen=True)
class LocalEntry:
    """One compiled graph in a local cache: `<root>/neuronxcc-<version>/MODULE_<hash>+<flags>/`."""

    version: str
    module: str
    path: Path
    state: EntryState

    @property
    def key(self) -> str:
        return entry_key(self.version, self.module)

    def files(self) -> list[Path]:
        """The entry's files, relative paths included, lock files excluded: what a share carries."""
        return [path for _, path in iter_entry_files(self.path)]

    def size(self) -> int:
        return sum(p.stat().st_size for p in self.files())

    def mtime(self) -> float:
        return max((p.stat().st_mtime for p in self.files()), default=self.path.stat().st_mtime)


def version_dir(version: str) -> str:
    return f"{VERSION_DIR_PREFIX}{version}"


def entry_key(version: str, module: str) -> str:
    """The entry's path relative to a cache root, the same locally and remotely."""
    return f"{version_dir(version)}/{module}"


def is_version_dir(name: str) -> bool:
    return bool(_VERSION_DIR_RE.match(name))


def version_of_dir(name: str) -> str:
    if not is_version_dir(name):
        raise ValueError(f"not a Neuron compiler version directory: {name!r} (expected neuronxcc-<version>)")
    return name[len(VERSION_DIR_PREFIX) :]


def is_entry_dir(name: str) -> bool:
    return bool(_ENTRY_RE.match(name))


def is_complete_file_set(names: Sequence[str]) -> bool:
    """Whether a set of file names (relative to the entry) makes a complete, shareable entry."""
    present = set(names)
    return (
        NEFF_FILE in present
        and DONE_FILE in present
        and FAILURE_LOG_FILE not in present
        and not any(n.endswith(LOCK_SUFFIX) for n in present)
    )


def entry_state(path: Path) -> EntryState:
    names = [p.name for p in path.iterdir()] if path.is_dir() else []
    if any(n.endswith(LOCK_SUFFIX) for n in names):
        return EntryState.LOCKED
    # the compiler's log of a failure, with or without a NEFF beside it: never shared, compiled again
    if FAILURE_LOG_FILE in names:
        return EntryState.FAILED
    if is_complete_file_set(names):
        return EntryState.COMPLETE
    return EntryState.INCOMPLETE


def parse_version(text: str) -> str:
    """The compiler version in `neuronx-cc --version` output or a version directory name."""
    match = _VERSION_RE.search(text)
    if match is None:
        raise CompilerNotFoundError(f"no Neuron compiler version (like 2.14.213.0+013d129b) in {text!r}")
    return match.group(1)


def discover_compiler_version(
    env: Mapping[str, str] | None = None, timeout: float = 60.0, explicit: str | None = None
) -> str:
    """The full version of the compiler this job will run, which names the cache's version directory.

    Asks the `neuronx-cc` found on PATH first (the one the framework will invoke), then the installed
    distribution's metadata.
    """
    if explicit:
        return parse_version(explicit)
    environment = dict(os.environ if env is None else env)
    executable = shutil.which(COMPILER_EXECUTABLE, path=environment.get("PATH"))
    problems: list[str] = []
    if executable is not None:
        try:
            completed = subprocess.run(
                [executable, "--version"],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=environment,
                check=False,
            )
            return parse_version(completed.stdout + completed.stderr)
        except (OSError, subprocess.TimeoutExpired, CompilerNotFoundError) as exc:
            problems.append(f"{executable} --version: {exc}")
    else:
        problems.append(f"{COMPILER_EXECUTABLE} is not on PATH")
    try:
        return parse_version(metadata.version(COMPILER_DISTRIBUTION))
    except (metadata.PackageNotFoundError, CompilerNotFoundError) as exc:
        problems.append(f"distribution {COMPILER_DISTRIBUTION}: {exc}")
    raise CompilerNotFoundError(
        "cannot determine the Neuron compiler version: " + "; ".join(problems) + " (pass --compiler-version)"
    )


# --- where the cache lives ---------------------------------------------------------------------------------


_CACHE_DIR_FLAG = "--cache_dir"


def _split_cache_dir(flags: str) -> tuple[str | None, list[str]]:
    """(the `--cache_dir` value, the other arguments) of NEURON_CC_FLAGS; both spellings are accepted."""
    args = shlex.split(flags)
    value: str | None = None
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith(_CACHE_DIR_FLAG + "="):
            value = arg.split("=", 1)[1]
        elif arg == _CACHE_DIR_FLAG and i + 1 < len(args):
            value = args[i + 1]
            i += 1
        else:
            rest.append(arg)
        i += 1
    return value, rest


def cache_dir_from_flags(flags: str) -> str | None:
    """`--cache_dir` in NEURON_CC_FLAGS (either `--cache_dir=X` or `--cache_dir X`)."""
    return _split_cache_dir(flags)[0]


def flags_with_cache_dir(flags: str, cache_dir: str) -> str:
    """NEURON_CC_FLAGS with `--cache_dir` pointing at `cache_dir`, the other flags untouched."""
    return shlex.join([*_split_cache_dir(flags)[1], f"{_CACHE_DIR_FLAG}={cache_dir}"])


def flags_without_cache_dir(flags: str) -> str:
    """The flags that change compiled graphs: NEURON_CC_FLAGS without where the cache is."""
    return shlex.join(_split_cache_dir(flags)[1])


@dataclass(frozen=True)
class CacheLocation:
    path: Path
    #: Why this directory: "option", "warm-pool", "NEURON_CC_FLAGS", "NEURON_COMPILE_CACHE_URL", "default".
    source: str


def choose_cache_dir(env: Mapping[str, str], explicit: str | None = None) -> CacheLocation:
    """The local compile cache a job uses.

    The warm pool's persistent directory comes first: on a reused instance it still holds the NEFFs of the
    previous job, which no download can beat. Then the compiler's own choices, in its precedence order.
    """
    if explicit:
        return CacheLocation(Path(explicit), "option")
    warm = env.get(WARMPOOL_CACHE_ENV)
    if warm:
        return CacheLocation(Path(warm) / WARMPOOL_CACHE_SUBDIR, "warm-pool")
    from_flags = cache_dir_from_flags(env.get(CC_FLAGS_ENV, ""))
    if from_flags and "://" not in from_flags:  # --cache_dir=s3://... is the compiler's own S3 cache
        return CacheLocation(Path(from_flags), CC_FLAGS_ENV)
    url = env.get(CACHE_URL_ENV, "")
    if url and "://" not in url:
        return CacheLocation(Path(url), CACHE_URL_ENV)
    return CacheLocation(Path(DEFAULT_NEURON_CACHE_DIR), "default")


def sdk_remote_cache(env: Mapping[str, str]) -> tuple[str, str] | None:
    """(URL, variable) of the S3 cache the Neuron compiler itself is told to use (`--cache_dir=s3://...` in
    NEURON_CC_FLAGS, which outranks NEURON_COMPILE_CACHE_URL=s3://...), or None."""
    from_flags = cache_dir_from_flags(env.get(CC_FLAGS_ENV, ""))
    if from_flags:
        return (from_flags, CC_FLAGS_ENV) if from_flags.startswith("s3://") else None
    url = env.get(CACHE_URL_ENV, "")
    return (url, CACHE_URL_ENV) if url.startswith("s3://") else None


def child_environment(env: Mapping[str, str], cache_dir: Path) -> dict[str, str]:
    """The training command's environment, pointing the compiler at `cache_dir` whatever set it before."""
    child = dict(env)
    child[CACHE_URL_ENV] = str(cache_dir)
    # --cache_dir outranks NEURON_COMPILE_CACHE_URL in the compiler, and optimum-neuron reads only
    # --cache_dir: it is always set, to our choice.
    child[CC_FLAGS_ENV] = flags_with_cache_dir(child.get(CC_FLAGS_ENV, ""), str(cache_dir))
    return child


# --- scanning and cleaning a local cache -------------------------------------------------------------------


def local_versions(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    return sorted(version_of_dir(p.name) for p in root.iterdir() if p.is_dir() and is_version_dir(p.name))


def scan(root: Path, version: str | None = None) -> list[LocalEntry]:
    """Every entry under `root` (of one compiler version, or all), with its state."""
    versions = [version] if version else local_versions(root)
    entries: list[LocalEntry] = []
    for v in versions:
        vdir = root / version_dir(v)
        if not vdir.is_dir():
            continue
        for child in sorted(vdir.iterdir()):
            if child.is_dir() and is_entry_dir(child.name):
                entries.append(LocalEntry(v, child.name, child, entry_state(child)))
    return entries


def remove_failed(root: Path, version: str | None = None) -> list[LocalEntry]:
    """Delete failed entries so the next run compiles them again instead of replaying the failure."""
    removed = []
    for entry in scan(root, version):
        if entry.state is EntryState.FAILED:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry)
    return removed


# --- neuron-monitor ----------------------------------------------------------------------------------------


def monitor_config(period_seconds: float) -> dict[str, object]:
    """A neuron-monitor configuration that reports NeuronCore counters of every runtime on the host."""
    period = max(1, round(period_seconds))
    return {
        "period": f"{period}s",
        "neuron_runtimes": [
            {"tag_filter": ".*", "metrics": [{"type": "neuroncore_counters"}]},
        ],
        "system_metrics": [],
    }


def monitor_command(config_path: Path, executable: str = MONITOR_EXECUTABLE) -> list[str]:
    return [executable, "-c", str(config_path)]


def utilization_from_report(line: str) -> list[float] | None:
    """NeuronCore utilizations (percent, one per core in use) in one neuron-monitor JSON report.

    Returns [] for a report with no runtime using a core (the host is idle) and None for a line that is
    not a report (neuron-monitor may print diagnostics); a bad value in one core skips that core only.
    """
    try:
        report = json.loads(line)
    except ValueError:
        return None
    if not isinstance(report, dict):
        return None
    values: list[float] = []
    for runtime in report.get("neuron_runtime_data") or []:
        if not isinstance(runtime, dict):
            continue
        counters = ((runtime.get("report") or {}).get("neuroncore_counters")) or {}
        cores = counters.get("neuroncores_in_use") or {}
        if not isinstance(cores, dict):
            continue
        for core in cores.values():
            value = core.get("neuroncore_utilization") if isinstance(core, dict) else None
            if isinstance(value, int | float) and 0 <= value <= 100:
                values.append(float(value))
    return values


# --- is the host compiling? ---------------------------------------------------------------------------------

#: Executables whose running process means "this host is compiling" (a cold compile reads ~0% utilization).
COMPILING_EXECUTABLES = (COMPILER_EXECUTABLE, PARALLEL_COMPILE_EXECUTABLE)


def compiling_processes(proc: Path = Path("/proc")) -> list[int]:
    """Processes running neuronx-cc or neuron_parallel_compile (directly, or as a script an interpreter
    runs), found in /proc; [] where /proc does not exist."""
    found = []
    for cmdline in proc.glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")[:2]
        except OSError:
            continue  # the process ended while we looked
        names = {os.path.basename(a.decode(errors="replace")) for a in args if a}
        if names.intersection(COMPILING_EXECUTABLES):
            found.append(int(cmdline.parent.name))
    return found


# --- neuron_parallel_compile -------------------------------------------------------------------------------


def parallel_compile_command(
    command: Sequence[str], executable: str = PARALLEL_COMPILE_EXECUTABLE
) -> list[str]:
    """Run `command` in graph-extraction mode, then compile the graphs it traced in parallel into the cache."""
    return [executable, *command]


#: A folder of this prefix inside an entry is a remote writer's (S3), copied down by hand: never shared.
WRITER_FOLDER_PREFIX = ".w-"


def iter_entry_files(entry_path: Path) -> Iterator[tuple[str, Path]]:
    """(name relative to the entry, path) for every shareable file of an entry directory.

    Only regular files inside the entry: a symbolic link (to a file or a folder) is never followed, so a
    link to credentials elsewhere is not published, and a remote writer's folder (`.w-*`) is left out."""
    found: list[tuple[str, Path]] = []
    for folder, dirs, files in os.walk(entry_path, followlinks=False):
        dirs[:] = [d for d in dirs if not d.startswith(WRITER_FOLDER_PREFIX)]
        for name in files:
            path = Path(folder) / name
            if name.endswith(LOCK_SUFFIX) or path.is_symlink() or not path.is_file():
                continue
            found.append((path.relative_to(entry_path).as_posix(), path))
    yield from sorted(found)
