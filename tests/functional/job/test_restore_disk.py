"""The restore never takes the disk the training's own compile needs: a real 20 MB tmpfs, a real wrapper."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import STANDINS, VERSION, Cache, make_cache, run_wrapper
from support.hub_server import HubServer

from sagequeue.job import neuron, sync

MB = 1024 * 1024
DISK = 20 * MB


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK // MB}m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _publish(cache: Cache, tmp_path: Path, count: int, size: int) -> list[str]:
    root = tmp_path / "publisher"
    modules = []
    for _ in range(count):
        module = f"MODULE_{int(uuid.uuid4().hex[:12], 16)}+abcdef12"
        entry = root / neuron.version_dir(VERSION) / module
        entry.mkdir(parents=True)
        (entry / "model.neff").write_bytes(os.urandom(size))
        (entry / "model.done").write_bytes(b"")
        modules.append(module)
    report = sync.upload(cache.remote, root, VERSION)
    assert len(report.result.published) == count
    return modules


def _run(cache: Cache, root: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    tag = uuid.uuid4().hex[:8]
    return run_wrapper(
        [
            "run",
            "--cache",
            cache.url,
            "--cache-dir",
            str(root),
            "--restore",
            "all",
            "--no-upload",
            "--no-progress",
            *extra,
            "--",
            str(STANDINS / "standin-train"),
            "--graphs",
            f"own-{tag}",
            "--report",
            str(tmp_path / "report.json"),
        ],
        cache.env,
        timeout=120,
    )


def _complete(root: Path) -> list[neuron.LocalEntry]:
    return [e for e in neuron.scan(root, VERSION) if e.state is neuron.EntryState.COMPLETE]


@pytest.fixture
def s3_cache(base_env: dict[str, str], hub_server: HubServer) -> Cache:
    return make_cache("s3", base_env, hub_server)


def test_the_default_floor_leaves_room_for_the_jobs_own_compile(
    s3_cache: Cache, small_disk: Path, tmp_path: Path
) -> None:
    # GIVEN a remote holding more than the disk can take (5 x 4 MB on a 20 MB disk)
    _publish(s3_cache, tmp_path, 5, 4 * MB)
    root = small_disk / "cache"
    # WHEN a job restores everything with the default floor (20% of the disk)
    result = _run(s3_cache, root, tmp_path)
    # THEN it restored what fits above the floor, and its own graph still compiled
    assert result.returncode == 0, result.stderr
    restored = [e for e in _complete(root) if e.module.endswith("+abcdef12")]
    assert 1 <= len(restored) < 5, result.stderr
    assert "do not fit" in result.stderr
    assert json.loads((tmp_path / "report.json").read_text())["compiled"], result.stderr
    assert shutil.disk_usage(small_disk).free >= DISK * 0.2 - MB
    # AND no staging is left anywhere
    assert not sync.staging_dir(root).exists()
    assert not list(small_disk.rglob("*.part"))


def test_a_full_disk_stops_the_restore_and_removes_its_staging(
    s3_cache: Cache, small_disk: Path, tmp_path: Path
) -> None:
    # GIVEN no floor at all, and more remote entries than the disk holds
    _publish(s3_cache, tmp_path, 6, 4 * MB)
    root = small_disk / "cache"
    result = _run(s3_cache, root, tmp_path, "--restore-min-free", "0", "--workers", "6")
    # THEN the restore stopped at ENOSPC, removed its partial files, and the command still ran
    assert "the disk is full" in result.stderr
    assert not sync.staging_dir(root).exists()
    assert not list(small_disk.rglob("*.part"))
    # the restore installed only complete entries: nothing half-written for the compiler to trip on
    # (the command's own compile, with no floor kept for it, may well have failed on the full disk)
    for entry in neuron.scan(root, VERSION):
        if entry.module.endswith("+abcdef12"):
            assert entry.state is neuron.EntryState.COMPLETE, entry
    # the command itself was started (its own compile may then fail on the disk left full)
    assert "standin-train" in result.stderr
    assert any("sagequeue-job INFO running " in line for line in result.stderr.splitlines()), result.stderr


def test_restore_max_bytes_caps_the_download(s3_cache: Cache, small_disk: Path, tmp_path: Path) -> None:
    _publish(s3_cache, tmp_path, 4, 2 * MB)
    root = small_disk / "cache"
    result = _run(s3_cache, root, tmp_path, "--restore-max-bytes", "5M")
    assert result.returncode == 0, result.stderr
    assert len([e for e in _complete(root) if e.module.endswith("+abcdef12")]) == 2
    assert "2 more do not fit" in result.stderr


def test_a_bad_size_is_named(s3_cache: Cache, tmp_path: Path) -> None:
    result = _run(s3_cache, tmp_path / "cache", tmp_path, "--restore-max-bytes", "lots")
    assert result.returncode == 2
    assert "expected a size like 500M or 20G, got 'lots'" in result.stderr


def test_restore_auto_takes_the_models_entries_never_the_whole_version(
    s3_cache: Cache, tmp_path: Path
) -> None:
    # GIVEN a shared cache holding two models' entries, each with its registry record
    publisher = tmp_path / "publisher"
    owned: dict[str, list[str]] = {}
    for model in ("team-a/llama", "team-b/mistral"):
        before = {e.module for e in neuron.scan(publisher, VERSION)}
        _publish_as(s3_cache, publisher, model, {"precision": "bf16"}, 2)
        owned[model] = sorted({e.module for e in neuron.scan(publisher, VERSION)} - before)
    env = dict(s3_cache.env, SAGEQUEUE_RESOURCE_CONFIG=str(tmp_path / "none.json"))

    def restored(*extra: str) -> set[str]:
        root = tmp_path / f"job-{uuid.uuid4().hex[:6]}"
        result = run_wrapper(
            [
                "run",
                "--cache",
                s3_cache.url,
                "--cache-dir",
                str(root),
                "--no-upload",
                "--no-progress",
                *extra,
                "--",
                str(STANDINS / "standin-train"),
                "--graphs",
                "own-graph",
            ],
            env,
        )
        assert result.returncode == 0, result.stderr
        return {e.module for e in neuron.scan(root, VERSION)} - {
            e.module for e in neuron.scan(root, VERSION) if (e.path / "model.hlo_module.pb").exists()
        }

    # THEN a job without --model restores nothing, and so does one of a model the cache does not know
    assert restored() == set()
    assert restored("--model", "team-c/unknown") == set()
    # AND a new configuration of a known model restores that model's entries, not the other team's
    assert restored("--model", "team-a/llama", "--config", "precision=fp32") == set(owned["team-a/llama"])
    # AND only --restore all takes the whole compiler version
    assert restored("--restore", "all") == set(owned["team-a/llama"] + owned["team-b/mistral"])


def _publish_as(cache: Cache, root: Path, model: str, config: dict[str, str], count: int) -> None:
    from sagequeue.job.remote import RegistryRecord

    modules = []
    for _ in range(count):
        module = f"MODULE_{int(uuid.uuid4().hex[:12], 16)}+abcdef12"
        entry = root / neuron.version_dir(VERSION) / module
        entry.mkdir(parents=True)
        (entry / "model.neff").write_bytes(os.urandom(4096))
        (entry / "model.done").write_bytes(b"")
        modules.append(module)
    record = RegistryRecord(model, VERSION, config, modules)
    report = sync.upload(cache.remote, root, VERSION, records=[record], only=modules)
    assert len(report.result.published) == count
