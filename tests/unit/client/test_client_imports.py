"""What importing the SDK costs: the client, the hook and the CLI never pull in the SageMaker SDK, and the
client defers boto3, botocore and urllib3 to its first request."""

from __future__ import annotations

import json
import subprocess
import sys


def modules_after(statement: str) -> set[str]:
    probe = f"import sys; {statement}; import json; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return set(json.loads(done.stdout))


def test_the_client_imports_no_aws_library_until_it_is_used() -> None:
    loaded = modules_after("import sagequeue, sagequeue.client, sagequeue.config")
    assert "sagequeue.client" in loaded
    assert not {"sagemaker", "boto3", "botocore", "urllib3"} & loaded


def test_the_hook_and_the_commands_never_import_the_sagemaker_sdk() -> None:
    loaded = modules_after("import sagequeue.hook, sagequeue.queue_cli, sagequeue.cli")
    assert "sagequeue.queue_cli" in loaded
    assert "sagemaker" not in loaded


def test_the_lazy_exports_resolve_to_the_modules() -> None:
    loaded = modules_after("import sagequeue; sagequeue.QueueClient; sagequeue.install")
    assert {"sagequeue.client", "sagequeue.hook"} <= loaded
    assert "sagemaker" not in loaded
