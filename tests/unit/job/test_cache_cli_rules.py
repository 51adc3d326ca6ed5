"""The pure parts of `sagequeue cache prune`: sizes and which entries go."""

from __future__ import annotations

import click
import pytest

from sagequeue.job.cache_cli import _choose, human, parse_size
from sagequeue.job.remote import RemoteEntry, RemoteFile

NOW = 1_800_000_000.0
DAY = 86_400.0


def _entry(module: str, size: int, version: str = "2.14.213.0+013d129b") -> RemoteEntry:
    return RemoteEntry(version, module, (RemoteFile("model.neff", size),))


@pytest.mark.parametrize(
    ("text", "size"),
    [("500M", 500 * 1024**2), ("20G", 20 * 1024**3), ("1.5GiB", int(1.5 * 1024**3)), ("4096", 4096)],
)
def test_sizes_read_as_binary_units(text: str, size: int) -> None:
    assert parse_size(text) == size


def test_a_bad_size_is_named() -> None:
    with pytest.raises(click.BadParameter, match="expected a size like 500M"):
        parse_size("lots")


def test_human_sizes() -> None:
    assert human(512) == "512 B"
    assert human(3 * 1024**2) == "3.0 MiB"


def test_prune_by_age_size_and_version() -> None:
    candidates = [
        (NOW - 40 * DAY, _entry("MODULE_1+a", 100)),
        (NOW - 10 * DAY, _entry("MODULE_2+a", 100)),
        (NOW - 5 * DAY, _entry("MODULE_3+a", 100)),
        (NOW - 1 * DAY, _entry("MODULE_4+a", 100, version="2.13.66.0+6dfecc895")),
    ]
    by_age = _choose(candidates, older_than=30, limit=None, versions=(), now=NOW)
    assert [e.module for _, e in by_age] == ["MODULE_1+a"]
    by_version = _choose(candidates, older_than=None, limit=None, versions=("2.13.66.0+6dfecc895",), now=NOW)
    assert [e.module for _, e in by_version] == ["MODULE_4+a"]
    # oldest first until the rest fits in 250 bytes
    by_size = _choose(candidates, older_than=None, limit=250, versions=(), now=NOW)
    assert [e.module for _, e in by_size] == ["MODULE_1+a", "MODULE_2+a"]
    # rules add up: what age removes counts toward the size
    both = _choose(candidates, older_than=30, limit=250, versions=(), now=NOW)
    assert [e.module for _, e in both] == ["MODULE_1+a", "MODULE_2+a"]
