"""The errors the emulator answers, each carrying SageMaker's error code.

botocore reads `__type` from the JSON body of a 400 answer and raises a ClientError with that code, so
callers branch on `error.response["Error"]["Code"]` exactly as they do against SageMaker.
"""

from __future__ import annotations


class SageMakerError(Exception):
    """A request SageMaker would refuse; `code` is the wire error code, `status` the HTTP status."""

    code = "InternalFailure"
    status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_wire(self) -> dict[str, str]:
        return {"__type": self.code, "message": self.message}


class ValidationError(SageMakerError):
    code = "ValidationException"


class ResourceInUse(SageMakerError):
    code = "ResourceInUse"


class ResourceLimitExceeded(SageMakerError):
    code = "ResourceLimitExceeded"


class ResourceNotFound(SageMakerError):
    code = "ResourceNotFound"


class ThrottlingError(SageMakerError):
    code = "ThrottlingException"


class UnknownOperation(SageMakerError):
    code = "UnknownOperationException"


class SerializationError(SageMakerError):
    code = "SerializationException"


class InternalFailure(SageMakerError):
    code = "InternalFailure"
    status = 500


class ServiceUnavailable(SageMakerError):
    code = "ServiceUnavailable"
    status = 503


#: Error classes by wire code, for injected failures (`SageMakerEmulator.fail_next`).
ERRORS_BY_CODE: dict[str, type[SageMakerError]] = {
    cls.code: cls
    for cls in (
        ValidationError,
        ResourceInUse,
        ResourceLimitExceeded,
        ResourceNotFound,
        ThrottlingError,
        InternalFailure,
        ServiceUnavailable,
    )
}


def not_found(what: str = "", code: str = "ValidationException") -> SageMakerError:
    """SageMaker's "not found" answer. The service model declares ResourceNotFound, but SageMaker has been
    seen answering ValidationException with the same text for DescribeTrainingJob (aws/aws-sdk#165); `code`
    picks which one the emulator gives."""
    # SageMaker's own text; the name is appended so a failing test says which job it looked for.
    suffix = f" ({what})" if what else ""
    error_class = ValidationError if code == ValidationError.code else ResourceNotFound
    return error_class(f"Requested resource not found.{suffix}")
