"""Lambda code must not pull in the SageMaker SDK or anything else heavy the layer does not carry."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HANDLERS = sorted(ROOT.glob("functions/*/app.py"))
#: Importable here, but not in the Lambda layer (or far too slow for a cold start).
FORBIDDEN = ("sagemaker", "moto", "huggingface_hub", "sagequeue", "pandas", "numpy", "torch")

PROBE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("app", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps({"handler": callable(getattr(module, "handler", None)), "modules": sorted(sys.modules)}))
"""


def test_every_function_in_the_layout_has_a_handler() -> None:
    assert {h.parent.name for h in HANDLERS} >= {"api", "scheduler"}


@pytest.mark.parametrize("handler", HANDLERS, ids=lambda p: p.parent.name)
def test_handler_imports_only_what_the_layer_carries(handler: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(handler)], capture_output=True, text=True, check=True
    )
    loaded = json.loads(out.stdout.splitlines()[-1])
    assert loaded["handler"], f"{handler} has no callable `handler`"
    heavy = sorted(
        name
        for name in loaded["modules"]
        if name.split(".")[0] in FORBIDDEN and not name.startswith("sagequeue_")
    )
    assert heavy == [], f"{handler.relative_to(ROOT)} imports {heavy}"
