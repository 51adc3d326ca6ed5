"""How the queue commands lay out jobs and pools, and how long a job waited and ran."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import click
import pytest

from sagequeue.client import Job, Pool
from sagequeue.queue_cli import COMMANDS, jobs_table, pools_table, ran, waited

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def job(name: str, state: str, priority: int, **times: Any) -> Job:
    data: dict[str, Any] = {
        "name": name,
        "state": state,
        "priority": priority,
        "pool": "ml.trn1.32xlarge",
        "attempt": 1 if times.get("started_at") else 0,
        "owner": "arn:aws:iam::1:user/a",
        "instances": 1,
    }
    data.update({k: v.isoformat() for k, v in times.items()})
    return Job.from_api(data)


def test_waited_and_ran_follow_the_jobs_life() -> None:
    queued = job("q", "queued", 1, submitted_at=NOW - timedelta(minutes=12, seconds=30))
    running = job(
        "r",
        "running",
        5,
        submitted_at=NOW - timedelta(hours=1),
        started_at=NOW - timedelta(minutes=41, seconds=5),
    )
    done = job(
        "d",
        "completed",
        5,
        submitted_at=NOW - timedelta(days=2),
        started_at=NOW - timedelta(days=1, hours=23),
        ended_at=NOW - timedelta(days=1),
    )
    assert (waited(queued, NOW), ran(queued, NOW)) == (750.0, None)
    assert (waited(running, NOW), ran(running, NOW)) == (19 * 60 - 5.0, 41 * 60 + 5.0)
    assert (waited(done, NOW), ran(done, NOW)) == (3600.0, 23 * 3600.0)


def test_a_starting_job_has_waited_but_not_yet_run() -> None:
    # GIVEN a job the scheduler started 3 minutes ago whose attempt is still starting on SageMaker
    starting = job(
        "s",
        "starting",
        5,
        submitted_at=NOW - timedelta(minutes=10),
        started_at=NOW - timedelta(minutes=3),
    )

    # THEN it waited until it was started, has run for no time yet, and the table says '-' under RAN
    assert (waited(starting, NOW), ran(starting, NOW)) == (420.0, None)
    header, row = jobs_table([starting], NOW).splitlines()[:2]
    assert row.split()[header.split().index("RAN")] == "-"


def test_the_table_is_ordered_by_priority_then_submission_with_short_durations() -> None:
    jobs = [
        job("late-low", "queued", 1, submitted_at=NOW - timedelta(seconds=40)),
        job("early-low", "queued", 1, submitted_at=NOW - timedelta(minutes=2)),
        job(
            "high",
            "running",
            300,
            submitted_at=NOW - timedelta(days=1, hours=3),
            started_at=NOW - timedelta(days=1, hours=2),
        ),
    ]
    lines = jobs_table(jobs, NOW).splitlines()
    assert [line.split() for line in lines] == [
        ["NAME", "STATE", "PRIORITY", "ATTEMPT", "POOL", "POSITION", "WAITED", "RAN", "CKPT", "REASON"],
        ["high", "running", "300", "1", "ml.trn1.32xlarge", "-", "1h00m", "1d02h", "-", "-"],
        ["early-low", "queued", "1", "0", "ml.trn1.32xlarge", "-", "2m00s", "-", "-", "-"],
        ["late-low", "queued", "1", "0", "ml.trn1.32xlarge", "-", "40s", "-", "-", "-"],
    ]
    # columns line up: every row starts its POOL column at the same place
    assert len({line.index("ml.trn1") for line in lines[1:]}) == 1


def test_a_terminal_gets_a_rich_table_of_the_same_cells_and_a_pipe_the_plain_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    jobs = [job("early", "queued", 5, submitted_at=NOW - timedelta(minutes=2))]
    monkeypatch.delenv("SAGEQUEUE_TABLES", raising=False)
    plain = jobs_table(jobs, NOW)  # pytest's stdout is no terminal
    assert "\x1b[" not in plain
    assert plain.splitlines()[1].split() == [
        "early",
        "queued",
        "5",
        "0",
        "ml.trn1.32xlarge",
        "-",
        "2m00s",
        "-",
        "-",
        "-",
    ]
    monkeypatch.setenv("SAGEQUEUE_TABLES", "rich")
    monkeypatch.setenv("COLUMNS", "160")  # rich's width when stdout is no terminal (a pytest-xdist worker)
    styled = jobs_table(jobs, NOW)
    assert "\x1b[1m" in styled  # bold headings
    cells = [line.split() for line in re.sub(r"\x1b\[[0-9;]*m", "", styled).splitlines() if line.strip()]
    assert cells[0] == plain.splitlines()[0].split()
    assert ["early", "queued", "5", "0", "ml.trn1.32xlarge", "-", "2m00s", "-", "-", "-"] in cells
    monkeypatch.setenv("SAGEQUEUE_TABLES", "fancy")
    with pytest.raises(click.ClickException, match="SAGEQUEUE_TABLES='fancy': use rich or plain"):
        jobs_table(jobs, NOW)


def test_pools_table_shows_free_instances() -> None:
    pools = [
        Pool.from_api({"instance_type": "ml.trn2.48xlarge", "capacity": 4, "used": 3, "queued": 7, "warm": 1})
    ]
    assert pools_table(pools).splitlines()[1].split() == ["ml.trn2.48xlarge", "4", "3", "1", "7", "1", "-"]
    learned = Pool.from_api({"instance_type": "ml.trn2.48xlarge", "capacity": 4, "warm_quota": 0})
    assert pools_table([learned]).splitlines()[0].split()[-1] == "WARM_QUOTA"
    assert pools_table([learned]).splitlines()[1].split()[-1] == "0", "SageMaker retained no warm pool"


@pytest.mark.parametrize(
    "name", ["submit", "ls", "show", "cancel", "priority", "hold", "release", "pools", "capacity", "whoami"]
)
def test_every_queue_command_takes_the_endpoint_options(name: str) -> None:
    options = {opt for param in COMMANDS[name].params for opt in getattr(param, "opts", [])}
    assert {"--endpoint", "--stack-name", "--region", "--profile", "--api-id", "--json"} <= options


def test_show_prints_the_counters_and_only_the_latest_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from sagequeue import queue_cli

    # GIVEN a job preempted 5,000 times, as the API answers GET /jobs/{name}
    veteran = job("veteran", "running", 1, submitted_at=NOW - timedelta(days=9), started_at=NOW)
    raw = {
        **veteran.raw,
        "attempt": 5001,
        "preemptions": 5000,
        "attempts_ended": 5000,
        "seconds_trained": 300_125,
        "attempts": ["veteran", *(f"veteran--{n}" for n in range(2, 5002))],
    }

    class Client:
        endpoint = "https://queue.example"
        server_time = NOW

        def job(self, name: str) -> Job:
            assert name == "veteran"
            return Job.from_api(raw)

    monkeypatch.setattr(queue_cli.Target, "client", lambda self: Client())
    result = CliRunner().invoke(COMMANDS["show"], ["veteran", "--endpoint", "https://queue.example"])

    # THEN the totals are shown, and the attempts list is bounded
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "attempts ended  5000" in lines
    assert "trained         3d11h (300125 s, ended attempts)" in lines
    attempts = lines[lines.index("attempts") + 1 : lines.index("attempts") + 1 + queue_cli.SHOWN_ATTEMPTS + 1]
    assert attempts[0] == f"  ... {5001 - queue_cli.SHOWN_ATTEMPTS} earlier"
    assert attempts[-1] == "  5001  veteran--5001"
