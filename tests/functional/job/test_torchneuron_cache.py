"""The TorchNeuron cache kind end to end: `sagequeue-job run` in an image with torch-neuronx installed (a
distribution's metadata on PYTHONPATH, so the real discovery path runs), the stand-in training script
writing torch-neuronx's sharded NEFF cache, S3 on moto's server and the Hub-API test server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from conftest import (
    BIN,
    STANDINS,
    Cache,
    assert_no_more_traffic,
    make_cache,
    run_cli,
    run_wrapper,
    stop_and_wait,
)
from fault_proxy import FaultProxy
from support.hub_server import DEFAULT_USER, HubServer

from sagequeue.job import torchneuron
from sagequeue.job.backends import open_remote

TRAIN = str(STANDINS / "standin-torchneuron-train")
TNX = "2.14.0"
CC = "2.22.5.0+abcdef12"


def image(
    tmp_path: Path, env: dict[str, str], torch_neuronx: str | None = TNX, torch_xla: bool = False
) -> dict[str, str]:
    """The environment of a container whose Python has torch-neuronx (and torch-xla) installed."""
    site = tmp_path / f"site-{uuid.uuid4().hex[:6]}"
    for name, version in (("torch_neuronx", torch_neuronx), ("torch_xla", "2.9.0" if torch_xla else None)):
        if version:
            info = site / f"{name}-{version}.dist-info"
            info.mkdir(parents=True)
            (info / "METADATA").write_text(
                f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n"
            )
    out = dict(env)
    out["PYTHONPATH"] = str(site)
    out["STANDIN_NEURONXCC_VERSION"] = CC
    out["SM_CURRENT_INSTANCE_TYPE"] = "ml.trn2.48xlarge"
    out["NEURON_RT_NUM_CORES"] = "32"
    out["TORCH_NEURONX_NEFF_LOCAL_CACHE_DIR"] = str(tmp_path / "locks")
    for name in ("TORCH_NEURONX_NEFF_CACHE_DIR", "SAGEQUEUE_CACHE_KIND"):
        out.pop(name, None)
    return out


def train(
    cache: Cache, env: dict[str, str], host: Path, *train_args: str, wrapper: tuple[str, ...] = ()
) -> tuple[dict, subprocess.CompletedProcess[str]]:
    report = host.parent / f"report-{uuid.uuid4().hex[:6]}.json"
    done = run_wrapper(
        [
            "run",
            "--no-progress",
            "--cache",
            cache.url,
            "--cache-dir",
            str(host),
            *wrapper,
            "--",
            TRAIN,
            "--report",
            str(report),
            *train_args,
        ],
        env,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(report.read_text()), done


def test_a_fresh_host_restores_a_warm_cache_and_compiles_nothing(cache: Cache, tmp_path: Path) -> None:
    env = image(tmp_path, cache.env)
    # GIVEN a job that compiled 60 eager ops and two graphs on one host and published them
    first, done = train(cache, env, tmp_path / "host-a", "--ops", "60", "--graphs", "fwd,bwd")
    assert len(first["compiled"]) == 62, done.stderr
    assert "TorchNeuron NEFF cache" in done.stderr
    assert "uploaded 62 entries" in done.stderr
    # the locks stayed where torch-neuronx keeps them, outside the shared directory
    assert first["lock_dir"] == str(tmp_path / "locks")
    # WHEN the same job runs on a fresh host
    second, done = train(cache, env, tmp_path / "host-b", "--ops", "60", "--graphs", "fwd,bwd")
    # THEN it restored every NEFF before the script started, and compiled nothing
    assert second["compiled"] == [], done.stderr
    assert sorted(second["hit"]) == sorted(first["compiled"])
    assert second["stale"] == []
    assert "restored 62 entries" in done.stderr
    # AND the upload after it found nothing new to publish
    assert "uploaded 0 entries" in done.stderr


@pytest.mark.slow
def test_two_thousand_eager_neffs_restore_within_1_2_times_a_raw_parallel_get(
    base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    """Many small files restore as fast as few large ones: the 2,000 per-op NEFFs of an eager-mode job
    restore on a fresh host within 1.2 times a raw parallel GET (16 at a time) of the same NEFFs stored one
    object each, both in their own process, alternating three times so load moves both alike (medians).
    bench/bench_neff_restore.py measures the same with real NEFF sizes beside `aws s3 sync`."""
    import sys
    from concurrent.futures import ThreadPoolExecutor

    import boto3

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    from bench_neff_restore import RAW_GET

    cache = make_cache("s3", base_env, hub_server)
    env = image(tmp_path, cache.env)
    # GIVEN an eager-mode job that compiled and published 2,000 op NEFFs of 24 KB (each compile instant
    # here: at the suite's 20 ms a compile, this setup took 40 s, and only the restore is measured)
    compiled_at_once = {**env, "STANDIN_COMPILE_SECONDS": "0"}
    first, done = train(
        cache, compiled_at_once, tmp_path / "host-a", "--ops", "2000", "--neff-bytes", "24576"
    )
    assert len(first["compiled"]) == 2000, done.stderr
    assert "uploaded 2000 entries" in done.stderr
    # AND the same NEFFs as one object each, the layout a per-file restore reads
    neffs = sorted((tmp_path / "host-a").rglob("*.neff"))
    bucket = cache.url[len("s3://") :].split("/")[0]
    client = boto3.client("s3")
    with ThreadPoolExecutor(16) as pool:
        list(
            pool.map(
                lambda p: client.put_object(
                    Bucket=bucket,
                    Key=f"raw/{p.relative_to(tmp_path / 'host-a').as_posix()}",
                    Body=p.read_bytes(),
                ),
                neffs,
            )
        )
    total = sum(p.stat().st_size for p in neffs)
    restore = ["cache", "--kind", "torchneuron", "restore", "--cache", cache.url, "--workers", "16"]
    restore += [
        "--torch-neuronx-version",
        TNX,
        "--compiler-version",
        CC,
        "--platform",
        "trn2",
        "--cores",
        "32",
    ]
    times: dict[str, list[float]] = {"restore": [], "raw": []}
    for attempt in range(3):
        # WHEN a fresh host restores them, and a raw parallel GET fetches the same bytes
        for tool in times:
            dest = tmp_path / f"{tool}-{attempt}"
            started = time.monotonic()
            if tool == "restore":
                ran = run_cli([*restore, "--cache-dir", str(dest)], env, timeout=300)
            else:
                ran = subprocess.run(
                    [sys.executable, "-c", RAW_GET, bucket, "raw", str(dest), "16"],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=300,
                    check=False,
                )
            times[tool].append(time.monotonic() - started)
            assert ran.returncode == 0, ran.stderr
            assert sum(p.stat().st_size for p in dest.rglob("*.neff")) == total
            if tool == "restore":
                # THEN the restore made a few dozen requests where the per-file restore makes 2,000
                assert "restored 2000 entries" in ran.stdout, ran.stdout
                requests = int(ran.stdout.split(" requests)")[0].rsplit(", ", 1)[1])
                assert requests <= 20, ran.stdout
    # AND it took at most 1.2 times as long
    medians = {tool: sorted(values)[1] for tool, values in times.items()}
    assert medians["restore"] <= 1.2 * medians["raw"], times


@pytest.mark.parametrize("change", ["torch-neuronx", "neuronx-cc", "platform", "cores", "nki"])
def test_a_job_of_another_namespace_restores_nothing(change: str, cache: Cache, tmp_path: Path) -> None:
    env = image(tmp_path, cache.env)
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "attention.py").write_text("def kernel(): return 1\n")
    first, _ = train(cache, env, tmp_path / "host-a", "--ops", "30", wrapper=("--nki-sources", str(kernels)))
    assert len(first["compiled"]) == 30
    other = dict(env)
    wrapper: tuple[str, ...] = ("--nki-sources", str(kernels))
    if change == "torch-neuronx":
        other = image(tmp_path, cache.env, torch_neuronx="2.14.1")
    elif change == "neuronx-cc":
        other["STANDIN_NEURONXCC_VERSION"] = "2.22.6.0+abcdef12"
    elif change == "platform":
        other["SM_CURRENT_INSTANCE_TYPE"] = "ml.trn3.48xlarge"
    elif change == "cores":
        other["NEURON_RT_NUM_CORES"] = "16"
    else:
        (kernels / "attention.py").write_text("def kernel(): return 2\n")
    second, done = train(cache, other, tmp_path / "host-b", "--ops", "30", wrapper=wrapper)
    # THEN nothing of the other namespace was restored: every op compiles, and no NEFF is stale
    assert "restored 0 entries" in done.stderr, done.stderr
    assert second["stale"] == []
    assert second["hit"] == []


def test_without_namespaces_a_new_compiler_would_load_stale_neffs(cache: Cache, tmp_path: Path) -> None:
    """Why the namespace: torch-neuronx's key omits the compiler version, so a cache directory shared as
    is (an NFS mount) hands another compiler's NEFFs to the job."""
    env = image(tmp_path, cache.env)
    train(cache, env, tmp_path / "shared", "--ops", "10", wrapper=("--no-upload",))
    other = dict(env, STANDIN_NEURONXCC_VERSION="2.22.6.0+abcdef12")
    second, _ = train(
        cache, other, tmp_path / "shared", "--ops", "10", wrapper=("--no-upload", "--restore", "none")
    )
    assert len(second["stale"]) == 10


def test_an_xla_image_keeps_the_xla_cache(cache: Cache, tmp_path: Path) -> None:
    env = image(tmp_path, cache.env, torch_xla=True)
    done = run_wrapper(["run", "--no-progress", "--cache-dir", str(tmp_path / "xla"), "--", "true"], env)
    assert done.returncode == 0, done.stderr
    assert "TorchNeuron" not in done.stderr
    assert "compile cache:" in done.stderr
    explicit = run_wrapper(
        [
            "run",
            "--no-progress",
            "--cache-kind",
            "torchneuron",
            "--cache-dir",
            str(tmp_path / "tnx"),
            "--",
            "true",
        ],
        env,
    )
    assert "TorchNeuron NEFF cache" in explicit.stderr


def test_temporary_files_and_empty_neffs_are_never_uploaded(cache: Cache, tmp_path: Path) -> None:
    env = image(tmp_path, cache.env)
    host = tmp_path / "host-a"
    host.mkdir()
    empty = host / "ab" / "cd" / ("abcd" + "0" * 28 + ".neff")
    empty.parent.mkdir(parents=True)
    empty.write_bytes(b"")
    first, _done = train(cache, env, host, "--ops", "5", "--leave-temp")
    assert Path(first["left_temp"]).exists()
    store = torchneuron.pack_store(cache.remote)
    namespace = torchneuron.Namespace(TNX, CC, "trn2", "32")
    indexes, problems = torchneuron.read_indexes(store, namespace)
    names = {e.name for i in indexes for e in i.entries}
    assert problems == {}
    assert len(names) == 5
    assert all(torchneuron.is_entry_name(n) for n in names)
    assert empty.relative_to(host).as_posix() not in names


def test_a_stop_publishes_what_was_compiled_within_the_grace(cache: Cache, tmp_path: Path) -> None:
    env = image(tmp_path, cache.env)
    report = tmp_path / "report.json"
    log = tmp_path / "wrapper.log"
    job = subprocess.Popen(
        [
            str(BIN / "sagequeue-job"),
            "run",
            "--no-progress",
            "--grace",
            "30",
            "--cache",
            cache.url,
            "--cache-dir",
            str(tmp_path / "host-a"),
            "--",
            TRAIN,
            "--ops",
            "40",
            "--steps",
            "200",
            "--step-seconds",
            "0.2",
            "--checkpoint",
            str(tmp_path / "ckpt"),
            "--term-status",
            "0",
            "--report",
            str(report),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )
    try:
        deadline = time.monotonic() + 60
        while len(torchneuron.local_entries(tmp_path / "host-a")) < 40:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        stopped = time.monotonic()
        job.send_signal(signal.SIGTERM)
        status = job.wait(timeout=40)
        took = time.monotonic() - stopped
    finally:
        job.kill()
    stderr = log.read_text()
    assert status == 0, stderr
    assert took < 30, stderr
    assert (tmp_path / "ckpt").exists()
    assert "uploaded 40 entries" in stderr, stderr
    second, _ = train(cache, env, tmp_path / "host-b", "--ops", "40")
    assert second["compiled"] == []


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["s3", "hub"])
def test_a_stop_during_a_slow_restore_exits_within_the_grace_and_stops_downloading(
    kind: str, base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    """The XLA cache's fault case for this kind: SageMaker stops the job while the restore crawls."""
    from sagequeue.job import sync

    cache = make_cache(kind, base_env, hub_server)
    env = image(tmp_path, cache.env)
    # GIVEN the namespace holds 8 MB of NEFFs, 32 s at the proxy's rate
    source = tmp_path / "source"
    for i in range(4):
        key = f"{i:02x}" * 16
        path = source / key[:2] / key[2:4] / f"{key}.neff"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(2 * 1024 * 1024))
    namespace = torchneuron.Namespace(TNX, CC, "trn2", "32")
    assert len(torchneuron.upload(torchneuron.pack_store(cache.remote), source, namespace).published) == 4
    upstream = env["AWS_ENDPOINT_URL"] if kind == "s3" else env["HF_ENDPOINT"]
    root = tmp_path / "host"
    report = tmp_path / "report.json"
    log = tmp_path / "wrapper.log"
    with FaultProxy(upstream, mode="slow", rate=256 * 1024) as proxy:
        env["AWS_ENDPOINT_URL" if kind == "s3" else "HF_ENDPOINT"] = proxy.url
        wrapper = ["run", "--no-progress", "--cache", cache.url, "--cache-dir", str(root), "--workers", "2"]
        job = subprocess.Popen(
            [str(BIN / "sagequeue-job"), *wrapper, "--grace", "6", "--", TRAIN, "--report", str(report)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log.open("w"),
        )
        try:
            # AND the restore is downloading, into a staging directory outside the cache root
            staging = sync.staging_dir(root)
            deadline = time.monotonic() + 60
            while sum(p.stat().st_size for p in staging.rglob("*.part") if p.is_file()) <= 512 * 1024:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            assert not staging.is_relative_to(root)
            # WHEN SageMaker stops the job
            status, elapsed = stop_and_wait(job)
        finally:
            job.kill()
        stderr = log.read_text()
        # THEN the wrapper left within the grace, without starting the command
        assert elapsed < 6, stderr
        assert status == 128 + signal.SIGTERM, stderr
        assert not report.exists()
        # AND nothing downloads any more
        assert_no_more_traffic(proxy)
    assert list(root.rglob("*.neff")) == []


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["s3", "hub"])
def test_a_blackholed_cache_delays_training_by_less_than_a_minute(
    kind: str, base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache(kind, base_env, hub_server)
    env = image(tmp_path, cache.env)
    upstream = env["AWS_ENDPOINT_URL"] if kind == "s3" else env["HF_ENDPOINT"]
    with FaultProxy(upstream, mode="blackhole") as proxy:
        env["AWS_ENDPOINT_URL" if kind == "s3" else "HF_ENDPOINT"] = proxy.url
        started = time.monotonic()
        report, done = train(cache, env, tmp_path / "host", "--ops", "5")
        took = time.monotonic() - started
    assert took < 2 * 60, done.stderr
    assert "restore did not finish" in done.stderr or "restore failed" in done.stderr
    assert len(report["compiled"]) == 5


def test_the_disk_floor_leaves_the_restore_to_the_compiler(cache: Cache, tmp_path: Path) -> None:
    env = image(tmp_path, cache.env)
    train(cache, env, tmp_path / "host-a", "--ops", "20")
    second, done = train(
        cache, env, tmp_path / "host-b", "--ops", "20", wrapper=("--restore-min-free", "100000T")
    )
    assert "restored 0 entries" in done.stderr, done.stderr
    assert "20 over budget" in done.stderr, done.stderr
    assert len(second["compiled"]) == 20
    capped, done = train(
        cache, env, tmp_path / "host-c", "--ops", "20", wrapper=("--restore-max-bytes", str(4096 * 5))
    )
    assert "restored 5 entries" in done.stderr, done.stderr
    assert len(capped["compiled"]) == 15


def test_the_cache_commands_for_this_kind(cache: Cache, tmp_path: Path) -> None:
    env = image(tmp_path, cache.env)
    env["SAGEQUEUE_CACHE_KIND"] = "torchneuron"
    train(cache, env, tmp_path / "host-a", "--ops", "12", wrapper=("--model", "org/m"))
    listed = run_cli(["cache", "ls", "--cache", cache.url], env)
    assert listed.returncode == 0, listed.stderr
    assert f"{TNX}__{CC}__trn2__32__nki-none" in listed.stdout
    assert "12 entries" in listed.stdout
    looked = run_cli(["cache", "--kind", "torchneuron", "lookup", "--cache", cache.url, "org/m"], env)
    assert looked.returncode == 0, looked.stderr
    assert "trn2" in looked.stdout, looked.stderr
    restored = run_cli(["cache", "restore", "--cache", cache.url, "--cache-dir", str(tmp_path / "cli")], env)
    assert restored.returncode == 0, restored.stderr
    assert len(torchneuron.local_entries(tmp_path / "cli")) == 12
    verified = run_cli(["cache", "verify", "--cache", cache.url], env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "0 broken" in verified.stdout, verified.stdout + verified.stderr
    # a local entry the remote lacks goes up with sync
    extra = tmp_path / "cli" / "ee" / "ff" / ("eeff" + "1" * 28 + ".neff")
    extra.parent.mkdir(parents=True)
    extra.write_bytes(b"x" * 100)
    synced = run_cli(["cache", "sync", "--cache", cache.url, "--cache-dir", str(tmp_path / "cli")], env)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    assert "1 uploaded" in synced.stdout, synced.stdout + synced.stderr
    dry = run_cli(["cache", "prune", "--cache", cache.url, "--max-size", "0"], env)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "would remove 2 packs" in dry.stdout, dry.stdout + dry.stderr
    removed = run_cli(["cache", "rm", "--cache", cache.url, f"{TNX}__{CC}__trn2__32__nki-none", "--yes"], env)
    assert removed.returncode == 0, removed.stderr
    after = run_cli(["cache", "ls", "--cache", cache.url], env)
    assert "nki-none" not in after.stdout


def test_a_hostile_index_writes_nothing_outside_the_cache(cache: Cache, tmp_path: Path) -> None:
    """An index naming `..`, an absolute path or a path through a planted link is refused whole."""
    store = torchneuron.pack_store(cache.remote)
    namespace = torchneuron.Namespace(TNX, CC, "trn2", "32")
    body = tmp_path / "evil.pack"
    body.write_bytes(b"A" * 10)
    import hashlib

    digest = hashlib.sha256(b"A" * 10).hexdigest()
    for pack_id, name in (
        ("evil-dotdot", "../../outside/ab/cd/" + "abcd" + "0" * 28 + ".neff"),
        ("evil-absolute", "/tmp/ab/cd/" + "abcd" + "0" * 28 + ".neff"),
    ):
        index = json.dumps(
            {
                "format": 1,
                "pack": pack_id,
                "namespace": namespace.describe(),
                "entries": [[name, 0, 10, digest]],
            }
        ).encode()
        pack_path, index_path = torchneuron.pack_paths(namespace, pack_id)
        assert store.put_pack(pack_path, body, index_path, index, lambda: None)
    # a sound pack whose entry's shard directory is a link planted in the local cache
    good = "ab/cd/" + "abcd" + "1" * 28 + ".neff"
    index = json.dumps(
        {
            "format": 1,
            "pack": "linked-0001",
            "namespace": namespace.describe(),
            "entries": [[good, 0, 10, digest]],
        }
    ).encode()
    pack_path, index_path = torchneuron.pack_paths(namespace, "linked-0001")
    assert store.put_pack(pack_path, body, index_path, index, lambda: None)
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "ab").mkdir(parents=True)
    os.symlink(outside, root / "ab" / "cd")
    report = torchneuron.restore(store, root, namespace)
    assert set(report.refused_packs) == {"evil-dotdot", "evil-absolute"}
    assert report.restored == []
    assert good in report.failed
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "outside" / "ab").exists()


def _op_key(op: int) -> str:
    """The stand-in's key of eager op `op` in this image (default shape, trn2, 32 cores, no compiler flags)."""
    import hashlib

    spec = json.dumps(["op", f"aten::op{op}", "8x1024", "trn2", "32", ""])
    return hashlib.blake2b(spec.encode(), digest_size=16).hexdigest()


def test_a_pack_an_untrusted_writer_planted_is_not_restored(
    cache: Cache, hub_server: HubServer, tmp_path: Path
) -> None:
    env = image(tmp_path, cache.env)
    env["SAGEQUEUE_CACHE_KIND"] = "torchneuron"
    if cache.kind == "s3":
        env["SAGEQUEUE_NEFF_CACHE_WRITER"] = me = "team-a"
        theirs = open_remote(cache.url, writer="team-b")
    else:
        me = DEFAULT_USER  # the user of the job's token, as the Hub records it
        theirs = open_remote(
            cache.url, endpoint=hub_server.url, token=hub_server.add_user("team-b"), backoff_base=0.05
        )
    namespace = torchneuron.Namespace(TNX, CC, "trn2", "32")
    # GIVEN the job's own team published the first two ops
    first, _ = train(cache, env, tmp_path / "host-a", "--ops", "2")
    assert sorted(first["compiled"]) == sorted(_op_key(i) for i in range(2))
    # AND another team planted NEFFs of the next two, bytes of its choosing with checksums that match them
    planted = tmp_path / "planted"
    for op in (2, 3):
        key = _op_key(op)
        path = planted / key[:2] / key[2:4] / f"{key}.neff"
        path.parent.mkdir(parents=True)
        path.write_bytes(json.dumps({"key": key, "compiler": "planted"}).encode() + b"\n" + b"x" * 200)
    plant = torchneuron.upload(torchneuron.pack_store(theirs), planted, namespace)
    assert len(plant.published) == 2
    (ref,) = plant.packs
    assert ref.startswith("writers/team-b/") if cache.kind == "s3" else "/" not in ref
    time.sleep(1.1)  # pack names start with their second of publication: the planted pack stays the earliest
    # WHEN a job trusting only its own team runs on a fresh host
    second, done = train(cache, dict(env, SAGEQUEUE_NEFF_CACHE_TRUST=me), tmp_path / "host-b", "--ops", "4")
    # THEN it restored its team's NEFFs, compiled the planted ops itself and loaded nothing planted
    assert sorted(second["hit"]) == sorted(first["compiled"]), done.stderr
    assert sorted(second["compiled"]) == sorted(_op_key(i) for i in (2, 3)), done.stderr
    assert second["stale"] == []
    assert "not restoring 1 packs of writers this job does not trust" in done.stderr
    # a job trusting any writer takes the planted pack (the earliest pack serves a name)
    third, done = train(cache, env, tmp_path / "host-c", "--ops", "4")
    assert sorted(third["stale"]) == sorted(_op_key(i) for i in (2, 3)), done.stderr

    # verify with the trust list names the planted pack; rm removes it by that name
    name = namespace.name
    verified = run_cli(["cache", "verify", "--cache", cache.url, "--trust", me], env)
    assert verified.returncode == 1, verified.stdout + verified.stderr
    assert f"untrusted {name}/{ref}: written by team-b" in verified.stdout
    assert "0 broken, 1 of untrusted writers" in verified.stdout
    unknown = run_cli(
        ["cache", "rm", "--cache", cache.url, name, "--pack", "writers/team-z/20260101T000000-0"], env
    )
    assert unknown.returncode == 1
    assert "no such pack" in unknown.stderr
    removed = run_cli(["cache", "rm", "--cache", cache.url, name, "--pack", ref, "--yes"], env)
    assert removed.returncode == 0, removed.stdout + removed.stderr
    again = run_cli(["cache", "verify", "--cache", cache.url, "--trust", me], env)
    assert again.returncode == 0, again.stdout + again.stderr
    fourth, done = train(cache, env, tmp_path / "host-d", "--ops", "4")
    assert fourth["stale"] == [], done.stderr
    assert len(fourth["hit"]) == 4, done.stderr
