"""notices: sagequeue's job events; tells each job's owner on the job notices topic (start, preemption,
requeue, end)."""

from __future__ import annotations

from typing import Any

from sagequeue_core.observability import logger
from sagequeue_core.runtime import dependencies
from sagequeue_core.service.notices import send_notice


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    notice = send_notice(dependencies(), event)
    return {"notice": None if notice is None else notice.attributes}
