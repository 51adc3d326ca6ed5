"""The SageMaker adapter: every training-job call sagequeue makes, behind named errors.

Errors are told apart by the ClientError code, never by message text. Create is idempotent because
attempt names are deterministic: ResourceInUse on our own attempt (it carries the request's
`sagequeue:seal`, an HMAC of its name under a secret only the table holds) means an earlier create went
through. Stop is idempotent: stopping a job that has ended or does not exist
is not an error.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from botocore.exceptions import ClientError, ParamValidationError

from sagequeue_core.defaults import JOB_TAG, SEAL_TAG
from sagequeue_core.domain import ResourceKey, tags_to_dict
from sagequeue_core.errors import (
    AttemptNameTaken,
    ResourceLimitExceeded,
    SageMakerError,
    SageMakerUnavailable,
    SageMakerValidationError,
    Throttled,
    TrainingJobNotFound,
)

#: Training job statuses after which a job holds no instances of its own (a warm pool may remain).
ENDED_STATUSES = frozenset({"Completed", "Failed", "Stopped"})

_THROTTLING_CODES = frozenset({"ThrottlingException", "Throttling", "TooManyRequestsException"})
_UNAVAILABLE_CODES = frozenset({"InternalFailure", "InternalServerError", "ServiceUnavailable"})
_NOT_FOUND_CODES = frozenset({"ResourceNotFound", "ResourceNotFoundException"})


class FailureKind(StrEnum):
    """What a Failed job's FailureReason says about retrying it."""

    CAPACITY = "capacity"  # EC2 had no instances: retry later
    INTERNAL = "internal"  # a SageMaker-side fault: retry
    JOB = "job"  # the job itself failed (algorithm, client, data): do not retry


def classify_failure(failure_reason: str | None) -> FailureKind:
    """SageMaker prefixes FailureReason with the error class ("CapacityError: Unable to provision ...")."""
    reason = (failure_reason or "").lstrip()
    if reason.startswith("CapacityError"):
        return FailureKind.CAPACITY
    if reason.startswith("InternalServerError"):
        return FailureKind.INTERNAL
    return FailureKind.JOB


@dataclass(frozen=True)
class CreateResult:
    training_job_name: str
    arn: str | None
    already_started: bool  # an earlier create of this very attempt had gone through


@dataclass(frozen=True)
class AvailableWarmPool:
    training_job_name: str
    resource_key: ResourceKey


#: The figures of SageMaker's account-quota refusal: the only word on the quota sagequeue gets. The error
#: is told apart by its code; its message is read only for the figures, and a message without them still
#: makes a ResourceLimitExceeded (the scheduler then falls back to what it holds).
_QUOTA_FIGURES = re.compile(
    r"'(?P<type>ml\.[a-z0-9.-]+) for training job usage' is (?P<limit>\d+) Instances?, "
    r"with current utilization of (?P<used>\d+) Instances?"
)


def quota_refusal(message: str, code: str = "ResourceLimitExceeded") -> ResourceLimitExceeded:
    """A ResourceLimitExceeded with the limit and utilization SageMaker's message states, if it does."""
    found = _QUOTA_FIGURES.search(message)
    if found is None:
        return ResourceLimitExceeded(message, code)
    return ResourceLimitExceeded(
        message,
        code,
        instance_type=found["type"],
        limit=int(found["limit"]),
        utilization=int(found["used"]),
    )


def _error(exc: ClientError) -> SageMakerError:
    code = str(exc.response.get("Error", {}).get("Code", ""))
    message = str(exc.response.get("Error", {}).get("Message", "")) or str(exc)
    if code == "ResourceLimitExceeded":
        return quota_refusal(message, code)
    if code in _THROTTLING_CODES:
        return Throttled(message, code)
    if code == "ValidationException":
        return SageMakerValidationError(message, code)
    if code in _NOT_FOUND_CODES:
        return TrainingJobNotFound(message, code)
    if code in _UNAVAILABLE_CODES:
        return SageMakerUnavailable(message, code)
    return SageMakerError(message, code)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class SageMakerAdapter:
    """Training-job calls over one boto3 SageMaker client (created once, injected)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def create_attempt(self, request: Mapping[str, Any], *, job_name: str) -> CreateResult:
        """Create the training job `request` describes (its TrainingJobName is the attempt's name).

        ResourceInUse on a job carrying this request's seal (SEAL_TAG, which only the scheduler can make)
        means an earlier try went through: that is a success. On any other job of that name, whatever its
        other tags say, it is AttemptNameTaken.
        """
        name = str(request["TrainingJobName"])
        try:
            response = self.client.create_training_job(**request)
        except ParamValidationError as exc:
            # botocore refused the request before sending it: the request itself is wrong, and sending it
            # again cannot succeed (the API validates submissions, so this is a request stored earlier or
            # a model that changed since).
            raise SageMakerValidationError(f"invalid request: {exc}", "ParamValidationError") from exc
        except ClientError as exc:
            if _code(exc) != "ResourceInUse":
                raise _error(exc) from exc
            existing = self.describe(name)
            arn = existing.get("TrainingJobArn")
            tags = self.tags(arn) if arn else {}
            seal = tags_to_dict(request.get("Tags")).get(SEAL_TAG)
            found = tags.get(SEAL_TAG)
            if (
                tags.get(JOB_TAG) != job_name
                or seal is None
                or found is None
                or not hmac.compare_digest(seal, found)
            ):
                raise AttemptNameTaken(
                    f"training job {name} exists and was not started by sagequeue for job {job_name}",
                    "ResourceInUse",
                ) from exc
            return CreateResult(name, arn, already_started=True)
        return CreateResult(name, response.get("TrainingJobArn"), already_started=False)

    def describe(self, training_job_name: str) -> dict[str, Any]:
        try:
            response: dict[str, Any] = self.client.describe_training_job(TrainingJobName=training_job_name)
        except ClientError as exc:
            # SageMaker answers an unknown training job with ValidationException ("Requested resource not
            # found"); a well-formed name has no other reason to be refused by Describe.
            if _code(exc) in _NOT_FOUND_CODES or _code(exc) == "ValidationException":
                raise TrainingJobNotFound(f"no training job named {training_job_name}", _code(exc)) from exc
            raise _error(exc) from exc
        response.pop("ResponseMetadata", None)
        return response

    def tags(self, arn: str) -> dict[str, str]:
        tags: list[dict[str, str]] = []
        kwargs: dict[str, Any] = {"ResourceArn": arn}
        while True:
            try:
                page = self.client.list_tags(**kwargs)
            except ClientError as exc:
                raise _error(exc) from exc
            tags.extend(page.get("Tags", []))
            token = page.get("NextToken")
            if not token:
                return tags_to_dict(tags)
            kwargs["NextToken"] = token

    def stop(self, training_job_name: str) -> bool:
        """Ask SageMaker to stop the job; False when it had already ended or does not exist (not an error)."""
        try:
            self.client.stop_training_job(TrainingJobName=training_job_name)
        except ClientError as exc:
            if _code(exc) in _NOT_FOUND_CODES:
                return False
            if _code(exc) != "ValidationException":
                raise _error(exc) from exc
            # ValidationException is what an ended or unknown job gets; tell them apart by asking, not by
            # reading the message.
            try:
                status = self.describe(training_job_name).get("TrainingJobStatus")
            except TrainingJobNotFound:
                return False
            if status in ENDED_STATUSES or status == "Stopping":
                return False
            raise _error(exc) from exc
        return True

    def set_keep_alive(self, training_job_name: str, seconds: int) -> None:
        """Change the warm-pool keep-alive; 0 on an Available warm pool releases its instances."""
        try:
            self.client.update_training_job(
                TrainingJobName=training_job_name,
                ResourceConfig={"KeepAlivePeriodInSeconds": seconds},
            )
        except ClientError as exc:
            raise _error(exc) from exc

    def list_training_jobs(self, **filters: Any) -> Iterator[dict[str, Any]]:
        """Every summary matching `filters`, all pages: MaxResults is applied before StatusEquals, so an
        empty page does not mean the end."""
        kwargs = dict(filters)
        while True:
            try:
                page = self.client.list_training_jobs(**kwargs)
            except ClientError as exc:
                raise _error(exc) from exc
            yield from page.get("TrainingJobSummaries", [])
            token = page.get("NextToken")
            if not token:
                return
            kwargs["NextToken"] = token

    def available_warm_pools(self) -> list[AvailableWarmPool]:
        """Warm pools SageMaker reports Available, with the key a new job must match to reuse them."""
        pools: list[AvailableWarmPool] = []
        for summary in self.list_training_jobs(WarmPoolStatusEquals="Available"):
            name = summary["TrainingJobName"]
            try:
                key = ResourceKey.from_request(self.describe(name))
            except TrainingJobNotFound:
                continue
            if key is not None:
                pools.append(AvailableWarmPool(name, key))
        return pools
