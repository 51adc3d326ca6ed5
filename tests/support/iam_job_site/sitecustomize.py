"""Put first on the PYTHONPATH of a job-image process a test starts: with SAGEQUEUE_IAM_JOB_LOG set, the
process appends each request its job-image code makes to that file, one JSON line each, for the test to
judge against the documented job role (tests/support/iam_check.py)."""

import os
import sys

if os.environ.get("SAGEQUEUE_IAM_JOB_LOG"):
    import json
    import threading
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from support import iam_check

    _log = Path(os.environ["SAGEQUEUE_IAM_JOB_LOG"])
    _lock = threading.Lock()

    def _append(request: "iam_check.JobRequest") -> None:
        line = json.dumps(request.to_json()) + "\n"
        with _lock, _log.open("a") as out:
            out.write(line)

    iam_check.install_job_recorder(_append).enabled = True
    sys.path.remove(str(Path(__file__).resolve().parents[2]))
