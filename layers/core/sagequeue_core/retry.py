"""The one retry policy of every sagequeue client.

A call that failed for a reason that may pass (throttling, a gateway or service error, a refused or
timed-out connection) is tried again, `MAX_ATTEMPTS` tries in all, after a pause drawn uniformly between
zero and an exponential ceiling (`backoff_seconds`: full jitter, so many clients that failed together do
not come back together). Only what is harmless to repeat is repeated after it may have reached the server.

Each kind of client takes the policy in its own library's terms, built here and nowhere else:

- the AWS clients (the functions' DynamoDB, SageMaker, EventBridge ...; the SDK session's logs; the job
  image's S3) as botocore's standard retry mode: `botocore_config()`;
- the sagequeue API client (the CLI, `QueueSession`, the botocore hook) as urllib3's `Retry`:
  `http_retry()`;
- a loop that must repeat a whole operation (a Hub commit that lost a race, a wait that rides out an
  outage of the queue) pauses `backoff_seconds(tries)` between tries.

botocore computes its standard mode's pauses itself (full jitter under 2**n seconds, capped at 20 s); the
attempts, timeouts and what is retried are this module's.
"""

from __future__ import annotations

import random
from typing import Any

#: Tries in all, the first included, of one call.
MAX_ATTEMPTS = 5
#: Tries of a call whose connection is refused or times out: a wrong endpoint is reported in about a
#: second rather than after the whole budget.
CONNECT_ATTEMPTS = 3
#: The ceiling of the first pause, in seconds; it doubles with every try.
BACKOFF_BASE_SECONDS = 0.2
#: No pause is longer than this, in seconds.
BACKOFF_MAX_SECONDS = 5.0
CONNECT_TIMEOUT_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 30.0
#: HTTP answers that say "not now" rather than "no": throttling and the gateway's own failures.
RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
#: Methods that change nothing more when repeated (the API's PATCH sets fields to values). A POST that may
#: have gone through (a submit) is not repeated.
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "PATCH"})


def backoff_seconds(
    tries: int, *, base: float = BACKOFF_BASE_SECONDS, cap: float = BACKOFF_MAX_SECONDS
) -> float:
    """The pause after `tries` failed tries (1 for the first failure): full jitter under
    `min(cap, base * 2**(tries - 1))`."""
    ceiling = min(cap, base * 2 ** (max(tries, 1) - 1))
    return random.uniform(0, ceiling)


def botocore_config(*, attempts: int = MAX_ATTEMPTS, **options: Any) -> Any:
    """A botocore `Config` with the policy: standard retry mode, `attempts` tries in all, bounded
    timeouts; `options` adds or overrides other `Config` fields (max_pool_connections, timeouts)."""
    from botocore.config import Config

    settings: dict[str, Any] = {
        "retries": {"mode": "standard", "total_max_attempts": attempts},
        "connect_timeout": CONNECT_TIMEOUT_SECONDS,
        "read_timeout": READ_TIMEOUT_SECONDS,
    }
    settings.update(options)
    return Config(**settings)


def http_retry(
    *,
    attempts: int = MAX_ATTEMPTS,
    base: float = BACKOFF_BASE_SECONDS,
    cap: float = BACKOFF_MAX_SECONDS,
) -> Any:
    """urllib3's `Retry` with the policy: `attempts` tries in all, at most `CONNECT_ATTEMPTS` of them for a
    connection that fails; throttling (429) for every method, since it was refused before any work; the
    gateway's errors and broken answers only for idempotent methods; `backoff_seconds` between tries (or
    what Retry-After asks for, up to `cap`); no redirects."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    return _retry_class()(
        total=attempts - 1,
        connect=min(attempts, CONNECT_ATTEMPTS) - 1,
        status_forcelist=RETRYABLE_STATUS,
        allowed_methods=IDEMPOTENT_METHODS,
        backoff_factor=base,
        backoff_max=cap,
        redirect=False,
        raise_on_status=False,
    )


_RETRY_CLASS: type | None = None


def _retry_class() -> type:
    """The Retry subclass, made on first use: urllib3 is imported only by the clients that speak HTTP
    themselves, not by every function that imports this module."""
    global _RETRY_CLASS
    if _RETRY_CLASS is None:
        import urllib3

        class PolicyRetry(urllib3.Retry):
            def is_retry(self, method: str, status_code: int, has_retry_after: bool = False) -> bool:
                if status_code == 429:
                    return True
                return bool(super().is_retry(method, status_code, has_retry_after))

            def get_backoff_time(self) -> float:
                return backoff_seconds(len(self.history), base=self.backoff_factor, cap=self.backoff_max)

        _RETRY_CLASS = PolicyRetry
    return _RETRY_CLASS
