"""The job image reports checkpoints (docs/adr/0025): `sagequeue-job run` around a stand-in script that
checkpoints at a known interval, with real processes and a real checkpoint directory."""

from __future__ import annotations

import json
import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import STANDINS, run_wrapper

from sagequeue.job.checkpoints import (
    CheckpointReportError,
    CheckpointWatcher,
    read_marker,
    report_checkpoint,
    step_of,
)
from sagequeue_core.checkpoint_marker import CHECKPOINT_MARKER, CheckpointReport


def _env(tmp_path: Path, folder: Path, name: str = "ckpt-job") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEQUEUE_", "NEURON_"))}
    env.update(
        {
            "TRAINING_JOB_NAME": name,
            "SAGEQUEUE_CHECKPOINT_DIR": str(folder),
            "SAGEQUEUE_CHECKPOINT_POLL_SECONDS": "0.3",
            "SAGEQUEUE_CONFIG_DIR": str(tmp_path / "config"),
        }
    )
    return env


def _logged(path: Path) -> list[tuple[int, float]]:
    return [(int(step), float(at)) for step, at in (line.split() for line in path.read_text().splitlines())]


def _resumed_folder(tmp_path: Path) -> Path:
    """A checkpoint directory as SageMaker fills it for a resumed attempt: the previous attempt's
    checkpoint and its marker."""
    folder = tmp_path / "checkpoints"
    (folder / "checkpoint-500").mkdir(parents=True)
    (folder / "checkpoint-500" / "model.bin").write_bytes(b"old")
    earlier = CheckpointReport("ckpt-job-previous", datetime(2026, 1, 1, tzinfo=UTC), 500, count=7)
    (folder / CHECKPOINT_MARKER).write_bytes(earlier.to_marker())
    return folder


def test_the_watcher_reports_each_checkpoint_the_script_writes_with_its_step_and_interval(
    tmp_path: Path,
) -> None:
    # GIVEN a resumed attempt's checkpoint directory and a script checkpointing every 10 steps of 0.1 s
    folder = _resumed_folder(tmp_path)
    log = tmp_path / "written.log"
    script = [
        sys.executable,
        str(STANDINS / "standin-checkpoint-train"),
        "--steps",
        "40",
        "--step-seconds",
        "0.1",
    ]
    script += ["--every", "10", "--write-seconds", "0.2", "--log", str(log)]
    # WHEN it runs under the job image's wrapper, which knows nothing of the script
    done = run_wrapper(["run", "--no-progress", "--metrics", "off", "--", *script], _env(tmp_path, folder))
    assert done.returncode == 0, done.stderr
    # THEN the marker names this attempt and counts its own four checkpoints, not the one it resumed from
    written = _logged(log)
    marker = read_marker(folder)
    assert marker is not None
    assert (marker.training_job_name, marker.source, marker.count, marker.step) == (
        "ckpt-job",
        "watched",
        4,
        40,
    )
    # AND its time is the last checkpoint's, its interval the gap between the last two (about 1.2 s)
    assert abs(marker.at.timestamp() - written[-1][1]) < 0.5
    assert marker.interval_seconds is not None
    assert abs(marker.interval_seconds - (written[-1][1] - written[-2][1])) < 0.5


def test_a_script_that_reports_itself_is_exact_and_the_watcher_leaves_its_marker_alone(
    tmp_path: Path,
) -> None:
    folder = _resumed_folder(tmp_path)
    log = tmp_path / "written.log"
    script = [
        sys.executable,
        str(STANDINS / "standin-checkpoint-train"),
        "--steps",
        "30",
        "--step-seconds",
        "0.05",
    ]
    script += ["--every", "10", "--exact", "--log", str(log)]
    done = run_wrapper(["run", "--no-progress", "--metrics", "off", "--", *script], _env(tmp_path, folder))
    assert done.returncode == 0, done.stderr
    marker = read_marker(folder)
    assert marker is not None
    assert (marker.training_job_name, marker.source, marker.count, marker.step) == (
        "ckpt-job",
        "script",
        3,
        30,
    )
    assert abs(marker.at.timestamp() - _logged(log)[-1][1]) < 0.2
    # the marker is the only file the reports add: no temporary file left where SageMaker syncs
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["checkpoint-500", "checkpoint-10", "checkpoint-20", "checkpoint-30", CHECKPOINT_MARKER]
    )


def test_reports_can_be_turned_off(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    env = {**_env(tmp_path, folder), "SAGEQUEUE_CHECKPOINT_REPORTS": "off"}
    script = [
        sys.executable,
        str(STANDINS / "standin-checkpoint-train"),
        "--steps",
        "10",
        "--step-seconds",
        "0.01",
    ]
    done = run_wrapper(["run", "--no-progress", "--metrics", "off", "--", *script], env)
    assert done.returncode == 0, done.stderr
    assert not (folder / CHECKPOINT_MARKER).exists()


def test_a_report_outside_a_training_job_says_why(tmp_path: Path) -> None:
    with pytest.raises(CheckpointReportError, match="TRAINING_JOB_NAME"):
        report_checkpoint(1, directory=tmp_path, env={})
    with pytest.raises(CheckpointReportError, match="not a directory"):
        report_checkpoint(1, directory=tmp_path / "missing", env={"TRAINING_JOB_NAME": "j"})
    with pytest.raises(ValueError, match="step"):
        report_checkpoint(-1, directory=tmp_path, env={"TRAINING_JOB_NAME": "j"})


def test_reports_derive_the_interval_from_the_last_gap_and_restart_for_a_new_attempt(tmp_path: Path) -> None:
    t0 = datetime(2026, 3, 1, tzinfo=UTC)
    env = {"TRAINING_JOB_NAME": "j--2"}
    (tmp_path / CHECKPOINT_MARKER).write_bytes(
        CheckpointReport("j", t0, 9, count=3, interval_seconds=60).to_marker()
    )
    first = report_checkpoint(10, directory=tmp_path, env=env, at=t0 + timedelta(minutes=5))
    assert (first.count, first.interval_seconds) == (1, None)
    second = report_checkpoint(20, directory=tmp_path, env=env, at=t0 + timedelta(minutes=35))
    third = report_checkpoint(None, directory=tmp_path, env=env, at=t0 + timedelta(minutes=75))
    assert (second.count, second.interval_seconds) == (2, 1800.0)
    assert (third.count, third.interval_seconds, third.step) == (3, 2400.0, None)
    assert read_marker(tmp_path) == third
    assert json.loads((tmp_path / CHECKPOINT_MARKER).read_text())["training_job_name"] == "j--2"


def test_files_being_written_are_no_checkpoint_until_they_settle(tmp_path: Path) -> None:
    watcher = CheckpointWatcher(tmp_path, "j", poll_seconds=60)
    (tmp_path / "step_100").mkdir()
    (tmp_path / "step_100" / "weights.pt").write_bytes(b"x")
    (tmp_path / ".weights.pt.tmp").write_bytes(b"partial")
    assert watcher.look() is None  # just appeared
    (tmp_path / "step_100" / "weights.pt").write_bytes(b"xy")
    assert watcher.look() is None  # still growing
    report = watcher.look()  # unchanged since the last look: complete
    assert report is not None
    assert (report.step, report.count, report.source) == (100, 1, "watched")
    assert watcher.look() is None  # nothing new


@pytest.mark.parametrize(
    ("paths", "step"),
    [
        (["checkpoint-1200/model.bin"], 1200),
        (["global_step300/mp_rank_00_model_states.pt"], 300),
        (["ckpt_7.pt", "ckpt_8.pt"], 8),
        (["weights.safetensors"], None),
    ],
)
def test_the_step_comes_from_the_checkpoint_names(paths: list[str], step: int | None) -> None:
    assert step_of(paths) == step
