"""Every error the SDK raises, in one flat module.

API errors carry the server's message and code, so a caller can branch on the class and show the message
as is. The classes mirror the API's error codes (see docs/contracts.md).
"""

from __future__ import annotations

from typing import Any


class SageQueueError(Exception):
    """Base of every sagequeue SDK error."""


class ConfigurationError(SageQueueError):
    """The queue cannot be located (no endpoint, no stack output) or the saved configuration cannot be
    read; the message says which and how to fix it."""


class NotTheQueue(ConfigurationError):
    """The endpoint answered, but not as a sagequeue API does: it is another service's."""

    def __init__(self, endpoint: str, detail: str) -> None:
        super().__init__(
            f"{endpoint} is not a sagequeue API ({detail}): point --endpoint or SAGEQUEUE_ENDPOINT at the "
            "stack's ApiUrl output, or the endpoint `sagequeue local` prints"
        )
        self.endpoint = endpoint


class CredentialsError(SageQueueError):
    """No AWS credentials to sign requests with."""


class EndpointUnreachable(SageQueueError):
    """The API endpoint did not answer (connection refused, DNS failure, timeout)."""

    def __init__(self, endpoint: str, detail: str) -> None:
        super().__init__(f"cannot reach the sagequeue API at {endpoint}: {detail}")
        self.endpoint = endpoint
        self.detail = detail


class ApiError(SageQueueError):
    """The API answered with an error. `message` is the server's, `code` its error code."""

    status: int = 0
    default_code: str = "Error"

    def __init__(
        self, message: str, *, status: int | None = None, code: str | None = None, body: Any = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.code = code or self.default_code
        self.body = body


class ValidationError(ApiError):
    """The request was refused as invalid (HTTP 400)."""

    status = 400
    default_code = "ValidationError"


class Forbidden(ApiError):
    """The caller may not do this (HTTP 403): not signed, not allowed, or not an admin."""

    status = 403
    default_code = "Forbidden"


class NotFound(ApiError):
    """No such job or pool (HTTP 404)."""

    status = 404
    default_code = "NotFound"


class Conflict(ApiError):
    """The job's state does not allow this, or the name is taken (HTTP 409)."""

    status = 409
    default_code = "Conflict"


class Throttled(ApiError):
    """Too many requests (HTTP 429), still refused after the client's retries."""

    status = 429
    default_code = "Throttled"


class ServerError(ApiError):
    """The API failed (HTTP 5xx)."""

    status = 500
    default_code = "InternalError"


_BY_CODE: dict[str, type[ApiError]] = {
    "ValidationError": ValidationError,
    "Forbidden": Forbidden,
    "NotFound": NotFound,
    "Conflict": Conflict,
    "Throttled": Throttled,
    "InternalError": ServerError,
}
_BY_STATUS: dict[int, type[ApiError]] = {
    400: ValidationError,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    429: Throttled,
}


def api_error(status: int, body: Any, fallback_message: str = "") -> ApiError:
    """The named error for an HTTP error answer: by the body's `code` when known, else by status."""
    code = body.get("code") if isinstance(body, dict) else None
    message = body.get("message") if isinstance(body, dict) else None
    if not isinstance(message, str) or not message:
        # API Gateway's own refusals (e.g. a bad signature) use "Message"
        alt = body.get("Message") if isinstance(body, dict) else None
        message = alt if isinstance(alt, str) and alt else fallback_message or f"HTTP {status}"
    cls = _BY_CODE.get(code) if isinstance(code, str) else None
    if cls is None:
        cls = _BY_STATUS.get(status, ServerError if status >= 500 else ApiError)
    return cls(message, status=status, code=code if isinstance(code, str) else None, body=body)
