"""idle_stop: the idle alarms' SNS topic; stops the training job an alarm caught idle."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sagequeue_core.observability import logger, metrics
from sagequeue_core.runtime import dependencies
from sagequeue_core.service.stop_idle import idle_stop_from


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    outcomes = idle_stop_from(dependencies()).on_sns(event)
    return {"outcomes": [asdict(outcome) for outcome in outcomes]}
