"""The registry stays small and true: compacted on publish, trimmed on prune, and a "hit" is what the
compiler will find on disk, not what a record claims."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from conftest import STANDINS, VERSION, Cache, make_cache, run_cli, run_wrapper
from huggingface_hub import CommitOperationAdd
from support.hub_server import HubServer

from sagequeue.job import neuron, sync
from sagequeue.job.hub import COMPACT_WRITER, HubCache
from sagequeue.job.remote import RegistryRecord


def _entries(root: Path, count: int) -> list[str]:
    modules = []
    for _ in range(count):
        module = f"MODULE_{int(uuid.uuid4().hex[:12], 16)}+abcdef12"
        path = root / neuron.version_dir(VERSION) / module
        path.mkdir(parents=True)
        (path / "model.neff").write_bytes(os.urandom(2048))
        (path / "model.done").write_bytes(b"")
        modules.append(module)
    return modules


def test_hub_records_of_one_configuration_compact_into_one_file_on_publish(
    base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache("hub", base_env, hub_server)
    remote = cache.remote
    assert isinstance(remote, HubCache)
    config = {"precision": "bf16"}
    # GIVEN 300 jobs of one configuration each left a record of their own (the old layout), in one commit
    old = [RegistryRecord("org/m", VERSION, config, [f"MODULE_{i}+abcdef12"]) for i in range(300)]
    remote.api.create_commit(
        remote.repo_id,
        operations=[CommitOperationAdd(path_in_repo=r.path, path_or_fileobj=r.to_json()) for r in old],
        commit_message="old records",
    )
    (combined,) = remote.records("org/m")
    assert len(combined.entries) == 300
    # WHEN one more job of that configuration publishes
    root = tmp_path / "local"
    (module,) = _entries(root, 1)
    record = RegistryRecord("org/m", VERSION, config, [module])
    result = sync.upload(remote, root, VERSION, records=[record])
    # THEN the configuration's folder holds one record naming every entry
    folder = record.path.rsplit("/", 1)[0]
    files = [p for p in hub_server.files(remote.repo_id) if p.startswith(folder + "/")]
    assert files == [f"{folder}/{COMPACT_WRITER}.json"]
    assert result.result.records == files
    (after,) = remote.records("org/m")
    assert set(after.entries) == {f"MODULE_{i}+abcdef12" for i in range(300)} | {module}


def _prune_case(cache: Cache, tmp_path: Path) -> tuple[list[str], RegistryRecord, RegistryRecord]:
    root = tmp_path / "local"
    modules = _entries(root, 3)
    both = RegistryRecord("org/p", VERSION, {"precision": "bf16"}, modules)
    first_only = RegistryRecord("org/p", VERSION, {"precision": "fp32"}, modules[:1])
    sync.upload(cache.remote, root, VERSION, records=[both, first_only])
    return modules, both, first_only


def test_prune_trims_records_and_drops_empty_ones(cache: Cache, tmp_path: Path) -> None:
    modules, both, first_only = _prune_case(cache, tmp_path)
    entries = cache.remote.entries(VERSION)
    # WHEN two of the three entries are pruned
    cache.remote.delete([entries[m] for m in modules[:2]])
    # THEN the records name only what is left, and a configuration left with nothing has no record
    records = {r.config_hash: r for r in cache.remote.records("org/p")}
    assert set(records) == {both.config_hash}
    assert records[both.config_hash].entries == [modules[2]]
    assert first_only.config_hash not in records


def test_a_record_naming_missing_entries_is_a_miss_and_precompiles(
    base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache("s3", base_env, hub_server)
    env = dict(cache.env, SAGEQUEUE_RESOURCE_CONFIG=str(tmp_path / "none.json"))
    # GIVEN a registry record for this job's configuration whose entries are gone from the cache
    record = RegistryRecord(
        "org/pruned", VERSION, {"precision": "bf16"}, ["MODULE_1234+abcdef12", "MODULE_5678+abcdef12"]
    )
    sync.upload(cache.remote, tmp_path / "empty", VERSION, records=[record])
    assert cache.remote.records("org/pruned")
    report = tmp_path / "report.json"
    result = run_wrapper(
        [
            "run",
            "--cache",
            cache.url,
            "--cache-dir",
            str(tmp_path / "cache"),
            "--model",
            "org/pruned",
            "--config",
            "precision=bf16",
            "--precompile-steps",
            "1",
            "--no-upload",
            "--no-progress",
            "--",
            str(STANDINS / "standin-train"),
            "--graphs",
            f"g-{uuid.uuid4().hex[:8]}",
            "--report",
            str(report),
        ],
        env,
    )
    # THEN the wrapper does not trust the record: it precompiles, and training only hits the cache
    assert result.returncode == 0, result.stderr
    assert "cache miss: precompiling" in result.stderr
    assert json.loads(report.read_text())["compiled"] == []


def test_lookup_and_restore_read_a_cache_optimum_neuron_wrote(
    base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache("hub", base_env, hub_server)
    remote = cache.remote
    assert isinstance(remote, HubCache)
    # GIVEN a repository in optimum-neuron's layout: its registry inside the version folder, one NEFF entry
    vdir = neuron.version_dir(VERSION)
    optimum_entry = {
        "_entry_class": "SingleModelCacheEntry",
        "_model_id": "meta-llama/Llama-3.1-8B",
        "model_type": "llama",
        "hidden_size": 4096,
        "neuron": {"batch_size": 4, "sequence_length": 4096, "tp_degree": 8, "auto_cast_type": "bf16"},
    }
    module = "MODULE_4242+abcdef12"
    remote.api.create_commit(
        remote.repo_id,
        operations=[
            CommitOperationAdd(
                path_in_repo=f"{vdir}/0_REGISTRY/0.0.28/inference/llama/meta-llama/Llama-3.1-8B/0123abcd.json",
                path_or_fileobj=json.dumps(optimum_entry).encode(),
            ),
            CommitOperationAdd(path_in_repo=f"{vdir}/{module}/model.neff", path_or_fileobj=os.urandom(4096)),
            CommitOperationAdd(path_in_repo=f"{vdir}/{module}/model.done", path_or_fileobj=b""),
        ],
        commit_message="written by optimum-neuron",
    )
    env = dict(cache.env, SAGEQUEUE_NEFF_CACHE=cache.url)
    # THEN lookup shows optimum-neuron's configuration of the model
    found = run_cli(["cache", "lookup", "meta-llama/Llama-3.1-8B"], env)
    assert found.returncode == 0, found.stderr
    assert "1 configurations of meta-llama/Llama-3.1-8B" in found.stdout
    assert "source: optimum-neuron" in found.stdout
    assert "batch_size: 4" in found.stdout
    assert "tp_degree: 8" in found.stdout
    # AND a restore takes its NEFF entry and leaves its registry folder alone
    restored = run_cli(
        [
            "cache",
            "restore",
            "--cache-dir",
            str(tmp_path / "local"),
            "--compiler-version",
            VERSION,
            "--no-progress",
        ],
        env,
    )
    assert restored.returncode == 0, restored.stderr
    assert [e.module for e in neuron.scan(tmp_path / "local", VERSION)] == [module]
