"""The SageMaker adapter's error handling, against a botocore Stubber (no network): codes, never
messages, decide; create and stop are idempotent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from sagequeue_core.defaults import SEAL_TAG
from sagequeue_core.errors import (
    AttemptNameTaken,
    ResourceLimitExceeded,
    SageMakerUnavailable,
    SageMakerValidationError,
    Throttled,
    TrainingJobNotFound,
)
from sagequeue_core.sagemaker import FailureKind, SageMakerAdapter, classify_failure

ARN = "arn:aws:sagemaker:us-east-1:123456789012:training-job/job-2"
REQUEST: dict[str, Any] = {
    "TrainingJobName": "job-2",
    "RoleArn": "arn:aws:iam::123456789012:role/R",
    "AlgorithmSpecification": {"TrainingImage": "img", "TrainingInputMode": "File"},
    "OutputDataConfig": {"S3OutputPath": "s3://b/o"},
    "ResourceConfig": {"InstanceType": "ml.trn1.32xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
    "StoppingCondition": {"MaxRuntimeInSeconds": 60},
}


@pytest.fixture
def stubbed() -> Iterator[tuple[SageMakerAdapter, Stubber]]:
    client = boto3.client("sagemaker", region_name="us-east-1")
    with Stubber(client) as stubber:
        yield SageMakerAdapter(client), stubber
        stubber.assert_no_pending_responses()


def _describe(status: str) -> dict[str, Any]:
    return {
        "TrainingJobName": "job-2",
        "TrainingJobArn": ARN,
        "TrainingJobStatus": status,
        "SecondaryStatus": "Starting",
        "AlgorithmSpecification": {"TrainingInputMode": "File"},
        "ResourceConfig": {"InstanceType": "ml.trn1.32xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
        "StoppingCondition": {},
        "CreationTime": "2026-03-02T09:00:00Z",
        "ModelArtifacts": {"S3ModelArtifacts": "s3://b/o"},
    }


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("ResourceLimitExceeded", ResourceLimitExceeded),
        ("ThrottlingException", Throttled),
        ("ValidationException", SageMakerValidationError),
        ("InternalFailure", SageMakerUnavailable),
    ],
)
def test_create_errors_are_named_by_code(
    stubbed: tuple[SageMakerAdapter, Stubber], code: str, error: type[Exception]
) -> None:
    adapter, stubber = stubbed
    stubber.add_client_error("create_training_job", service_error_code=code, service_message="whatever text")
    with pytest.raises(error) as raised:
        adapter.create_attempt(REQUEST, job_name="job")
    assert raised.value.code == code  # type: ignore[attr-defined]


def test_resource_in_use_on_our_own_attempt_means_it_started(
    stubbed: tuple[SageMakerAdapter, Stubber],
) -> None:
    adapter, stubber = stubbed
    sealed = {**REQUEST, "Tags": [{"Key": "sagequeue:job", "Value": "job"}, {"Key": SEAL_TAG, "Value": "s1"}]}
    stubber.add_client_error("create_training_job", service_error_code="ResourceInUse")
    stubber.add_response("describe_training_job", _describe("InProgress"), {"TrainingJobName": "job-2"})
    stubber.add_response("list_tags", {"Tags": sealed["Tags"]}, {"ResourceArn": ARN})
    result = adapter.create_attempt(sealed, job_name="job")
    assert (result.training_job_name, result.already_started) == ("job-2", True)


@pytest.mark.parametrize(
    "tags",
    [
        [{"Key": "team", "Value": "x"}],
        # sagequeue's job tag, which anyone allowed AddTags can set, without the request's seal
        [{"Key": "sagequeue:job", "Value": "job"}],
        [{"Key": "sagequeue:job", "Value": "job"}, {"Key": SEAL_TAG, "Value": "forged"}],
    ],
)
def test_resource_in_use_on_someone_elses_job_is_refused(
    stubbed: tuple[SageMakerAdapter, Stubber], tags: list[dict[str, str]]
) -> None:
    adapter, stubber = stubbed
    sealed = {**REQUEST, "Tags": [{"Key": "sagequeue:job", "Value": "job"}, {"Key": SEAL_TAG, "Value": "s1"}]}
    stubber.add_client_error("create_training_job", service_error_code="ResourceInUse")
    stubber.add_response("describe_training_job", _describe("Completed"), {"TrainingJobName": "job-2"})
    stubber.add_response("list_tags", {"Tags": tags}, {"ResourceArn": ARN})
    with pytest.raises(AttemptNameTaken):
        adapter.create_attempt(sealed, job_name="job")


@pytest.mark.parametrize("status", ["Completed", "Stopped", "Failed", "Stopping"])
def test_stopping_a_job_that_is_ending_or_ended_is_not_an_error(
    stubbed: tuple[SageMakerAdapter, Stubber], status: str
) -> None:
    adapter, stubber = stubbed
    stubber.add_client_error("stop_training_job", service_error_code="ValidationException")
    stubber.add_response("describe_training_job", _describe(status), {"TrainingJobName": "job-2"})
    assert adapter.stop("job-2") is False


def test_stopping_an_unknown_job_is_not_an_error(stubbed: tuple[SageMakerAdapter, Stubber]) -> None:
    adapter, stubber = stubbed
    stubber.add_client_error("stop_training_job", service_error_code="ValidationException")
    stubber.add_client_error("describe_training_job", service_error_code="ValidationException")
    assert adapter.stop("job-2") is False


def test_a_stop_refused_while_the_job_runs_is_an_error(stubbed: tuple[SageMakerAdapter, Stubber]) -> None:
    adapter, stubber = stubbed
    stubber.add_client_error("stop_training_job", service_error_code="ValidationException")
    stubber.add_response("describe_training_job", _describe("InProgress"), {"TrainingJobName": "job-2"})
    with pytest.raises(SageMakerValidationError):
        adapter.stop("job-2")


def test_describe_of_an_unknown_job_is_not_found(stubbed: tuple[SageMakerAdapter, Stubber]) -> None:
    adapter, stubber = stubbed
    stubber.add_client_error("describe_training_job", service_error_code="ValidationException")
    with pytest.raises(TrainingJobNotFound):
        adapter.describe("job-2")


def test_listing_follows_every_page_even_empty_ones(stubbed: tuple[SageMakerAdapter, Stubber]) -> None:
    adapter, stubber = stubbed
    summary = {
        "TrainingJobName": "a",
        "TrainingJobArn": ARN,
        "CreationTime": "2026-03-02T09:00:00Z",
        "TrainingJobStatus": "InProgress",
    }
    stubber.add_response("list_training_jobs", {"TrainingJobSummaries": [], "NextToken": "t1"})
    stubber.add_response("list_training_jobs", {"TrainingJobSummaries": [summary], "NextToken": "t2"})
    stubber.add_response("list_training_jobs", {"TrainingJobSummaries": [summary]})
    assert len(list(adapter.list_training_jobs(StatusEquals="InProgress"))) == 2


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("CapacityError: Unable to provision requested ML compute capacity.", FailureKind.CAPACITY),
        ("InternalServerError: We encountered an internal error.", FailureKind.INTERNAL),
        ("AlgorithmError: exit code 1", FailureKind.JOB),
        ("ClientError: Data download failed", FailureKind.JOB),
        (None, FailureKind.JOB),
    ],
)
def test_failure_reasons_are_classified_by_their_prefix(reason: str | None, kind: FailureKind) -> None:
    assert classify_failure(reason) is kind
