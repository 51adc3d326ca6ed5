"""governance: SageMaker training job state changes (every job in the account) and the reconcile timer."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from sagequeue_core.events import MalformedEvent, is_training_job_event
from sagequeue_core.observability import logger, metrics
from sagequeue_core.runtime import dependencies
from sagequeue_core.service.govern import governance_from

#: What EventBridge sends for a schedule (the reconcile timer).
SCHEDULED_EVENT = "Scheduled Event"


@logger.inject_lambda_context(clear_state=True)
@metrics.log_metrics
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    governance = governance_from(dependencies())
    if is_training_job_event(event):
        name = (event.get("detail") or {}).get("TrainingJobName")
        logger.append_keys(training_job_name=name)
        return asdict(governance.on_event(event))
    if event.get("detail-type") == SCHEDULED_EVENT:
        report = governance.reconcile()
        return {"jobs_seen": report.jobs_seen, "orphans_deleted": report.orphans_deleted}
    # Retrying cannot help an event of the wrong kind: fail loudly so it lands in the DLQ for a look.
    raise MalformedEvent(
        f"governance handles SageMaker training job state changes and its timer, not "
        f"source={event.get('source')!r} detail-type={event.get('detail-type')!r}"
    )
