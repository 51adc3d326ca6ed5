"""Every relative link of the README and of docs/ leads somewhere: the file exists, and an anchor names a
heading of it (GitHub's slugs). Links to the web are not fetched (no network in tests)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "image" / "README.md", *(ROOT / "docs").rglob("*.md")])
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"`[^`\n]*`")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+?)\s*#*$", text, flags=re.MULTILINE):
        base = slug(heading)
        count = seen.get(base, 0)
        out.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return out


def links(page: Path) -> list[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    text = _INLINE_CODE.sub("", text)
    return [target for target in _LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]


def test_the_slugs_are_githubs() -> None:
    assert slug("Schedule quality: `sagequeue simulate`") == "schedule-quality-sagequeue-simulate"
    assert slug("The NEFF cache's restore") == "the-neff-caches-restore"
    assert slug("sagequeue or AWS Batch for SageMaker?") == "sagequeue-or-aws-batch-for-sagemaker"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_is_alive(page: Path) -> None:
    dead = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            dead.append(f"{target}: no such file")
            continue
        if anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            dead.append(f"{target}: no heading with anchor #{anchor}")
    assert dead == []


def test_the_readme_is_a_guide_not_a_log() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) < 20_000
    # the figures live in one place: docs/figures.md, linked from the README
    assert "docs/figures.md" in readme
    # no table of the README is repeated in docs/ (the parameter tables live there only)
    tables = [line for line in readme.splitlines() if line.startswith("|")]
    assert tables == []
