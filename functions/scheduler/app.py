"""The scheduler's handler: SageMaker state changes, sagequeue's JobQueued/JobChanged, and the one-minute
timer all arrive here, one invocation at a time (reserved concurrency 1)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from sagequeue_core.observability import logger, metrics
from sagequeue_core.runtime import dependencies
from sagequeue_core.service.schedule import handle_event


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    report = handle_event(dependencies(), event)
    return {
        "started": report.started,
        "adopted": report.adopted,
        "preempted": report.preempted,
        "released": report.released,
        "failed": report.failed,
        "waiting": report.waiting,
        "applied": report.applied,
    }
