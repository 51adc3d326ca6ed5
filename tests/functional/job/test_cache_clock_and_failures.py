"""`prune --older-than` on a host whose clock is wrong, and entries the compiler marked as failed, on S3
(moto's server) and the Hub test server."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import VERSION, Cache, run_cli

from sagequeue.job import neuron, sync
from sagequeue.job.remote import Deadline

SKEW_DAYS = 30


def _entry(root: Path, module: str, *, log: bool = False) -> Path:
    path = root / neuron.version_dir(VERSION) / module
    path.mkdir(parents=True)
    (path / "model.neff").write_bytes(os.urandom(256))
    (path / "model.done").touch()
    if log:
        (path / "model.log").write_text("ERROR 70: the compiler reported a failure\n")
    return path


def _skewed(env: dict[str, str], tmp_path: Path, days: float) -> dict[str, str]:
    """The environment of a process whose wall clock runs `days` ahead (time.time, as a host with a wrong
    clock or no NTP would have it)."""
    site = tmp_path / "skewed-clock"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        f"import time\n_real = time.time\ntime.time = lambda: _real() + {days * 86400.0!r}\n"
    )
    skewed = dict(env)
    skewed["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    return skewed


def test_prune_by_age_compares_entry_times_with_the_servers_clock_not_the_local_one(
    cache: Cache, tmp_path: Path
) -> None:
    root = tmp_path / "local"
    _entry(root, "MODULE_1+aaaa")
    _entry(root, "MODULE_2+aaaa")
    assert len(sync.upload(cache.remote, root, VERSION, deadline=Deadline(None)).result.published) == 2

    env = _skewed(cache.env, tmp_path, SKEW_DAYS)
    probe = run_cli(["cache", "ls", "--cache", cache.url], env)
    assert probe.returncode == 0, probe.stderr
    pruned = run_cli(["cache", "prune", "--cache", cache.url, "--older-than", "7", "--yes"], env)

    assert pruned.returncode == 0, pruned.stderr
    assert "removing 0 entries" in pruned.stdout, pruned.stdout
    assert set(cache.remote.entries(VERSION)) == {"MODULE_1+aaaa", "MODULE_2+aaaa"}


def test_an_entry_with_a_compiler_log_is_failed_even_with_a_neff(cache: Cache, tmp_path: Path) -> None:
    root = tmp_path / "local"
    _entry(root, "MODULE_1+aaaa")
    failed = _entry(root, "MODULE_2+aaaa", log=True)

    assert neuron.entry_state(failed) is neuron.EntryState.FAILED
    report = sync.upload(cache.remote, root, VERSION, deadline=Deadline(None))

    assert report.result.published == [neuron.entry_key(VERSION, "MODULE_1+aaaa")]
    assert report.cleaned_failed == [neuron.entry_key(VERSION, "MODULE_2+aaaa")]
    assert not failed.exists()
    assert set(cache.remote.entries(VERSION)) == {"MODULE_1+aaaa"}
