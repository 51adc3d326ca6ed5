"""Every named error sagequeue raises on purpose, in one flat module.

Callers catch these by name; none of them is ever told apart by its message text.
"""

from __future__ import annotations

from sagequeue_core.domain import DomainError


class SageQueueError(Exception):
    """Base of sagequeue's named errors."""


# --- the table -----------------------------------------------------------------------------------------------


class StoreError(SageQueueError):
    """A write to the table was refused."""


class StaleVersion(StoreError):
    """The item changed since it was read (another writer, a replayed event); re-read and decide again."""


class LedgerMoved(StoreError):
    """A pool's ledger changed since the pass read it (another pass started work there): the start it was
    about to record could exceed the pool; the next pass decides again on what is there now."""


class JobAlreadyExists(StoreError):
    """A job with this name is already in the queue (or was, and still is in the table)."""


class JobNotFound(StoreError):
    """No job of that name."""


class PoolNotFound(StoreError):
    """No pool for that instance type."""


# --- SageMaker -----------------------------------------------------------------------------------------------


class SageMakerError(SageQueueError):
    """A SageMaker call failed; `code` is the service's error code."""

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code


class AttemptNameTaken(SageMakerError):
    """The attempt's name belongs to a training job sagequeue did not start for this job."""


class ResourceLimitExceeded(SageMakerError):
    """The account's quota for the instance type is used up; the job stays queued.

    Where SageMaker's answer states them (its "The account-level service limit '<type> for training job
    usage' is N Instances, with current utilization of M Instances" sentence), `instance_type`, `limit` and
    `utilization` carry the figures; None otherwise."""

    def __init__(
        self,
        message: str,
        code: str = "",
        *,
        instance_type: str | None = None,
        limit: int | None = None,
        utilization: int | None = None,
    ) -> None:
        super().__init__(message, code)
        self.instance_type = instance_type
        self.limit = limit
        self.utilization = utilization


class Throttled(SageMakerError):
    """SageMaker asked us to slow down; the call can be retried on a later pass."""


class SageMakerValidationError(SageMakerError):
    """SageMaker refused the request itself; retrying the same request cannot succeed."""


class TrainingJobNotFound(SageMakerError):
    """No training job of that name."""


class SageMakerUnavailable(SageMakerError):
    """A transient service-side failure (InternalFailure, ServiceUnavailable)."""


# --- requests ------------------------------------------------------------------------------------------------


class RequestInvalid(DomainError):
    """A request breaks a rule; the message names the field or the rule (HTTP 400)."""


class Forbidden(SageQueueError):
    """The caller may not do this (HTTP 403)."""
