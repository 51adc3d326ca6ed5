"""Restore a NEFF cache of realistic shape and compare with `aws s3 sync` and `snapshot_download`.

The cache: ENTRIES compile cache entries of one compiler version, NEFFs sized like a real training cache
(log-normal around 1.5 MB, from 50 KB to 40 MB) plus BIG entries of BIG_MB each (the large graphs of a
model's forward/backward pass). Every tool restores the same tree from the same servers, each in its own
process, into an empty directory (cold) and again into the filled one (warm, nothing to do):

    sagequeue cache restore   S3 on moto's server        and   the Hub-API test server
    aws s3 sync               S3 on moto's server (awscli in its own venv, default 10 concurrent requests)
    snapshot_download         the Hub-API test server   (huggingface_hub, max_workers as given)

The servers run in their own processes on this machine, so figures measure client overhead and
parallelism over loopback, not a network; on a real network the ratio between tools is what carries over.
Time grows linearly with total bytes once past the per-entry cost (S3: one manifest GET and one GET per
file; Hub: one GET per file, one tree listing per 1000 files).

A TorchNeuron-shaped cache runs in the same invocation: TNX_ENTRIES eager-mode NEFFs (one per op,
log-normal around TNX_MEAN_KB, torch-neuronx's `ab/cd/<32 hex>.neff` layout) published in packs, restored by

    sagequeue cache --kind torchneuron restore   S3 and the Hub (ranged GETs of packs, in parallel)
    raw parallel GET          the same NEFFs as one S3 object each, WORKERS GETs at a time (the floor a
                              per-file restore could reach)
    aws s3 sync               that per-file tree on S3
    snapshot_download         that per-file tree on the Hub

and the ratio of sagequeue's restore to the raw parallel GET of the same bytes is printed.

Usage (from the repository root, after `python -m venv .venv-bench && .venv-bench/bin/pip install awscli`):

    .venv/bin/python bench/bench_neff_restore.py                  # 300 entries + 3 x 200 MB, a few minutes
    .venv/bin/python bench/bench_neff_restore.py --entries 60 --big 1 --big-mb 50   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = REPO / ".venv" / "bin" / "python"
SAGEQUEUE = REPO / ".venv" / "bin" / "sagequeue"
AWS = REPO / ".venv-bench" / "bin" / "aws"
VERSION = "2.14.213.0+013d129b"
REPO_ID = "bench-org/neff-cache"
BUCKET = "sagequeue-bench"
PREFIX = "neff-cache"
MB = 1024 * 1024


@dataclass
class Run:
    tool: str
    backend: str
    phase: str
    seconds: float
    files: int
    size: int


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for(port: int, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port} after {timeout}s")


def write_random(path: Path, size: int, rng: random.Random) -> None:
    # random bytes so no layer can compress or deduplicate them; written in blocks to bound memory
    block = rng.randbytes(min(size, 4 * MB)) if size else b""
    with path.open("wb") as out:
        left = size
        while left > 0:
            piece = block[: min(left, len(block))]
            out.write(piece)
            left -= len(piece)
            block = block[len(block) // 2 :] + block[: len(block) // 2]  # shuffle so blocks differ


def build_cache(root: Path, entries: int, big: int, big_mb: int, seed: int) -> tuple[int, int]:
    rng = random.Random(seed)
    version_dir = root / f"neuronxcc-{VERSION}"
    files = total = 0
    for index in range(entries + big):
        module = f"MODULE_{rng.getrandbits(60)}+{rng.getrandbits(32):08x}"
        entry = version_dir / module
        entry.mkdir(parents=True)
        if index < entries:
            neff = int(min(40 * MB, max(50 * 1024, rng.lognormvariate(14.2, 1.1))))
            hlo = int(min(1 * MB, max(20 * 1024, rng.lognormvariate(11.5, 0.8))))
        else:
            neff, hlo = big_mb * MB, 4 * MB
        (entry / "compile_flags.json").write_text(
            json.dumps(["--target=trn1", "--model-type=transformer", "-O1"])
        )
        write_random(entry / "model.hlo_module.pb", hlo, rng)
        write_random(entry / "model.neff", neff, rng)
        (entry / "model.done").touch()
        files += 4
        total += neff + hlo + (entry / "compile_flags.json").stat().st_size
    return files, total


def tree_size(root: Path) -> tuple[int, int]:
    files = [p for p in root.rglob("*") if p.is_file() and ".cache" not in p.parts]
    return len(files), sum(p.stat().st_size for p in files)


def timed(command: list[str], env: dict[str, str]) -> float:
    started = time.monotonic()
    completed = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    elapsed = time.monotonic() - started
    if completed.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command[:4])} failed ({completed.returncode}): {completed.stderr[-2000:]}"
        )
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=300)
    parser.add_argument("--big", type=int, default=3)
    parser.add_argument("--big-mb", type=int, default=200)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--tnx-entries", type=int, default=2000, help="TorchNeuron eager NEFFs (0: none)")
    parser.add_argument("--tnx-mean-kb", type=int, default=300, help="their mean size")
    parser.add_argument("--tnx-repeat", type=int, default=3, help="cold runs of the S3 pair, alternating")
    parser.add_argument("--skip-xla", action="store_true", help="only the TorchNeuron-shaped cache")
    args = parser.parse_args()
    if not AWS.exists():
        sys.exit(f"{AWS} not found: python -m venv .venv-bench && .venv-bench/bin/pip install awscli")

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="sq-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    s3_port, hub_port = free_port(), free_port()
    env = dict(os.environ)
    env.update(
        {
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3_port}",
            "AWS_EC2_METADATA_DISABLED": "true",
            "HF_ENDPOINT": f"http://127.0.0.1:{hub_port}",
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "HF_HOME": str(work / "hf-home"),
            "PYTHONPATH": str(REPO / "tests"),
        }
    )
    servers = [
        subprocess.Popen(
            [str(PYTHON), "-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3_port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [
                str(PYTHON),
                "-m",
                "support.hub_server",
                "--port",
                str(hub_port),
                "--storage",
                str(work / "hub"),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
    ]
    try:
        wait_for(s3_port)
        wait_for(hub_port)
        os.environ.update(env)
        runs = run_benchmark(args, work, env)
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=10)
    print_table(runs)
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)


def run_benchmark(args: argparse.Namespace, work: Path, env: dict[str, str]) -> list[Run]:
    import boto3
    from huggingface_hub import HfApi

    boto3.client("s3").create_bucket(Bucket=BUCKET)
    HfApi().create_repo(REPO_ID, private=True, exist_ok=True)
    runs: list[Run] = [] if args.skip_xla else run_xla(args, work, env)
    if args.tnx_entries:
        runs += run_torchneuron(args, work, env)
    return runs


def run_xla(args: argparse.Namespace, work: Path, env: dict[str, str]) -> list[Run]:
    from sagequeue.job import sync
    from sagequeue.job.backends import open_remote
    from sagequeue.job.remote import Deadline

    source = work / "source"
    started = time.monotonic()
    files, total = build_cache(source, args.entries, args.big, args.big_mb, args.seed)
    print(
        f"cache: {args.entries + args.big} entries, {files} files, {total / MB:.0f} MB "
        f"(written in {time.monotonic() - started:.1f}s)",
        flush=True,
    )
    runs: list[Run] = []
    for backend, url in (("s3", f"s3://{BUCKET}/{PREFIX}"), ("hub", f"hf://{REPO_ID}")):
        remote = open_remote(url)
        started = time.monotonic()
        report = sync.upload(remote, source, VERSION, deadline=Deadline(None))
        elapsed = time.monotonic() - started
        assert len(report.result.published) == args.entries + args.big, report.result
        runs.append(Run("sagequeue upload", backend, "publish", elapsed, files, total))
        print(f"published to {backend} in {elapsed:.1f}s", flush=True)

    tools = {
        ("sagequeue cache restore", "s3"): lambda dest: [
            str(SAGEQUEUE),
            "cache",
            "restore",
            "--cache",
            f"s3://{BUCKET}/{PREFIX}",
            "--cache-dir",
            str(dest),
            "--compiler-version",
            VERSION,
            "--workers",
            str(args.workers),
            "--no-progress",
        ],
        ("aws s3 sync", "s3"): lambda dest: [
            str(AWS),
            "s3",
            "sync",
            f"s3://{BUCKET}/{PREFIX}/neuronxcc-{VERSION}",
            str(dest / f"neuronxcc-{VERSION}"),
            # the tree the Neuron compiler reads; each entry's writer-prefixed copy is sagequeue's
            "--exclude",
            "*/.w-*",
            "--only-show-errors",
        ],
        ("sagequeue cache restore", "hub"): lambda dest: [
            str(SAGEQUEUE),
            "cache",
            "restore",
            "--cache",
            f"hf://{REPO_ID}",
            "--cache-dir",
            str(dest),
            "--compiler-version",
            VERSION,
            "--workers",
            str(args.workers),
            "--no-progress",
        ],
        ("snapshot_download", "hub"): lambda dest: [
            str(PYTHON),
            "-c",
            "import sys; from huggingface_hub import snapshot_download; "
            f"snapshot_download({REPO_ID!r}, allow_patterns=['neuronxcc-{VERSION}/*'], local_dir=sys.argv[1], "
            f"max_workers={args.workers})",
            str(dest),
        ],
    }
    for (tool, backend), command in tools.items():
        dest = work / f"restore-{tool.split()[0]}-{backend}"
        shutil.rmtree(dest, ignore_errors=True)
        for phase in ("cold", "warm"):
            elapsed = timed(command(dest), env)
            got_files, got_size = tree_size(dest / f"neuronxcc-{VERSION}")
            assert got_size == total, f"{tool} on {backend}: {got_size} bytes restored, {total} expected"
            runs.append(Run(tool, backend, phase, elapsed, got_files, got_size))
            print(f"{tool:<24} {backend:<4} {phase:<5} {elapsed:7.1f}s", flush=True)
        shutil.rmtree(dest, ignore_errors=True)
    return runs


TNX_NS = {"torch_neuronx": "2.14.0", "neuronx_cc": VERSION, "platform": "trn2", "cores": "32", "nki": "none"}
RAW_PREFIX = "raw-neff-cache"
RAW_REPO_ID = "bench-org/raw-neff-cache"
#: A restore by one GET per file, WORKERS at a time, in its own process like the other tools.
RAW_GET = """
import sys, boto3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from botocore.config import Config
bucket, prefix, dest, workers = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
client = boto3.client("s3", config=Config(max_pool_connections=workers * 2))
keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
        for o in page.get("Contents", [])]
def get(key):
    target = dest / key[len(prefix) + 1:]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())
with ThreadPoolExecutor(workers) as pool:
    list(pool.map(get, keys))
"""


def build_torchneuron_cache(root: Path, entries: int, mean_kb: int, seed: int) -> int:
    """`entries` eager-mode NEFFs in torch-neuronx's sharded layout, log-normal sizes around mean_kb."""
    import math

    rng = random.Random(seed + 1)
    sigma = 0.9
    mu = math.log(mean_kb * 1024) - sigma * sigma / 2
    total = 0
    for _ in range(entries):
        key = f"{rng.getrandbits(128):032x}"
        path = root / key[:2] / key[2:4] / f"{key}.neff"
        path.parent.mkdir(parents=True, exist_ok=True)
        size = int(min(8 * MB, max(4 * 1024, rng.lognormvariate(mu, sigma))))
        write_random(path, size, rng)
        total += size
    return total


def run_torchneuron(args: argparse.Namespace, work: Path, env: dict[str, str]) -> list[Run]:
    import boto3
    from huggingface_hub import HfApi

    from sagequeue.job import torchneuron
    from sagequeue.job.backends import open_remote
    from sagequeue.job.remote import Deadline

    source = work / "tnx-source"
    total = build_torchneuron_cache(source, args.tnx_entries, args.tnx_mean_kb, args.seed)
    files = args.tnx_entries
    print(f"TorchNeuron cache: {files} NEFFs, {total / MB:.0f} MB", flush=True)
    namespace = torchneuron.Namespace(**TNX_NS)
    runs: list[Run] = []
    for backend, url in (("s3", f"s3://{BUCKET}/{PREFIX}"), ("hub", f"hf://{REPO_ID}")):
        store = torchneuron.pack_store(open_remote(url))
        started = time.monotonic()
        report = torchneuron.upload(store, source, namespace, deadline=Deadline(None))
        elapsed = time.monotonic() - started
        assert len(report.published) == files, report
        runs.append(Run("sagequeue upload (tnx)", backend, "publish", elapsed, files, total))
        print(f"TorchNeuron: published {len(report.packs)} packs to {backend} in {elapsed:.1f}s", flush=True)
    # the per-file tree the other tools read: one object per NEFF
    client = boto3.client("s3")
    started = time.monotonic()
    from concurrent.futures import ThreadPoolExecutor

    neffs = sorted(source.rglob("*.neff"))
    with ThreadPoolExecutor(16) as pool:
        list(
            pool.map(
                lambda p: client.put_object(
                    Bucket=BUCKET, Key=f"{RAW_PREFIX}/{p.relative_to(source).as_posix()}", Body=p.read_bytes()
                ),
                neffs,
            )
        )
    HfApi().create_repo(RAW_REPO_ID, private=True, exist_ok=True)
    HfApi().upload_folder(repo_id=RAW_REPO_ID, folder_path=str(source))
    print(f"per-file copies written in {time.monotonic() - started:.1f}s", flush=True)

    ns_args = [
        "--torch-neuronx-version", TNX_NS["torch_neuronx"], "--compiler-version", VERSION,
        "--platform", TNX_NS["platform"], "--cores", TNX_NS["cores"],
    ]  # fmt: skip
    tools = {
        ("sagequeue restore (tnx)", "s3"): lambda dest: [
            str(SAGEQUEUE),
            "cache",
            "--kind",
            "torchneuron",
            "restore",
            "--cache",
            f"s3://{BUCKET}/{PREFIX}",
            "--cache-dir",
            str(dest),
            "--workers",
            str(args.workers),
            *ns_args,
        ],
        ("raw parallel GET (tnx)", "s3"): lambda dest: [
            str(PYTHON),
            "-c",
            RAW_GET,
            BUCKET,
            RAW_PREFIX,
            str(dest),
            str(args.workers),
        ],
        ("aws s3 sync (tnx)", "s3"): lambda dest: [
            str(AWS),
            "s3",
            "sync",
            f"s3://{BUCKET}/{RAW_PREFIX}",
            str(dest),
            "--only-show-errors",
        ],
        ("sagequeue restore (tnx)", "hub"): lambda dest: [
            str(SAGEQUEUE),
            "cache",
            "--kind",
            "torchneuron",
            "restore",
            "--cache",
            f"hf://{REPO_ID}",
            "--cache-dir",
            str(dest),
            "--workers",
            str(args.workers),
            *ns_args,
        ],
        ("snapshot_download (tnx)", "hub"): lambda dest: [
            str(PYTHON),
            "-c",
            "import sys; from huggingface_hub import snapshot_download; "
            f"snapshot_download({RAW_REPO_ID!r}, allow_patterns=['*.neff'], local_dir=sys.argv[1], "
            f"max_workers={args.workers})",
            str(dest),
        ],
    }

    def cold_run(tool: str, backend: str) -> float:
        dest = work / f"tnx-restore-{tool.split()[0]}-{backend}"
        shutil.rmtree(dest, ignore_errors=True)
        elapsed = timed(tools[(tool, backend)](dest), env)
        got = sorted(dest.rglob("*.neff"))
        size = sum(p.stat().st_size for p in got)
        assert size == total, f"{tool} on {backend}: {size} bytes restored, {total} expected"
        return elapsed

    for (tool, backend), command in tools.items():
        dest = work / f"tnx-restore-{tool.split()[0]}-{backend}"
        elapsed = cold_run(tool, backend)
        runs.append(Run(tool, backend, "cold", elapsed, files, total))
        print(f"{tool:<24} {backend:<4} cold  {elapsed:7.1f}s", flush=True)
        if not tool.startswith("raw"):  # a raw GET has no notion of what is already there
            elapsed = timed(command(dest), env)
            runs.append(Run(tool, backend, "warm", elapsed, files, total))
            print(f"{tool:<24} {backend:<4} warm  {elapsed:7.1f}s", flush=True)
        shutil.rmtree(dest, ignore_errors=True)
    # the ratio the cache is judged by: more cold runs of the pair, alternating, so load moves both alike
    pair: dict[str, list[float]] = {"sagequeue restore (tnx)": [], "raw parallel GET (tnx)": []}
    for run in runs:
        if run.backend == "s3" and run.phase == "cold" and run.tool in pair:
            pair[run.tool].append(run.seconds)
    for _ in range(args.tnx_repeat - 1):
        for tool in pair:
            pair[tool].append(cold_run(tool, "s3"))
    medians = {tool: sorted(times)[len(times) // 2] for tool, times in pair.items()}
    for tool, times in pair.items():
        print(
            f"{tool:<24} s3   cold runs {', '.join(f'{t:.1f}' for t in times)} s; median {medians[tool]:.1f} s"
        )
    ratio = medians["sagequeue restore (tnx)"] / medians["raw parallel GET (tnx)"]
    print(
        f"TorchNeuron restore / raw parallel GET of the same bytes (S3, cold, medians): {ratio:.2f}",
        flush=True,
    )
    return runs


def print_table(runs: list[Run]) -> None:
    print()
    print(
        f"| {'tool':<24} | {'backend':<7} | {'phase':<7} | {'files':>6} | {'MB':>7} | {'seconds':>7} | {'MB/s':>7} |"
    )
    print(f"|{'-' * 26}|{'-' * 9}|{'-' * 9}|{'-' * 8}|{'-' * 9}|{'-' * 9}|{'-' * 9}|")
    for run in runs:
        rate = run.size / MB / run.seconds if run.phase != "warm" else float("nan")
        rate_text = f"{rate:7.0f}" if run.phase != "warm" else "      -"
        print(
            f"| {run.tool:<24} | {run.backend:<7} | {run.phase:<7} | {run.files:>6} | {run.size / MB:>7.0f} | "
            f"{run.seconds:>7.1f} | {rate_text} |"
        )


if __name__ == "__main__":
    main()
