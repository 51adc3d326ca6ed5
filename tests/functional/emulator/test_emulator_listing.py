"""ListTrainingJobs: filters, sorting, NextToken pagination and SageMaker's MaxResults-before-status quirk;
and the tag operations."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

from sagequeue.local import SageMakerEmulator, VirtualClock


def names(page: dict[str, Any]) -> list[str]:
    return [s["TrainingJobName"] for s in page["TrainingJobSummaries"]]


def create_jobs(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any, count: int, **kw: Any
) -> list[str]:
    """`count` jobs created a second apart, on an instance type without a limit."""
    created = []
    for n in range(count):
        name = f"job-{n:02d}"
        sagemaker.create_training_job(
            **make_request(name, ResourceConfig={"InstanceType": "ml.c5.xlarge"}, **kw)
        )
        created.append(name)
        emulator.advance(1)
    return created


def test_pages_follow_next_token_in_creation_order_by_default(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any
) -> None:
    created = create_jobs(emulator, sagemaker, make_request, 25)
    first = sagemaker.list_training_jobs(MaxResults=10)
    assert names(first) == created[:10]
    second = sagemaker.list_training_jobs(MaxResults=10, NextToken=first["NextToken"])
    assert names(second) == created[10:20]
    third = sagemaker.list_training_jobs(MaxResults=10, NextToken=second["NextToken"])
    assert names(third) == created[20:]
    assert "NextToken" not in third
    assert names(sagemaker.list_training_jobs()) == created[:10], "MaxResults defaults to 10"


def test_sort_by_name_and_creation_time_in_both_orders(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any
) -> None:
    for name in ("charlie", "alpha", "bravo"):
        sagemaker.create_training_job(**make_request(name, ResourceConfig={"InstanceType": "ml.c5.xlarge"}))
        emulator.advance(1)
    assert names(sagemaker.list_training_jobs(SortBy="Name")) == ["alpha", "bravo", "charlie"]
    assert names(sagemaker.list_training_jobs(SortBy="Name", SortOrder="Descending")) == [
        "charlie",
        "bravo",
        "alpha",
    ]
    assert names(sagemaker.list_training_jobs(SortOrder="Descending")) == ["bravo", "alpha", "charlie"]
    paginated = sagemaker.get_paginator("list_training_jobs").paginate(
        SortBy="Name", SortOrder="Descending", PaginationConfig={"PageSize": 1}
    )
    assert [n for page in paginated for n in names(page)] == ["charlie", "bravo", "alpha"]


def test_max_results_is_applied_before_the_status_filter(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any
) -> None:
    # GIVEN 10 short jobs that complete, then 5 that still run
    done = create_jobs(emulator, sagemaker, make_request, 10, Environment={"SAGEQUEUE_SIM_DURATION": "10"})
    emulator.advance(3600)
    running = []
    for n in range(5):
        name = f"late-{n}"
        sagemaker.create_training_job(**make_request(name, ResourceConfig={"InstanceType": "ml.c5.xlarge"}))
        running.append(name)
    assert all(
        sagemaker.describe_training_job(TrainingJobName=n)["TrainingJobStatus"] == "Completed" for n in done
    )

    # WHEN the first page of 5 is asked for InProgress jobs
    page = sagemaker.list_training_jobs(MaxResults=5, StatusEquals="InProgress")

    # THEN it is empty (the 5 oldest jobs were taken, then filtered) but it is not the end
    assert page["TrainingJobSummaries"] == []
    assert "NextToken" in page
    everything = (
        sagemaker.get_paginator("list_training_jobs")
        .paginate(StatusEquals="InProgress", PaginationConfig={"PageSize": 5})
        .build_full_result()
    )
    assert names(everything) == running
    completed = sagemaker.list_training_jobs(MaxResults=100, StatusEquals="Completed")
    assert names(completed) == done


def test_name_and_creation_time_filters(
    emulator: SageMakerEmulator, sagemaker: Any, clock: VirtualClock, make_request: Any
) -> None:
    start = clock.now()
    create_jobs(emulator, sagemaker, make_request, 6)
    assert names(sagemaker.list_training_jobs(NameContains="JOB-0")) == [f"job-0{n}" for n in range(6)]
    assert names(sagemaker.list_training_jobs(NameContains="03")) == ["job-03"]
    window = sagemaker.list_training_jobs(
        CreationTimeAfter=start + timedelta(seconds=1), CreationTimeBefore=start + timedelta(seconds=4)
    )
    assert names(window) == ["job-02", "job-03"], "both bounds are exclusive"


def test_training_plan_filter(emulator: SageMakerEmulator, sagemaker: Any, make_request: Any) -> None:
    plan = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/trn1-reserved"
    sagemaker.create_training_job(**make_request("on-plan", ResourceConfig={"TrainingPlanArn": plan}))
    sagemaker.create_training_job(**make_request("on-demand"))
    assert names(sagemaker.list_training_jobs(TrainingPlanArnEquals=plan)) == ["on-plan"]


def test_a_token_from_another_ordering_or_made_up_is_refused(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any
) -> None:
    create_jobs(emulator, sagemaker, make_request, 3)
    token = sagemaker.list_training_jobs(MaxResults=1)["NextToken"]
    for kwargs in ({"NextToken": "garbage!"}, {"NextToken": token, "SortBy": "Name"}):
        with pytest.raises(ClientError) as caught:
            sagemaker.list_training_jobs(**kwargs)
        assert caught.value.response["Error"]["Code"] == "ValidationException"
        assert "pagination token" in caught.value.response["Error"]["Message"]


def test_summaries_carry_status_times_and_warm_pool_but_not_the_resource_config(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any
) -> None:
    sagemaker.create_training_job(**make_request("warm", ResourceConfig={"KeepAlivePeriodInSeconds": 600}))
    emulator.advance(1000)
    (summary,) = sagemaker.list_training_jobs()["TrainingJobSummaries"]
    assert summary["TrainingJobStatus"] == "Completed"
    assert summary["SecondaryStatus"] == "Completed"
    assert summary["WarmPoolStatus"]["Status"] == "Available"
    assert "TrainingEndTime" in summary
    assert "ResourceConfig" not in summary
    assert "RoleArn" not in summary


def test_tags_can_be_added_listed_and_deleted(sagemaker: Any, make_request: Any) -> None:
    arn = sagemaker.create_training_job(**make_request("tagged"))["TrainingJobArn"]
    assert sagemaker.list_tags(ResourceArn=arn)["Tags"] == [{"Key": "team", "Value": "nlp"}]
    added = sagemaker.add_tags(
        ResourceArn=arn,
        Tags=[{"Key": "team", "Value": "vision"}, {"Key": "sagequeue:job", "Value": "tagged"}],
    )
    assert added["Tags"] == [{"Key": "team", "Value": "vision"}, {"Key": "sagequeue:job", "Value": "tagged"}]
    sagemaker.delete_tags(ResourceArn=arn, TagKeys=["team", "absent"])
    assert sagemaker.list_tags(ResourceArn=arn)["Tags"] == [{"Key": "sagequeue:job", "Value": "tagged"}]


def test_list_tags_paginates_and_unknown_arns_are_not_found(sagemaker: Any, make_request: Any) -> None:
    arn = sagemaker.create_training_job(**make_request("many-tags", Tags=[]))["TrainingJobArn"]
    for start in range(0, 50, 10):
        sagemaker.add_tags(
            ResourceArn=arn, Tags=[{"Key": f"k{i:02d}", "Value": str(i)} for i in range(start, start + 10)]
        )
    everything = sagemaker.get_paginator("list_tags").paginate(
        ResourceArn=arn, PaginationConfig={"PageSize": 50}
    )
    assert [t["Key"] for page in everything for t in page["Tags"]] == [f"k{i:02d}" for i in range(50)]
    with pytest.raises(ClientError) as caught:
        sagemaker.add_tags(ResourceArn=arn, Tags=[{"Key": "one-too-many", "Value": "x"}])
    assert caught.value.response["Error"]["Code"] == "ResourceLimitExceeded"
    ghost = arn.replace("many-tags", "ghost")
    with pytest.raises(ClientError) as caught:
        sagemaker.list_tags(ResourceArn=ghost)
    assert caught.value.response["Error"]["Code"] == "ValidationException"


@pytest.mark.parametrize(
    "payload",
    [
        {"after": [], "by": "CreationTime", "desc": False},
        {"after": ["x", "y"], "by": "CreationTime", "desc": False},
        {"after": [1.0, True], "by": "CreationTime", "desc": False},
        {"after": [1.0, 2], "by": "Name", "desc": False},
        {"after": None, "by": "CreationTime", "desc": False},
        {"by": "CreationTime"},
    ],
)
def test_forged_tokens_are_validation_errors(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any, payload: dict[str, Any]
) -> None:
    create_jobs(emulator, sagemaker, make_request, 2)
    token = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode()
    sort_by = "Name" if payload.get("by") == "Name" else "CreationTime"
    with pytest.raises(ClientError) as caught:
        sagemaker.list_training_jobs(NextToken=token, SortBy=sort_by)
    assert caught.value.response["Error"]["Code"] == "ValidationException"


def test_descending_pages_do_not_shift_when_jobs_are_created_while_paginating(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any
) -> None:
    created = create_jobs(emulator, sagemaker, make_request, 5)
    first = sagemaker.list_training_jobs(MaxResults=2, SortOrder="Descending")
    assert names(first) == ["job-04", "job-03"]
    sagemaker.create_training_job(**make_request("newcomer", ResourceConfig={"InstanceType": "ml.c5.xlarge"}))
    rest = sagemaker.list_training_jobs(MaxResults=10, SortOrder="Descending", NextToken=first["NextToken"])
    assert names(rest) == created[2::-1]
