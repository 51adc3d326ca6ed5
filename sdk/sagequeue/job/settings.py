"""Where the default remote cache is remembered (`sagequeue cache set`) and how a URL is chosen."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from sagequeue_core.defaults import NEFF_CACHE_ENV

#: Overrides the directory of sagequeue's user configuration.
CONFIG_DIR_ENV = "SAGEQUEUE_CONFIG_DIR"
CACHE_URL_FILE = "neff-cache-url"


def config_dir(env: Mapping[str, str] | None = None) -> Path:
    environment = os.environ if env is None else env
    explicit = environment.get(CONFIG_DIR_ENV)
    if explicit:
        return Path(explicit)
    base = environment.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "sagequeue"


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
