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


def _moto_backs_up_each_table_once_per_transaction() -> None:
    """moto's TransactWriteItems deep-copies the table for every item of the transaction that names it, as
    the backup it rolls back to: one pass's waiting reasons copied a 10,000-job table twenty times
    (test_pass_cost.py spent half its time there). All these copies are taken before the first write, so
    one per table is the same backup; anything else moto copies (items) is copied as before."""
    import copy
    import threading

    from moto.dynamodb import models
    from moto.dynamodb.models.table import Table

    if getattr(models.DynamoDBBackend.transact_write_items, "_backs_up_once", False):
        return
    taken = threading.local()

    class _Copy:
        def __getattr__(self, name: str) -> object:
            return getattr(copy, name)

        @staticmethod
        def deepcopy(value: object, memo: dict[int, object] | None = None) -> object:
            backups: dict[int, object] | None = getattr(taken, "backups", None)
            if backups is None or memo is not None or not isinstance(value, Table):
                return copy.deepcopy(value, memo)
            if id(value) not in backups:
                backups[id(value)] = copy.deepcopy(value)
            return backups[id(value)]

    original = models.DynamoDBBackend.transact_write_items

    def transact_write_items(self: object, transact_items: list[dict[str, object]]) -> None:
        taken.backups = {}
        try:
            original(self, transact_items)
        finally:
            taken.backups = None

    transact_write_items._backs_up_once = True  # type: ignore[attr-defined]
    models.copy = _Copy()  # type: ignore[assignment]
    models.DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]


_moto_backs_up_each_table_once_per_transaction()


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


# --- IAM: every AWS request a function makes is checked against its role in template.yaml ------------------
# tests/support/iam_check.py records the requests of the functions' clients and evaluates them against the
# role policies the template renders; a request the role would deny fails the test that made it.
# SAGEQUEUE_IAM_CALL_LOG=<file> keeps a representative log of the allowed requests (tests/functional/iam/calls.json is
# one, made from the functional and end-to-end suites) and prints the grants no recorded request used.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from support import iam_check  # noqa: E402

_IAM_RECORDER = iam_check.install()
_IAM_POLICIES = iam_check.Policies()


@pytest.fixture(autouse=True)
def _functions_calls_are_allowed_by_their_roles(request: pytest.FixtureRequest) -> Iterator[None]:
    recorder = _IAM_RECORDER
    recorder.test = request.node.nodeid
    first, first_error = len(recorder.calls), len(recorder.errors)
    yield
    made = recorder.calls[first:]
    problems = recorder.errors[first_error:] + (iam_check.denials(made, _IAM_POLICIES) if made else [])
    if not os.environ.get("SAGEQUEUE_IAM_CALL_LOG"):
        del recorder.calls[first:]  # judged; kept only when a call log is wanted
    if problems:
        pytest.fail(
            "template.yaml does not allow what the functions did:\n  " + "\n  ".join(problems), pytrace=False
        )


#: The test files that take longest, slowest first. .ci/run hands each of its workers whole files
#: (--dist loadfile) in collection order (--no-loadscope-reorder): the long files start first and short ones
#: fill in at the end, instead of one worker finishing a long file alone while the other waits.
SLOWEST_FILES = Path(__file__).with_name("slowest_files.txt")


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    listed = [
        line.strip()
        for line in SLOWEST_FILES.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    rank = {path: n for n, path in enumerate(listed)}
    # stable: unlisted files keep their order after the listed ones, and every file its tests' order
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get("SAGEQUEUE_IAM_CALL_LOG")
    if not target or not _IAM_RECORDER.calls:
        return
    log = Path(target)
    # several runs may add to one log (suites whose conftest modules cannot share a pytest run)
    earlier = iam_check.load(log) if log.is_file() else []
    iam_check.save([*earlier, *_IAM_RECORDER.calls], log)
    unused = iam_check.unused_report([*earlier, *_IAM_RECORDER.calls], _IAM_POLICIES)
    print(f"\nIAM: {len(_IAM_RECORDER.calls)} requests of the functions recorded in {target}")
    print("IAM: granted but used by no recorded request, and not justified in template.yaml:")
    print(iam_check.summary(unused) or "  none")


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
