"""A function's warning reaches the terminal of a quiet local stack (`sagequeue local`'s default) as one
line a person reads, with the keys it was logged with, not as the JSON document CloudWatch would index."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    from sagequeue.local import LocalStack

    POOL = "ml.trn1.32xlarge"
    with LocalStack(settings={"capacity": {POOL: 1}}, function_logs=False) as stack:
        # two nominal quotas of 1 on a pool of 1: the API stores them and logs a warning
        stack.client("admin").set_team_quota("vision", POOL, 1)
        stack.client("admin").set_team_quota("speech", POOL, 1)
        print("done")
    """
)


def test_a_function_warning_is_one_readable_line() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=False
    )

    assert done.returncode == 0, done.stderr[-2000:]
    output = (done.stdout + done.stderr).splitlines()
    warnings = [line for line in output if "team quotas above the pool's capacity" in line]
    assert warnings, output
    assert warnings[0] == (
        "ApiFunction WARNING: team quotas above the pool's capacity (pool=ml.trn1.32xlarge, team=speech)"
    )
    assert not any(line.lstrip().startswith("{") for line in output), output
