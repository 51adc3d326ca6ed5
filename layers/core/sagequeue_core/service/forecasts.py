"""The score of the forecasts the stack kept (GET /forecasts/score): any caller may read it, since it names
no job, only per-pool figures (docs/adr/0024-stored-forecasts-and-their-score.md)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sagequeue_core.forecasts import SCORE_READ, PoolScore, calibration_answer, score
from sagequeue_core.runtime import Dependencies
from sagequeue_core.service.access import require_caller


def scores(deps: Dependencies, caller: str | None, hours: int) -> list[PoolScore]:
    """Each pool's logged forecasts made in the last `hours`, scored against the starts that followed: one
    Query per pool (the newest SCORE_READ), arithmetic, no simulation."""
    require_caller(caller)
    now = deps.now()
    since = now - timedelta(hours=hours)
    return [
        score(
            status.pool.instance_type,
            deps.store.past_forecasts(status.pool.instance_type, since, SCORE_READ),
            now,
        )
        for status in deps.store.pools()
    ]


def calibration(deps: Dependencies, caller: str | None) -> dict[str, Any]:
    """The calibration the forecast function last applied, per pool (one GetItem): clients that forecast on
    their own machine apply the same (docs/adr/0026). Per-pool figures only, no job: any caller."""
    require_caller(caller)
    return calibration_answer(deps.store.forecast_calibration())
