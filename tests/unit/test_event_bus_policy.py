"""Only the stack's own functions put events on its bus (#27): anyone else's PutEvents would trigger
scheduling passes that compete with the scheduler's one reserved execution.

The local stack's moto does not evaluate IAM, so the policy is checked as the template states it: a deny
for every principal that is not one of the roles of the functions allowed to put events there. The roles
are named by ARN: a principal tag would be satisfied by a session tag or a TagRole.
"""

from __future__ import annotations

from pathlib import Path

from sagequeue.local.template import load_template

TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"


def test_the_bus_denies_put_events_to_every_principal_but_the_roles_of_the_functions_that_put_events() -> (
    None
):
    template = load_template(TEMPLATE)
    resources = template["Resources"]
    assert "Policy" not in resources["EventBus"]["Properties"]
    (policy,) = [r["Properties"] for r in resources.values() if r["Type"] == "AWS::Events::EventBusPolicy"]
    assert policy["EventBusName"] == {"Ref": "EventBus"}
    statement = policy["Statement"]
    assert (statement["Effect"], statement["Principal"], statement["Action"]) == (
        "Deny",
        "*",
        "events:PutEvents",
    )
    assert statement["Resource"] == {"Fn::GetAtt": ["EventBus", "Arn"]}
    (condition,) = statement["Condition"].items()
    assert condition[0] == "ArnNotEquals"
    admitted = {role["Fn::GetAtt"][0] for role in condition[1]["aws:PrincipalArn"]}
    # every function allowed to put events on the bus, and no other, has its generated role admitted
    putting = {
        f"{logical_id}Role"
        for logical_id, resource in resources.items()
        if resource["Type"] == "AWS::Serverless::Function"
        and any("EventBridgePutEventsPolicy" in p for p in resource["Properties"].get("Policies", []))
    }
    assert putting
    assert admitted == putting
    functions = [r for r in resources.values() if r["Type"] == "AWS::Serverless::Function"]
    assert all("Role" not in f["Properties"] for f in functions), "a given role has no <Function>Role"


def test_a_throttled_reconcile_is_retried() -> None:
    template = load_template(TEMPLATE)
    reconcile = template["Resources"]["SchedulerFunction"]["Properties"]["Events"]["Reconcile"]["Properties"]
    assert reconcile["RetryPolicy"]["MaximumRetryAttempts"] >= 1
