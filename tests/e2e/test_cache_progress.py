"""`sagequeue cache` draws a progress bar on stderr when stderr is a terminal, as `hf` does, and leaves
pipes and files clean: run through the installed entry point, with stderr on a pseudo-terminal."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

from sagequeue.job import neuron

COMMAND = str(Path(sys.executable).with_name("sagequeue"))
VERSION = "2.19.64.0+3b4a5b1a"


def local_cache(root: Path, entries: int) -> None:
    for index in range(entries):
        path = root / neuron.version_dir(VERSION) / f"MODULE_{index}+aaaaaaaa"
        path.mkdir(parents=True)
        (path / "compile_flags.json").write_text("[]")
        (path / "model.hlo_module.pb").write_bytes(b"h" * 256)
        (path / "model.neff").write_bytes(b"n" * 1024)
        (path / "model.done").touch()


def prune(root: Path, tmp_path: Path, *, terminal: bool) -> tuple[int, str, str]:
    """`sagequeue cache prune --local` on `root`; stderr on a pseudo-terminal or a pipe."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEQUEUE_", "HF_"))}
    environment.update(SAGEQUEUE_HOME=str(tmp_path / "home"), HF_HOME=str(tmp_path / "hf"), TERM="xterm")
    args = [COMMAND, "cache", "prune", "--local", "--cache-dir", str(root), "--older-than", "0", "--yes"]
    if not terminal:
        done = subprocess.run(args, capture_output=True, text=True, env=environment, timeout=60, check=False)
        return done.returncode, done.stdout, done.stderr
    leader, follower = pty.openpty()
    try:
        process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=follower, env=environment, text=True)
        os.close(follower)
        out, _ = process.communicate(timeout=60)
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal's other end is closed: everything was read
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(leader)
    return process.returncode, out, drawn.decode(errors="replace")


def test_prune_draws_a_bar_on_a_terminal_and_nothing_on_a_pipe(tmp_path: Path) -> None:
    # GIVEN two local caches of three complete entries each
    on_terminal, on_pipe = tmp_path / "a", tmp_path / "b"
    local_cache(on_terminal, 3)
    local_cache(on_pipe, 3)

    # WHEN each is pruned, one with stderr on a terminal, one with stderr on a pipe
    code, out, drawn = prune(on_terminal, tmp_path, terminal=True)
    piped_code, piped_out, piped_err = prune(on_pipe, tmp_path, terminal=False)

    # THEN both removed everything and said so on stdout
    assert (code, piped_code) == (0, 0)
    for printed, root in ((out, on_terminal), (piped_out, on_pipe)):
        assert "removing 3 entries" in printed
        assert neuron.scan(root) == []
    # the terminal saw a bar move to the end: its label, the bar, and the count of done out of all
    assert f"prune {on_terminal}" in drawn
    assert "3/3" in drawn
    assert "#" in drawn
    assert "Traceback" not in drawn
    # the pipe got no bar to garble a log with: at most the label, once
    assert "3/3" not in piped_err
    assert "#" not in piped_err
    assert piped_err.count(f"prune {on_pipe}") <= 1
