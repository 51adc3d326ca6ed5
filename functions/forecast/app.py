"""The forecast function's handler: on its timer, forecast every waiting job from the table and store the
forecasts GET /jobs/{name} shows, then settle logged forecasts whose jobs started
(docs/adr/0024-stored-forecasts-and-their-score.md). The engine is the SDK's (the ForecastLayer)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from sagequeue.forecast.stored import publish
from sagequeue_core.observability import logger
from sagequeue_core.runtime import dependencies


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    done = publish(dependencies())
    logger.info(
        "forecasts stored", extra={"forecast": done.forecast, "logged": done.logged, "runs": done.runs}
    )
    return {"forecast": done.forecast, "logged": done.logged, "settled": done.settled, "runs": done.runs}
