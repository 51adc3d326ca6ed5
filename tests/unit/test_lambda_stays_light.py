"""Lambda code must not pull in the SageMaker SDK or anything else heavy the layer does not carry, and each
handler loads only what it uses: a cold start pays for every module imported (docs/adr/0004)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HANDLERS = sorted(ROOT.glob("functions/*/app.py"))
#: Importable here, but not in the Lambda layer (or far too slow for a cold start).
FORBIDDEN = ("sagemaker", "moto", "huggingface_hub", "sagequeue", "pandas", "numpy", "torch")
#: In the layer's reach but loaded by no handler: traces come from Lambda's active tracing, not the X-Ray
#: SDK behind Powertools' Tracer, which cost more to import than boto3; the API routes and checks requests
#: itself, without Powertools' resolver and the pydantic validation behind it (about 1 x boto3 together).
NEVER = (
    "aws_xray_sdk",
    "wrapt",
    "pydantic",
    "pydantic_core",
    "aws_lambda_powertools.event_handler",
    "asyncio",
)
#: Third-party packages a handler may load: what the layer carries (layers/core/requirements.txt and what
#: it brings). Anything else is a new dependency of a cold start.
LAYER = frozenset(
    {
        "aws_lambda_powertools",
        "botocore",
        "certifi",
        "dateutil",
        "jmespath",
        "pynamodb",
        "six",
        "typing_extensions",
        "urllib3",
    }
)
#: Installed here (moto's server needs it) but not in the layer; pynamodb uses it when it is there.
LAYER_LACKS = ("blinker",)
#: The project modules each handler loads, exactly: a new import in a handler or in the modules it loads
#: shows up here, and must be worth its cold-start cost to be added.
PROJECT = {
    "api": {
        "checkpoint_marker", "checkpoints", "config", "defaults", "domain", "errors", "events", "forecasts",
        "governance", "observability", "quotas", "retry", "runtime", "sagemaker", "service", "service.access",
        "service.exemptions", "service.forecasts", "service.http", "service.jobs", "service.submit",
        "service.teams", "store", "validation",
    },
    "scheduler": {
        "checkpoint_marker", "checkpoints", "config", "defaults", "domain", "errors", "events", "markers",
        "observability", "policy", "quotas", "retry", "runtime", "sagemaker", "service",
        "service.checkpoints", "service.schedule", "snapshot", "store",
    },
    "governance": {
        "alarm_evaluation", "alarms", "checkpoint_marker", "checkpoints", "config", "defaults", "domain",
        "errors", "events", "governance", "notify", "observability", "retry", "runtime", "sagemaker",
        "service", "service.exemptions", "service.govern", "store",
    },
    "idle_stop": {
        "alarm_evaluation", "alarms", "checkpoint_marker", "checkpoints", "config", "defaults", "domain",
        "errors", "events", "governance", "notify", "observability", "retry", "runtime", "sagemaker",
        "service", "service.exemptions", "service.stop_idle", "store",
    },
    "notices": {
        "checkpoint_marker", "checkpoints", "config", "defaults", "domain", "errors", "events", "notify",
        "observability", "retry", "runtime", "sagemaker", "service", "service.notices", "store",
    },
    # the policy, run forward; the API's reads of jobs and pools load when it runs, not at the cold start
    "forecast": {
        "checkpoint_marker", "checkpoints", "config", "defaults", "domain", "errors", "events", "forecasts",
        "observability", "policy", "quotas", "retry", "runtime", "sagemaker", "snapshot", "store",
    },
}  # fmt: skip
#: The SDK's modules a handler may load, exactly, from the layer that carries them (template.yaml:
#: ForecastLayer): the forecast engine and what it imports (the simulator's package imports its parts).
SDK = {
    "forecast": {
        "sagequeue", "sagequeue.client", "sagequeue.config", "sagequeue.exceptions", "sagequeue.forecast",
        "sagequeue.forecast.calibrate", "sagequeue.forecast.engine", "sagequeue.forecast.live", "sagequeue.forecast.model",
        "sagequeue.forecast.stored", "sagequeue.sim", "sagequeue.sim.engine", "sagequeue.sim.metrics",
        "sagequeue.sim.run", "sagequeue.sim.sagemaker", "sagequeue.sim.schedulers", "sagequeue.sim.trace",
        "sagequeue.sim.workload",
    },
}  # fmt: skip
#: Modules that only some handlers need, and the handlers that may load them.
ONLY_FOR = {
    "sagequeue_core.service.http": {"api"},
    "sagequeue_core.service.jobs": {"api"},
    "sagequeue_core.service.submit": {"api"},
    "sagequeue_core.service.access": {"api"},
    "sagequeue_core.service.teams": {"api"},
    "sagequeue_core.service.forecasts": {"api"},
    "sagequeue_core.service.schedule": {"scheduler"},
    # the policy: the scheduler decides with it, the forecast runs it forward
    "sagequeue_core.policy": {"scheduler", "forecast"},
    # team quotas: the API sets and checks them, the scheduler applies them, the forecast models them
    "sagequeue_core.quotas": {"api", "scheduler", "forecast"},
    # stored forecasts: the forecast function writes them, the API reads and scores them
    "sagequeue_core.forecasts": {"api", "forecast"},
    "sagequeue.forecast.stored": {"forecast"},
    "sagequeue.forecast.calibrate": {"forecast"},
    # the checkpoint markers: only the scheduler reads them (docs/adr/0025)
    "sagequeue_core.markers": {"scheduler"},
    "sagequeue_core.service.checkpoints": {"scheduler"},
    "sagequeue_core.service.govern": {"governance"},
    "sagequeue_core.service.stop_idle": {"idle_stop"},
    "sagequeue_core.alarms": {"governance", "idle_stop"},
    # CloudWatch's alarm rules: idle stop re-checks an alarm's data before it stops a job
    "sagequeue_core.alarm_evaluation": {"governance", "idle_stop"},
    "sagequeue_core.notify": {"governance", "idle_stop", "notices"},
    "sagequeue_core.service.notices": {"notices"},
    # the tag and policy rules: the API checks submissions, governance checks running jobs
    "sagequeue_core.governance": {"api", "governance", "idle_stop"},
}

PROBE = f"""
import importlib.util, json, sys
sys.modules.update(dict.fromkeys({LAYER_LACKS!r}))
spec = importlib.util.spec_from_file_location("app", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps({{"handler": callable(getattr(module, "handler", None)), "modules": sorted(sys.modules)}}))
"""

_loaded: dict[Path, dict[str, object]] = {}


def loaded(handler: Path) -> dict[str, object]:
    """What a fresh interpreter holds after importing `handler` (one probe per handler per session)."""
    if handler not in _loaded:
        out = subprocess.run(
            [sys.executable, "-c", PROBE, str(handler)], capture_output=True, text=True, check=True
        )
        _loaded[handler] = json.loads(out.stdout.splitlines()[-1])
    return _loaded[handler]


def _modules(handler: Path) -> list[str]:
    modules = loaded(handler)["modules"]
    assert isinstance(modules, list)
    return [str(name) for name in modules]


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_every_function_in_the_layout_has_a_handler() -> None:
    assert {h.parent.name for h in HANDLERS} >= {"api", "scheduler", "governance", "idle_stop"}


@pytest.mark.parametrize("handler", HANDLERS, ids=lambda p: p.parent.name)
def test_handler_imports_only_what_the_layer_carries(handler: Path) -> None:
    assert loaded(handler)["handler"], f"{handler} has no callable `handler`"
    sdk = SDK.get(handler.parent.name, set())
    heavy = sorted(
        name
        for name in _modules(handler)
        if (name.split(".")[0] in FORBIDDEN or any(_within(name, never) for never in NEVER))
        and not name.startswith("sagequeue_")
        and name not in sdk
    )
    assert heavy == [], f"{handler.relative_to(ROOT)} imports {heavy}"
    loaded_sdk = {name for name in _modules(handler) if _within(name, "sagequeue")}
    assert loaded_sdk == sdk, f"{handler.relative_to(ROOT)}: the SDK modules it loads changed"


@pytest.mark.parametrize("handler", HANDLERS, ids=lambda p: p.parent.name)
def test_handler_loads_no_package_beyond_the_layer(handler: Path) -> None:
    packages = {name.split(".")[0] for name in _modules(handler) if name not in LAYER_LACKS}
    carried = {"sagequeue"} if handler.parent.name in SDK else set()
    outside = sorted(
        packages
        - LAYER
        - carried
        - set(sys.stdlib_module_names)
        - {"sagequeue_core", "__main__", "__mp_main__"}
    )
    outside = [name for name in outside if not name.startswith("_") and not name.startswith("__editable__")]
    assert outside == [], f"{handler.relative_to(ROOT)} loads packages the layer does not carry: {outside}"


@pytest.mark.parametrize("handler", HANDLERS, ids=lambda p: p.parent.name)
def test_handler_loads_exactly_the_project_modules_it_uses(handler: Path) -> None:
    function = handler.parent.name
    loaded_now = {
        name.removeprefix("sagequeue_core.")
        for name in _modules(handler)
        if name.startswith("sagequeue_core.")
    }
    assert loaded_now == PROJECT[function], (
        f"{function}: loads {sorted(loaded_now - PROJECT[function])} beyond what it uses; "
        f"no longer loads {sorted(PROJECT[function] - loaded_now)}"
    )


@pytest.mark.parametrize("handler", HANDLERS, ids=lambda p: p.parent.name)
def test_nothing_only_another_handler_needs_is_imported(handler: Path) -> None:
    function = handler.parent.name
    foreign = sorted(
        name
        for name in _modules(handler)
        for package, users in ONLY_FOR.items()
        if _within(name, package) and function not in users
    )
    assert foreign == [], f"{handler.relative_to(ROOT)} loads what only other handlers need: {foreign}"


@pytest.mark.parametrize("handler", HANDLERS, ids=lambda p: p.parent.name)
def test_each_handler_loads_its_own_use_case(handler: Path) -> None:
    """The table above is not vacuous: each handler does load the modules reserved for it."""
    function = handler.parent.name
    own = {package for package, users in ONLY_FOR.items() if users == {function}}
    assert own, f"no module is reserved for {function}; add its use case to ONLY_FOR"
    modules = set(_modules(handler))
    assert own <= modules, f"{function} does not load {sorted(own - modules)}"


def _unused_imports(source: str) -> list[str]:
    tree = ast.parse(source)
    imported: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue
            for alias in node.names:
                imported[(alias.asname or alias.name).split(".")[0]] = node.lineno
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    used |= {
        node.value.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
    }
    return sorted(name for name in imported if name not in used)


@pytest.mark.parametrize("handler", HANDLERS, ids=lambda p: p.parent.name)
def test_handler_imports_nothing_it_does_not_use(handler: Path) -> None:
    assert _unused_imports(handler.read_text()) == []


def test_the_unused_import_check_sees_an_unused_import() -> None:
    source = "from typing import Any\nimport json\nfrom x import tracer, logger\n\n@logger.wrap\ndef f(a: Any): ...\n"
    assert _unused_imports(source) == ["json", "tracer"]
