"""What the stand-ins share: how the Neuron stack names, writes and locks compile cache entries.

The stand-ins play the Neuron tools in tests, where the real ones cannot run: `neuronx-cc` compiles (a
graph containing FAIL fails), `neuron_parallel_compile` extracts graphs from a trial run and compiles them
into the cache, `neuron-monitor` prints JSON reports, and `standin-train` is a training script whose
framework compiles its graphs just in time through the cache, like torch-neuronx does.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

DEFAULT_VERSION = "2.14.213.0+013d129b"
DEFAULT_ROOT = "/var/tmp/neuron-compile-cache"


def compiler_version() -> str:
    return os.environ.get("STANDIN_NEURONXCC_VERSION", DEFAULT_VERSION)


def cache_root() -> Path:
    """The compiler's precedence: --cache_dir in NEURON_CC_FLAGS, then NEURON_COMPILE_CACHE_URL."""
    args = shlex.split(os.environ.get("NEURON_CC_FLAGS", ""))
    for i, arg in enumerate(args):
        if arg.startswith("--cache_dir="):
            return Path(arg.split("=", 1)[1])
        if arg == "--cache_dir" and i + 1 < len(args):
            return Path(args[i + 1])
    return Path(os.environ.get("NEURON_COMPILE_CACHE_URL") or DEFAULT_ROOT)


def compile_flags() -> list[str]:
    args = shlex.split(os.environ.get("NEURON_CC_FLAGS", ""))
    return [a for a in args if not a.startswith("--cache_dir")]


def module_name(graph: bytes, flags: list[str]) -> str:
    graph_hash = int(hashlib.sha256(graph).hexdigest()[:15], 16)
    flags_hash = hashlib.md5(json.dumps(flags).encode(), usedforsecurity=False).hexdigest()[:8]
    return f"MODULE_{graph_hash}+{flags_hash}"


def graph_bytes(name: str, size: int = 2048) -> bytes:
    seed = hashlib.sha256(name.encode()).digest()
    body = (seed * (size // len(seed) + 1))[:size]
    return name.encode() + b"\n" + body


class CachedFailure(RuntimeError):
    pass


def compile_into_cache(graph: bytes, log: list[str] | None = None) -> str:
    """Look the graph up in the cache; compile it there on a miss. Returns "hit" or "compiled"."""
    flags = compile_flags()
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    (root / "lock").touch()
    entry = root / f"neuronxcc-{compiler_version()}" / module_name(graph, flags)
    if (entry / "model.neff").exists() and (entry / "model.done").exists():
        return "hit"
    if (entry / "model.log").exists() and not (entry / "model.neff").exists():
        raise CachedFailure(f"Got a cached failed neff at {entry}. Will skip compilation.")
    entry.mkdir(parents=True, exist_ok=True)
    hlo = entry / "model.hlo_module.pb"
    lock = entry / "model.hlo_module.pb.lock"
    lock.touch()
    try:
        (entry / "compile_flags.json").write_text(json.dumps(flags))
        hlo.write_bytes(graph)
        completed = subprocess.run(
            [
                "neuronx-cc",
                "compile",
                "--framework=XLA",
                str(hlo),
                "--output",
                str(entry / "model.neff"),
                *flags,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if completed.returncode != 0:
            (entry / "model.neff").unlink(missing_ok=True)
            (entry / "model.log").write_text(completed.stdout + completed.stderr)
            raise RuntimeError(f"compilation failed for {entry.name}: {completed.stderr.strip()}")
        (entry / "model.done").touch()
    finally:
        lock.unlink(missing_ok=True)
    if log is not None:
        log.append(entry.name)
    print(f"compiled {entry.name}", file=sys.stderr, flush=True)
    return "compiled"
