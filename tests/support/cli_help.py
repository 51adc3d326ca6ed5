"""Walk every command of the `sagequeue` CLI through its `--help`, as a user of an install would."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence

#: runs the CLI with these arguments and answers the finished process
Runner = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]


def subcommands(help_text: str) -> list[str]:
    """The command names of a click group's `--help` ("Commands:" section, one per line)."""
    names: list[str] = []
    listing = False
    for line in help_text.splitlines():
        if line.strip() == "Commands:":
            listing = True
            continue
        if listing:
            if not line.startswith("  "):
                break
            if line.startswith("   "):
                continue  # a wrapped description
            names.append(line.split()[0])
    return names


def every_help(run: Runner) -> dict[tuple[str, ...], subprocess.CompletedProcess[str]]:
    """`--help` of the top command and of every command and subcommand, by command path."""
    answers: dict[tuple[str, ...], subprocess.CompletedProcess[str]] = {}
    pending: list[tuple[str, ...]] = [()]
    while pending:
        path = pending.pop()
        done = run([*path, "--help"])
        answers[path] = done
        if done.returncode == 0:
            pending.extend((*path, name) for name in subcommands(done.stdout))
    return answers


def failures(answers: dict[tuple[str, ...], subprocess.CompletedProcess[str]]) -> list[str]:
    """The helps that did not exit 0 with usage on stdout and nothing alarming on stderr."""
    bad = []
    for path, done in sorted(answers.items()):
        words = " ".join(("sagequeue", *path))
        if done.returncode != 0 or "Usage:" not in done.stdout or "Traceback" in done.stderr:
            bad.append(f"{words} --help: exit {done.returncode}: {(done.stderr or done.stdout)[-300:]}")
    return bad
