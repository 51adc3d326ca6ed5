"""Logging, metrics and tracing through Powertools, configured in one place.

Logs are structured JSON with the job name and attempt as keys; metrics are CloudWatch EMF under the
namespace POWERTOOLS_METRICS_NAMESPACE (template.yaml sets `SageQueue`). Handlers decorate themselves with
`logger.inject_lambda_context` and `metrics.log_metrics`; use cases add keys and metrics.

Traces come from Lambda's active tracing (`Tracing: Active` in template.yaml), which records each
invocation's segment without any SDK in the package. Powertools' Tracer is deliberately not used: the X-Ray
SDK it loads cost more at every cold start than boto3 itself (docs/adr/0004-cold-start-budget.md).
"""

from __future__ import annotations

from aws_lambda_powertools import Logger, Metrics, single_metric
from aws_lambda_powertools.metrics import MetricUnit

SERVICE = "sagequeue"
NAMESPACE = "SageQueue"

logger = Logger(service=SERVICE)
metrics = Metrics(service=SERVICE, namespace=NAMESPACE)

# --- metric names (one place, so dashboards and alarms agree with the code) ----------------------------------
QUEUE_DEPTH = "QueueDepth"  # queued jobs per pool (dimension Pool)
OLDEST_WAIT = "OldestQueuedWaitSeconds"  # longest wait among the jobs a pass looked at, per pool
STARTS = "JobsStarted"
RESUMES = "JobsResumed"
PREEMPTIONS = "JobsPreempted"
WARM_POOL_REUSES = "WarmPoolReuses"
WARM_POOL_RELEASES = "WarmPoolsReleased"
FINISHED = "JobsFinished"
REQUEUES = "JobsRequeued"
SUBMISSIONS = "JobsSubmitted"
POLICY_STOPS = "JobsStoppedForPolicy"
IDLE_STOPS = "JobsIdleStopped"
TEAM_USED = "TeamInstancesUsed"  # instances a team holds per pool (dimensions Team, Pool)
TEAM_BORROWED = "TeamInstancesBorrowed"  # of those, above its nominal quota
SKIPPED_ON_ERROR = "ItemsSkippedOnError"  # a job or pool a pass or reconcile could not handle, skipped
JOBS_REBUILT = "JobsEnteredFromTags"  # live attempts the table had lost, entered again by the reconcile


def count(name: str, value: float = 1) -> None:
    metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)


def pool_gauge(name: str, pool: str, value: float, unit: MetricUnit = MetricUnit.Count) -> None:
    """A per-pool value, in its own EMF document so its Pool dimension does not leak onto other metrics."""
    with single_metric(name=name, unit=unit, value=value, namespace=NAMESPACE) as metric:
        metric.add_dimension(name="Pool", value=pool)


def team_gauge(name: str, team: str, pool: str, value: float) -> None:
    """A per-team, per-pool value (instances used, borrowed, lent)."""
    with single_metric(name=name, unit=MetricUnit.Count, value=value, namespace=NAMESPACE) as metric:
        metric.add_dimension(name="Team", value=team)
        metric.add_dimension(name="Pool", value=pool)


__all__ = ["MetricUnit", "count", "logger", "metrics", "pool_gauge", "team_gauge"]
