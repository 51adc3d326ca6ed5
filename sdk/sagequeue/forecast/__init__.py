"""When waiting jobs start: the scheduler's own policy run forward from the queue as it is, many times, with
run times and later arrivals drawn from what the queue has seen (docs/forecast.md)."""

from __future__ import annotations

from sagequeue.forecast.engine import Forecast, JobForecast, forecast, replace_job, with_job
from sagequeue.forecast.model import (
    ForecastSettings,
    History,
    QueueState,
    RetainedPool,
    Submission,
    Traits,
    Work,
)

__all__ = [
    "Forecast",
    "ForecastSettings",
    "History",
    "JobForecast",
    "QueueState",
    "RetainedPool",
    "Submission",
    "Traits",
    "Work",
    "forecast",
    "replace_job",
    "with_job",
]
