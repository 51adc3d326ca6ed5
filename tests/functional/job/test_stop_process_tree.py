"""A stop checkpoints whatever launches the workers: real process trees under a real `sagequeue-job`.

The launchers are the ones that broke the promise: a shell that starts workers in the background and has
no SIGTERM trap, and a Python launcher without a SIGTERM handler (what the SageMaker training toolkit's
`train` is). Each worker takes seconds to write its checkpoint after SIGTERM; the wrapper must outlive
them (within the grace) instead of leaving when its direct child dies.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import BIN, STANDINS, VERSION, make_cache
from support.hub_server import HubServer

CHECKPOINT_SECONDS = 2.0


def _worker(tmp_path: Path, name: str) -> list[str]:
    return [
        str(STANDINS / "standin-train"),
        "--graphs",
        f"g-{name}-{tmp_path.name}",
        "--steps",
        "600",
        "--step-seconds",
        "0.1",
        "--checkpoint",
        str(tmp_path / f"checkpoint-{name}.json"),
        "--checkpoint-seconds",
        str(CHECKPOINT_SECONDS),
        "--started",
        str(tmp_path / f"started-{name}"),
        "--term-status",
        "143",
    ]


def _launcher(kind: str, tmp_path: Path) -> list[str]:
    workers = [_worker(tmp_path, "a"), _worker(tmp_path, "b")]
    if kind == "bash":
        script = " & ".join(shlex.join(w) for w in workers) + " & wait"
        return ["bash", "-c", script]
    # no SIGTERM handler: Python's default action ends the launcher at once, its children keep running
    code = (
        "import subprocess, sys, json\n"
        "workers = [subprocess.Popen(w) for w in json.loads(sys.argv[1])]\n"
        "raise SystemExit(max(w.wait() for w in workers))\n"
    )
    return [sys.executable, "-c", code, json.dumps(workers)]


@pytest.mark.parametrize("launcher", ["bash", "python-no-handler"])
def test_a_stop_waits_for_every_worker_of_the_group_to_checkpoint(
    launcher: str, base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    cache = make_cache("s3", base_env, hub_server)
    job = subprocess.Popen(
        [
            str(BIN / "sagequeue-job"),
            "run",
            "--cache",
            cache.url,
            "--cache-dir",
            str(tmp_path / "cache"),
            "--grace",
            "20",
            "--no-progress",
            "--",
            *_launcher(launcher, tmp_path),
        ],
        env=cache.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # GIVEN both workers train
    end = time.monotonic() + 60
    while not all((tmp_path / f"started-{n}").exists() for n in "ab"):
        assert job.poll() is None, job.communicate()[1]
        assert time.monotonic() < end
        time.sleep(0.05)
    time.sleep(0.5)
    # WHEN SageMaker stops the job
    stopped_at = time.monotonic()
    job.send_signal(signal.SIGTERM)
    _, stderr = job.communicate(timeout=60)
    elapsed = time.monotonic() - stopped_at
    # THEN both workers wrote their (slow) checkpoints before the wrapper left, within the grace
    for name in "ab":
        checkpoint = tmp_path / f"checkpoint-{name}.json"
        assert checkpoint.exists(), stderr
        assert json.loads(checkpoint.read_text())["signal"] == signal.SIGTERM
    assert CHECKPOINT_SECONDS <= elapsed < 20, stderr
    assert "waiting for the rest of its process group" in stderr
    assert "process group has exited" in stderr
    # AND no worker outlives the wrapper
    for name in "ab":
        pid = int((tmp_path / f"started-{name}").read_text())
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z"


def test_a_worker_that_ignores_the_stop_is_left_at_the_end_of_the_grace(
    base_env: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN a launcher whose worker ignores SIGTERM entirely
    code = (
        "import os, signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "open(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(120)\n"
    )
    script = f"{shlex.quote(sys.executable)} -c {shlex.quote(code)} {tmp_path}/pid & wait"
    log = tmp_path / "wrapper.log"
    job = subprocess.Popen(
        [
            str(BIN / "sagequeue-job"),
            "run",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--grace",
            "4",
            "--no-progress",
            "--",
            "bash",
            "-c",
            script,
        ],
        env=base_env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )
    end = time.monotonic() + 30
    while not (tmp_path / "pid").exists() or not (tmp_path / "pid").read_text().strip():
        assert time.monotonic() < end
        time.sleep(0.05)
    worker = int((tmp_path / "pid").read_text())
    try:
        stopped_at = time.monotonic()
        job.send_signal(signal.SIGTERM)
        job.wait(timeout=30)
        elapsed = time.monotonic() - stopped_at
        stderr = log.read_text()
        # THEN the wrapper waits for it only until the grace (minus the exit margin) runs out
        assert 1.5 <= elapsed < 4, stderr
        assert "still run at the end of the stop grace: killing them" in stderr
        # AND it does not outlive the wrapper
        time.sleep(0.2)
        stat = Path(f"/proc/{worker}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)


def test_a_command_that_outlives_the_grace_is_killed_and_the_wrapper_leaves_in_time(
    base_env: dict[str, str], tmp_path: Path
) -> None:
    """The direct child itself outlives the stop (a script whose checkpoint takes longer than the grace,
    or torchrun waiting for such workers): the wrapper must not wait for it past the grace."""
    # GIVEN a command that ignores SIGTERM, run by the wrapper as its direct child
    code = (
        "import os, signal, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "open(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(120)\n"
    )
    log = tmp_path / "wrapper.log"
    job = subprocess.Popen(
        [
            str(BIN / "sagequeue-job"),
            "run",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--grace",
            "4",
            "--no-progress",
            "--",
            sys.executable,
            "-c",
            code,
            str(tmp_path / "pid"),
        ],
        env=base_env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )
    end = time.monotonic() + 30
    while not (tmp_path / "pid").exists() or not (tmp_path / "pid").read_text().strip():
        assert time.monotonic() < end
        time.sleep(0.05)
    command = int((tmp_path / "pid").read_text())
    try:
        stopped_at = time.monotonic()
        job.send_signal(signal.SIGTERM)
        try:
            job.wait(timeout=15)
        except subprocess.TimeoutExpired:
            job.kill()
            pytest.fail("the wrapper still waits for its command 15 s after a stop with a 4 s grace")
        elapsed = time.monotonic() - stopped_at
        stderr = log.read_text()
        # THEN it kills the command at the end of the grace (minus the exit margin) and leaves
        assert 1.5 <= elapsed < 4, stderr
        assert "still runs at the end of the stop grace: killing its process group" in stderr
        assert job.returncode == 128 + signal.SIGKILL, stderr
        time.sleep(0.2)
        stat = Path(f"/proc/{command}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(command, signal.SIGKILL)


SLOW_CHECKPOINT_SECONDS = 6.0


def test_a_stop_uploads_the_complete_entries_while_the_workers_still_checkpoint(
    base_env: dict[str, str], hub_server: HubServer, tmp_path: Path
) -> None:
    """torchrun-like: the direct child handles SIGTERM by waiting for its workers, so it outlives their
    checkpoints; the upload must not wait for it, and must leave alone an entry still being written."""
    from sagequeue.job import neuron

    cache = make_cache("s3", base_env, hub_server)
    local = tmp_path / "cache"
    workers = [
        [
            str(STANDINS / "standin-train"),
            "--graphs",
            f"g-{name}-{tmp_path.name}",
            "--steps",
            "600",
            "--step-seconds",
            "0.1",
            "--checkpoint",
            str(tmp_path / f"checkpoint-{name}.json"),
            "--checkpoint-seconds",
            str(SLOW_CHECKPOINT_SECONDS),
            "--started",
            str(tmp_path / f"started-{name}"),
            "--term-status",
            "143",
        ]
        for name in "ab"
    ]
    # a third worker whose compile in flight at the stop finishes during its checkpoint
    late = (
        "import os, pathlib, signal, sys, time\n"
        f"sys.path.insert(0, {str(STANDINS)!r})\n"
        "from _standin_neuron import compile_into_cache, graph_bytes\n"
        "def on_term(*_):\n"
        "    time.sleep(1.0)\n"
        f"    compile_into_cache(graph_bytes('late-{tmp_path.name}'))\n"
        "    time.sleep(3.0)\n"
        "    pathlib.Path(sys.argv[1]).write_text('{\"signal\": 15}')\n"
        "    sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "pathlib.Path(sys.argv[2]).write_text(str(os.getpid()))\n"
        "while True:\n"
        "    time.sleep(0.1)\n"
    )
    workers.append(
        [sys.executable, "-c", late, str(tmp_path / "checkpoint-c.json"), str(tmp_path / "started-c")]
    )
    # a launcher that, like torchrun, waits for its workers when stopped and exits after them
    code = (
        "import json, signal, subprocess, sys\n"
        "signal.signal(signal.SIGTERM, lambda *_: None)\n"
        "workers = [subprocess.Popen(w) for w in json.loads(sys.argv[1])]\n"
        "raise SystemExit(max(w.wait() for w in workers))\n"
    )
    grace = 20.0
    log = tmp_path / "wrapper.log"
    job = subprocess.Popen(
        [
            str(BIN / "sagequeue-job"),
            "run",
            "--cache",
            cache.url,
            "--cache-dir",
            str(local),
            "--grace",
            str(int(grace)),
            "--model",
            "org/stop-test",
            "--no-progress",
            "--",
            sys.executable,
            "-c",
            code,
            json.dumps(workers),
        ],
        env=cache.env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )
    try:
        # GIVEN both workers train, their graphs compiled into the local cache
        end = time.monotonic() + 60
        while not all((tmp_path / f"started-{n}").exists() for n in "abc") or (
            len([e for e in neuron.scan(local, VERSION) if e.state is neuron.EntryState.COMPLETE]) < 2
        ):
            assert job.poll() is None, log.read_text()
            assert time.monotonic() < end, log.read_text()
            time.sleep(0.05)
        complete = {e.module for e in neuron.scan(local, VERSION) if e.state is neuron.EntryState.COMPLETE}
        # AND two entries a compiler is still writing: one holding its lock, one without its done marker
        version_dir = local / neuron.version_dir(VERSION)
        locked = version_dir / "MODULE_beingwritten1+abc123"
        locked.mkdir()
        (locked / neuron.NEFF_FILE).write_bytes(b"half a neff")
        (locked / neuron.DONE_FILE).write_text("")
        (locked / "model.hlo_module.pb.lock").write_text("")
        undone = version_dir / "MODULE_beingwritten2+abc123"
        undone.mkdir()
        (undone / neuron.NEFF_FILE).write_bytes(b"a neff without its done marker")
        time.sleep(0.3)
        # WHEN SageMaker stops the job
        stopped_at = time.monotonic()
        job.send_signal(signal.SIGTERM)
        # THEN the complete entries reach the remote while the workers are still writing checkpoints
        uploaded_at = None
        while time.monotonic() - stopped_at < grace:
            if complete <= set(cache.remote.entries(VERSION)):  # type: ignore[attr-defined]
                uploaded_at = time.monotonic()
                break
            time.sleep(0.1)
        assert uploaded_at is not None, log.read_text()
        checkpoints = [tmp_path / f"checkpoint-{n}.json" for n in "abc"]
        assert not any(c.exists() for c in checkpoints), (
            f"the upload finished {uploaded_at - stopped_at:.1f}s after the stop, after the checkpoints\n"
            + log.read_text()
        )
        job.wait(timeout=grace + 10)
        elapsed = time.monotonic() - stopped_at
        stderr = log.read_text()
        # AND the workers still checkpointed, and the wrapper left within the grace
        for checkpoint in checkpoints:
            assert json.loads(checkpoint.read_text())["signal"] == signal.SIGTERM, stderr
        assert SLOW_CHECKPOINT_SECONDS <= elapsed < grace, stderr
        # AND the entry completed during the checkpoints went up after them, and the registry record of
        # the job names it too
        final = {e.module for e in neuron.scan(local, VERSION) if e.state is neuron.EntryState.COMPLETE}
        assert len(final - complete) == 1, stderr
        assert "1 entries completed during the stop: uploading them too" in stderr
        remote = set(cache.remote.entries(VERSION))  # type: ignore[attr-defined]
        assert remote == final, stderr
        records = cache.remote.records("org/stop-test")  # type: ignore[attr-defined]
        assert [sorted(r.entries) for r in records] == [sorted(final)], stderr
        # AND nothing still being written was published
        assert not {locked.name, undone.name} & remote
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
