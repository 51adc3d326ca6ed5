"""docs/openapi.json is what the api handler's routes and models generate: regenerate it with
`python tests/unit/server/test_openapi.py` after changing them."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from sagequeue_core.service.http import tidy_openapi

ROOT = Path(__file__).resolve().parents[3]
DOCUMENT = ROOT / "docs" / "openapi.json"


def generated() -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location("sagequeue_api_for_openapi", ROOT / "functions/api/app.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    document: dict[str, Any] = tidy_openapi(
        json.loads(
            module.app.get_openapi_json_schema(
                title="sagequeue",
                version="1",
                description="Priority queue and scheduler for Amazon SageMaker training jobs. "
                "Every route requires SigV4 (IAM) authentication; errors are {message, code}.",
            )
        )
    )
    return document


def test_the_committed_openapi_document_is_current() -> None:
    assert json.loads(DOCUMENT.read_text()) == generated(), (
        "docs/openapi.json is stale: run `python tests/unit/server/test_openapi.py`"
    )


def test_every_route_of_the_contract_is_documented() -> None:
    paths = generated()["paths"]
    routes = {(path, method) for path, methods in paths.items() for method in methods}
    assert routes >= {
        ("/jobs", "post"),
        ("/add-job", "post"),
        ("/jobs", "get"),
        ("/jobs/{name}", "get"),
        ("/jobs/{name}", "delete"),
        ("/jobs/{name}", "patch"),
        ("/pools", "get"),
        ("/pools/{instanceType}", "put"),
        ("/whoami", "get"),
    }
    assert "201" in paths["/jobs"]["post"]["responses"]
    assert "400" in paths["/jobs"]["post"]["responses"]
    for path, methods in paths.items():
        for method, operation in methods.items():
            codes = set(operation["responses"])
            assert codes & {"200", "201"}, f"{method.upper()} {path} documents no success"
            assert "422" not in codes, f"{method.upper()} {path} documents a 422 the API never answers"


if __name__ == "__main__":
    DOCUMENT.write_text(json.dumps(generated(), indent=2, sort_keys=True) + "\n")
    sys.stdout.write(f"wrote {DOCUMENT}\n")
