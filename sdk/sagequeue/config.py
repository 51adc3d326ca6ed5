"""Where the SDK and the CLI find the queue: the saved local-stack connection and the environment.

`sagequeue local` writes the connection of the stack it serves with `save_local_connection`; `QueueClient`
reads it with `load_local_connection` when no endpoint is given. The file is JSON at
`$SAGEQUEUE_HOME/local.json`; without SAGEQUEUE_HOME, sagequeue's one configuration directory is the
platform's (platformdirs' user config dir: `~/.config/sagequeue` on Linux, honouring XDG_CONFIG_HOME):

    {"endpoint": "http://127.0.0.1:8765", "region": "us-east-1",
     "access_key_id": "...", "secret_access_key": "...",
     "sagemaker_endpoint": "http://127.0.0.1:8766", "aws_endpoint": "http://127.0.0.1:8767",
     "job_notices_topic_arn": "arn:aws:sns:us-east-1:...:sagequeue-local-job-notices", "pid": 4242}

This module imports only the standard library and sagequeue.exceptions, so reading it costs nothing.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from sagequeue.exceptions import ConfigurationError

if TYPE_CHECKING:  # pragma: no cover
    from collections.abc import Mapping
    from pathlib import Path

#: Names the API endpoint (e.g. https://abc123.execute-api.us-east-1.amazonaws.com/prod).
ENDPOINT_ENV = "SAGEQUEUE_ENDPOINT"
#: Names a deployed stack whose `ApiUrl` output is the endpoint.
STACK_NAME_ENV = "SAGEQUEUE_STACK_NAME"
#: The API's id, sent as `x-apigw-api-id` when a private API is called through a VPC endpoint's own DNS name.
API_ID_ENV = "SAGEQUEUE_API_ID"
#: Directory of sagequeue's per-user files; default: the platform's user config dir for "sagequeue".
HOME_ENV = "SAGEQUEUE_HOME"

#: The CloudFormation output of the stack that holds the API's base URL.
API_URL_OUTPUT = "ApiUrl"
LOCAL_CONNECTION_FILE = "local.json"


@dataclass(frozen=True)
class LocalConnection:
    """How to reach a stack served by `sagequeue local`: its URL and the credentials it accepts."""

    endpoint: str
    region: str
    access_key_id: str
    secret_access_key: str = field(repr=False)
    #: The SageMaker emulator's URL (its port changes at every start).
    sagemaker_endpoint: str | None = None
    #: The URL of the stack's AWS services (moto's server: S3, SNS, ...), where `sagequeue cache`, training
    #: outputs and notice subscriptions go.
    aws_endpoint: str | None = None
    #: The stack's JobNoticesTopicArn output (`sagequeue notify` subscribes to it).
    job_notices_topic_arn: str | None = None
    #: The process serving the stack.
    pid: int | None = None

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "local connection") -> LocalConnection:
        if not isinstance(data, dict):
            raise ConfigurationError(f"{source} must hold a JSON object, got {type(data).__name__}")
        missing = [
            key for key in ("endpoint", "region", "access_key_id", "secret_access_key") if not data.get(key)
        ]
        if missing:
            raise ConfigurationError(f"{source} lacks {', '.join(missing)}")
        pid = data.get("pid")
        if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0):
            raise ConfigurationError(f"{source}: pid must be a positive whole number, got {pid!r}")
        sagemaker = data.get("sagemaker_endpoint")
        aws = data.get("aws_endpoint")
        notices = data.get("job_notices_topic_arn")
        return cls(
            endpoint=str(data["endpoint"]),
            region=str(data["region"]),
            access_key_id=str(data["access_key_id"]),
            secret_access_key=str(data["secret_access_key"]),
            sagemaker_endpoint=str(sagemaker) if sagemaker else None,
            aws_endpoint=str(aws) if aws else None,
            job_notices_topic_arn=str(notices) if notices else None,
            pid=pid,
        )

    def to_dict(self) -> dict[str, Any]:
        return {key: value for key, value in asdict(self).items() if value is not None}


def sagequeue_home(env: Mapping[str, str] | None = None) -> Path:
    """sagequeue's one configuration home, for the local stack's files and the NEFF cache's settings
    alike: SAGEQUEUE_HOME, else platformdirs' user configuration directory (~/.config/sagequeue on Linux)."""
    # pathlib and tempfile are imported when a file is touched: importing the client stays cheap
    from pathlib import Path

    value = (os.environ if env is None else env).get(HOME_ENV)
    if value:
        return Path(value).expanduser()
    import platformdirs

    return Path(platformdirs.user_config_dir("sagequeue", appauthor=False))


def local_connection_path() -> Path:
    return sagequeue_home() / LOCAL_CONNECTION_FILE


def save_local_connection(connection: LocalConnection, path: Path | None = None) -> Path:
    """Write the connection atomically (readers never see half a file), readable by the owner only,
    since it holds the local stack's secret key."""
    import tempfile
    from pathlib import Path

    target = path or local_connection_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".local-", suffix=".json", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(connection.to_dict(), handle, indent=2)
            handle.write("\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def load_local_connection(path: Path | None = None) -> LocalConnection | None:
    """The saved connection, or None when no local stack has been saved."""
    source = path or local_connection_path()
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigurationError(f"cannot read {source}: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{source} is not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    return LocalConnection.from_dict(data, source=str(source))


def remove_local_connection(path: Path | None = None, *, endpoint: str | None = None) -> bool:
    """Delete the saved connection (when `endpoint` is given, only if it still names that endpoint, so a
    stack shutting down does not erase the file of another that replaced it). True if a file was removed."""
    source = path or local_connection_path()
    if endpoint is not None:
        try:
            saved = load_local_connection(source)
        except ConfigurationError:
            return False
        if saved is None or saved.endpoint != endpoint:
            return False
    try:
        source.unlink()
    except FileNotFoundError:
        return False
    return True
