"""Forecasts the stack keeps, on a busy pool with a reservation and a loan: the forecast function's forecast
of a waiting job in GET /jobs/{name} (through the client) and in the SDK's waiting line, and `sagequeue
forecast --score` scoring the forecasts it logged against the starts that followed, run as a user runs it.

GIVEN a pool of 2 where one long job runs, a 2-instance job holds a reservation, a small job runs on loan
from it and a low-priority job waits, with the forecast function on its 5-minute timer,
WHEN users read their jobs, wait on them through the SDK, and ask for the score once the jobs started,
THEN a waiting job's stored forecast is shown while fresh and for its current attempt only, the waiting line
carries its P50 and range, and the score counts each logged forecast against its job's first start after
it: one whose range missed is uncovered.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from test_forecast_cli import OTHER, POOL, request
from test_forecast_cli import sagequeue as sagequeue_cli

import sagequeue
from sagequeue.client import Job, QueueClient
from sagequeue.config import save_local_connection
from sagequeue.forecast.calibrate import FLOOR, Calibration, CalibrationSettings, measure
from sagequeue.forecast.stored import REFRESH_SECONDS
from sagequeue.local import LocalStack
from sagequeue_core.forecasts import FRESH_SECONDS, PastForecast, StartForecast
from sagequeue_core.runtime import dependencies

FORECAST_EVERY = 300  # ForecastSchedule's default, rate(5 minutes)


def advance_until(stack: Any, done: Callable[[], bool], *, step: float = 60, limit: float = 6 * 3600) -> None:
    stack.run_until_idle()
    waited = 0.0
    while not done():
        if waited >= limit:
            raise AssertionError(f"condition not reached after {limit:g} simulated seconds")
        stack.advance(step)
        waited += step


@pytest.fixture(scope="module")
def stack() -> Iterator[Any]:
    with LocalStack(settings={"capacity": {POOL: 2, OTHER: 1}}) as running:
        yield running


@pytest.fixture(scope="module")
def home(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("user-home")
    save_local_connection(stack.connection(), where / "local.json")
    return where


@pytest.fixture(scope="module")
def busy(stack: Any) -> QueueClient:
    """A pool of 2: one long job runs, a 2-instance job holds a drain reservation on the free instance, a
    small checkpointed job runs on loan from it, and a low-priority job waits behind them."""
    queue: QueueClient = stack.client()
    queue.submit(request(stack, "done", seconds=1800), priority=5)
    advance_until(stack, lambda: queue.job("done").state == "completed", limit=5400)
    queue.submit(request(stack, "runner", seconds=3 * 3600), priority=5)
    stack.run_until_idle()
    queue.submit(request(stack, "wide", count=2, seconds=3600), priority=5)
    stack.run_until_idle()
    stack.advance(1900)  # waited at the head past reserve_after_seconds: it reserves what it can
    stack.run_until_idle()
    assert queue.job("wide").raw.get("reservation"), queue.job("wide").reason
    queue.submit(request(stack, "borrower", seconds=2 * 3600), priority=3)
    advance_until(stack, lambda: queue.job("borrower").raw.get("on_loan_for") == "wide", limit=600)
    queue.submit(request(stack, "waiter", seconds=3600, checkpoint=False), priority=1)
    stack.run_until_idle()
    return queue


def _now(queue: QueueClient) -> datetime:
    queue.whoami()
    assert queue.server_time is not None
    return queue.server_time


def _first_start_after(job: Job, made: StartForecast) -> datetime | None:
    """From the job's history as the API lists it: the first entry of the attempt after the forecast's."""
    for entry in job.history:
        if entry.attempt == made.attempt + 1 and entry.state in ("starting", "running") and entry.at:
            return entry.at
    return None


def test_get_job_answers_the_stored_forecast_of_a_waiting_job(stack: Any, busy: QueueClient) -> None:
    stack.advance(FORECAST_EVERY)  # the forecast function's timer fires
    now = _now(busy)
    waiter = busy.job("waiter")
    predicted = waiter.forecast
    assert predicted is not None, waiter.raw.get("forecast")
    assert predicted.p10 is not None
    assert predicted.p50 is not None
    assert predicted.p90 is not None
    assert predicted.p10 <= predicted.p50 <= predicted.p90
    # refreshed at least every REFRESH_SECONDS (at once when a job joins the queue), so never stale here
    assert now - timedelta(seconds=REFRESH_SECONDS + FORECAST_EVERY) <= predicted.made_at <= now
    assert predicted.runs >= 3
    # the runner holds one instance and the borrower the other: the waiter starts after one of them ends
    assert predicted.p10 > predicted.made_at + timedelta(minutes=5)
    wide = busy.job("wide").forecast
    assert wide is not None
    assert wide.p50 is not None
    assert wide.p50 < predicted.p50  # the reservation holder goes first
    runner = busy.job("runner")
    assert runner.state in ("starting", "running")
    assert runner.forecast is None
    assert runner.raw["forecast"] is None
    # the request's MaxRuntimeInSeconds, listed for every job (the forecast's bound on its run time)
    assert {j.raw.get("max_runtime_seconds") for j in busy.jobs()} == {4 * 3600}

    # GIVEN a stored forecast too old, or made for an earlier attempt, THEN GET shows none
    store = dependencies().store
    old = StartForecast("waiter", POOL, 0, now - timedelta(seconds=FRESH_SECONDS + 60), now, now, now, 10)
    store.save_forecasts([(old, None)])
    assert busy.job("waiter").forecast is None
    earlier = StartForecast("waiter", POOL, waiter.attempt + 1, now, now, now, now, 10)
    store.save_forecasts([(earlier, None)])
    assert busy.job("waiter").forecast is None
    # the next run replaces them
    stack.advance(FORECAST_EVERY)
    again = busy.job("waiter").forecast
    assert again is not None
    assert again.made_at > predicted.made_at


def test_the_waiting_line_shows_the_forecast_start_and_stays_quiet_without_one(
    stack: Any, busy: QueueClient
) -> None:
    lines: list[str] = []
    client = stack.emulator.client()
    sagequeue.install(client, client=busy, report=lines.append)
    try:
        described = client.describe_training_job(TrainingJobName="waiter")
        predicted = busy.job("waiter").forecast
        assert predicted is not None
        assert predicted.p50 is not None
        p50 = predicted.p50.strftime("%Y-%m-%d %H:%M UTC")
        said = [line for line in lines if line.startswith("sagequeue: waiter:")]
        assert said, lines
        assert f"Forecast start {p50} (P10-P90 " in said[-1], lines
        assert f"Forecast start {p50}" in described["SecondaryStatusTransitions"][-1]["StatusMessage"]
        # a job submitted since the last forecast run has no stored forecast: the line says where it waits only
        client.create_training_job(**request(stack, "fresh", seconds=3600))
        client.describe_training_job(TrainingJobName="fresh")
        fresh = [line for line in lines if line.startswith("sagequeue: fresh:")]
        assert fresh, lines
        assert "Waiting in the sagequeue queue" in fresh[-1], lines
        assert "Forecast" not in fresh[-1]
    finally:
        sagequeue.uninstall(client)
        busy.cancel("fresh")
        stack.run_until_idle()


def test_forecast_score_counts_each_logged_forecast_against_the_start_that_followed(
    stack: Any, busy: QueueClient, home: Path
) -> None:
    now = _now(busy)
    # GIVEN a logged forecast whose range the start will miss: the waiter within three minutes
    store = dependencies().store
    missed = StartForecast(
        "waiter",
        POOL,
        busy.job("waiter").attempt,
        now - timedelta(seconds=1),
        now + timedelta(minutes=1),
        now + timedelta(minutes=2),
        now + timedelta(minutes=3),
        10,
    )
    store.save_forecasts([], [missed])
    early = sagequeue_cli("forecast", "--score", home=home)
    assert early.code == 0, early.err
    assert f"{OTHER}: too little data to score (0 forecast(s) of started jobs" in early.out

    # WHEN every job of the pool has started (the runner ends, the wide job runs, then the waiter)
    advance_until(stack, lambda: busy.job("waiter").state in ("starting", "running", "completed"))
    stack.advance(FORECAST_EVERY)  # a run settles the forecasts of the jobs that started

    answer = sagequeue_cli("forecast", "--score", "--json", "--hours", "48", home=home)
    assert answer.code == 0, answer.err
    scores = {pool["pool"]: pool for pool in json.loads(answer.out)["pools"]}

    # THEN its figures are those of the logged forecasts against each job's start as GET /jobs lists it
    logged: list[PastForecast] = store.past_forecasts(POOL, now - timedelta(hours=48), 1000)
    starts = {entry.forecast.job: busy.job(entry.forecast.job) for entry in logged}
    scored = [
        (entry.forecast, start)
        for entry in logged
        if (start := _first_start_after(starts[entry.forecast.job], entry.forecast)) is not None
    ]
    covered = [made for made, start in scored if made.p10 <= start <= made.p90]  # type: ignore[operator]
    errors = [abs((start - made.p50).total_seconds()) for made, start in scored]  # type: ignore[operator]
    pool = scores[POOL]
    assert pool["forecasts"] == len(logged)
    assert pool["scored"] == len(scored) >= 5
    assert pool["covered"] == len(covered)
    assert missed.made_at in {made.made_at for made, _ in scored}
    assert missed.made_at not in {made.made_at for made in covered}  # its range missed: uncovered
    assert pool["covered"] < pool["scored"]
    assert pool["coverage"] == pytest.approx(len(covered) / len(scored))
    assert pool["median_error_seconds"] == pytest.approx(statistics.median(errors), abs=0.1)
    assert pool["enough"] is True
    assert scores[OTHER]["forecasts"] == 0
    assert scores[OTHER]["coverage"] is None

    text = sagequeue_cli("forecast", "--score", "--hours", "48", home=home)
    assert text.code == 0, text.err
    row = next(line for line in text.out.splitlines() if line.startswith(POOL))
    assert f"{round(100 * len(covered) / len(scored))} %" in row
    assert f"{OTHER}: too little data" in text.out


def _seconds(at: str | None, made_at: datetime) -> float:
    return math.inf if at is None else (datetime.fromisoformat(at) - made_at).total_seconds()


def test_stored_and_cli_forecasts_carry_the_calibration_learnt_from_the_log_and_no_more_than_its_bound(
    stack: Any, busy: QueueClient, home: Path
) -> None:
    # GIVEN a log whose past forecasts of the pool all saw their jobs start ten days after their P90 (as a
    # tenant might arrange by the jobs it submits and cancels: the most it can do to the calibration)
    store = dependencies().store
    now = _now(busy)
    past = [
        StartForecast(
            f"past-{i:03d}",
            POOL,
            0,
            now - timedelta(hours=1, minutes=i),
            now - timedelta(minutes=50),
            now - timedelta(minutes=40),
            now - timedelta(minutes=30),
            10,
        )
        for i in range(60)
    ]
    store.save_forecasts([], past)
    store.settle_forecasts([PastForecast(made, started_at=now + timedelta(days=10)) for made in past])
    # and a job waiting in the pool behind two long ones
    for name in ("long-a", "long-b"):
        busy.submit(request(stack, name, seconds=3 * 3600), priority=9)
    busy.submit(request(stack, "late", seconds=1800), priority=1)
    stack.run_until_idle()
    assert busy.job("late").state == "queued", busy.job("late").reason

    # WHEN the forecast function's timer fires
    stack.advance(FORECAST_EVERY)

    # THEN it learnt from its log to widen the pool's ranges, as far as the bound and no further
    learnt = busy.forecast_calibration()
    assert learnt["made_at"] is not None
    settings = CalibrationSettings()
    assert learnt["pools"][POOL]["scale"] == pytest.approx(settings.max_scale)
    calibration = Calibration.from_api(learnt)
    # the stored forecast is the engine's with that calibration applied, and keeps the engine's beside it
    stored = store.job_forecast("late")
    assert stored is not None
    made = stored[0]
    assert made.engine is not None
    engine = tuple(_seconds(None if at is None else at.isoformat(), made.made_at) for at in made.engine)
    shown = tuple(
        _seconds(None if at is None else at.isoformat(), made.made_at)
        for at in (made.p10, made.p50, made.p90)
    )
    assert shown == pytest.approx(calibration.apply(POOL, engine), abs=1e-3)  # type: ignore[arg-type]
    assert shown[1] == pytest.approx(engine[1], abs=1e-3)  # the P50 is the engine's
    assert shown[0] <= engine[0]
    assert shown[2] >= engine[2]
    # at most max_scale times the engine's range in log-wait on each side of the P50
    if not math.isinf(engine[2]):
        assert (
            measure(shown[2]) - measure(shown[1])
            <= settings.max_scale * max(measure(engine[2]) - measure(engine[1]), FLOOR) + 1e-9
        )
    # GET /jobs/{name} (the SDK's waiting line) shows the calibrated range
    answered = busy.job("late").forecast
    assert answered is not None
    assert (answered.p10, answered.p50, answered.p90) == (made.p10, made.p50, made.p90)

    # and the CLI, forecasting on the caller's machine, applies the same calibration to its own forecasts
    listed = sagequeue_cli("ls", "--start", "--json", "--active", home=home)
    assert listed.code == 0, listed.err
    shown_by = {"ls --start": next(job for job in listed.json["jobs"] if job["name"] == "late")["forecast"]}
    for command in (("show", "late"), ("why", "late")):
        answer = sagequeue_cli(*command, "--json", home=home)
        assert answer.code == 0, answer.err
        shown_by[command[0]] = answer.json["forecast"]
    dry = sagequeue_cli(
        "submit",
        "-",
        "--priority",
        "1",
        "--dry-run",
        "--json",
        home=home,
        stdin=json.dumps(request(stack, "maybe")),
    )
    assert dry.code == 0, dry.err
    shown_by["submit --dry-run"] = dry.json["forecast"]
    for command, forecast in shown_by.items():
        at = datetime.fromisoformat(forecast["made_at"])
        cli_engine = tuple(_seconds(forecast["engine"][q], at) for q in ("p10", "p50", "p90"))
        cli_shown = tuple(_seconds(forecast[q], at) for q in ("p10", "p50", "p90"))
        assert cli_shown == pytest.approx(calibration.apply(POOL, cli_engine), abs=1e-3), command  # type: ignore[arg-type]
        assert cli_shown[0] <= cli_engine[0], command
        assert cli_shown[2] >= cli_engine[2], command

    # `sagequeue forecast --score` shows the calibration in use per pool
    text = sagequeue_cli("forecast", "--score", "--hours", "48", home=home)
    assert text.code == 0, text.err
    row = next(line for line in text.out.splitlines() if line.startswith(POOL))
    assert row.rstrip().endswith(f"x{settings.max_scale:.2f}"), text.out
    assert "ranges calibrated by what past forecasts of the pool got wrong" in text.out
