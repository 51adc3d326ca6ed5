"""The account's quota is learned per instance type, from the figures SageMaker states in its refusal."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

from sagequeue_core.domain import Job, Pool
from sagequeue_core.sagemaker import quota_refusal
from sagequeue_core.service.schedule import _quota_limits
from sagequeue_core.store import PoolStatus

NOW = datetime(2026, 1, 1, tzinfo=UTC)
TRN1 = "ml.trn1.32xlarge"
PLAN = "plan:reserved"
REFUSAL = (
    "The account-level service limit 'ml.trn1.32xlarge for training job usage' is 3 Instances, with current "
    "utilization of 1 Instances and a request delta of 3 Instances. Please use AWS Service Quotas to request "
    "an increase for this quota."
)


def test_the_refusal_states_the_limit_and_the_utilization() -> None:
    refused = quota_refusal(REFUSAL)
    assert (refused.instance_type, refused.limit, refused.utilization) == (TRN1, 3, 1)


def test_a_refusal_without_figures_is_still_a_quota_refusal() -> None:
    refused = quota_refusal("Resource limit exceeded")
    assert refused.code == "ResourceLimitExceeded"
    assert (refused.instance_type, refused.limit, refused.utilization) == (None, None, None)


def _status(pool: str, capacity: int, quota: int | None = None) -> PoolStatus:
    return PoolStatus(Pool(pool, capacity), 0, quota=quota, quota_seen_at=NOW if quota is not None else None)


def test_a_quota_of_a_type_is_shared_by_every_pool_of_the_type() -> None:
    # GIVEN a quota of 3 trn1 learned on the on-demand pool, and a training plan's pool holding 2 trn1
    held = Counter({(TRN1, TRN1): 1, (TRN1, PLAN): 2})
    statuses = [_status(TRN1, 4, quota=3), _status(PLAN, 4)]
    # THEN the on-demand pool may hold 3 - 2 and the plan's pool 3 - 1
    assert _quota_limits(statuses, held, [], NOW) == {TRN1: 1, PLAN: 2}


def test_a_pool_of_another_type_is_not_limited() -> None:
    held = Counter({(TRN1, TRN1): 3, ("ml.trn2.48xlarge", "ml.trn2.48xlarge"): 1})
    statuses = [_status(TRN1, 4, quota=3), _status("ml.trn2.48xlarge", 2)]
    assert _quota_limits(statuses, held, [], NOW) == {TRN1: 3}


def test_a_queued_job_tells_a_plan_pools_instance_type() -> None:
    request = {
        "TrainingJobName": "p",
        "ResourceConfig": {
            "InstanceType": TRN1,
            "InstanceCount": 1,
            "TrainingPlanArn": "arn:aws:sagemaker:us-east-1:123456789012:training-plan/reserved",
        },
    }
    job = Job(name="p", request=request, priority=5, owner="o", submitted_at=NOW)
    assert job.pool == PLAN
    held = Counter({(TRN1, TRN1): 3})
    statuses = [_status(TRN1, 4, quota=3), _status(PLAN, 4)]
    # the on-demand pool used the whole quota: the plan's pool may hold none of the type
    assert _quota_limits(statuses, held, [job], NOW) == {TRN1: 3, PLAN: 0}
