"""The precompile run on a cache miss cannot corrupt what the training run resumes from: the script is told
to skip every save (SAGEQUEUE_PRECOMPILE=1), SageMaker's output directories point at scratch, and a save
that happens anyway is named in the log. Real processes, stand-in Neuron tools."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import STANDINS, run_wrapper


def _resumed_job(base_env: dict[str, str], tmp_path: Path, *extra: str) -> tuple[dict[str, object], str]:
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    weights = checkpoints / "weights.json"
    weights.write_text(json.dumps({"valid": True, "steps": 1000}))
    env = dict(base_env, SAGEQUEUE_CHECKPOINT_DIR=str(checkpoints), SM_MODEL_DIR=str(tmp_path / "model"))
    run = run_wrapper(
        [
            "run",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--precompile-steps",
            "1",
            "--no-progress",
            "--",
            str(STANDINS / "standin-train"),
            "--graphs",
            "forward,backward",
            "--weights",
            str(weights),
            "--report",
            str(tmp_path / "report.json"),
            *extra,
        ],
        env,
    )
    assert run.returncode == 0, run.stderr
    assert "cache miss: precompiling" in run.stderr
    return json.loads((tmp_path / "report.json").read_text()), run.stderr


def test_a_resumed_job_resumes_from_its_own_checkpoint_not_the_precompile_runs(
    base_env: dict[str, str], tmp_path: Path
) -> None:
    report, stderr = _resumed_job(base_env, tmp_path)
    # the precompile run compiled the graphs, and saved nothing: the training run hit them and resumed
    # from the checkpoint it had
    assert report["hit"] == ["forward", "backward"]
    assert report["resumed_from"] == {"valid": True, "steps": 1000}
    assert "the precompile run wrote" not in stderr


def test_a_script_that_saves_during_the_precompile_run_is_named_in_the_log(
    base_env: dict[str, str], tmp_path: Path
) -> None:
    _report, stderr = _resumed_job(base_env, tmp_path, "--ignore-precompile-signal")
    assert "ERROR the precompile run wrote" in stderr
    assert str(tmp_path / "checkpoints" / "weights.json") in stderr
