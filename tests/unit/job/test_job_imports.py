"""The job image carries no server-side dependencies: only sagequeue_core.defaults and the retry policy
(sagequeue_core.retry, standard library only) cross over."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
import sagequeue.job.cli, sagequeue.job.cache_cli, sagequeue.job.runner, sagequeue.job.hub
import sagequeue.job.s3, sagequeue.job.metrics, sagequeue.job.sync
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in
    ("pynamodb", "aws_lambda_powertools", "moto", "sagemaker", "sagequeue_core"))))
"""


def test_the_job_package_imports_only_the_shared_defaults_and_retry_policy_from_the_server_side() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == ["sagequeue_core", "sagequeue_core.defaults", "sagequeue_core.retry"]
