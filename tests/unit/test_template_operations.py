"""Every health alarm of template.yaml reaches someone: it notifies the operations topic on ALARM and on OK,
and the dashboard's alarm widget shows it. An alarm added later without either fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from sagequeue.local.template import load_template

TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"


def resources() -> dict[str, Any]:
    found: dict[str, Any] = load_template(TEMPLATE)["Resources"]
    return found


def test_every_alarm_notifies_the_operations_topic() -> None:
    alarms = {k: v for k, v in resources().items() if v["Type"] == "AWS::CloudWatch::Alarm"}
    assert len(alarms) >= 4
    for name, alarm in alarms.items():
        for actions in ("AlarmActions", "OKActions"):
            assert alarm["Properties"].get(actions) == [{"Ref": "OperationsTopic"}], (name, actions)


def test_the_dashboard_shows_every_alarm() -> None:
    everything = resources()
    alarms = {k for k, v in everything.items() if v["Type"] == "AWS::CloudWatch::Alarm"}
    body = everything["Dashboard"]["Properties"]["DashboardBody"]["Fn::Sub"]
    # the ${...} references parse as JSON strings once substituted; read the alarm widget's list
    document = json.loads(re.sub(r"\$\{([A-Za-z:]+)\}", r"\1", body))
    (widget,) = [w for w in document["widgets"] if w["type"] == "alarm"]
    shown = {re.sub(r"\$\{(\w+)\.Arn\}", r"\1", arn) for arn in widget["properties"]["alarms"]}
    assert shown == alarms
