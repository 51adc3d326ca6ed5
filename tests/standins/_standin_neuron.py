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


def cache_url() -> str:
    """The compiler's precedence: --cache_dir in NEURON_CC_FLAGS, then NEURON_COMPILE_CACHE_URL."""
    args = shlex.split(os.environ.get("NEURON_CC_FLAGS", ""))
    for i, arg in enumerate(args):
        if arg.startswith("--cache_dir="):
            return arg.split("=", 1)[1]
        if arg == "--cache_dir" and i + 1 < len(args):
            return args[i + 1]
    return os.environ.get("NEURON_COMPILE_CACHE_URL") or DEFAULT_ROOT


def cache_root() -> Path:
    return Path(cache_url())


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


def _s3_lookup(url: str, module: str) -> tuple[object, str, str, bool]:
    """(client, bucket, entry prefix, whether the entry is there) in an s3:// compile cache, read the way the
    Neuron compiler's S3 cache reads it: the files of `neuronxcc-<version>/<module>/` under the URL."""
    import boto3

    bucket, _, prefix = url[len("s3://") :].partition("/")
    entry = "/".join(p for p in (prefix.strip("/"), f"neuronxcc-{compiler_version()}", module) if p)
    client = boto3.client("s3")
    listed = client.list_objects_v2(Bucket=bucket, Prefix=entry + "/", Delimiter="/")
    names = {item["Key"].rsplit("/", 1)[-1] for item in listed.get("Contents", [])}
    found = "model.done" in names and "model.neff" in names
    if found:
        # the NEFF is what the runtime loads: it must be readable, whole
        client.get_object(Bucket=bucket, Key=f"{entry}/model.neff")["Body"].read()
    return client, bucket, entry, found


def compile_into_cache(graph: bytes, log: list[str] | None = None) -> str:
    """Look the graph up in the cache; compile it there on a miss. Returns "hit" or "compiled"."""
    flags = compile_flags()
    url = cache_url()
    if url.startswith("s3://"):
        return _compile_into_s3(url, graph, flags, log)
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


def _compile_into_s3(url: str, graph: bytes, flags: list[str], log: list[str] | None) -> str:
    """The compiler's S3 cache: a hit is an entry whose files are at the entry's own path; a miss compiles
    locally and stores the entry there, the done marker last."""
    import tempfile

    module = module_name(graph, flags)
    client, bucket, entry, found = _s3_lookup(url, module)
    if found:
        return "hit"
    with tempfile.TemporaryDirectory() as work:
        hlo = Path(work) / "model.hlo_module.pb"
        hlo.write_bytes(graph)
        neff = Path(work) / "model.neff"
        completed = subprocess.run(
            ["neuronx-cc", "compile", "--framework=XLA", str(hlo), "--output", str(neff), *flags],
            capture_output=True,
            text=True,
            check=False,
        )
        if completed.returncode != 0:
            raise RuntimeError(f"compilation failed for {module}: {completed.stderr.strip()}")
        for name, body in (
            ("compile_flags.json", json.dumps(flags).encode()),
            ("model.hlo_module.pb", graph),
            ("model.neff", neff.read_bytes()),
            ("model.done", b""),
        ):
            client.put_object(Bucket=bucket, Key=f"{entry}/{name}", Body=body)
    if log is not None:
        log.append(module)
    print(f"compiled {module}", file=sys.stderr, flush=True)
    return "compiled"
