"""Stored forecasts and their calibration against a hostile tenant and bad data, on the local stack.

GIVEN a pool where one long job runs and a tenant's job waits, another pool where a bystander waits, and the
forecast function on its 5-minute timer,
WHEN the tenant holds its job after the forecast function logged forecasts of it (and keeps it held past
their P90), or the table holds a forecast item cut short,
THEN the held job's forecasts are dropped as a cancelled job's are (neither the score nor the calibration
learns from a wait the tenant chose), and a bad item is skipped: GET /jobs/{name} answers, the forecast
function still forecasts every pool.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from test_forecast_cli import OTHER, POOL, request
from test_forecast_cli import sagequeue as sagequeue_cli
from test_forecast_stored import FORECAST_EVERY, _now

from sagequeue.client import QueueClient
from sagequeue.config import save_local_connection
from sagequeue.local import LocalStack
from sagequeue_core.forecasts import StartForecast
from sagequeue_core.runtime import dependencies


@pytest.fixture(scope="module")
def stack() -> Iterator[Any]:
    with LocalStack(settings={"capacity": {POOL: 1, OTHER: 1}}) as running:
        yield running


def _in(pool: str, body: dict[str, Any]) -> dict[str, Any]:
    body["ResourceConfig"]["InstanceType"] = pool
    return body


@pytest.fixture(scope="module")
def queues(stack: Any) -> tuple[QueueClient, QueueClient]:
    """`user` runs a long job in each pool and a bystander waits in OTHER; the tenant `other` waits in POOL."""
    user: QueueClient = stack.client()
    tenant: QueueClient = stack.client("other")
    user.submit(request(stack, "runner", seconds=3 * 3600), priority=5)
    user.submit(_in(OTHER, request(stack, "runner-other", seconds=3 * 3600)), priority=5)
    stack.run_until_idle()
    tenant.submit(request(stack, "tenant-job", seconds=1800), priority=1)
    user.submit(_in(OTHER, request(stack, "bystander", seconds=1800)), priority=1)
    stack.run_until_idle()
    assert tenant.job("tenant-job").state == "queued"
    assert user.job("bystander").state == "queued"
    return user, tenant


def _logged(pool: str, job: str, since: datetime) -> list[Any]:
    return [e for e in dependencies().store.past_forecasts(pool, since, 1000) if e.forecast.job == job]


def test_a_held_jobs_forecasts_are_dropped_not_learnt_from(
    stack: Any, queues: tuple[QueueClient, QueueClient]
) -> None:
    user, tenant = queues
    start = _now(user)
    stack.advance(FORECAST_EVERY)  # the forecast function logs a forecast of every waiting job
    assert _logged(POOL, "tenant-job", start - timedelta(hours=1)), "the tenant's job was not logged"
    # GIVEN a logged forecast of the tenant's job whose P90 has passed (the runner holds the only instance)
    now = _now(user)
    attempt = tenant.job("tenant-job").attempt
    missed = StartForecast(
        "tenant-job",
        POOL,
        attempt,
        now - timedelta(seconds=200),
        now - timedelta(seconds=150),
        now - timedelta(seconds=120),
        now - timedelta(seconds=100),
        10,
    )
    dependencies().store.save_forecasts([], [missed])

    # WHEN the tenant holds its job (its right) and the forecast function's timer fires
    tenant.hold("tenant-job")
    stack.advance(FORECAST_EVERY)

    # THEN its forecasts are settled as gone, as a cancelled job's: a wait the tenant chose says nothing of
    # the pool's forecasts (it was the one miss of the pool, and would widen every range in it)
    entries = _logged(POOL, "tenant-job", start - timedelta(hours=1))
    assert len(entries) >= 2
    assert all(entry.gone for entry in entries), entries
    learnt = user.forecast_calibration()
    assert learnt["made_at"] is not None  # the bystander keeps the function forecasting
    assert learnt["pools"].get(POOL, {"weight": 0.0})["weight"] == 0.0, learnt
    score = {pool["pool"]: pool for pool in user.forecast_score(hours=48)["pools"]}
    assert score[POOL]["overdue"] == 0

    # and once released and started, its earlier forecasts are not scored against that start either
    tenant.release("tenant-job")
    user.cancel("runner")
    stack.run_until_idle()
    for _ in range(12):
        if tenant.job("tenant-job").state in ("starting", "running", "completed"):
            break
        stack.advance(FORECAST_EVERY)
    assert tenant.job("tenant-job").state in ("starting", "running", "completed")
    stack.advance(FORECAST_EVERY)
    score = {pool["pool"]: pool for pool in user.forecast_score(hours=48)["pools"]}
    assert score[POOL]["scored"] == 0, score[POOL]


def test_a_forecast_item_cut_short_or_an_older_calibration_breaks_nothing(
    stack: Any, queues: tuple[QueueClient, QueueClient], tmp_path: Path
) -> None:
    user, _ = queues
    user.submit(_in(OTHER, request(stack, "bystander-2", seconds=1800)), priority=1)
    stack.run_until_idle()
    assert user.job("bystander").state == "queued"
    assert user.job("bystander-2").state == "queued"
    # GIVEN the bystander's latest forecast item without its time (cut short, or written by an older
    # version), another's with a time no date parser reads, and a calibration item of another shape
    dynamodb = stack.aws_client("dynamodb")
    table = stack.settings.table_name
    dynamodb.put_item(
        TableName=table,
        Item={
            "pk": {"S": "FORECAST#bystander-2"},
            "sk": {"S": "FORECAST"},
            "name": {"S": "bystander-2"},
            "forecast_pool": {"S": OTHER},
            "made_at": {"S": "yesterday"},
            "p50": {"N": "12"},
        },
    )
    dynamodb.put_item(
        TableName=table,
        Item={
            "pk": {"S": "FORECAST#bystander"},
            "sk": {"S": "FORECAST"},
            "name": {"S": "bystander"},
            "forecast_pool": {"S": OTHER},
            "runs": {"N": "3"},
        },
    )
    dynamodb.put_item(
        TableName=table,
        Item={
            "pk": {"S": "FORECASTS"},
            "sk": {"S": "CALIBRATION"},
            "detail": {"S": json.dumps({"pools": {OTHER: "x3", POOL: {"scale": "wide"}}, "all": [1, 2]})},
            "made_at": {"S": _now(user).strftime("%Y-%m-%dT%H:%M:%S.%f+0000")},
        },
    )

    # WHEN its owner reads the job, and lists the queue with forecasts, before the function runs again
    # THEN the job answers without a forecast, and the CLI forecasts with the calibration as the identity
    assert user.job("bystander").forecast is None
    assert user.job("bystander-2").forecast is None
    home = tmp_path / "home"
    save_local_connection(stack.connection(), home / "local.json")
    listed = sagequeue_cli("ls", "--start", "--json", "--active", home=home)
    assert listed.code == 0, listed.err
    shown = next(job for job in listed.json["jobs"] if job["name"] == "bystander")["forecast"]
    assert shown["p50"] == shown["engine"]["p50"]
    assert (shown["p10"], shown["p90"]) == (shown["engine"]["p10"], shown["engine"]["p90"])
    text = sagequeue_cli("forecast", "--score", home=home)
    assert text.code == 0, text.err

    # and the forecast function's next run forecasts the pool again (it read the bad item as none)
    stack.advance(FORECAST_EVERY)
    for name in ("bystander", "bystander-2"):
        again = user.job(name).forecast
        assert again is not None, name
        assert again.made_at >= _now(user) - timedelta(seconds=FORECAST_EVERY)


def test_a_forecast_made_after_the_start_it_was_for_is_dropped(
    stack: Any, queues: tuple[QueueClient, QueueClient]
) -> None:
    user, _ = queues
    runner = user.job("runner-other")
    assert runner.state in ("starting", "running")
    assert runner.started_at is not None
    # GIVEN a logged forecast of its first attempt made a second after that attempt started (the queue read
    # as the job left it), whose P90 has long passed
    made_at = runner.started_at + timedelta(seconds=1)
    late = StartForecast(
        "runner-other",
        OTHER,
        runner.attempt - 1,
        made_at,
        made_at + timedelta(seconds=1),
        made_at + timedelta(seconds=2),
        made_at + timedelta(seconds=3),
        10,
    )
    dependencies().store.save_forecasts([], [late])
    # WHEN the forecast function's timer fires
    stack.advance(FORECAST_EVERY)
    # THEN it is settled as nothing to score: neither a start nor a job still waiting past its P90
    entries = _logged(OTHER, "runner-other", made_at - timedelta(seconds=1))
    assert [(entry.gone, entry.started_at) for entry in entries] == [(True, None)], entries
