"""Fixtures every tier shares: fake AWS credentials and one moto server over real HTTP per test session."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

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
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/support, for every tier

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


@pytest.fixture(autouse=True)
def _sagemaker_as_aws_documents_it(request: pytest.FixtureRequest) -> Iterator[None]:
    """In the scheduler, governance and end-to-end suites, every emulator a test used is AWS's (see
    tests/support/aws_guard.py); a kinder one fails the test unless it names why."""
    from support.aws_guard import guarded, unexplained

    from sagequeue.local.emulator.emulator import STARTED

    if not guarded(Path(str(request.node.fspath))):
        yield
        return
    before = set(STARTED)
    yield
    problems = []
    for emulator in list(STARTED):
        if emulator.running or emulator not in before:
            found = unexplained(emulator)
            if found:
                problems.append("; ".join(found))
    if problems:
        pytest.fail(
            "the SageMaker emulator was kinder than AWS without a Kinder(reason, ...) saying why: "
            + " | ".join(problems),
            pytrace=False,
        )
