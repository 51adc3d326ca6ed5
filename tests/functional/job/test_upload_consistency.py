"""Uploads that die half-way or race each other leave the remote cache consistent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import boto3
from conftest import BIN, STANDINS, VERSION, make_cache, run_cli, run_wrapper
from support.hub_server import HubServer

from sagequeue.job import neuron, sync

_ENTRY_FILES = ("compile_flags.json", "model.hlo_module.pb", "model.neff", "model.done")


def _entry(root: Path, module: str, neff_bytes: int = 4096) -> Path:
    path = root / neuron.version_dir(VERSION) / module
    path.mkdir(parents=True)
    (path / "compile_flags.json").write_text('["--target=trn1"]')
    (path / "model.hlo_module.pb").write_bytes(os.urandom(1024))
    (path / "model.neff").write_bytes(os.urandom(neff_bytes))
    (path / "model.done").touch()
    return path


def _sync(env: dict[str, str], url: str, root: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(BIN / "sagequeue"), "cache", "sync", "--cache", url, "--cache-dir", str(root)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait(condition, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.05)


def test_s3_upload_killed_midway_leaves_no_visible_entry(
    base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache("s3", base_env, hub_server)
    root = tmp_path / "local"
    # GIVEN an entry whose NEFF takes many multipart requests to store
    _entry(root, "MODULE_111+aaaaaaaa", neff_bytes=72 * 1024 * 1024)
    bucket, _, prefix = cache.url[len("s3://") :].partition("/")
    s3 = boto3.client("s3")
    # WHEN the uploader is killed once the first of its objects exists
    uploader = _sync(base_env, cache.url, root)
    _wait(
        lambda: (
            s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("KeyCount", 0) > 0
            or uploader.poll() is not None
        )
    )
    uploader.kill()
    uploader.wait()
    # THEN readers see no entry, and a restore brings nothing half-written into a cache
    assert cache.remote.entries(VERSION) == {}
    fresh = tmp_path / "fresh"
    report = sync.restore(cache.remote, fresh, VERSION, progress=False)
    assert report.restored == []
    assert neuron.scan(fresh, VERSION) == []
    # AND the next uploader makes the entry whole and visible
    finished = run_cli(
        ["cache", "sync", "--cache", cache.url, "--cache-dir", str(root)], base_env, timeout=120
    )
    assert finished.returncode == 0, finished.stderr
    assert list(cache.remote.entries(VERSION)) == ["MODULE_111+aaaaaaaa"]


def test_hub_upload_killed_before_its_commit_changes_nothing(
    base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache("hub", base_env, hub_server)
    repo = cache.url[len("hf://") :]
    root = tmp_path / "local"
    _entry(root, "MODULE_222+bbbbbbbb", neff_bytes=256 * 1024)
    head_before = hub_server.head(repo).oid
    arrivals = hub_server.state.lfs_arrivals
    hub_server.state.lfs_gate = threading.Event()
    try:
        # WHEN the uploader dies while its LFS objects are in flight
        uploader = _sync(base_env, cache.url, root)
        _wait(lambda: hub_server.state.lfs_arrivals > arrivals)
        uploader.send_signal(signal.SIGKILL)
        uploader.wait()
    finally:
        hub_server.state.lfs_gate.set()
        hub_server.state.lfs_gate = None
    # THEN the repository has not moved: no commit, no entry
    assert hub_server.head(repo).oid == head_before
    assert cache.remote.entries(VERSION) == {}
    # AND a later sync publishes the entry in one commit
    finished = run_cli(["cache", "sync", "--cache", cache.url, "--cache-dir", str(root)], base_env)
    assert finished.returncode == 0, finished.stderr
    assert list(cache.remote.entries(VERSION)) == ["MODULE_222+bbbbbbbb"]
    assert hub_server.head(repo).parent == head_before


def test_two_concurrent_hub_uploaders_both_land(
    base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache("hub", base_env, hub_server)
    repo = cache.url[len("hf://") :]
    first, second = tmp_path / "host-1", tmp_path / "host-2"
    _entry(first, "MODULE_301+cccccccc")
    _entry(first, "MODULE_302+cccccccc")
    _entry(second, "MODULE_401+dddddddd")
    _entry(second, "MODULE_302+cccccccc")  # both compiled the same graph
    statuses = len(hub_server.state.commit_statuses)
    # GIVEN both commits reach the Hub together, pinned to the same parent
    hub_server.state.race_next_commits(2)
    uploaders = [_sync(base_env, cache.url, first), _sync(base_env, cache.url, second)]
    outputs = [u.communicate(timeout=90) for u in uploaders]
    # THEN one lost the race with 412, retried on the new head, and both sets of entries landed
    assert all(u.returncode == 0 for u in uploaders), outputs
    assert 412 in hub_server.state.commit_statuses[statuses:]
    assert set(cache.remote.entries(VERSION)) == {
        "MODULE_301+cccccccc",
        "MODULE_302+cccccccc",
        "MODULE_401+dddddddd",
    }
    commits = [c for c in hub_server.state.repos[repo].commits if c.parent is not None]
    assert len(commits) == 2


def test_hub_commit_retried_on_409_and_412(
    base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache("hub", base_env, hub_server)
    root = tmp_path / "local"
    _entry(root, "MODULE_501+eeeeeeee")
    hub_server.state.fail_next_commits = [409, 412]
    report = sync.upload(cache.remote, root, VERSION)
    assert report.result.published == [neuron.entry_key(VERSION, "MODULE_501+eeeeeeee")]
    assert report.result.conflicts_retried == 2


def test_s3_two_writers_of_the_same_entries_leave_every_entry_restorable(
    base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache("s3", base_env, hub_server)
    modules = [f"MODULE_{7000 + i}+cccccccc" for i in range(50)]
    # GIVEN two hosts that compiled the same 50 graphs into different bytes (NEFFs are not reproducible)
    roots = [tmp_path / "writer-a", tmp_path / "writer-b"]
    for root in roots:
        for module in modules:
            _entry(root, module, neff_bytes=8192)
    # WHEN both publish at the same time
    writers = [_sync(base_env, cache.url, root) for root in roots]
    for writer in writers:
        _, stderr = writer.communicate(timeout=120)
        assert writer.returncode == 0, stderr
    # THEN every entry restores whole, and each is one writer's bytes
    fresh = tmp_path / "reader"
    report = sync.restore(cache.remote, fresh, VERSION, progress=False)
    assert report.failed == {}
    assert len(report.restored) == 50
    for module in modules:
        neff = (fresh / neuron.version_dir(VERSION) / module / "model.neff").read_bytes()
        sources = [
            (root / neuron.version_dir(VERSION) / module / "model.neff").read_bytes() for root in roots
        ]
        assert neff in sources
    assert sync.verify(cache.remote, VERSION).broken == {}
    # AND the losing writer removed its objects: only the manifests' files remain under writer prefixes
    bucket, _, prefix = cache.url[len("s3://") :].partition("/")
    s3 = boto3.client("s3")
    paginator = s3.get_paginator("list_objects_v2")
    vdir = neuron.version_dir(VERSION)
    data_keys = [
        item["Key"]
        for page in paginator.paginate(Bucket=bucket, Prefix=f"{prefix}/{vdir}/")
        for item in page.get("Contents", [])
    ]
    by_writer = [k for k in data_keys if "/.w-" in k]
    assert len(by_writer) == 50 * 4
    assert len({k.rsplit("/", 1)[0] for k in by_writer}) == 50
    # AND every entry is also whole where the Neuron compiler's own S3 cache reads it, in one writer's bytes
    canonical = {k[len(f"{prefix}/{vdir}/") :] for k in data_keys if "/.w-" not in k}
    assert canonical == {f"{m}/{name}" for m in modules for name in _ENTRY_FILES}
    for module in modules:
        neff = s3.get_object(Bucket=bucket, Key=f"{prefix}/{vdir}/{module}/model.neff")["Body"].read()
        assert neff in [(root / vdir / module / "model.neff").read_bytes() for root in roots]
    found = run_cli(["cache", "verify", "--cache", cache.url], base_env)
    assert found.returncode == 0, found.stdout + found.stderr
    assert "50 entries checked, 0 broken, 0 not readable by the Neuron compiler" in found.stdout


def test_verify_finds_and_repair_removes_an_entry_a_past_race_broke(
    base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache("s3", base_env, hub_server)
    root = tmp_path / "local"
    _entry(root, "MODULE_8001+dddddddd")
    _entry(root, "MODULE_8002+dddddddd")
    assert len(sync.upload(cache.remote, root, VERSION).result.published) == 2
    # GIVEN an entry in the old layout whose bytes another writer overwrote after its manifest was written
    bucket, _, prefix = cache.url[len("s3://") :].partition("/")
    s3 = boto3.client("s3")
    key = neuron.entry_key(VERSION, "MODULE_8001+dddddddd")
    manifest_key = f"{prefix}/manifests/{key}.json"
    manifest = json.loads(s3.get_object(Bucket=bucket, Key=manifest_key)["Body"].read())
    manifest.pop("prefix")
    s3.put_object(Bucket=bucket, Key=manifest_key, Body=json.dumps(manifest).encode())
    for name in manifest["files"]:
        s3.put_object(
            Bucket=bucket, Key=f"{prefix}/{key}/{name}", Body=os.urandom(manifest["files"][name]["size"])
        )
    # THEN verify names it and fails
    found = run_cli(["cache", "verify", "--cache", cache.url], base_env)
    assert found.returncode == 1, found.stderr
    assert f"broken {key}" in found.stdout
    assert "2 entries checked, 1 broken" in found.stdout
    # WHEN repaired, the entry is gone, and the next writer publishes it again instead of skipping it
    repaired = run_cli(["cache", "verify", "--cache", cache.url, "--repair"], base_env)
    assert repaired.returncode == 0, repaired.stderr
    assert set(cache.remote.entries(VERSION)) == {"MODULE_8002+dddddddd"}
    again = sync.upload(cache.remote, root, VERSION)
    assert again.result.published == [key]
    report = sync.restore(cache.remote, tmp_path / "reader", VERSION, progress=False)
    assert report.failed == {}
    assert len(report.restored) == 2


def test_the_neuron_compilers_own_s3_cache_reads_what_the_wrapper_published(
    base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache("s3", base_env, hub_server)
    graphs = "embed,forward,backward"
    # GIVEN a job that compiled three graphs and published them through the wrapper
    first = run_wrapper(
        [
            "run",
            "--cache",
            cache.url,
            "--cache-dir",
            str(tmp_path / "host-1"),
            "--no-progress",
            "--",
            str(STANDINS / "standin-train"),
            "--graphs",
            graphs,
        ],
        base_env,
    )
    assert first.returncode == 0, first.stderr
    modules = sorted(cache.remote.entries(VERSION))
    assert len(modules) == 3
    # AND a writer that died after its manifest, before its copy of one entry for the compiler
    bucket, _, prefix = cache.url[len("s3://") :].partition("/")
    s3 = boto3.client("s3")
    gone = f"{prefix}/{neuron.entry_key(VERSION, modules[0])}/model.done"
    s3.delete_object(Bucket=bucket, Key=gone)
    # THEN verify says the compiler cannot read that entry, and fails
    found = run_cli(["cache", "verify", "--cache", cache.url], base_env)
    assert found.returncode == 1, found.stderr
    assert (
        f"not readable by the Neuron compiler {neuron.entry_key(VERSION, modules[0])}: model.done missing"
        in (found.stdout)
    )
    assert "3 entries checked, 0 broken, 1 not readable by the Neuron compiler" in found.stdout
    # WHEN repaired
    repaired = run_cli(["cache", "verify", "--cache", cache.url, "--repair"], base_env)
    assert repaired.returncode == 0, repaired.stderr
    assert "copied 1 entries to where the Neuron compiler reads them" in repaired.stdout
    # THEN a training on another host whose compiler uses the S3 cache directly (NEURON_COMPILE_CACHE_URL,
    # no sagequeue in between) finds every graph there and compiles nothing
    env = dict(base_env, NEURON_COMPILE_CACHE_URL=cache.url)
    report = tmp_path / "direct.json"
    direct = subprocess.run(
        [str(STANDINS / "standin-train"), "--graphs", graphs, "--report", str(report)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert direct.returncode == 0, direct.stderr
    assert json.loads(report.read_text()) == {"hit": graphs.split(","), "compiled": [], "extracted": []}
    assert run_cli(["cache", "verify", "--cache", cache.url], base_env).returncode == 0


def test_verify_finds_a_truncated_file_where_the_neuron_compiler_reads_and_repair_replaces_it(
    base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache("s3", base_env, hub_server)
    local = tmp_path / "host-1"
    # GIVEN two entries published through the wrapper
    first = run_wrapper(
        [
            "run",
            "--cache",
            cache.url,
            "--cache-dir",
            str(local),
            "--no-progress",
            "--",
            str(STANDINS / "standin-train"),
            "--graphs",
            "forward,backward",
        ],
        base_env,
    )
    assert first.returncode == 0, first.stderr
    modules = sorted(cache.remote.entries(VERSION))  # type: ignore[attr-defined]
    assert len(modules) == 2
    neff = local / neuron.entry_key(VERSION, modules[0]) / neuron.NEFF_FILE
    size = neff.stat().st_size
    # AND the compiler's copy of one NEFF cut short (an interrupted writer at the compiler's own path):
    # present, so a presence check passes it
    bucket, _, prefix = cache.url[len("s3://") :].partition("/")
    s3 = boto3.client("s3")
    key = f"{prefix}/{neuron.entry_key(VERSION, modules[0])}/{neuron.NEFF_FILE}"
    s3.put_object(Bucket=bucket, Key=key, Body=neff.read_bytes()[: size // 2])
    # THEN verify names the file and both sizes, and fails
    found = run_cli(["cache", "verify", "--cache", cache.url], base_env)
    assert found.returncode == 1, found.stdout + found.stderr
    assert (
        f"not readable by the Neuron compiler {neuron.entry_key(VERSION, modules[0])}: "
        f"model.neff: {size // 2} bytes, the manifest says {size}"
    ) in found.stdout
    assert "2 entries checked, 0 broken, 1 not readable by the Neuron compiler" in found.stdout
    # WHEN repaired
    repaired = run_cli(["cache", "verify", "--cache", cache.url, "--repair"], base_env)
    assert repaired.returncode == 0, repaired.stderr
    assert "copied 1 entries to where the Neuron compiler reads them" in repaired.stdout
    # THEN the compiler's copy is the published NEFF again, byte for byte
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == neff.read_bytes()
    again = run_cli(["cache", "verify", "--cache", cache.url], base_env)
    assert again.returncode == 0, again.stdout
    assert "2 entries checked, 0 broken, 0 not readable by the Neuron compiler" in again.stdout
