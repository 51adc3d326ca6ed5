"""Refusals with SageMaker's codes and messages, protocol robustness, injected faults, concurrent clients."""

from __future__ import annotations

import http.client
import json
import threading
from collections import Counter
from typing import Any
from urllib.parse import urlparse

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, EndpointConnectionError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sagequeue.local import SageMakerEmulator

TRN1 = "ml.trn1.32xlarge"


def error_of(call: Any, **kwargs: Any) -> dict[str, str]:
    with pytest.raises(ClientError) as caught:
        call(**kwargs)
    return caught.value.response["Error"]


def test_a_duplicate_name_is_resource_in_use_even_after_the_first_job_ended(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any
) -> None:
    sagemaker.create_training_job(**make_request("unique"))
    error = error_of(sagemaker.create_training_job, **make_request("unique"))
    assert error["Code"] == "ResourceInUse"
    assert "Training job names must be unique" in error["Message"]
    emulator.advance(2000)
    assert error_of(sagemaker.create_training_job, **make_request("unique"))["Code"] == "ResourceInUse"
    jobs = sagemaker.list_training_jobs()["TrainingJobSummaries"]
    assert [j["TrainingJobName"] for j in jobs] == ["unique"], "the duplicate did not replace the job"


def test_beyond_the_instance_limit_create_is_resource_limit_exceeded_until_instances_free(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any
) -> None:
    # GIVEN a limit of 4 ml.trn1.32xlarge: a 3-instance job and a 1-instance job fill it
    sagemaker.create_training_job(**make_request("three", ResourceConfig={"InstanceCount": 3}))
    sagemaker.create_training_job(**make_request("one", Environment={"SAGEQUEUE_SIM_DURATION": "60"}))
    error = error_of(sagemaker.create_training_job, **make_request("over"))
    assert error["Code"] == "ResourceLimitExceeded"
    assert error["Message"].startswith(
        "The account-level service limit 'ml.trn1.32xlarge for training job usage' is 4 Instances, "
        "with current utilization of 4 Instances and a request delta of 1 Instances."
    )
    # Instance types without a configured limit are unlimited.
    sagemaker.create_training_job(
        **make_request("elsewhere", ResourceConfig={"InstanceType": "ml.trn2.48xlarge", "InstanceCount": 64})
    )
    # WHEN the small job completes, its instance is free again
    emulator.advance(120 + 30 + 60 + 20)
    assert sagemaker.describe_training_job(TrainingJobName="one")["TrainingJobStatus"] == "Completed"
    sagemaker.create_training_job(**make_request("fits-now"))
    assert error_of(sagemaker.create_training_job, **make_request("over"))["Code"] == "ResourceLimitExceeded"


def test_a_stopping_job_still_holds_its_instances(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any
) -> None:
    sagemaker.create_training_job(**make_request("big", ResourceConfig={"InstanceCount": 4}))
    sagemaker.stop_training_job(TrainingJobName="big")
    assert error_of(sagemaker.create_training_job, **make_request("next"))["Code"] == "ResourceLimitExceeded"
    emulator.advance(30)
    sagemaker.create_training_job(**make_request("next"))


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"TrainingJobName": "bad_name"}, "regular expression pattern"),
        ({"TrainingJobName": "x" * 64}, "length less than or equal to 63"),
        ({"TrainingJobName": "-leading-hyphen"}, "regular expression pattern"),
        ({"RoleArn": "not-a-role"}, "roleArn"),
        ({"ResourceConfig": {"InstanceCount": 0}}, "resourceConfig.instanceCount"),
        ({"ResourceConfig": {"InstanceType": "trn1"}}, "resourceConfig.instanceType"),
        ({"ResourceConfig": {"KeepAlivePeriodInSeconds": 21601}}, "less than or equal to 21600"),
        ({"ResourceConfig": {"KeepAlivePeriodInSeconds": -1}}, "greater than or equal to 0"),
        ({"StoppingCondition": {"MaxRuntimeInSeconds": 28 * 86400 + 1}}, "maxRuntimeInSeconds"),
        (
            {"StoppingCondition": {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 7200}},
            "EnableManagedSpot",
        ),
        (
            {"EnableManagedSpotTraining": True, "ResourceConfig": {"KeepAlivePeriodInSeconds": 60}},
            "not supported with managed spot",
        ),
        (
            {
                "EnableManagedSpotTraining": True,
                "StoppingCondition": {"MaxRuntimeInSeconds": 3600, "MaxWaitTimeInSeconds": 60},
            },
            "greater than or equal to MaxRuntimeInSeconds",
        ),
        ({"OutputDataConfig": None}, "outputDataConfig"),
        ({"AlgorithmSpecification": {"TrainingImage": None}}, "TrainingImage or the AlgorithmName"),
        ({"Environment": {"SAGEQUEUE_SIM_OUTCOME": "Exploded"}}, "SAGEQUEUE_SIM_OUTCOME"),
        ({"Environment": {"SAGEQUEUE_SIM_OUTCOME": "Interrupted:some"}}, "Interrupted needs a count"),
        ({"Environment": {"SAGEQUEUE_SIM_DURATION": "-5"}}, "SAGEQUEUE_SIM_DURATION"),
        ({"Tags": [{"Key": "aws:owner", "Value": "x"}]}, "reserved prefix"),
    ],
)
def test_invalid_create_requests_are_validation_errors_naming_the_problem(
    raw_sagemaker: Any, make_request: Any, overrides: dict[str, Any], fragment: str
) -> None:
    error = error_of(raw_sagemaker.create_training_job, **make_request("valid-name", **overrides))
    assert error["Code"] == "ValidationException"
    assert fragment in error["Message"]
    assert raw_sagemaker.list_training_jobs()["TrainingJobSummaries"] == [], "nothing was created"


def test_instance_groups_with_a_keep_alive_are_refused(raw_sagemaker: Any, make_request: Any) -> None:
    request = make_request("hetero")
    request["ResourceConfig"] = {
        "InstanceGroups": [
            {"InstanceGroupName": "a", "InstanceType": TRN1, "InstanceCount": 1},
            {"InstanceGroupName": "b", "InstanceType": "ml.c5.xlarge", "InstanceCount": 1},
        ],
        "VolumeSizeInGB": 100,
        "KeepAlivePeriodInSeconds": 60,
    }
    error = error_of(raw_sagemaker.create_training_job, **request)
    assert error["Code"] == "ValidationException"
    assert "heterogeneous" in error["Message"]


def test_describing_an_unknown_job_is_a_validation_exception_as_sagemaker_answers(sagemaker: Any) -> None:
    error = error_of(sagemaker.describe_training_job, TrainingJobName="ghost")
    assert error["Code"] == "ValidationException"
    assert error["Message"].startswith("Requested resource not found.")


def test_an_operation_the_emulator_does_not_offer_answers_a_sagemaker_style_error(
    emulator: SageMakerEmulator, sagemaker: Any
) -> None:
    error = error_of(sagemaker.list_endpoints)
    assert error["Code"] == "UnknownOperationException"
    assert "ListEndpoints" in error["Message"]


def _post(endpoint_url: str, body: bytes, headers: dict[str, str], method: str = "POST") -> tuple[int, Any]:
    url = urlparse(endpoint_url)
    connection = http.client.HTTPConnection(str(url.hostname), url.port, timeout=5)
    try:
        connection.request(method, "/", body=body, headers=headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        connection.close()


@pytest.mark.parametrize(
    ("body", "headers", "method", "code"),
    [
        (b"{not json", {"X-Amz-Target": "SageMaker.ListTrainingJobs"}, "POST", "SerializationException"),
        (b"\xff\xfe\x00", {"X-Amz-Target": "SageMaker.ListTrainingJobs"}, "POST", "SerializationException"),
        (b"[1, 2, 3]", {"X-Amz-Target": "SageMaker.DescribeTrainingJob"}, "POST", "ValidationException"),
        (
            b'{"TrainingJobName": 7}',
            {"X-Amz-Target": "SageMaker.DescribeTrainingJob"},
            "POST",
            "ValidationException",
        ),
        (
            b'{"MaxResults": "ten"}',
            {"X-Amz-Target": "SageMaker.ListTrainingJobs"},
            "POST",
            "ValidationException",
        ),
        (b"{}", {}, "POST", "UnknownOperationException"),
        (b"{}", {"X-Amz-Target": "Kinesis.PutRecord"}, "POST", "UnknownOperationException"),
        (b"", {}, "GET", "UnknownOperationException"),
    ],
)
def test_malformed_requests_get_sagemaker_style_errors_and_the_server_keeps_serving(
    emulator: SageMakerEmulator,
    sagemaker: Any,
    body: bytes,
    headers: dict[str, str],
    method: str,
    code: str,
) -> None:
    status, payload = _post(
        emulator.endpoint_url, body, {"Content-Type": "application/x-amz-json-1.1", **headers}, method
    )
    assert status == 400
    assert payload["__type"] == code
    assert payload["message"]
    assert sagemaker.list_training_jobs()["TrainingJobSummaries"] == []


def test_a_client_that_hangs_up_mid_request_does_not_disturb_the_server(
    emulator: SageMakerEmulator, sagemaker: Any, make_request: Any
) -> None:
    url = urlparse(emulator.endpoint_url)
    connection = http.client.HTTPConnection(str(url.hostname), url.port, timeout=5)
    connection.putrequest("POST", "/")
    connection.putheader("Content-Length", "1000")
    connection.putheader("X-Amz-Target", "SageMaker.ListTrainingJobs")
    connection.endheaders(b'{"MaxRes')
    connection.close()
    sagemaker.create_training_job(**make_request("still-fine"))
    assert sagemaker.describe_training_job(TrainingJobName="still-fine")["TrainingJobStatus"] == "InProgress"


def test_injected_throttling_reaches_the_client_and_standard_retries_recover(
    emulator: SageMakerEmulator, sagemaker: Any
) -> None:
    emulator.fail_next("ListTrainingJobs", times=2)
    assert error_of(sagemaker.list_training_jobs)["Code"] == "ThrottlingException"
    retrying = emulator.client()
    answer = retrying.list_training_jobs()
    assert answer["ResponseMetadata"]["RetryAttempts"] == 1
    assert answer["TrainingJobSummaries"] == []
    with pytest.raises(ValueError, match="not an emulated operation"):
        emulator.fail_next("CreateEndpoint")


def test_concurrent_clients_never_exceed_the_limit_and_see_consistent_state(make_request: Any) -> None:
    # rates=None: 320 calls at one virtual instant test locking, not throttling (tested on its own)
    with SageMakerEmulator(instance_limits={"ml.trn1.32xlarge": 4}, rates=None) as emulator:
        _race(emulator, make_request)


def _race(emulator: SageMakerEmulator, make_request: Any) -> None:
    # GIVEN 8 clients racing to create 20 single-instance jobs each against a limit of 4
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()

    def worker(index: int) -> None:
        client = emulator.client()
        for n in range(20):
            try:
                client.create_training_job(**make_request(f"w{index}-job{n}"))
                result = "created"
            except ClientError as error:
                result = error.response["Error"]["Code"]
            client.list_training_jobs(MaxResults=100)
            with lock:
                outcomes[result] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert outcomes == Counter({"created": 4, "ResourceLimitExceeded": 156})
    listed = emulator.client().get_paginator("list_training_jobs").paginate().build_full_result()
    assert len(listed["TrainingJobSummaries"]) == 4


def test_a_stopped_emulator_answers_no_one_not_even_over_kept_alive_connections(
    make_request: Any,
) -> None:
    emulator = SageMakerEmulator().start()
    client = emulator.client(config=Config(retries={"total_max_attempts": 1}))
    client.create_training_job(**make_request("before-stop"))
    emulator.stop()
    with pytest.raises(EndpointConnectionError):
        client.describe_training_job(TrainingJobName="before-stop")


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)
CREATE_KEYS = [
    "TrainingJobName",
    "RoleArn",
    "AlgorithmSpecification",
    "OutputDataConfig",
    "ResourceConfig",
    "StoppingCondition",
    "VpcConfig",
    "Environment",
    "Tags",
    "EnableManagedSpotTraining",
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    operation=st.sampled_from(
        [
            "CreateTrainingJob",
            "DescribeTrainingJob",
            "ListTrainingJobs",
            "StopTrainingJob",
            "UpdateTrainingJob",
            "AddTags",
        ]
    ),
    base=st.booleans(),
    replacements=st.dictionaries(
        st.sampled_from([*CREATE_KEYS, "ResourceArn", "MaxResults", "NextToken"]), json_values
    ),
)
def test_no_request_body_makes_the_server_fail(
    emulator: SageMakerEmulator, make_request: Any, operation: str, base: bool, replacements: dict[str, Any]
) -> None:
    body = {**(make_request("fuzzed") if base else {}), **replacements}
    status, payload = _post(
        emulator.endpoint_url,
        json.dumps(body).encode(),
        {"Content-Type": "application/x-amz-json-1.1", "X-Amz-Target": f"SageMaker.{operation}"},
    )
    assert status in (200, 400), payload
    if status == 400:
        assert payload["__type"] in {
            "ValidationException",
            "ResourceNotFound",
            "ResourceInUse",
            "ResourceLimitExceeded",
        }
        assert payload["message"]


def test_unknown_jobs_can_be_answered_with_resource_not_found_as_the_service_model_declares(
    make_request: Any,
) -> None:
    with SageMakerEmulator(not_found_code="ResourceNotFound") as emulator:
        client = emulator.client(config=Config(retries={"total_max_attempts": 1}))
        for call, kwargs in (
            (client.describe_training_job, {"TrainingJobName": "ghost"}),
            (client.stop_training_job, {"TrainingJobName": "ghost"}),
        ):
            error = error_of(call, **kwargs)
            assert error["Code"] == "ResourceNotFound"
            assert error["Message"].startswith("Requested resource not found.")
    with pytest.raises(ValueError, match="not_found_code"):
        SageMakerEmulator(not_found_code="NoSuchJob")
