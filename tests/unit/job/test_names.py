"""The one check names from a remote cache pass before they become paths, and the registry records that
carry names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sagequeue.job.names import UnsafeNameError, check_name, path_inside
from sagequeue.job.remote import RegistryRecord

HOSTILE = [
    "../x",
    "a/../../x",
    "/etc/cron.d/x",
    "",
    ".",
    "a//b",
    "a/./b",
    "a\\..\\x",
    "a\x00b",
    "a\nb",
    "x" * 2000,
]


@pytest.mark.parametrize("name", HOSTILE)
def test_a_name_that_could_leave_its_folder_is_refused(name: str, tmp_path: Path) -> None:
    with pytest.raises(UnsafeNameError):
        check_name(name)
    with pytest.raises(UnsafeNameError):
        path_inside(tmp_path, name)


@pytest.mark.parametrize("name", ["model.neff", "sub/model.hlo_module.pb", "..hidden", "a..b", "é.neff"])
def test_ordinary_names_pass(name: str, tmp_path: Path) -> None:
    assert check_name(name) == name
    assert path_inside(tmp_path, name) == tmp_path / name


def test_a_symbolic_link_on_the_way_out_is_refused(tmp_path: Path) -> None:
    top = tmp_path / "top"
    top.mkdir()
    (top / "inside").mkdir()
    (top / "escape").symlink_to(tmp_path)
    (top / "loop").symlink_to(top / "inside")
    assert path_inside(top, "loop/model.neff") == top / "loop" / "model.neff"
    with pytest.raises(UnsafeNameError, match="outside"):
        path_inside(top, "escape/model.neff")


def test_a_registry_record_naming_paths_out_of_the_cache_is_not_read() -> None:
    good = {"model": "org/m", "compiler_version": "2.14.213.0+013d129b", "config": {}}
    entries = ["MODULE_1+aa", "../../../etc/x", "/abs", "MODULE_2+bb"]
    record = RegistryRecord.from_json(json.dumps({**good, "entries": entries}))
    assert record.entries == ["MODULE_1+aa", "MODULE_2+bb"]
    with pytest.raises(ValueError, match="registry model"):
        RegistryRecord.from_json(json.dumps({**good, "model": "../../x"}))
    with pytest.raises(ValueError, match="compiler version"):
        RegistryRecord.from_json(json.dumps({**good, "compiler_version": "../../x"}))
