"""DeleteTrainingJob: only for ended jobs without an Available warm pool; the name may then be reused."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError


def error_of(call: Any, **kwargs: Any) -> dict[str, Any]:
    try:
        call(**kwargs)
    except ClientError as error:
        return dict(error.response["Error"])
    raise AssertionError("the call succeeded")


def names(sagemaker: Any, **kwargs: Any) -> list[str]:
    pages = sagemaker.get_paginator("list_training_jobs").paginate(**kwargs)
    return [s["TrainingJobName"] for page in pages for s in page["TrainingJobSummaries"]]


def test_deleting_follows_sagemakers_rules_and_frees_the_name(
    emulator: Any, sagemaker: Any, make_request: Any
) -> None:
    for name in ("a", "b", "c"):
        sagemaker.create_training_job(**make_request(name))
    sagemaker.create_training_job(**make_request("pooled", ResourceConfig={"KeepAlivePeriodInSeconds": 600}))
    running = error_of(sagemaker.delete_training_job, TrainingJobName="b")
    assert running["Code"] == "ValidationException"
    assert "InProgress" in running["Message"]
    emulator.advance(800)
    pooled = error_of(sagemaker.delete_training_job, TrainingJobName="pooled")
    assert pooled["Code"] == "ValidationException"
    assert "warm pool" in pooled["Message"]

    first_page = sagemaker.list_training_jobs(MaxResults=1)
    sagemaker.delete_training_job(TrainingJobName="b")
    gone = error_of(sagemaker.describe_training_job, TrainingJobName="b")
    assert (gone["Code"], gone["Message"].startswith("Requested resource not found")) == (
        "ValidationException",
        True,
    )
    assert names(sagemaker) == ["a", "c", "pooled"]
    # a cursor taken before the delete resumes in place
    rest = sagemaker.list_training_jobs(MaxResults=10, NextToken=first_page["NextToken"])
    assert [s["TrainingJobName"] for s in rest["TrainingJobSummaries"]] == ["c", "pooled"]
    assert names(sagemaker, SortBy="Name") == ["a", "c", "pooled"]

    sagemaker.create_training_job(**make_request("b", Environment={"SAGEQUEUE_SIM_DURATION": "60"}))
    assert sagemaker.describe_training_job(TrainingJobName="b")["TrainingJobStatus"] == "InProgress"
    assert names(sagemaker) == ["a", "c", "pooled", "b"]
    emulator.advance(300)
    assert sagemaker.describe_training_job(TrainingJobName="b")["TrainingJobStatus"] == "Completed"
    assert error_of(sagemaker.delete_training_job, TrainingJobName="ghost")["Code"] == "ValidationException"
