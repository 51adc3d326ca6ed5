"""Host identity from SageMaker's files, and registry records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sagequeue.job.host import HostIdentityError, resolve
from sagequeue.job.remote import Deadline, RegistryRecord, merge_records, registry_path_parts


def test_host_identity_comes_from_resourceconfig_and_the_job_name(tmp_path: Path) -> None:
    config = tmp_path / "resourceconfig.json"
    config.write_text(
        json.dumps(
            {
                "current_host": "algo-3",
                "hosts": ["algo-1", "algo-2", "algo-3"],
                "current_instance_type": "ml.trn1.32xlarge",
            }
        )
    )
    identity = resolve({"TRAINING_JOB_NAME": "llama-7b-2", "SAGEQUEUE_RESOURCE_CONFIG": str(config)})
    assert identity.host_index == 3
    assert identity.dimension_value == "llama-7b-2/algo-3"
    assert identity.instance_type == "ml.trn1.32xlarge"


@pytest.mark.parametrize(
    ("env", "content", "message"),
    [
        ({}, None, "TRAINING_JOB_NAME is not set"),
        ({"TRAINING_JOB_NAME": "j"}, None, "does not exist"),
        ({"TRAINING_JOB_NAME": "j"}, "{", "is not JSON"),
        ({"TRAINING_JOB_NAME": "j"}, '{"current_host": "node-1"}', "not of the form algo-<n>"),
    ],
)
def test_missing_identity_is_named(
    tmp_path: Path, env: dict[str, str], content: str | None, message: str
) -> None:
    path = tmp_path / "rc.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(HostIdentityError, match=message):
        resolve({**env, "SAGEQUEUE_RESOURCE_CONFIG": str(path)})


def _record(entries: list[str], **config: str) -> RegistryRecord:
    return RegistryRecord(
        "meta-llama/Llama-3.1-8B", "2.14.213.0+013d129b", {"precision": "bf16", **config}, entries
    )


def test_records_of_the_same_configuration_share_a_path_and_merge() -> None:
    first, second = _record(["MODULE_1+a"]), _record(["MODULE_2+a"])
    assert first.path == second.path
    assert first.path.startswith("registry/neuronxcc-2.14.213.0+013d129b/meta-llama/Llama-3.1-8B/")
    assert registry_path_parts(first.path) == ("neuronxcc-2.14.213.0+013d129b", "meta-llama/Llama-3.1-8B")
    assert _record([], precision="fp32").config_hash != first.config_hash
    merged = merge_records([second], {first.path: first})
    assert merged[0].entries == ["MODULE_1+a", "MODULE_2+a"]
    # nothing new: nothing to write
    assert merge_records([_record(["MODULE_1+a"])], {first.path: first}) == []


def test_a_record_round_trips_and_bad_ones_are_rejected() -> None:
    record = _record(["MODULE_2+a", "MODULE_1+a"], batch_size="8")
    again = RegistryRecord.from_json(record.to_json())
    assert again.entries == ["MODULE_1+a", "MODULE_2+a"]
    assert again.config_hash == record.config_hash
    with pytest.raises(ValueError, match="needs model"):
        RegistryRecord.from_json(b'{"model": "x"}')


def test_deadline() -> None:
    assert not Deadline(None).expired(1e9)
    assert Deadline(0).expired()
    assert Deadline(30).expired(reserve=31)
