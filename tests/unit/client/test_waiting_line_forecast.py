"""The waiting line the SDK prints (fit(), boto3 with sagequeue.install) with the stack's stored forecast:
P50 and range when GET /jobs/{name} gave one, unchanged when it gave none, said again only when one comes."""

from __future__ import annotations

from typing import Any

from sagequeue.client import Job
from sagequeue.hook import forecast_key, queue_message

FORECAST = {
    "p10": "2026-03-02T12:40:00+00:00",
    "p50": "2026-03-02T14:10:30+00:00",
    "p90": "2026-03-02T17:05:00+00:00",
    "made_at": "2026-03-02T09:00:00+00:00",
    "runs": 40,
}


def job(**changes: Any) -> Job:
    data = {
        "name": "train",
        "state": "queued",
        "priority": 1,
        "pool": "ml.trn1.32xlarge",
        "attempt": 0,
        "owner": "arn:aws:iam::123456789012:role/u",
        "position": 2,
        "forecast": FORECAST,
        **changes,
    }
    return Job.from_api(data)


def test_the_line_carries_the_forecast_start_and_range() -> None:
    assert queue_message(job()) == (
        "Waiting in the sagequeue queue: position 2 in the queue for ml.trn1.32xlarge, priority 1. "
        "Forecast start 2026-03-02 14:10 UTC (P10-P90 2026-03-02 12:40 UTC to 2026-03-02 17:05 UTC)."
    )


def test_an_open_p90_reads_later() -> None:
    assert queue_message(job(forecast={**FORECAST, "p90": None})).endswith(
        "(P10-P90 2026-03-02 12:40 UTC to later)."
    )


def test_without_a_forecast_the_line_is_as_it_was() -> None:
    for answer in (None, {}, {"p50": None, "made_at": "2026-03-02T09:00:00+00:00"}, "soon"):
        assert queue_message(job(forecast=answer)) == (
            "Waiting in the sagequeue queue: position 2 in the queue for ml.trn1.32xlarge, priority 1."
        )
    # a held job waits for its release, not for capacity: no forecast is shown
    assert "Forecast" not in queue_message(job(state="held"))


def test_the_line_is_said_again_when_a_forecast_comes_not_when_its_p50_moves() -> None:
    assert forecast_key(job(forecast=None)) != forecast_key(job())
    moved = {**FORECAST, "p50": "2026-03-02T16:55:00+00:00"}
    assert forecast_key(job(forecast=moved)) == forecast_key(job())


def test_the_score_table_gives_figures_and_says_plainly_when_data_is_thin() -> None:
    from sagequeue.queue_cli import score_text

    answer = {
        "hours": 24,
        "minimum": 5,
        "pools": [
            {
                "pool": "ml.trn1.32xlarge",
                "forecasts": 12,
                "scored": 10,
                "covered": 8,
                "coverage": 0.8,
                "median_error_seconds": 2460.0,
                "overdue": 1,
                "engine_covered": 6,
                "engine_coverage": 0.6,
                "enough": True,
            },
            {
                "pool": "ml.trn2.48xlarge",
                "forecasts": 3,
                "scored": 2,
                "covered": 2,
                "coverage": None,
                "median_error_seconds": None,
                "overdue": 0,
                "engine_covered": 1,
                "engine_coverage": None,
                "enough": False,
            },
        ],
        "calibration": {
            "made_at": "2026-03-02T09:00:00+00:00",
            # a pool's own; the other takes all pools'; a scale past the bounds is shown bounded
            "pools": {"ml.trn1.32xlarge": {"scale": 1.3142, "shift": 0.0, "weight": 130.2}},
            "all": {"scale": 40.0, "shift": 0.0, "weight": 140.0},
        },
    }
    text = score_text(answer)
    rows = {line.split()[0]: line.split() for line in text.splitlines()[2:4]}
    assert rows["ml.trn1.32xlarge"] == [
        *("ml.trn1.32xlarge", "12", "10", "8", "80", "%", "60", "%", "41m00s", "1", "x1.31"),
    ]
    assert rows["ml.trn2.48xlarge"] == ["ml.trn2.48xlarge", "3", "2", "2", "-", "-", "-", "0", "x3.00"]
    assert "learnt 2026-03-02T09:00:00+00:00" in text
    # with no calibration learnt, the table says the ranges are the engine's
    bare = score_text({**answer, "calibration": {"made_at": None, "pools": {}, "all": None}})
    assert "x1.00" in bare
    assert "no calibration learnt yet" in bare
    assert (
        "ml.trn2.48xlarge: too little data to score (2 forecast(s) of started jobs, 5 needed; 3 made)" in text
    )
    assert "ml.trn1.32xlarge: too little" not in text


def test_forecast_without_score_is_a_usage_error() -> None:
    from click.testing import CliRunner

    from sagequeue.queue_cli import COMMANDS

    result = CliRunner().invoke(COMMANDS["forecast"], ["--endpoint", "http://127.0.0.1:9"])
    assert result.exit_code == 2
    assert "--score" in result.output
