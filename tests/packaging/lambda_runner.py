"""Invoke one built handler the way Lambda's Python runtime loads it, and print its answer as JSON.

Run with the function runtime's interpreter (python3.12) in isolated mode (`-I -S`): nothing of the
source tree or of a virtual environment is importable but what is given here, in Lambda's order: the
function's folder (the task root), the layers' `python/` folders (what Lambda extracts into /opt/python,
in the function's order; LAYER_PYTHON names one, or several joined by the path separator), then the
runtime's own packages (boto3 and botocore, which Lambda's python3.12 runtime provides).

    python3.12 -I -S lambda_runner.py TASK_ROOT LAYER_PYTHON RUNTIME_SITE app.handler EVENT_JSON
"""

import importlib
import json
import os
import sys


def main() -> None:
    task_root, layer_python, runtime_site, handler_name, event_file = sys.argv[1:6]
    sys.path[:] = [
        task_root,
        *layer_python.split(os.pathsep),
        runtime_site,
        *[p for p in sys.path if "lib/python3" in p and "site-packages" not in p],
    ]
    module_name, _, attribute = handler_name.rpartition(".")
    module = importlib.import_module(module_name)
    handler = getattr(module, attribute)
    with open(event_file, encoding="utf-8") as source:
        event = json.load(source)

    class Context:
        function_name = "smoke"
        memory_limit_in_mb = 512
        invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:smoke"
        aws_request_id = "00000000-0000-0000-0000-000000000000"

        def get_remaining_time_in_millis(self) -> int:
            return 60_000

    answer = handler(event, Context())
    core = sys.modules["sagequeue_core"].__file__ or ""
    print(
        "SMOKE-ANSWER "
        + json.dumps(
            {"answer": answer, "sagequeue_core": core, "python": list(sys.version_info[:2])}, default=str
        )
    )


if __name__ == "__main__":
    main()
