"""CreateTrainingJob requests checked against SageMaker's own service model, as botocore ships it.

botocore's ParamValidator checks what botocore checks before it sends a request (required members, unknown
members, types, minimum lengths and values); the model also states maximums, patterns and enums, which
SageMaker checks on its side. Both are applied here, so a request the API accepts is one SageMaker accepts
as far as its model says, and a request it refuses is named by the member at fault.

The model is loaded once, lazily (botocore's loader reads one JSON file; no client is created).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from botocore.loaders import Loader
from botocore.model import ListShape, MapShape, ServiceModel, Shape, StructureShape
from botocore.validate import ParamValidator

from sagequeue_core.domain import DomainError

CREATE_TRAINING_JOB = "CreateTrainingJob"
#: The instance types listed first in messages: the ones sagequeue is built for.
PREFERRED_FAMILIES = ("ml.trn1.", "ml.trn1n.", "ml.trn2.")
#: How many problems one answer names at most (a hostile body can have thousands).
MAX_PROBLEMS = 10


class RequestShapeInvalid(DomainError):
    """A request that SageMaker's service model refuses; `problems` names each member at fault."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = tuple(problems)
        shown = "; ".join(self.problems[:MAX_PROBLEMS])
        more = len(self.problems) - MAX_PROBLEMS
        super().__init__(shown + (f"; and {more} more" if more > 0 else ""))


@cache
def sagemaker_model() -> ServiceModel:
    loader = Loader()
    return ServiceModel(loader.load_service_model("sagemaker", "service-2"), service_name="sagemaker")


@cache
def _input_shape(operation: str) -> StructureShape:
    shape = sagemaker_model().operation_model(operation).input_shape
    assert isinstance(shape, StructureShape)
    return shape


@cache
def training_instance_types() -> tuple[str, ...]:
    """Every TrainingInstanceType the service model knows: Trainium first, then the rest in order."""
    shape = sagemaker_model().shape_for("TrainingInstanceType")
    values = [str(value) for value in shape.enum]
    preferred = sorted(v for v in values if v.startswith(PREFERRED_FAMILIES))
    return (*preferred, *sorted(v for v in values if not v.startswith(PREFERRED_FAMILIES)))


def check_training_instance_type(value: Any, where: str = "InstanceType") -> str:
    """`value` if it is a training instance type SageMaker knows, else a DomainError listing the valid ones
    (Trainium first). Used for submissions and for pools alike."""
    known = training_instance_types()
    if isinstance(value, str) and value in known:
        return value
    raise DomainError(
        f"{where} {value!r} is not a SageMaker training instance type; valid: {', '.join(known)}"
    )


def validate_create_training_job(request: Mapping[str, Any]) -> None:
    """RequestShapeInvalid naming every member of `request` SageMaker's model refuses; None when it fits."""
    shape = _input_shape(CREATE_TRAINING_JOB)
    report = ParamValidator().validate(dict(request), shape)
    # botocore formats one message per problem, each naming the member ("Invalid type for parameter
    # HyperParameters.epochs, value: 3, ..."); its joined report would split a member name that holds a
    # newline, so the messages are taken one by one.
    errors = getattr(report, "_errors", None)
    format_error = getattr(report, "_format_error", None)
    if errors is not None and format_error is not None:
        problems = [str(format_error(error)) for error in errors]
    else:
        problems = [line.strip() for line in report.generate_report().splitlines()[1:] if line.strip()]
    if report.has_errors() and not problems:
        problems = [report.generate_report()]
    if not problems:
        problems = _limits(request, shape, "")
    if problems:
        raise RequestShapeInvalid(problems)


def _limits(value: Any, shape: Shape, where: str) -> list[str]:
    """Maximums, patterns and enums of the model, which botocore does not check. Runs on a request whose
    types botocore already accepted."""
    problems: list[str] = []
    metadata = shape.metadata
    label = where or "request"
    if isinstance(shape, StructureShape) and isinstance(value, Mapping):
        for member, member_value in value.items():
            if member in shape.members and member_value is not None:
                path = f"{where}.{member}" if where else str(member)
                problems.extend(_limits(member_value, shape.members[member], path))
        return problems
    if isinstance(shape, ListShape) and isinstance(value, list):
        if "max" in metadata and len(value) > metadata["max"]:
            problems.append(f"{label} has {len(value)} items; at most {metadata['max']}")
        for index, item in enumerate(value):
            problems.extend(_limits(item, shape.member, f"{label}[{index}]"))
        return problems
    if isinstance(shape, MapShape) and isinstance(value, Mapping):
        if "max" in metadata and len(value) > metadata["max"]:
            problems.append(f"{label} has {len(value)} entries; at most {metadata['max']}")
        for key, item in value.items():
            problems.extend(_limits(key, shape.key, f"{label} key {key!r}"))
            problems.extend(_limits(item, shape.value, f"{label}.{key}"))
        return problems
    if shape.type_name == "string" and isinstance(value, str):
        if "max" in metadata and len(value) > metadata["max"]:
            problems.append(f"{label} is {len(value)} characters; at most {metadata['max']}")
        enum = getattr(shape, "enum", None) or metadata.get("enum")
        if shape.name == "TrainingInstanceType":
            try:
                check_training_instance_type(value, label)
            except DomainError as exc:
                problems.append(str(exc))
        elif enum and value not in enum:
            problems.append(f"{label} {value!r} is not one of {', '.join(_enum_order(enum))}")
        pattern = _pattern(metadata.get("pattern"))
        if pattern is not None and not pattern.fullmatch(value):
            problems.append(f"{label} {value!r} does not match {metadata['pattern']}")
    elif shape.type_name in _INTEGER_LIMITS and isinstance(value, int) and not isinstance(value, bool):
        # SageMaker's integers are Java's: without a stated maximum, the type's own bounds apply.
        lowest, highest = _INTEGER_LIMITS[shape.type_name]
        highest = min(highest, metadata.get("max", highest))
        if value > highest:
            problems.append(f"{label} {value} is above the maximum {highest}")
        elif value < lowest:
            problems.append(f"{label} {value} is below the minimum {lowest}")
    return problems


_INTEGER_LIMITS = {"integer": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}


def _enum_order(enum: Sequence[str]) -> list[str]:
    preferred = [v for v in enum if v.startswith(PREFERRED_FAMILIES)]
    return preferred + [v for v in enum if not v.startswith(PREFERRED_FAMILIES)]


#: Java's Unicode classes in the model's patterns, as Python `re` classes that accept at least as much
#: (letters become word characters): a valid value is never refused for Python's lack of `\p{...}`.
_UNICODE_CLASSES = {
    r"\p{Alnum}": "a-zA-Z0-9",
    r"\p{L}": r"\w",
    r"\p{N}": r"\d",
    r"\p{Z}": r"\s",
    r"\p{M}": r"\w",
}


@cache
def _pattern(source: str | None) -> re.Pattern[str] | None:
    """The model's pattern as a Python regex; None when it uses syntax Python lacks (not checked then)."""
    if not source:
        return None
    translated = source
    for java, python in _UNICODE_CLASSES.items():
        translated = translated.replace(java, python)
    try:
        return re.compile(translated, re.DOTALL)
    except re.error:
        return None
