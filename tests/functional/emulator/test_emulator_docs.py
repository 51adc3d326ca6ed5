"""The example at the top of docs/emulator.md runs as written and prints what the page says it prints."""

from __future__ import annotations

import contextlib
import io
import re
from datetime import datetime
from pathlib import Path

DOC = Path(__file__).resolve().parents[3] / "docs" / "emulator.md"


def test_the_documented_example_runs_and_prints_the_documented_output() -> None:
    text = DOC.read_text()
    example = re.search(r"```python\n(.*?)```", text, re.S)
    printed = re.search(r"It prints:\n\n```\n(.*?)```", text, re.S)
    assert example is not None
    assert printed is not None

    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        exec(compile(example.group(1), str(DOC), "exec"), {})  # noqa: S102 - running the page's own example

    assert relative(output.getvalue()) == relative(printed.group(1))


def relative(lines: str) -> list[tuple[float | None, str]]:
    """Each line with its time as seconds after the first line's: a virtual clock starts at the current
    time, while the page shows one fixed morning."""
    out: list[tuple[float | None, str]] = []
    first: datetime | None = None
    for line in lines.strip().splitlines():
        stamp, _, rest = line.partition(" ")
        try:
            moment = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")
        except ValueError:
            out.append((None, line))
            continue
        first = first or moment
        out.append(((moment - first).total_seconds(), rest))
    return out
