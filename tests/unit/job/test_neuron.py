"""The Neuron-specific rules: versions, cache location, entry states, neuron-monitor reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sagequeue.job import neuron

VERSION = "2.14.213.0+013d129b"


def _entry(root: Path, module: str, *files: str) -> Path:
    path = root / neuron.version_dir(VERSION) / module
    path.mkdir(parents=True)
    for name in files:
        (path / name).write_bytes(b"x")
    return path


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("NeuronX Compiler version 2.14.213.0+013d129b\n\nPython version 3.10.12", "2.14.213.0+013d129b"),
        ("neuronxcc-2.15.141.0+d3cfc8ca", "2.15.141.0+d3cfc8ca"),
        ("2.21.18209.0", "2.21.18209.0"),
    ],
)
def test_compiler_version_is_read_from_tool_output_and_directory_names(text: str, expected: str) -> None:
    assert neuron.parse_version(text) == expected


def test_an_unreadable_version_names_the_text() -> None:
    with pytest.raises(neuron.CompilerNotFoundError, match="no Neuron compiler version"):
        neuron.parse_version("command not found")


def test_discovery_without_a_compiler_says_what_was_tried(tmp_path: Path) -> None:
    with pytest.raises(neuron.CompilerNotFoundError, match="neuronx-cc is not on PATH"):
        neuron.discover_compiler_version({"PATH": str(tmp_path)})


def test_an_explicit_version_wins() -> None:
    assert (
        neuron.discover_compiler_version({"PATH": ""}, explicit="2.16.372.0+4a9b2326")
        == "2.16.372.0+4a9b2326"
    )


def test_cache_dir_precedence_puts_the_warm_pool_first() -> None:
    env = {
        "SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY": "/opt/ml/sagemaker/warmpoolcache",
        "NEURON_CC_FLAGS": "--cache_dir=/cache/flags --model-type transformer",
        "NEURON_COMPILE_CACHE_URL": "/cache/url",
    }
    assert neuron.choose_cache_dir(env).path == Path("/opt/ml/sagemaker/warmpoolcache/neuron-compile-cache")
    assert neuron.choose_cache_dir(env, "/explicit").source == "option"
    del env["SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY"]
    assert neuron.choose_cache_dir(env).path == Path("/cache/flags")
    env["NEURON_CC_FLAGS"] = "--model-type transformer"
    assert neuron.choose_cache_dir(env).path == Path("/cache/url")
    env["NEURON_COMPILE_CACHE_URL"] = "s3://bucket/neuron"  # the compiler's own S3 cache is not a local dir
    assert neuron.choose_cache_dir(env) == neuron.CacheLocation(
        Path("/var/tmp/neuron-compile-cache"), "default"
    )


@pytest.mark.parametrize(
    "flags", ["--cache_dir=s3://bucket/neuron -O1", "--cache_dir s3://bucket/neuron -O1"]
)
def test_a_remote_cache_dir_in_the_flags_is_not_taken_for_a_local_directory(flags: str) -> None:
    # the compiler's own S3 cache given as --cache_dir: not a path (it would become ./s3:/bucket/neuron)
    env = {"NEURON_CC_FLAGS": flags, "NEURON_COMPILE_CACHE_URL": "/cache/url"}
    assert neuron.choose_cache_dir(env) == neuron.CacheLocation(
        Path("/cache/url"), "NEURON_COMPILE_CACHE_URL"
    )
    del env["NEURON_COMPILE_CACHE_URL"]
    assert neuron.choose_cache_dir(env).path == Path("/var/tmp/neuron-compile-cache")
    child = neuron.child_environment(env, neuron.choose_cache_dir(env).path)
    assert neuron.cache_dir_from_flags(child["NEURON_CC_FLAGS"]) == "/var/tmp/neuron-compile-cache"
    assert "-O1" in child["NEURON_CC_FLAGS"]


@pytest.mark.parametrize("flags", ["--cache_dir=/old -O1", "--cache_dir /old -O1", "-O1 --cache_dir /old"])
def test_the_child_compiler_is_pointed_at_the_chosen_cache(flags: str) -> None:
    child = neuron.child_environment({"NEURON_CC_FLAGS": flags}, Path("/warm/neuron-compile-cache"))
    assert neuron.cache_dir_from_flags(child["NEURON_CC_FLAGS"]) == "/warm/neuron-compile-cache"
    assert "-O1" in child["NEURON_CC_FLAGS"]
    assert child["NEURON_COMPILE_CACHE_URL"] == "/warm/neuron-compile-cache"
    assert neuron.flags_without_cache_dir(flags) == "-O1"


@pytest.mark.parametrize("flags", [None, "", "--model-type transformer"])
def test_the_child_always_gets_the_chosen_cache_dir_in_its_flags(flags: str | None) -> None:
    # optimum-neuron reads only --cache_dir in NEURON_CC_FLAGS, not NEURON_COMPILE_CACHE_URL
    env = {} if flags is None else {"NEURON_CC_FLAGS": flags}
    child = neuron.child_environment(env, Path("/c d/cache"))
    assert neuron.cache_dir_from_flags(child["NEURON_CC_FLAGS"]) == "/c d/cache"
    assert neuron.flags_without_cache_dir(child["NEURON_CC_FLAGS"]) == (flags or "")
    assert child["NEURON_COMPILE_CACHE_URL"] == "/c d/cache"


def test_entry_states_follow_the_compiler_files(tmp_path: Path) -> None:
    complete = _entry(
        tmp_path, "MODULE_1+abcdef12", "compile_flags.json", "model.hlo_module.pb", "model.neff", "model.done"
    )
    failed = _entry(tmp_path, "MODULE_2+abcdef12", "compile_flags.json", "model.hlo_module.pb", "model.log")
    locked = _entry(
        tmp_path, "MODULE_3+abcdef12", "model.hlo_module.pb", "model.hlo_module.pb.lock", "model.neff"
    )
    no_done = _entry(tmp_path, "MODULE_4+abcdef12", "model.hlo_module.pb", "model.neff")
    older_layout = _entry(tmp_path, "MODULE_5+abcdef12", "model.hlo.pb", "model.neff", "model.done")
    (tmp_path / neuron.version_dir(VERSION) / "not-an-entry").mkdir()
    assert neuron.entry_state(complete) is neuron.EntryState.COMPLETE
    assert neuron.entry_state(failed) is neuron.EntryState.FAILED
    assert neuron.entry_state(locked) is neuron.EntryState.LOCKED
    assert neuron.entry_state(no_done) is neuron.EntryState.INCOMPLETE
    assert neuron.entry_state(older_layout) is neuron.EntryState.COMPLETE
    assert [e.module for e in neuron.scan(tmp_path)] == [f"MODULE_{i}+abcdef12" for i in range(1, 6)]
    removed = neuron.remove_failed(tmp_path, VERSION)
    assert [e.module for e in removed] == ["MODULE_2+abcdef12"]
    assert not failed.exists()
    assert complete.exists()


def test_lock_files_are_never_shared(tmp_path: Path) -> None:
    entry = _entry(tmp_path, "MODULE_1+abcdef12", "model.neff", "model.done", "model.neff.lock")
    assert [name for name, _ in neuron.iter_entry_files(entry)] == ["model.done", "model.neff"]
    assert not neuron.is_complete_file_set(["model.neff", "model.done", "x.lock"])


def test_version_and_entry_names() -> None:
    assert neuron.is_version_dir(f"neuronxcc-{VERSION}")
    assert not neuron.is_version_dir("neuronxcc-latest")
    assert neuron.is_entry_dir("MODULE_17543078732677368054+d41d8cd9")
    assert not neuron.is_entry_dir("MODULE_x")
    with pytest.raises(ValueError, match="not a Neuron compiler version directory"):
        neuron.version_of_dir("registry")


REPORT = {
    "neuron_runtime_data": [
        {
            "pid": 4120,
            "neuron_runtime_tag": "4120",
            "error": "",
            "report": {
                "neuroncore_counters": {
                    "period": 1.000,
                    "neuroncores_in_use": {
                        "0": {"neuroncore_utilization": 80.0, "flops": 1},
                        "1": {"neuroncore_utilization": 40.0, "flops": 1},
                    },
                    "error": "",
                }
            },
        },
        {
            "pid": 4121,
            "report": {
                "neuroncore_counters": {"neuroncores_in_use": {"2": {"neuroncore_utilization": "n/a"}}}
            },
        },
    ],
    "system_data": None,
}


def test_utilization_is_read_per_core_in_use() -> None:
    assert neuron.utilization_from_report(json.dumps(REPORT)) == [80.0, 40.0]


def test_a_report_without_runtimes_means_idle_and_noise_is_not_a_report() -> None:
    assert neuron.utilization_from_report(json.dumps({"neuron_runtime_data": []})) == []
    assert neuron.utilization_from_report("neuron-monitor: starting") is None
    assert neuron.utilization_from_report("[1, 2]") is None


def test_monitor_config_asks_for_neuroncore_counters_at_whole_seconds() -> None:
    config = neuron.monitor_config(0.4)
    assert config["period"] == "1s"
    assert config["neuron_runtimes"] == [{"tag_filter": ".*", "metrics": [{"type": "neuroncore_counters"}]}]


def test_parallel_compile_wraps_the_command() -> None:
    assert neuron.parallel_compile_command(["torchrun", "train.py"]) == [
        "neuron_parallel_compile",
        "torchrun",
        "train.py",
    ]
