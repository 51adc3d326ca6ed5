"""Only the stack's own functions put events on its bus (#27): anyone else's PutEvents would trigger
scheduling passes that compete with the scheduler's one reserved execution.

The local stack's moto does not evaluate IAM, so the policy is checked as the template states it: a deny
for every principal whose role lacks the stack's tag, and that tag on every function's generated role.
"""

from __future__ import annotations

from pathlib import Path

from sagequeue.local.template import load_template

TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"


def test_the_bus_denies_put_events_to_principals_without_the_stacks_tag_and_every_function_has_it() -> None:
    template = load_template(TEMPLATE)
    (statement,) = template["Resources"]["EventBus"]["Properties"]["Policy"]["Statement"]
    assert (statement["Effect"], statement["Principal"], statement["Action"]) == (
        "Deny",
        "*",
        "events:PutEvents",
    )
    assert statement["Condition"] == {
        "StringNotEquals": {"aws:PrincipalTag/sagequeue:stack": {"Ref": "AWS::StackName"}}
    }
    # SAM puts a function's tags on the role it generates for it: every function's role carries the tag
    assert template["Globals"]["Function"]["Tags"] == {"sagequeue:stack": {"Ref": "AWS::StackName"}}
    functions = [r for r in template["Resources"].values() if r["Type"] == "AWS::Serverless::Function"]
    assert functions
    assert all("Role" not in f["Properties"] for f in functions), "a given role would not get the tag"


def test_a_throttled_reconcile_is_retried() -> None:
    template = load_template(TEMPLATE)
    reconcile = template["Resources"]["SchedulerFunction"]["Properties"]["Events"]["Reconcile"]["Properties"]
    assert reconcile["RetryPolicy"]["MaximumRetryAttempts"] >= 1
