"""The trace importer: JSON Lines, CSV and DescribeTrainingJob records; every bad line named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sagequeue.sim.trace import TraceError, load_trace, parse_csv, parse_jsonl

GOOD = {
    "submit": 0,
    "priority": 5,
    "instance_type": "ml.trn1.32xlarge",
    "instance_count": 2,
    "duration_seconds": 60,
}


def lines(*rows: object) -> str:
    return "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows)


def test_jsonl_offsets_sorted_with_defaults() -> None:
    trace = parse_jsonl(
        lines(
            "# a comment",
            {**GOOD, "name": "late", "submit": 30, "keep_alive_seconds": 600, "family": "f"},
            "",
            {**GOOD, "name": "early", "checkpoint_minutes": 15},
        )
    )
    assert [j.name for j in trace.jobs] == ["early", "late"]
    early, late = trace.jobs
    assert early.checkpoint_minutes == 15
    assert early.keep_alive_seconds == 0
    assert early.family is None
    assert late.keep_alive_seconds == 600
    assert late.family == "f"
    assert late.submit_seconds == 30
    assert trace.pools == ("ml.trn1.32xlarge",)


def test_iso_timestamps_become_offsets_from_the_first() -> None:
    trace = parse_jsonl(
        lines({**GOOD, "submit": "2026-03-02T10:00:00Z"}, {**GOOD, "submit": "2026-03-02T09:00:00+00:00"})
    )
    assert sorted(j.submit_seconds for j in trace.jobs) == [0, 3600]
    assert trace.start.hour == 9


def test_csv_with_optional_columns(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "name,submit,priority,instance_type,instance_count,duration_seconds,keep_alive_seconds\n"
        "a,0,3,ml.trn2.48xlarge,4,3600,\n"
        "b,10,9,ml.trn2.48xlarge,1,60,300\n"
    )
    trace = load_trace(path)
    assert [(j.name, j.instance_count, j.keep_alive_seconds) for j in trace.jobs] == [
        ("a", 4, 0),
        ("b", 1, 300),
    ]


def test_describe_training_job_records() -> None:
    record = {
        "TrainingJobName": "llama-sft",
        "CreationTime": "2026-03-02T09:00:00Z",
        "ResourceConfig": {
            "InstanceType": "ml.trn1.32xlarge",
            "InstanceCount": 4,
            "KeepAlivePeriodInSeconds": 900,
        },
        "TrainingTimeInSeconds": 7200,
        "Tags": [{"Key": "priority", "Value": "7"}],
        "CheckpointConfig": {"S3Uri": "s3://b/ckpt"},
    }
    (job,) = parse_jsonl(lines(record)).jobs
    assert (job.name, job.priority, job.instance_count, job.duration_seconds) == ("llama-sft", 7, 4, 7200)
    assert job.keep_alive_seconds == 900
    assert job.checkpoint_minutes == 30


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("{not json", "line 2: not JSON"),
        ("[1, 2]", "line 2: expected a JSON object"),
        (json.dumps({**GOOD, "instance_type": "trn1"}), "line 2: instance_type must look like"),
        (json.dumps({**GOOD, "instance_count": -1}), "line 2: instance_count must be at least 1"),
        (json.dumps({**GOOD, "instance_count": "two"}), "line 2: instance_count must be an integer"),
        (json.dumps({**GOOD, "duration_seconds": 0}), "line 2: duration_seconds must be positive"),
        (json.dumps({**GOOD, "priority": 5000}), "line 2: priority must be between"),
        (json.dumps({**GOOD, "submit": "yesterday"}), "line 2: submit must be"),
        (json.dumps({**GOOD, "keep_alive_seconds": 99999}), "line 2: keep_alive_seconds must be between"),
        (json.dumps({**GOOD, "colour": "red"}), "line 2: unknown field(s) colour"),
        (json.dumps({"priority": 1}), "line 2: missing submit, instance_type"),
        (json.dumps({**GOOD, "name": "first"}), "line 2: job name 'first' already used on line 1"),
        (json.dumps({**GOOD, "submit": "2026-03-02T09:00:00Z"}), "line 2: submit times mix"),
    ],
)
def test_a_bad_line_is_named(bad_line: str, message: str) -> None:
    with pytest.raises(TraceError, match=r"trace line|trace:") as caught:
        parse_jsonl(lines({**GOOD, "name": "first"}, bad_line))
    assert message in str(caught.value)


def test_csv_errors_name_the_line() -> None:
    with pytest.raises(TraceError, match="line 1: the CSV header lacks column"):
        parse_csv("name,submit\na,0\n")
    with pytest.raises(TraceError, match="line 3: instance_count must be at least 1"):
        parse_csv(
            "submit,priority,instance_type,instance_count,duration_seconds\n"
            "0,1,ml.trn1.32xlarge,1,60\n"
            "0,1,ml.trn1.32xlarge,0,60\n"
        )


def test_an_empty_trace_and_an_unknown_pool_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="has no jobs"):
        parse_jsonl("\n# nothing\n")
    trace = parse_jsonl(lines(GOOD))
    with pytest.raises(TraceError, match=r"instance type ml.trn1.32xlarge has no pool .*ml.trn2.48xlarge"):
        trace.check_pools({"ml.trn2.48xlarge": 4})
    with pytest.raises(TraceError, match="cannot read trace"):
        load_trace(tmp_path / "missing.jsonl")
