"""`sagequeue cache` against S3 on moto and the Hub test server."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import VERSION, Cache

from sagequeue.cli import main
from sagequeue.job import neuron, settings, sync
from sagequeue.job.remote import RegistryRecord

OLD_VERSION = "2.13.66.0+6dfecc895"


def _entry(root: Path, version: str, module: str, *, neff: int = 2048, state: str = "complete") -> None:
    path = root / neuron.version_dir(version) / module
    path.mkdir(parents=True)
    (path / "compile_flags.json").write_text("[]")
    (path / "model.hlo_module.pb").write_bytes(os.urandom(512))
    if state == "complete":
        (path / "model.neff").write_bytes(os.urandom(neff))
        (path / "model.done").touch()
    elif state == "failed":
        (path / "model.log").write_text("ERROR: compilation failed")
    elif state == "locked":
        (path / "model.hlo_module.pb.lock").touch()


@pytest.fixture
def cli(base_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    for key in ("SAGEQUEUE_CONFIG_DIR", "HF_ENDPOINT", "HF_HOME"):
        monkeypatch.setenv(key, base_env[key])
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", base_env["HF_ENDPOINT"])
    return CliRunner()


def test_create_sync_list_lookup_prune_and_status(cache: Cache, cli: CliRunner, tmp_path: Path) -> None:
    root = tmp_path / "local"
    _entry(root, VERSION, "MODULE_1+aaaaaaaa", neff=4096)
    _entry(root, VERSION, "MODULE_2+aaaaaaaa", neff=8192)
    _entry(root, VERSION, "MODULE_3+aaaaaaaa", state="failed")
    _entry(root, VERSION, "MODULE_4+aaaaaaaa", state="locked")
    _entry(root, OLD_VERSION, "MODULE_9+bbbbbbbb")

    created = cli.invoke(main, ["cache", "create", cache.url])
    assert created.exit_code == 0, created.output
    assert settings.saved_cache_url() == cache.url

    (sync.staging_dir(root) / "x").mkdir(parents=True)
    (sync.staging_dir(root) / "x" / "model.neff.part").write_bytes(b"0" * 2048)
    status = cli.invoke(main, ["cache", "status", "--cache-dir", str(root)])
    assert status.exit_code == 0, status.output
    assert f"neuronxcc-{VERSION}: 2 complete, 1 failed, 1 locked, 0 incomplete" in status.output
    assert "partial downloads kept for resuming: 2.0 KiB" in status.output

    # sync uses the saved default cache, uploads complete entries only and removes the failed one
    synced = cli.invoke(main, ["cache", "sync", "--cache-dir", str(root)])
    assert synced.exit_code == 0, synced.output
    assert (
        f"neuronxcc-{VERSION}: 2 uploaded, 0 already there, 0 left for later, 1 failed entries removed"
        in synced.output
    )
    assert not (root / neuron.version_dir(VERSION) / "MODULE_3+aaaaaaaa").exists()
    assert set(cache.remote.entries(VERSION)) == {"MODULE_1+aaaaaaaa", "MODULE_2+aaaaaaaa"}
    again = cli.invoke(main, ["cache", "sync", "--cache-dir", str(root)])
    assert f"neuronxcc-{VERSION}: 0 uploaded, 2 already there" in again.output

    fresh = tmp_path / "fresh"
    restored = cli.invoke(
        main, ["cache", "restore", "--cache-dir", str(fresh), "--compiler-version", VERSION, "--no-progress"]
    )
    assert restored.exit_code == 0, restored.output
    assert f"neuronxcc-{VERSION}: restored 2 entries" in restored.output
    assert [e.state for e in neuron.scan(fresh, VERSION)] == [neuron.EntryState.COMPLETE] * 2

    record = RegistryRecord(
        "org/llama-tiny",
        VERSION,
        {"instance_type": "ml.trn1.32xlarge", "precision": "bf16"},
        ["MODULE_2+aaaaaaaa"],
    )
    sync.upload(cache.remote, root, VERSION, records=[record])

    listed = cli.invoke(main, ["cache", "ls"])
    assert listed.exit_code == 0, listed.output
    assert f"neuronxcc-{VERSION}: 2 entries" in listed.output
    assert f"neuronxcc-{OLD_VERSION}: 1 entries" in listed.output
    assert "MODULE_2+aaaaaaaa" in listed.output
    assert "org/llama-tiny" in listed.output
    only_model = cli.invoke(main, ["cache", "ls", "--model", "org/llama-tiny", "--compiler-version", VERSION])
    assert "MODULE_1+aaaaaaaa" not in only_model.output
    assert "MODULE_2+aaaaaaaa" in only_model.output

    found = cli.invoke(main, ["cache", "lookup", "org/llama-tiny"])
    assert found.exit_code == 0, found.output
    assert "1 configurations of org/llama-tiny" in found.output
    assert "precision: bf16" in found.output

    # prune is a dry run unless told otherwise
    dry = cli.invoke(main, ["cache", "prune", "--compiler-version", OLD_VERSION])
    assert "would remove 1 entries" in dry.output
    assert cache.remote.entries(OLD_VERSION) != {}
    real = cli.invoke(main, ["cache", "prune", "--compiler-version", OLD_VERSION, "--yes"])
    assert real.exit_code == 0, real.output
    assert cache.remote.entries(OLD_VERSION) == {}
    # by size: the oldest go first until the rest fits
    by_size = cli.invoke(main, ["cache", "prune", "--max-size", "10K", "--yes"])
    assert by_size.exit_code == 0, by_size.output
    assert "removing 1 entries" in by_size.output
    assert len(cache.remote.entries(VERSION)) == 1


def test_sync_counts_entries_and_restore_draws_no_bar_on_a_pipe(
    cache: Cache, cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a local cache of three complete entries over two compiler versions, and a failed one
    root = tmp_path / "local"
    _entry(root, VERSION, "MODULE_1+aaaaaaaa")
    _entry(root, VERSION, "MODULE_2+aaaaaaaa")
    _entry(root, VERSION, "MODULE_3+aaaaaaaa", state="failed")
    _entry(root, OLD_VERSION, "MODULE_9+bbbbbbbb")
    assert cli.invoke(main, ["cache", "create", cache.url]).exit_code == 0

    # WHEN it is synced with stderr taken for a terminal
    import click._termui_impl

    with monkeypatch.context() as terminal:
        terminal.setattr(click._termui_impl, "isatty", lambda stream: True)
        synced = cli.invoke(main, ["cache", "sync", "--cache-dir", str(root)])

    # THEN the bar counted the three complete entries, not the two versions
    assert synced.exit_code == 0, synced.output
    drawn = re.findall(rf"sync to {re.escape(cache.url)}\s+\[[#-]+\]\s+(\d+)/(\d+)", synced.stderr)
    assert drawn[-1] == ("3", "3")
    assert {total for _, total in drawn} == {"3"}

    # WHEN they are restored with stderr on a pipe (progress left on, its default)
    fresh = tmp_path / "fresh"
    restored = cli.invoke(
        main, ["cache", "restore", "--cache-dir", str(fresh), "--compiler-version", VERSION]
    )

    # THEN the entries arrived and no bar was drawn into the pipe, as prune and sync draw none there
    assert restored.exit_code == 0, restored.output
    assert f"neuronxcc-{VERSION}: restored 2 entries" in restored.stdout
    assert restored.stderr == ""


def test_prune_local_by_age_keeps_entries_being_compiled(cli: CliRunner, tmp_path: Path) -> None:
    root = tmp_path / "local"
    _entry(root, VERSION, "MODULE_1+aaaaaaaa")
    _entry(root, VERSION, "MODULE_2+aaaaaaaa", state="locked")
    old = root / neuron.version_dir(VERSION) / "MODULE_1+aaaaaaaa"
    for path in old.iterdir():
        os.utime(path, (1_600_000_000, 1_600_000_000))
    result = cli.invoke(
        main, ["cache", "prune", "--local", "--cache-dir", str(root), "--older-than", "30", "--yes"]
    )
    assert result.exit_code == 0, result.output
    assert not old.exists()
    assert (root / neuron.version_dir(VERSION) / "MODULE_2+aaaaaaaa").exists()
    _entry(root, VERSION, "MODULE_3+aaaaaaaa", state="failed")
    (sync.staging_dir(root)).mkdir()
    cleaned = cli.invoke(main, ["cache", "status", "--cache-dir", str(root), "--clean"])
    assert "removed 1 failed entries" in cleaned.output
    assert not (sync.staging_dir(root)).exists()


def test_a_missing_cache_is_named_in_the_error(cli: CliRunner, base_env: dict[str, str]) -> None:
    result = cli.invoke(main, ["cache", "ls", "--cache", "s3://no-such-bucket-sagequeue/x"])
    assert result.exit_code != 0
    assert "no-such-bucket-sagequeue does not exist" in result.output
