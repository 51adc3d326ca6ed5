"""A hostile writer of a shared cache, on S3 (moto's server) and the Hub test server: names that would
write outside the cache, symbolic links on the way, and local links an upload must not follow."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import boto3
import pytest
from conftest import VERSION, Cache, make_cache
from support.hub_server import HubServer

from sagequeue.job import neuron, sync
from sagequeue.job.remote import Deadline

MODULE = "MODULE_77+deadbeef"


def _plant_s3(cache: Cache, module: str, files: dict[str, bytes], prefix: str | None = None) -> None:
    """An entry written straight to the bucket, manifest included: what anyone with write access can do."""
    s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1")
    bucket, _, root = cache.url[len("s3://") :].partition("/")
    key = neuron.entry_key(VERSION, module)
    prefix = prefix or f"{key}/.w-planted"
    listed = {}
    for name, data in files.items():
        s3.put_object(Bucket=bucket, Key=f"{root}/{prefix}/{name}", Body=data)
        listed[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest = {"version": VERSION, "module": module, "prefix": prefix, "files": listed}
    s3.put_object(
        Bucket=bucket,
        Key=f"{root}/manifests/{neuron.version_dir(VERSION)}/{module}.json",
        Body=json.dumps(manifest).encode(),
    )


def _plant_hub(cache: Cache, hub_server: HubServer, module: str, files: dict[str, bytes]) -> None:
    repo = cache.url[len("hf://") :]
    hub_server.plant(
        repo, {f"{neuron.entry_key(VERSION, module)}/{name}": data for name, data in files.items()}
    )


def _plant(cache: Cache, hub_server: HubServer, module: str, files: dict[str, bytes]) -> None:
    if cache.kind == "s3":
        _plant_s3(cache, module, files)
    else:
        _plant_hub(cache, hub_server, module, files)


GOOD = {"model.neff": b"N" * 300, "model.done": b""}


@pytest.mark.parametrize("hostile", ["dotdot", "absolute"])
def test_a_name_that_leaves_the_cache_is_refused_with_a_warning_naming_it(
    cache: Cache, hub_server: HubServer, tmp_path: Path, caplog: pytest.LogCaptureFixture, hostile: str
) -> None:
    root = tmp_path / "a" / "b" / "local"
    escaped = tmp_path / "a" / "b" / "sitecustomize.py"
    name = "../../../sitecustomize.py" if hostile == "dotdot" else str(tmp_path / "abs" / "sitecustomize.py")
    if cache.kind == "hub" and hostile == "absolute":
        name = "/" + name.lstrip("/")
    _plant(cache, hub_server, MODULE, {**GOOD, name: b"import os  # runs in every python of the job\n"})
    _plant(cache, hub_server, "MODULE_78+deadbeef", dict(GOOD))

    with caplog.at_level(logging.WARNING, logger="sagequeue.job.sync"):
        report = sync.restore(cache.remote, root, VERSION, progress=False)

    assert not escaped.exists()
    assert not (tmp_path / "abs").exists()
    assert not list(tmp_path.rglob("sitecustomize.py"))
    key = neuron.entry_key(VERSION, MODULE)
    assert list(report.refused) == [key]
    assert report.restored == [neuron.entry_key(VERSION, "MODULE_78+deadbeef")]
    assert not (root / key).exists()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(key in m and "sitecustomize.py" in m for m in warned), warned


def test_a_symbolic_link_in_staging_does_not_carry_a_restore_out_of_it(
    cache: Cache, hub_server: HubServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "local"
    outside = tmp_path / "outside"
    outside.mkdir()
    _plant(cache, hub_server, MODULE, {**GOOD, "sub/model.hlo_module.pb": b"graph"})
    # a link left in the staging directory (another process on a shared volume, an earlier hostile run)
    staged = sync.staging_dir(root) / neuron.version_dir(VERSION) / MODULE
    staged.mkdir(parents=True)
    (staged / "sub").symlink_to(outside)

    with caplog.at_level(logging.WARNING, logger="sagequeue.job.sync"):
        report = sync.restore(cache.remote, root, VERSION, progress=False)

    assert list(outside.iterdir()) == []
    assert list(report.refused) == [neuron.entry_key(VERSION, MODULE)]
    assert "outside" in report.refused[neuron.entry_key(VERSION, MODULE)]


def test_a_manifest_pointing_outside_its_entry_is_refused(
    base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    # only S3 keeps manifests that name where an entry's bytes are
    cache = make_cache("s3", base_env, hub_server)
    # another entry's objects, or a key outside the cache's prefix
    _plant_s3(cache, "MODULE_1+aaaa", dict(GOOD))
    _plant_s3(cache, MODULE, dict(GOOD), prefix=f"{neuron.entry_key(VERSION, 'MODULE_1+aaaa')}/.w-planted")
    _plant_s3(cache, "MODULE_2+aaaa", dict(GOOD), prefix="../other-team")
    report = sync.restore(cache.remote, tmp_path / "local", VERSION, progress=False)
    assert sorted(report.refused) == sorted(neuron.entry_key(VERSION, m) for m in (MODULE, "MODULE_2+aaaa"))
    assert report.restored == [neuron.entry_key(VERSION, "MODULE_1+aaaa")]
    checked = sync.verify(cache.remote, VERSION)
    assert sorted(checked.broken) == sorted(report.refused)


def test_upload_never_follows_a_file_link_out_of_the_entry(cache: Cache, tmp_path: Path) -> None:
    root = tmp_path / "local"
    secret = tmp_path / "credentials"
    secret.write_text("[default]\naws_secret_access_key = not-for-the-cache\n")
    entry = root / neuron.version_dir(VERSION) / MODULE
    entry.mkdir(parents=True)
    (entry / "model.neff").write_bytes(b"N" * 100)
    (entry / "model.done").touch()
    (entry / "notes.txt").symlink_to(secret)
    (entry / "linked").symlink_to(tmp_path, target_is_directory=True)
    # a writer folder copied down from S3 by hand (`aws s3 sync`) is not part of the entry
    (entry / ".w-0123456789abcdef").mkdir()
    (entry / ".w-0123456789abcdef" / "model.neff").write_bytes(b"N" * 100)

    report = sync.upload(cache.remote, root, VERSION, deadline=Deadline(None))

    assert report.result.published == [neuron.entry_key(VERSION, MODULE)]
    entries = cache.remote.entries(VERSION)
    files = (
        entries[MODULE].files if entries[MODULE].verified else cache.remote.verified_files(entries[MODULE])
    )
    assert sorted(f.name for f in files) == ["model.done", "model.neff"]


def test_a_remote_entry_holding_a_compiler_log_is_not_restored(
    cache: Cache, hub_server: HubServer, tmp_path: Path
) -> None:
    # a NEFF beside the compiler's failure log: the Neuron stack would replay the failure
    _plant(cache, hub_server, MODULE, {**GOOD, "model.log": b"ERROR: compilation failed\n"})
    _plant(cache, hub_server, "MODULE_78+deadbeef", dict(GOOD))
    root = tmp_path / "local"
    report = sync.restore(cache.remote, root, VERSION, progress=False)
    assert report.restored == [neuron.entry_key(VERSION, "MODULE_78+deadbeef")]
    assert not (root / neuron.entry_key(VERSION, MODULE)).exists()
