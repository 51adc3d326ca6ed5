"""`sagequeue simulate` as a user runs it: the table, --json, --compare, --plot, and bad input as one line
naming the flag or the line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sagequeue.cli import main
from sagequeue.sim import SimSettings, WorkloadSpec, generate
from sagequeue_core.snapshot import policy_settings

SMALL = ["--jobs", "30", "--days", "2", "--seed", "3"]


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["simulate", *args])
    return result.exit_code, result.stdout, result.stderr


def test_the_table_has_every_baseline_and_the_issue_metrics() -> None:
    code, out, _ = invoke(*SMALL)
    assert code == 0
    header = out.splitlines()[1]
    for name in ("fifo", "priority", "naive", "sagequeue"):
        assert name in header
    for metric in (
        "jobs unfinished",
        "held in use while backlog",
        "training share",
        "warm idle share",
        "warm reuse",
        "preemptions max per job",
        "work lost",
        "wait gang",
        "top-priority p95 wait / (grace + provisioning)",
        "makespan / per-pool lower bound",
        "wait priority",
    ):
        assert metric in out


def test_json_and_compare_run_on_the_same_trace(tmp_path: Path) -> None:
    code, out, _ = invoke(
        *SMALL,
        "--policies",
        "sagequeue",
        "--compare",
        "capacity=ml.trn1.32xlarge=8",
        "--compare",
        "fifo:min-runtime=0",
        "--json",
    )
    assert code == 0
    document = json.loads(out)
    runs = {run["label"]: run for run in document["runs"]}
    assert set(runs) == {"sagequeue", "sagequeue capacity=ml.trn1.32xlarge=8", "fifo min-runtime=0"}
    assert runs["sagequeue capacity=ml.trn1.32xlarge=8"]["settings"]["capacity"]["ml.trn1.32xlarge"] == 8
    assert runs["fifo min-runtime=0"]["scheduler"] == "fifo"
    jobs = {run["summary"]["jobs"] for run in runs.values()}
    assert jobs == {30}
    # more capacity never makes the same trace's makespan longer by more than a pass or so
    more = runs["sagequeue capacity=ml.trn1.32xlarge=8"]["summary"]
    assert more["lower_bound_seconds"] <= runs["sagequeue"]["summary"]["lower_bound_seconds"]


def test_a_trace_file_round_trips_and_plots_as_html(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    plot = tmp_path / "out.html"
    code, _, _ = invoke(*SMALL, "--policies", "fifo", "--save-trace", str(trace))
    assert code == 0
    assert trace.read_text().count("\n") == 30
    code, _, _ = invoke("--trace", str(trace), "--policies", "fifo,sagequeue", "--plot", str(plot))
    assert code == 0
    page = plot.read_text()
    assert page.count("<svg") == 2 * (2 + 1)  # per run: one chart per pool and the wait CDF
    assert "priority" in page
    assert "training" in page


def test_a_setting_the_policy_does_not_read_is_reported_as_such() -> None:
    code, out, _ = invoke(
        *SMALL, "--policies", "sagequeue", "--preemption-budget", "1", "--min-runtime", "60"
    )
    assert code == 0
    settings = SimSettings(capacity={"ml.trn1.32xlarge": 4}, max_preemptions_per_job=1)
    ignored = policy_settings(settings) == policy_settings(settings.with_changes(max_preemptions_per_job=3))
    assert ("note: --preemption-budget: today's policy has no such setting" in out) == ignored
    assert "--min-runtime" not in out  # the policy reads it


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--capacity", "ml.trn1.32xlarge=-1"],
            "--capacity 'ml.trn1.32xlarge=-1': the number of instances must not be negative",
        ),
        (["--capacity", "trn1=4"], "--capacity 'trn1=4': expected TYPE=N"),
        (["--capacity", "ml.trn1.32xlarge=four"], "is not an integer"),
        (["--min-runtime", "-5"], "--min-runtime -5: must not be negative"),
        (["--lookahead", "0"], "--lookahead 0: must be at least 1"),
        (["--capacity-error-rate", "2"], "--capacity-error-rate 2.0: must be between 0 and 1"),
        (["--policies", "lottery"], "--policies: unknown scheduler(s) lottery"),
        (["--compare", "speed=3"], "unknown setting 'speed'"),
        (["--compare", "lottery:min-runtime=0"], "unknown scheduler 'lottery'"),
        (["--plot", "out.svg"], "--plot out.svg: the file must end in .html or .png"),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag_and_exit_2(args: list[str], message: str) -> None:
    code, _, err = (
        invoke(*SMALL, "--policies", "fifo", *args) if "--policies" not in args else invoke(*SMALL, *args)
    )
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("sagequeue simulate: error:")


def test_a_malformed_trace_line_and_an_unknown_instance_type(tmp_path: Path) -> None:
    trace = generate(WorkloadSpec(jobs=3, days=1), seed=1)
    path = tmp_path / "t.jsonl"
    path.write_text(trace.to_jsonl() + "{oops\n")
    code, _, err = invoke("--trace", str(path))
    assert code == 2
    assert f"{path} line 4: not JSON" in err

    path.write_text(trace.to_jsonl())
    code, _, err = invoke("--trace", str(path), "--capacity", "ml.p5.48xlarge=2")
    assert code == 2
    assert "has no pool (pools given with --capacity: ml.p5.48xlarge)" in err


def test_a_progress_bar_on_request_goes_to_stderr_only() -> None:
    code, out, err = invoke(*SMALL, "--policies", "fifo,priority", "--progress", "--json")
    assert code == 0
    assert "simulating" in err
    assert json.loads(out)["runs"][1]["label"] == "priority"
