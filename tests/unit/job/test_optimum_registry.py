"""Reading optimum-neuron's registry (`neuronxcc-<version>/0_REGISTRY/...`) in each of its layouts."""

from __future__ import annotations

import json

import pytest

from sagequeue.job.remote import matches_job, optimum_record_path, optimum_records_from

V = "neuronxcc-2.19.8089.0+8ab9f450"
TEXT = json.dumps(
    {
        "_entry_class": "SingleModelCacheEntry",
        "_model_id": "meta-llama/Llama-3.1-8B",
        "_task": "text-generation",
        "model_type": "llama",
        "neuron": {"batch_size": 4, "sequence_length": 4096, "tp_degree": 8, "torch_dtype": "bfloat16"},
    }
).encode()


@pytest.mark.parametrize(
    ("path", "model", "model_type"),
    [
        (f"{V}/0_REGISTRY/0.4.1/{'a' * 64}/0123456789abcdef0123.json", None, None),
        (
            f"{V}/0_REGISTRY/0.4.1/llama/meta-llama/Llama-3.1-8B/0123456789abcdef0123.json",
            "meta-llama/Llama-3.1-8B",
            "llama",
        ),
        (
            f"{V}/0_REGISTRY/0.0.28/inference/llama/meta-llama/Llama-3.1-8B/0123456789abcdef0123.json",
            "meta-llama/Llama-3.1-8B",
            "llama",
        ),
        (f"{V}/0_REGISTRY/0.0.28/training/gpt2/gpt2/0123456789abcdef0123.json", "gpt2", "gpt2"),
    ],
)
def test_each_layout_names_version_hash_and_model(
    path: str, model: str | None, model_type: str | None
) -> None:
    where = optimum_record_path(path)
    assert where is not None
    assert where.compiler_version == "2.19.8089.0+8ab9f450"
    assert where.hash == "0123456789abcdef0123"
    assert (where.model, where.model_type) == (model, model_type)


@pytest.mark.parametrize(
    "path",
    [
        f"{V}/MODULE_1+abc/model.neff",
        f"{V}/0_REGISTRY/0.4.1/x.json",  # no folder for the record
        f"{V}/0_REGISTRY/0.4.1/llama/model/readme.txt",
        "registry/neuronxcc-2.19.8089.0/org/m/abc/w.json",  # sagequeue's own registry
        "not-a-version/0_REGISTRY/0.4.1/llama/org/m/h.json",
    ],
)
def test_other_paths_are_not_optimum_records(path: str) -> None:
    assert optimum_record_path(path) is None


def test_the_two_copies_of_a_record_count_once_and_unreadable_ones_are_skipped() -> None:
    files = {
        f"{V}/0_REGISTRY/0.4.1/{'a' * 64}/0123456789abcdef0123.json": TEXT,
        f"{V}/0_REGISTRY/0.4.1/llama/meta-llama/Llama-3.1-8B/0123456789abcdef0123.json": TEXT,
        f"{V}/0_REGISTRY/0.4.1/llama/meta-llama/Llama-3.1-8B/ffffffffffffffffffff.json": b"{not json",
    }
    (record,) = optimum_records_from(files).values()
    assert record.model == "meta-llama/Llama-3.1-8B"
    assert record.config["batch_size"] == "4"
    assert record.config["source"] == "optimum-neuron"
    assert record.config["task"] == "text-generation"
    assert record.entries == []


def test_a_job_matches_a_record_on_the_settings_they_share() -> None:
    (record,) = optimum_records_from(
        {f"{V}/0_REGISTRY/0.4.1/llama/org/m/0123456789abcdef0123.json": TEXT}
    ).values()
    assert matches_job(record, {"batch_size": "4", "sequence_length": "4096", "precision": "bf16"})
    assert not matches_job(record, {"batch_size": "8", "sequence_length": "4096"})
    # nothing in common: not a match (the model-wide restore of --restore auto covers it)
    assert not matches_job(record, {"precision": "bf16", "instance_type": "ml.trn1.32xlarge"})
