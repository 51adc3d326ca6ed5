"""DescribeTrainingJob and the summaries as SageMaker fills them, including what the request left out."""

from __future__ import annotations

from typing import Any

PLAN = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/trn1-reserved"


def test_describe_fills_the_defaults_sagemaker_fills(
    emulator: Any, sagemaker: Any, make_request: Any
) -> None:
    sagemaker.create_training_job(**make_request("bare", HyperParameters=None))
    described = sagemaker.describe_training_job(TrainingJobName="bare")
    assert described["EnableNetworkIsolation"] is False
    assert described["EnableInterContainerTrafficEncryption"] is False
    assert described["EnableManagedSpotTraining"] is False
    assert described["OutputDataConfig"] == {
        "S3OutputPath": "s3://bucket/output",
        "KmsKeyId": "",
        "CompressionType": "GZIP",
    }
    assert described["HyperParameters"] == {}


def test_what_the_request_says_wins_over_the_defaults(sagemaker: Any, make_request: Any) -> None:
    sagemaker.create_training_job(
        **make_request(
            "explicit",
            EnableNetworkIsolation=True,
            OutputDataConfig={"KmsKeyId": "alias/mine", "CompressionType": "NONE"},
        )
    )
    described = sagemaker.describe_training_job(TrainingJobName="explicit")
    assert described["EnableNetworkIsolation"] is True
    assert described["OutputDataConfig"]["KmsKeyId"] == "alias/mine"
    assert described["OutputDataConfig"]["CompressionType"] == "NONE"


def test_training_time_is_truncated_to_the_second(emulator: Any, sagemaker: Any, make_request: Any) -> None:
    sagemaker.create_training_job(
        **make_request("fractional", Environment={"SAGEQUEUE_SIM_DURATION": "100.9"})
    )
    emulator.advance(1000)
    described = sagemaker.describe_training_job(TrainingJobName="fractional")
    # on instances from Downloading: 30 + 100.9 + 20 = 150.9 s
    assert described["TrainingTimeInSeconds"] == 150


def test_summaries_name_the_training_plan(sagemaker: Any, make_request: Any) -> None:
    sagemaker.create_training_job(**make_request("planned", ResourceConfig={"TrainingPlanArn": PLAN}))
    sagemaker.create_training_job(**make_request("unplanned"))
    summaries = {s["TrainingJobName"]: s for s in sagemaker.list_training_jobs()["TrainingJobSummaries"]}
    assert summaries["planned"]["TrainingPlanArn"] == PLAN
    assert "TrainingPlanArn" not in summaries["unplanned"]
