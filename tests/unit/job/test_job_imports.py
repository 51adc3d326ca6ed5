"""The job image carries no server-side dependencies: only sagequeue_core.defaults, the retry policy
(sagequeue_core.retry) and the checkpoint marker's format (sagequeue_core.checkpoint_marker), all standard
library only, cross over."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import json, sys
import sagequeue.job.cli, sagequeue.job.cache_cli, sagequeue.job.runner, sagequeue.job.hub
import sagequeue.job.s3, sagequeue.job.metrics, sagequeue.job.sync, sagequeue.job.checkpoints
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in
    ("pynamodb", "aws_lambda_powertools", "moto", "sagemaker", "sagequeue_core"))))
"""


def test_the_job_package_imports_only_the_shared_defaults_retry_policy_and_marker_format() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [
        "sagequeue_core",
        "sagequeue_core.checkpoint_marker",
        "sagequeue_core.defaults",
        "sagequeue_core.retry",
    ]


def _job_imports() -> dict[str, set[str]]:
    """Module -> the sagequeue.job modules it imports (at any depth of the file: a function-level import
    is still an edge of the circle)."""
    import ast
    from pathlib import Path

    import sagequeue.job

    package = Path(sagequeue.job.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in sorted(package.glob("*.py")):
        name = f"sagequeue.job.{path.stem}"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "sagequeue.job":
                    edges |= {f"sagequeue.job.{alias.name}" for alias in node.names}
                elif node.module.startswith("sagequeue.job."):
                    edges.add(node.module)
            elif isinstance(node, ast.Import):
                edges |= {a.name for a in node.names if a.name.startswith("sagequeue.job.")}
        graph[name] = edges - {name}
    return graph


def test_the_job_package_has_no_import_circle() -> None:
    graph = _job_imports()
    assert "sagequeue.job.remote" in graph
    assert "sagequeue.job.hub" in graph

    def cycle_from(start: str) -> list[str] | None:
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return [*path, nxt]
                if nxt not in path:
                    stack.append((nxt, [*path, nxt]))
        return None

    circles = [c for c in (cycle_from(m) for m in sorted(graph)) if c]
    assert circles == []
