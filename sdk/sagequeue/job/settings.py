"""Where the default remote cache is remembered (`sagequeue cache set`) and how a URL is chosen."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sagequeue_core.defaults import NEFF_CACHE_ENV

#: Overrides the directory of sagequeue's user configuration.
CONFIG_DIR_ENV = "SAGEQUEUE_CONFIG_DIR"
CACHE_URL_FILE = "neff-cache-url"


def config_dir(env: Mapping[str, str] | None = None) -> Path:
    environment = os.environ if env is None else env
    explicit = environment.get(CONFIG_DIR_ENV)
    if explicit:
        return Path(explicit)
    from sagequeue.config import sagequeue_home

    return sagequeue_home(environment)


def saved_cache_url(env: Mapping[str, str] | None = None) -> str | None:
    path = config_dir(env) / CACHE_URL_FILE
    if not path.exists():
        return None
    return path.read_text().strip() or None


def save_cache_url(url: str, env: Mapping[str, str] | None = None) -> Path:
    path = config_dir(env) / CACHE_URL_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(url + "\n")
    return path


def cache_url(explicit: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """The remote cache: the option, else SAGEQUEUE_NEFF_CACHE, else the one `sagequeue cache set` saved."""
    environment = os.environ if env is None else env
    return explicit or environment.get(NEFF_CACHE_ENV) or saved_cache_url(environment)


#: The writer a job publishes as on S3 (its team's `writers/<name>/` folder, the only one its IAM policy lets
#: it write); unset: the entry's own folder, as before writers were recorded.
CACHE_WRITER_ENV = "SAGEQUEUE_NEFF_CACHE_WRITER"
#: The writers a job restores from, comma-separated (S3: writer folders; the Hub: users); unset or `*`: any.
CACHE_TRUST_ENV = "SAGEQUEUE_NEFF_CACHE_TRUST"


def cache_writer(env: Mapping[str, str] | None = None) -> str | None:
    return (os.environ if env is None else env).get(CACHE_WRITER_ENV) or None


def cache_trust(env: Mapping[str, str] | None = None) -> str | None:
    return (os.environ if env is None else env).get(CACHE_TRUST_ENV) or None


#: Secrets Manager secret (name or ARN) holding the Hub token, so the token stays out of the training
#: job's environment, which DescribeTrainingJob shows to anyone allowed to describe it.
HF_TOKEN_SECRET_ENV = "SAGEQUEUE_HF_TOKEN_SECRET"  # noqa: S105 - a variable name, not a secret
_TOKEN_KEYS = ("HF_TOKEN", "hf_token", "token")


class SecretError(RuntimeError):
    """The Hub token secret could not be read or holds no token."""


#: Tries of the token's GetSecretValue, and the connect and read timeout of each, in seconds.
SECRET_ATTEMPTS = 2
SECRET_TIMEOUT_SECONDS = 5.0


def hub_token_from_secret(secret_id: str, client: Any = None) -> str:
    """The token in a secret: the whole SecretString, or its HF_TOKEN/token key when it is JSON."""
    import json

    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from sagequeue_core.retry import botocore_config

    # bounded like the cache itself: a Secrets Manager that never answers costs seconds, not minutes
    secrets = client or boto3.client(
        "secretsmanager",
        config=botocore_config(
            attempts=SECRET_ATTEMPTS,
            connect_timeout=SECRET_TIMEOUT_SECONDS,
            read_timeout=SECRET_TIMEOUT_SECONDS,
        ),
    )
    try:
        value = secrets.get_secret_value(SecretId=secret_id)
    except (BotoCoreError, ClientError) as exc:
        raise SecretError(f"cannot read secret {secret_id}: {exc}") from exc
    text = str(value.get("SecretString") or "").strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise SecretError(f"secret {secret_id} looks like JSON but does not parse") from exc
        text = next((str(data[k]) for k in _TOKEN_KEYS if isinstance(data, dict) and data.get(k)), "")
    if not text:
        raise SecretError(f"secret {secret_id} holds no token (a plain string, or JSON with HF_TOKEN)")
    return text
