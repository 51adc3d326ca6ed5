"""The one retry policy (sagequeue_core.retry), as each kind of client receives it."""

from __future__ import annotations

import pytest
import urllib3
from hypothesis import given
from hypothesis import strategies as st

from sagequeue_core import retry, runtime


@given(tries=st.integers(min_value=-3, max_value=60), base=st.floats(0.01, 5), cap=st.floats(0.01, 60))
def test_a_pause_is_full_jitter_under_a_capped_exponential_ceiling(
    tries: int, base: float, cap: float
) -> None:
    pause = retry.backoff_seconds(tries, base=base, cap=cap)
    assert 0 <= pause <= min(cap, base * 2 ** (max(tries, 1) - 1))


def test_pauses_are_spread_not_fixed() -> None:
    # clients that failed together must not come back together
    assert len({round(retry.backoff_seconds(3), 6) for _ in range(50)}) > 40


def test_the_functions_aws_clients_use_the_policy() -> None:
    config = runtime.CLIENT_CONFIG
    assert config.retries == {"mode": "standard", "total_max_attempts": retry.MAX_ATTEMPTS}
    assert (config.connect_timeout, config.read_timeout) == (
        retry.CONNECT_TIMEOUT_SECONDS,
        retry.READ_TIMEOUT_SECONDS,
    )


def test_a_client_may_take_fewer_tries_and_other_options_but_keeps_the_mode() -> None:
    config = retry.botocore_config(attempts=2, max_pool_connections=32, read_timeout=15)
    assert config.retries == {"mode": "standard", "total_max_attempts": 2}
    assert (config.max_pool_connections, config.read_timeout) == (32, 15)


def test_throttling_is_retried_for_every_method_gateway_errors_only_when_harmless() -> None:
    policy = retry.http_retry()
    assert policy.is_retry("POST", 429)  # refused before any work: a submit too
    assert not policy.is_retry("POST", 503)  # a submit that may have gone through is not repeated
    for method in ("GET", "PUT", "DELETE", "PATCH"):
        assert policy.is_retry(method, 503)
    assert not policy.is_retry("GET", 400)
    assert not policy.is_retry("GET", 500)


def test_the_http_policy_counts_tries_in_all_and_connection_failures_apart() -> None:
    policy = retry.http_retry(attempts=5)
    error = urllib3.exceptions.NewConnectionError(None, "refused")  # type: ignore[arg-type]
    policy = policy.increment("GET", "http://q/jobs", error=error)
    policy = policy.increment("GET", "http://q/jobs", error=error)
    with pytest.raises(urllib3.exceptions.MaxRetryError):
        policy.increment("GET", "http://q/jobs", error=error)  # the third refused connection ends it
    assert 0 <= policy.get_backoff_time() <= retry.BACKOFF_BASE_SECONDS * 2


def test_one_try_means_no_retry_and_zero_is_refused() -> None:
    with pytest.raises(urllib3.exceptions.MaxRetryError):
        retry.http_retry(attempts=1).increment("GET", "http://q/jobs", error=ConnectionError())
    with pytest.raises(ValueError, match="at least 1"):
        retry.http_retry(attempts=0)
