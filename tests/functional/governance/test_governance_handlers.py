"""The handlers as Lambda runs them (loaded from their folders), on the dependencies the embedded stack
installs: they route the event to the use case and refuse what they do not handle."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from governance_world import World, training_request, unique

from sagequeue.local.router import LambdaContext
from sagequeue_core import runtime
from sagequeue_core.config import ConfigError, Settings
from sagequeue_core.events import MalformedEvent
from sagequeue_core.service.govern import rules_from

FUNCTIONS = Path(__file__).resolve().parents[3] / "functions"


def load(function: str) -> ModuleType:
    path = FUNCTIONS / function / "app.py"
    spec = importlib.util.spec_from_file_location(f"governance_test_{function}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def context(name: str) -> LambdaContext:
    return LambdaContext(name, f"arn:aws:lambda:us-east-1:123456789012:function:{name}", 512, 60)


@pytest.fixture
def installed(world: World) -> Iterator[World]:
    runtime.install(world.deps)
    yield world
    runtime.reset()


@pytest.fixture
def governance_handler() -> Callable[[dict[str, Any], Any], Any]:
    handler: Callable[[dict[str, Any], Any], Any] = load("governance").handler
    return handler


def test_a_state_change_reaches_governance_and_the_timer_reconciles(
    installed: World, governance_handler: Callable[[dict[str, Any], Any], Any]
) -> None:
    world = installed
    name = unique("handled")
    world.sagemaker.create_training_job(**training_request(name, tags={}))
    (event,) = world.take_events(name)

    answer = governance_handler(event, context("governance"))
    assert answer["stopped"] == "policy violation: missing required tag 'team'"

    scheduled = {
        "version": "0",
        "id": "1",
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "detail": {},
    }
    report = governance_handler(scheduled, context("governance"))
    assert set(report) == {"jobs_seen", "orphans_deleted"}


def test_an_event_of_another_kind_is_refused_by_name(
    installed: World, governance_handler: Callable[[dict[str, Any], Any], Any]
) -> None:
    with pytest.raises(MalformedEvent, match=r"not source='aws\.s3' detail-type='Object Created'"):
        governance_handler({"source": "aws.s3", "detail-type": "Object Created"}, context("governance"))


def test_the_idle_stop_handler_answers_per_record(installed: World) -> None:
    handler = load("idle_stop").handler
    message = '{"AlarmName": "not-ours", "NewStateValue": "ALARM"}'
    answer = handler({"Records": [{"Sns": {"Message": message}}]}, context("idle-stop"))
    assert answer == {
        "outcomes": [
            {
                "alarm_name": "not-ours",
                "training_job_name": None,
                "stopped": False,
                "detail": "not a sagequeue idle alarm",
            }
        ]
    }


def test_idle_settings_cloudwatch_would_refuse_are_a_config_error_naming_the_variables() -> None:
    settings = Settings.build(idle_period_seconds=90)
    with pytest.raises(ConfigError, match=r"SAGEQUEUE_IDLE_PERIOD_SECONDS .*multiple of 60"):
        rules_from(settings)
