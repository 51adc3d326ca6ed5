"""Fixtures every tier shares: fake AWS credentials and one moto server over real HTTP per test session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# No test may reach a real AWS account: fake credentials, a fixed region, no instance metadata lookups.
os.environ.update(
    {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SECURITY_TOKEN": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
)
for _var in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
    os.environ.pop(_var, None)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto's server on 127.0.0.1 (a free port), shared by the session; tests use unique resource names."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
