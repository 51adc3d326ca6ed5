"""Request validation for the fields sagequeue uses, with SageMaker's constraints and message style.

botocore checks types and required members before sending, but not patterns, maxima or the rules that
span fields; tests that switch botocore's validation off see these answers, as they would from SageMaker.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sagequeue.local.emulator.errors import ValidationError
from sagequeue_core.defaults import TRAINING_JOB_NAME_PATTERN

TRAINING_JOB_NAME_RE = re.compile(TRAINING_JOB_NAME_PATTERN)
ROLE_ARN_RE = re.compile(r"^arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+$")
INSTANCE_TYPE_RE = re.compile(r"^ml\.[a-z0-9]+(-[a-z0-9]+)*\.[a-z0-9]+$")
S3_URI_RE = re.compile(r"^(https|s3)://([^/]+)/?(.*)$")
TRAINING_JOB_ARN_RE = re.compile(
    r"^arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]*:[0-9]{12}:training-job/([a-zA-Z0-9](-*[a-zA-Z0-9]){0,62})$"
)
ENV_KEY_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
NAME_CONTAINS_RE = re.compile(r"^[a-zA-Z0-9\-]+$")

#: KeepAlivePeriodInSeconds range in the current service model (older guides say 3600).
MAX_KEEP_ALIVE_SECONDS = 21600
#: StoppingCondition.MaxRuntimeInSeconds: SageMaker's default (1 day) and maximum (28 days).
DEFAULT_MAX_RUNTIME_SECONDS = 86400
MAX_RUNTIME_LIMIT_SECONDS = 28 * 86400
MAX_TAGS = 50
TRAINING_STATUSES = ("InProgress", "Completed", "Failed", "Stopping", "Stopped")
WARM_POOL_STATUSES = ("Available", "Terminated", "Reused", "InUse")
SORT_BY = ("Name", "CreationTime", "Status")
SORT_ORDER = ("Ascending", "Descending")


def violation(value: Any, where: str, constraint: str) -> ValidationError:
    """One failed constraint, worded the way SageMaker words it."""
    return ValidationError(
        f"1 validation error detected: Value {_show(value)} at '{where}' failed to satisfy constraint: "
        f"Member must {constraint}"
    )


def _show(value: Any) -> str:
    if value is None:
        return "null"
    return f"'{value}'"


def require_mapping(request: Any, operation: str) -> Mapping[str, Any]:
    if not isinstance(request, Mapping):
        raise ValidationError(f"{operation} expects a JSON object as its request body")
    return request


def training_job_name(value: Any, where: str = "trainingJobName") -> str:
    if value is None:
        raise violation(value, where, "not be null")
    if not isinstance(value, str):
        raise violation(value, where, "be a string")
    if not 1 <= len(value) <= 63:
        raise violation(value, where, "have length less than or equal to 63")
    if not TRAINING_JOB_NAME_RE.match(value):
        raise violation(value, where, f"satisfy regular expression pattern: {TRAINING_JOB_NAME_PATTERN}")
    return value


def _integer(value: Any, where: str, minimum: int | None = None, maximum: int | None = None) -> int:
    if value is None:
        raise violation(value, where, "not be null")
    if isinstance(value, bool) or not isinstance(value, int):
        raise violation(value, where, "be an integer")
    if minimum is not None and value < minimum:
        raise violation(value, where, f"have value greater than or equal to {minimum}")
    if maximum is not None and value > maximum:
        raise violation(value, where, f"have value less than or equal to {maximum}")
    return value


def _optional_bool(request: Mapping[str, Any], key: str) -> None:
    value = request.get(key)
    if value is not None and not isinstance(value, bool):
        raise violation(value, key[0].lower() + key[1:], "be a boolean")


def create_training_job(request: Mapping[str, Any]) -> None:
    """Checks a CreateTrainingJob request; raises ValidationError naming the first problem found."""
    training_job_name(request.get("TrainingJobName"))
    role = request.get("RoleArn")
    if not isinstance(role, str) or not ROLE_ARN_RE.match(role):
        raise violation(
            role,
            "roleArn",
            r"satisfy regular expression pattern: ^arn:aws[a-z\-]*:iam::\d{12}:role/?[a-zA-Z_0-9+=,.@\-_/]+$",
        )
    output = request.get("OutputDataConfig")
    if not isinstance(output, Mapping):
        raise violation(output, "outputDataConfig", "not be null")
    s3_path = output.get("S3OutputPath")
    if not isinstance(s3_path, str) or not S3_URI_RE.match(s3_path):
        raise violation(
            s3_path,
            "outputDataConfig.s3OutputPath",
            "satisfy regular expression pattern: ^(https|s3)://([^/]+)/?(.*)$",
        )
    algorithm = request.get("AlgorithmSpecification")
    if not isinstance(algorithm, Mapping):
        raise ValidationError("AlgorithmSpecification is required: give a TrainingImage or an AlgorithmName")
    if not algorithm.get("TrainingImage") and not algorithm.get("AlgorithmName"):
        raise ValidationError(
            "You must specify either the TrainingImage or the AlgorithmName in AlgorithmSpecification."
        )
    if algorithm.get("TrainingImage") and algorithm.get("AlgorithmName"):
        raise ValidationError(
            "TrainingImage and AlgorithmName are mutually exclusive in AlgorithmSpecification."
        )
    mode = algorithm.get("TrainingInputMode")
    if mode not in ("Pipe", "File", "FastFile"):
        raise violation(
            mode, "algorithmSpecification.trainingInputMode", "satisfy enum value set: [Pipe, File, FastFile]"
        )
    for key in (
        "EnableManagedSpotTraining",
        "EnableNetworkIsolation",
        "EnableInterContainerTrafficEncryption",
    ):
        _optional_bool(request, key)
    spot = bool(request.get("EnableManagedSpotTraining"))
    _resource_config(request.get("ResourceConfig"), spot=spot)
    _stopping_condition(request.get("StoppingCondition"), spot=spot)
    _vpc_config(request.get("VpcConfig"))
    _environment(request.get("Environment"))
    tag_list(request.get("Tags"), "tags", required=False)


def _resource_config(config: Any, *, spot: bool) -> None:
    if not isinstance(config, Mapping):
        raise violation(config, "resourceConfig", "not be null")
    if config.get("InstancePreferences") and config.get("InstanceType") is not None:
        raise ValidationError(
            "InstancePreferences cannot be used together with InstanceType in ResourceConfig: give one of them."
        )
    groups = config.get("InstanceGroups")
    if groups:
        if not isinstance(groups, list):
            raise violation(groups, "resourceConfig.instanceGroups", "be a list")
        if config.get("InstanceType") is not None or config.get("InstanceCount") is not None:
            raise ValidationError(
                "InstanceGroups cannot be used together with InstanceType and InstanceCount in ResourceConfig."
            )
        for index, group in enumerate(groups):
            where = f"resourceConfig.instanceGroups.{index + 1}"
            if not isinstance(group, Mapping):
                raise violation(group, where, "be an object")
            _instance_type(group.get("InstanceType"), f"{where}.instanceType")
            _integer(group.get("InstanceCount"), f"{where}.instanceCount", minimum=1)
            if not group.get("InstanceGroupName"):
                raise violation(group.get("InstanceGroupName"), f"{where}.instanceGroupName", "not be null")
    else:
        _instance_type(config.get("InstanceType"), "resourceConfig.instanceType")
        _integer(config.get("InstanceCount"), "resourceConfig.instanceCount", minimum=1)
    if config.get("VolumeSizeInGB") is not None:
        _integer(config.get("VolumeSizeInGB"), "resourceConfig.volumeSizeInGB", minimum=1)
    keep_alive = config.get("KeepAlivePeriodInSeconds")
    if keep_alive is not None:
        keep_alive = keep_alive_seconds(keep_alive, "resourceConfig.keepAlivePeriodInSeconds")
        if keep_alive > 0 and spot:
            raise ValidationError(
                "KeepAlivePeriodInSeconds is not supported with managed spot training: warm pools need on-demand instances."
            )
        if keep_alive > 0 and groups:
            raise ValidationError(
                "KeepAlivePeriodInSeconds is not supported for heterogeneous clusters (InstanceGroups)."
            )


def _instance_type(value: Any, where: str) -> None:
    if not isinstance(value, str) or not INSTANCE_TYPE_RE.match(value):
        raise violation(value, where, "be a SageMaker training instance type such as ml.trn1.32xlarge")


def keep_alive_seconds(value: Any, where: str) -> int:
    return _integer(value, where, minimum=0, maximum=MAX_KEEP_ALIVE_SECONDS)


def _stopping_condition(condition: Any, *, spot: bool) -> None:
    if condition is None:
        return
    if not isinstance(condition, Mapping):
        raise violation(condition, "stoppingCondition", "be an object")
    runtime = condition.get("MaxRuntimeInSeconds")
    if runtime is not None:
        _integer(
            runtime, "stoppingCondition.maxRuntimeInSeconds", minimum=1, maximum=MAX_RUNTIME_LIMIT_SECONDS
        )
    wait = condition.get("MaxWaitTimeInSeconds")
    if wait is not None:
        _integer(wait, "stoppingCondition.maxWaitTimeInSeconds", minimum=1)
        if not spot:
            raise ValidationError("MaxWaitTimeInSeconds is only valid with EnableManagedSpotTraining.")
        if wait < (runtime if runtime is not None else DEFAULT_MAX_RUNTIME_SECONDS):
            raise ValidationError(
                "Invalid MaxWaitTimeInSeconds. It must be greater than or equal to MaxRuntimeInSeconds."
            )


def _vpc_config(vpc: Any) -> None:
    if vpc is None:
        return
    if not isinstance(vpc, Mapping):
        raise violation(vpc, "vpcConfig", "be an object")
    for key, where in (("SecurityGroupIds", "vpcConfig.securityGroupIds"), ("Subnets", "vpcConfig.subnets")):
        items = vpc.get(key)
        if not isinstance(items, list) or not items or not all(isinstance(i, str) and i for i in items):
            raise violation(items, where, "be a non-empty list of identifiers")


def _environment(environment: Any) -> None:
    if environment is None:
        return
    if not isinstance(environment, Mapping):
        raise violation(environment, "environment", "be a map of strings")
    if len(environment) > 100:
        raise violation(len(environment), "environment", "have at most 100 entries")
    for key, value in environment.items():
        if not ENV_KEY_RE.match(key):
            raise violation(key, "environment", "have keys matching ^[a-zA-Z_][a-zA-Z0-9_]*$")
        if not isinstance(value, str) or len(value) > 512:
            raise violation(value, f"environment.{key}", "be a string of at most 512 characters")


def tag_list(tags: Any, where: str, *, required: bool) -> list[dict[str, str]]:
    if tags is None:
        if required:
            raise violation(tags, where, "not be null")
        return []
    if not isinstance(tags, list):
        raise violation(tags, where, "be a list of {Key, Value}")
    if len(tags) > MAX_TAGS:
        raise violation(len(tags), where, f"have length less than or equal to {MAX_TAGS}")
    out: list[dict[str, str]] = []
    for tag in tags:
        if not isinstance(tag, Mapping):
            raise violation(tag, where, "be a list of {Key, Value}")
        key, value = tag.get("Key"), tag.get("Value")
        if not isinstance(key, str) or not 1 <= len(key) <= 128:
            raise violation(key, f"{where}.member.key", "have length between 1 and 128")
        if key.lower().startswith("aws:"):
            raise ValidationError(f"Tag key {key!r} uses the reserved prefix 'aws:'.")
        if not isinstance(value, str) or len(value) > 256:
            raise violation(value, f"{where}.member.value", "have length less than or equal to 256")
        out.append({"Key": key, "Value": value})
    return out


def training_job_arn_name(arn: Any) -> str:
    """The job name inside a training job ARN; tag operations address jobs by ARN."""
    if not isinstance(arn, str):
        raise violation(arn, "resourceArn", "not be null")
    match = TRAINING_JOB_ARN_RE.match(arn)
    if not match:
        raise ValidationError(f"Resource ARN {arn!r} is not the ARN of a training job.")
    return match.group(1)


def timestamp(value: Any, where: str) -> datetime | None:
    """botocore sends timestamps to JSON services as epoch seconds; ISO 8601 strings are accepted too."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise violation(value, where, "be a timestamp")
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise violation(value, where, "be a timestamp") from None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    raise violation(value, where, "be a timestamp")


def enum(value: Any, where: str, allowed: tuple[str, ...]) -> str | None:
    if value is None:
        return None
    if value not in allowed:
        raise violation(value, where, f"satisfy enum value set: [{', '.join(allowed)}]")
    return str(value)


def max_results(value: Any, where: str, minimum: int, maximum: int, default: int) -> int:
    if value is None:
        return default
    return _integer(value, where, minimum=minimum, maximum=maximum)


def name_contains(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 63 or not NAME_CONTAINS_RE.match(value):
        raise violation(value, "nameContains", "satisfy regular expression pattern: [a-zA-Z0-9\\-]+")
    return value
