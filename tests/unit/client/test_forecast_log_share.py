"""Which waiting jobs' forecasts go to the forecast log in a run: at most LOG_PER_RUN, the longest unlogged
first, so a tenant who queues more jobs than a run logs cannot keep the rest of a pool out of the log (and
out of what its calibration learns)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from test_live_forecast_inputs import listed

from sagequeue.forecast.calibrate import Calibration
from sagequeue.forecast.engine import Forecast, JobForecast
from sagequeue.forecast.live import LiveQueue
from sagequeue.forecast.stored import _store
from sagequeue_core.domain import JobState
from sagequeue_core.forecasts import LOG_EVERY_SECONDS, LOG_PER_RUN, StartForecast

NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
POOL = "ml.trn1.32xlarge"


class _Store:
    """What `_store` hands the table, kept (the table's own writes are the e2e tests')."""

    def __init__(self) -> None:
        self.latest: list[tuple[StartForecast, datetime | None]] = []
        self.logged: list[StartForecast] = []

    def save_forecasts(self, latest: Any, logged: Any, calibration: Any) -> None:
        self.latest, self.logged = list(latest), list(logged)


def _run(names: list[str], earlier: dict[str, datetime | None]) -> _Store:
    queued = [listed(name, JobState.QUEUED, None) for name in names]
    queue = LiveQueue(now=NOW, capacity={POOL: 1}, warm={}, queued=queued, live=[], completed=[])
    made = Forecast(NOW, {name: JobForecast(name, NOW, (60.0, 120.0, 180.0)) for name in names}, samples=3)
    store = _Store()
    previous = {
        name: (StartForecast(name, POOL, 0, at or NOW, None, None, None, 3), at)
        for name, at in earlier.items()
    }
    _store(SimpleNamespace(store=store), queue, made, previous, Calibration(), 14 * 86400.0)  # type: ignore[arg-type]
    return store


def test_a_flood_of_one_tenants_jobs_ahead_in_the_queue_does_not_keep_the_rest_out_of_the_log() -> None:
    # GIVEN a pool whose queue starts with more of one tenant's jobs than a run logs, logged a while ago
    # (but due again), and behind them jobs never logged
    flood = [f"flood-{i:04d}" for i in range(LOG_PER_RUN + 50)]
    others = [f"other-{i}" for i in range(5)]
    due = NOW - timedelta(seconds=LOG_EVERY_SECONDS + 60)
    # WHEN the forecast function stores this run's forecasts
    store = _run(flood + others, dict.fromkeys(flood, due))
    # THEN the jobs never logged are logged first, and the run logs no more than LOG_PER_RUN
    logged = {forecast.job for forecast in store.logged}
    assert len(logged) == LOG_PER_RUN
    assert set(others) <= logged
    # and each job's "last logged" moves to now exactly when it was logged
    assert {start.job for start, at in store.latest if at == NOW} == logged
    assert len(store.latest) == len(flood) + len(others)


def test_among_jobs_due_again_the_longest_unlogged_go_first_and_recent_ones_wait() -> None:
    names = [f"j-{i:04d}" for i in range(LOG_PER_RUN + 20)]
    # the queue's first 20 were logged last a minute ago (not due); the rest at times further back the
    # further they are in the queue
    earlier: dict[str, datetime | None] = {name: NOW - timedelta(seconds=60) for name in names[:20]}
    for i, name in enumerate(names[20:]):
        earlier[name] = NOW - timedelta(seconds=LOG_EVERY_SECONDS + i)
    store = _run(names, earlier)
    logged = [forecast.job for forecast in store.logged]
    assert set(logged) == set(names[20:])  # all due ones fit in one run here
    # with one more job due than a run logs, the most recently logged of the due ones waits
    extra = [*names, "j-late"]
    earlier["j-late"] = NOW - timedelta(days=1)
    store = _run(extra, earlier)
    logged = [forecast.job for forecast in store.logged]
    assert "j-late" in logged
    assert names[20] not in logged  # logged LOG_EVERY_SECONDS ago, the least overdue
    assert len(logged) == LOG_PER_RUN
