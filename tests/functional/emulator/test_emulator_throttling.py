"""Throttling per API with a token bucket, and seeded transient server errors."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from sagequeue.local import SageMakerEmulator, VirtualClock
from sagequeue.local.emulator.throttling import DEFAULT_RATES, Rate
from tests.functional.emulator.conftest import START, sagemaker_client


def code_of(call: Any, **kwargs: Any) -> tuple[str, int] | None:
    try:
        call(**kwargs)
    except ClientError as error:
        return error.response["Error"]["Code"], error.response["ResponseMetadata"]["HTTPStatusCode"]
    return None


def test_a_burst_beyond_the_bucket_is_throttled_until_tokens_refill(make_request: Any) -> None:
    clock = VirtualClock(START)
    rates = {"ListTrainingJobs": Rate(per_second=2.0, burst=3)}
    with SageMakerEmulator(clock=clock, rates=rates) as emulator:
        sagemaker = sagemaker_client(emulator.endpoint_url)
        assert [code_of(sagemaker.list_training_jobs) for _ in range(3)] == [None, None, None]
        with pytest.raises(ClientError) as caught:
            sagemaker.list_training_jobs()
        assert caught.value.response["Error"]["Code"] == "ThrottlingException"
        assert caught.value.response["Error"]["Message"] == "Rate exceeded"
        # other APIs have their own buckets (none here)
        assert code_of(sagemaker.describe_training_job, TrainingJobName="x") == ("ValidationException", 400)
        emulator.advance(0.5)  # one token back
        assert code_of(sagemaker.list_training_jobs) is None
        assert code_of(sagemaker.list_training_jobs) == ("ThrottlingException", 400)
        emulator.advance(10)  # the bucket holds at most its burst
        results = [code_of(sagemaker.list_training_jobs) for _ in range(4)]
        assert results == [None, None, None, ("ThrottlingException", 400)]


def test_default_rates_let_a_burst_of_describes_through_then_throttle() -> None:
    burst = DEFAULT_RATES["DescribeTrainingJob"].burst
    with SageMakerEmulator() as emulator:
        sagemaker = sagemaker_client(emulator.endpoint_url)
        codes = [code_of(sagemaker.describe_training_job, TrainingJobName="nobody") for _ in range(burst + 1)]
    assert codes[:burst] == [("ValidationException", 400)] * burst
    assert codes[burst] == ("ThrottlingException", 400)


def test_transient_server_errors_are_seeded_and_botocore_retries_them(make_request: Any) -> None:
    def sequence(seed: int) -> list[tuple[str, int] | None]:
        with SageMakerEmulator(seed=seed, transient_error_share=0.5, rates=None) as emulator:
            sagemaker = sagemaker_client(emulator.endpoint_url)
            return [code_of(sagemaker.list_training_jobs) for _ in range(40)]

    first = sequence(11)
    assert first == sequence(11)
    assert first != sequence(12)
    assert {c for c in first if c is not None} == {("InternalFailure", 500), ("ServiceUnavailable", 503)}
    assert 5 < first.count(None) < 35
    with SageMakerEmulator(seed=11, transient_error_share=0.5, rates=None) as emulator:
        patient = sagemaker_client(emulator.endpoint_url, retries=10)
        for _ in range(6):
            assert "TrainingJobSummaries" in patient.list_training_jobs()


def test_a_bad_rate_is_refused() -> None:
    with pytest.raises(ValueError, match="per_second"):
        Rate(per_second=0, burst=1)
    with pytest.raises(ValueError, match="transient_error_share"):
        SageMakerEmulator(transient_error_share=2)
