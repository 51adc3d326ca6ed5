"""The registry stays small and true: compacted on publish, trimmed on prune, and a "hit" is what the
compiler will find on disk, not what a record claims."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path

import boto3
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


def _optimum_text(model: str, model_type: str, **neuron_config: object) -> bytes:
    """A record as optimum-neuron serializes one (sorted keys, indent 2)."""
    body = {
        "_entry_class": "SingleModelCacheEntry",
        "_model_id": model,
        "_task": "text-generation",
        "model_type": model_type,
        "hidden_size": 4096,
        "neuron": neuron_config,
    }
    return json.dumps(body, indent=2, sort_keys=True).encode()


def _optimum_hash(text: bytes) -> str:
    return hashlib.sha512(text).hexdigest()[:20]


def _entry_ops(module: str) -> list[CommitOperationAdd]:
    vdir = neuron.version_dir(VERSION)
    return [
        CommitOperationAdd(
            path_in_repo=f"{vdir}/{module}/compile_flags.json", path_or_fileobj=b'["--target=trn1"]'
        ),
        CommitOperationAdd(
            path_in_repo=f"{vdir}/{module}/model.hlo_module.pb", path_or_fileobj=os.urandom(512)
        ),
        CommitOperationAdd(path_in_repo=f"{vdir}/{module}/model.neff", path_or_fileobj=os.urandom(4096)),
        CommitOperationAdd(path_in_repo=f"{vdir}/{module}/model.done", path_or_fileobj=b""),
    ]


LLAMA = "meta-llama/Llama-3.1-8B"


def _public_cache_layout(remote: HubCache) -> dict[str, list[str]]:
    """A repository as optimum-neuron's cache builder leaves it: one sync commit per export, holding the
    export's record (both copies of the newest layout, or the older layouts) and the entries it compiled."""
    vdir = neuron.version_dir(VERSION)
    exports = {
        "llama-b4": (
            _optimum_text(LLAMA, "llama", batch_size=4, sequence_length=4096, tp_degree=8, target="trn1"),
            "digest",
            ["MODULE_1001+aaaaaaaa", "MODULE_1002+aaaaaaaa"],
        ),
        "qwen": (
            _optimum_text("Qwen/Qwen3-8B", "qwen3", batch_size=4, sequence_length=4096, tp_degree=8),
            "digest",
            ["MODULE_2001+aaaaaaaa"],
        ),
        "llama-b1-2024": (
            _optimum_text(LLAMA, "llama", batch_size=1, sequence_length=2048, tp_degree=2),
            "mode",
            ["MODULE_3001+aaaaaaaa"],
        ),
    }
    remote.api.create_commit(
        remote.repo_id,
        operations=[
            CommitOperationAdd(path_in_repo="inference-cache-config/llama3.json", path_or_fileobj=b"{}"),
            CommitOperationAdd(path_in_repo="inference-cache-config/qwen3.json", path_or_fileobj=b"{}"),
        ],
        commit_message="configs",
    )
    for text, layout, modules in exports.values():
        record = json.loads(text)
        model, model_type, digest = record["_model_id"], record["model_type"], "d" * 64
        name = f"{_optimum_hash(text)}.json"
        if layout == "digest":
            paths = [
                f"{vdir}/0_REGISTRY/0.4.1/{digest}/{name}",
                f"{vdir}/0_REGISTRY/0.4.1/{model_type}/{model}/{name}",
            ]
        else:
            paths = [f"{vdir}/0_REGISTRY/0.0.28/inference/{model_type}/{model}/{name}"]
        remote.api.create_commit(
            remote.repo_id,
            operations=[CommitOperationAdd(path_in_repo=p, path_or_fileobj=text) for p in paths]
            + [op for module in modules for op in _entry_ops(module)],
            commit_message="Synchronizing local compiler cache.",
        )
    return {key: modules for key, (_, _, modules) in exports.items()}


def test_lookup_and_restore_read_a_cache_optimum_neuron_wrote(
    base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache("hub", base_env, hub_server)
    remote = cache.remote
    assert isinstance(remote, HubCache)
    # GIVEN a repository in the layouts of optimum-neuron's caches, the public precompiled one's included
    exports = _public_cache_layout(remote)
    env = dict(cache.env, SAGEQUEUE_NEFF_CACHE=cache.url, SAGEQUEUE_RESOURCE_CONFIG=str(tmp_path / "no.json"))
    # THEN lookup shows each of the model's configurations once (the newest layout keeps two copies of a
    # record), with the entries its export compiled
    found = run_cli(["cache", "lookup", LLAMA], env)
    assert found.returncode == 0, found.stderr
    assert f"2 configurations of {LLAMA}" in found.stdout
    assert "(2 entries" in found.stdout
    assert "(1 entries" in found.stdout
    assert "source: optimum-neuron" in found.stdout
    assert "tp_degree: 8" in found.stdout
    assert "tp_degree: 2" in found.stdout
    # AND ls attributes the model's entries to it, and only those
    listed = run_cli(["cache", "ls", "--model", LLAMA], env)
    assert listed.returncode == 0, listed.stderr
    assert "3 entries" in listed.stdout
    assert all(m in listed.stdout for m in exports["llama-b4"] + exports["llama-b1-2024"])
    assert exports["qwen"][0] not in listed.stdout
    by_model = {r.model: r for r in remote.optimum_records("Qwen/Qwen3-8B")}
    assert by_model["Qwen/Qwen3-8B"].entries == exports["qwen"]

    def wrapper(restore: str, *config: str) -> set[str]:
        local = tmp_path / f"local-{uuid.uuid4().hex[:6]}"
        args = ["run", "--cache-dir", str(local), "--model", LLAMA, "--restore", restore, "--no-upload"]
        for item in config:
            args += ["--config", item]
        result = run_wrapper(
            [*args, "--no-progress", "--", str(STANDINS / "standin-train"), "--graphs", "g"], env
        )
        assert result.returncode == 0, result.stderr
        return {e.module for e in neuron.scan(local, VERSION)} - set(_compiled(local))

    # WHEN a job of a configuration optimum-neuron exported restores from the registry
    # THEN it takes that export's entries, not the other configuration's, not the other model's
    assert wrapper("registry", "batch_size=4", "sequence_length=4096") == set(exports["llama-b4"])
    # AND a configuration optimum-neuron never exported restores nothing from the registry alone
    assert wrapper("registry", "batch_size=64") == set()
    # AND with --restore auto it takes the model's entries, of every configuration, never the other model's
    assert wrapper("auto", "batch_size=64") == set(exports["llama-b4"] + exports["llama-b1-2024"])
    # AND `cache restore --model` takes the same
    restored = run_cli(
        [
            "cache",
            "restore",
            "--cache-dir",
            str(tmp_path / "cli"),
            "--compiler-version",
            VERSION,
            "--model",
            LLAMA,
            "--no-progress",
        ],
        env,
    )
    assert restored.returncode == 0, restored.stderr
    assert {e.module for e in neuron.scan(tmp_path / "cli", VERSION)} == set(
        exports["llama-b4"] + exports["llama-b1-2024"]
    )


def _compiled(root: Path) -> list[str]:
    """Entries the stand-in training compiled itself (its graph, not a restored one)."""
    return [
        e.module
        for e in neuron.scan(root, VERSION)
        if (e.path / "model.hlo_module.pb").read_bytes().startswith(b"g\n")
    ]


def test_optimum_neuron_records_written_in_the_job_are_published_beside_its_entries(
    cache: Cache, tmp_path: Path
) -> None:
    # GIVEN a training whose optimum-neuron writes its record into the compile cache (two copies, the second
    # a symbolic link, as it does) and compiles two graphs there
    text = _optimum_text("org/opt-model", "llama", batch_size=2, sequence_length=1024, tp_degree=2)
    name = f"{_optimum_hash(text)}.json"
    digest_path = f"{neuron.version_dir(VERSION)}/0_REGISTRY/0.4.1/{'e' * 64}/{name}"
    alias_path = f"{neuron.version_dir(VERSION)}/0_REGISTRY/0.4.1/llama/org/opt-model/{name}"
    script = (
        'set -e; root="$SAGEQUEUE_NEURON_CACHE_DIR"; '
        f'mkdir -p "$root/$(dirname {digest_path})" "$root/$(dirname {alias_path})"; '
        f"printf '%s' '{text.decode()}' > \"$root/{digest_path}\"; "
        f'ln -s "$root/{digest_path}" "$root/{alias_path}"; '
        f"exec {STANDINS / 'standin-train'} --graphs opt-a,opt-b"
    )
    local = tmp_path / "local"
    result = run_wrapper(
        ["run", "--cache", cache.url, "--cache-dir", str(local), "--no-progress", "--", "bash", "-c", script],
        cache.env,
    )
    assert result.returncode == 0, result.stderr
    # THEN both record files are in the remote cache, byte for byte, at optimum-neuron's own paths
    for path in (digest_path, alias_path):
        if cache.kind == "hub":
            assert isinstance(cache.remote, HubCache)
            assert cache.remote.read_text(path) == text
        else:
            bucket, _, prefix = cache.url[len("s3://") :].partition("/")
            body = boto3.client("s3").get_object(Bucket=bucket, Key=f"{prefix}/{path}")["Body"].read()
            assert body == text
    # AND lookup shows the configuration; on the Hub, where the record and the entries share a commit, with
    # the job's entries (S3 keeps no commits to tell which entries came with a record)
    (record,) = cache.remote.optimum_records("org/opt-model")
    assert record.config["tp_degree"] == "2"
    compiled = sorted(e.module for e in neuron.scan(local, VERSION))
    assert len(compiled) == 2
    assert record.entries == (compiled if cache.kind == "hub" else [])
    # AND a second run publishes neither the records again nor anything else
    again = sync.upload(cache.remote, local, VERSION)
    assert again.result.foreign_records == []
    assert again.result.published == []
