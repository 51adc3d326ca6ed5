"""Host identity from SageMaker's files, and registry records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sagequeue.job.host import HostIdentityError, resolve
from sagequeue.job.remote import Deadline, RegistryRecord, combine_records, registry_path_parts


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


def test_writers_of_one_configuration_have_their_own_files_and_readers_combine_them() -> None:
    first, second = _record(["MODULE_1+a"]), _record(["MODULE_2+a", "MODULE_1+a"])
    # one directory per configuration, one file per writer: no writer rewrites another's record
    assert first.path.rsplit("/", 1)[0] == second.path.rsplit("/", 1)[0]
    assert first.path != second.path
    assert first.path.startswith(
        f"registry/neuronxcc-2.14.213.0+013d129b/meta-llama/Llama-3.1-8B/{first.config_hash}/"
    )
    assert registry_path_parts(first.path) == ("neuronxcc-2.14.213.0+013d129b", "meta-llama/Llama-3.1-8B")
    other = _record(["MODULE_7+a"], precision="fp32")
    assert other.config_hash != first.config_hash
    combined = {r.config_hash: r for r in combine_records([first, second, other])}
    assert combined[first.config_hash].entries == ["MODULE_1+a", "MODULE_2+a"]
    assert combined[other.config_hash].entries == ["MODULE_7+a"]


def test_a_record_round_trips_and_bad_ones_are_rejected() -> None:
    record = _record(["MODULE_2+a", "MODULE_1+a"], batch_size="8")
    again = RegistryRecord.from_json(record.to_json())
    assert again.entries == ["MODULE_1+a", "MODULE_2+a"]
    assert again.config_hash == record.config_hash
    assert again.path == record.path
    with pytest.raises(ValueError, match="needs model"):
        RegistryRecord.from_json(b'{"model": "x"}')


def test_deadline() -> None:
    assert not Deadline(None).expired(1e9)
    assert Deadline(0).expired()
    assert Deadline(30).expired(reserve=31)
