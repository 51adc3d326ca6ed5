"""The SAM transform's result is kept between processes, keyed by all it depends on, and a damaged or
missing cache costs a translation, never a wrong template."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sagequeue.local import template as template_module
from sagequeue.local.template import CACHE_DIR_ENV, StackContext, Template, build_spec

REPO = Path(__file__).resolve().parents[3]
STACK = REPO / "template.yaml"
CONTEXT = StackContext("cache-stack", "eu-west-1", "111122223333", queue_url_base="http://127.0.0.1:9")
ROLES = {"AllowedRoleArns": ["arn:aws:iam::111122223333:role/train"]}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(template_module, "_TRANSLATED", {})
    return tmp_path


def _translate_fails(*args: object, **kwargs: object) -> None:
    raise AssertionError("translated again")


def test_a_translation_is_kept_and_used_by_the_next_process(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = Template.from_file(STACK, CONTEXT, ROLES)
    kept = list(cache.glob("*.json"))
    assert len(kept) == 1
    # GIVEN a new process (nothing in memory) and a translator that must not run
    monkeypatch.setattr(template_module, "_TRANSLATED", {})
    monkeypatch.setitem(sys.modules, "samtranslator.translator.translator", None)
    second = Template.from_file(STACK, CONTEXT, ROLES)
    assert second.document == first.document
    assert second.code_dirs == first.code_dirs
    assert build_spec(second).functions.keys() == build_spec(first).functions.keys()


def test_another_parameter_value_is_another_translation(cache: Path) -> None:
    Template.from_file(STACK, CONTEXT, ROLES)
    other = Template.from_file(STACK, CONTEXT, {**ROLES, "QueueLookahead": 7})
    assert len(list(cache.glob("*.json"))) == 2
    assert other.parameters["QueueLookahead"] in ("7", 7)


def test_a_damaged_cache_file_is_translated_again(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = Template.from_file(STACK, CONTEXT, ROLES).document
    (kept,) = cache.glob("*.json")
    for damage in ("{not json", json.dumps(["a list"]), json.dumps({"Resources": "none"})):
        kept.write_text(damage)
        monkeypatch.setattr(template_module, "_TRANSLATED", {})
        assert Template.from_file(STACK, CONTEXT, ROLES).document == fresh
        assert json.loads(kept.read_text()) == json.loads(json.dumps(fresh))  # rewritten whole


def test_an_unwritable_cache_is_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(CACHE_DIR_ENV, str(blocker / "below-a-file"))
    monkeypatch.setattr(template_module, "_TRANSLATED", {})
    assert "Resources" in Template.from_file(STACK, CONTEXT, ROLES).document


def test_an_empty_setting_turns_the_cache_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(template_module, "_TRANSLATED", {})
    Template.from_file(STACK, CONTEXT, ROLES)
    assert list(tmp_path.rglob("*.json")) == []
