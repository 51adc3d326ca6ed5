"""Reading template.yaml: short tags, intrinsics, conditions, Globals, and the specs the local stack runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from sagequeue.local.template import (
    StackContext,
    Template,
    TemplateError,
    build_spec,
    load_template,
)

REPO = Path(__file__).resolve().parents[3]
CONTEXT = StackContext("unit-stack", "eu-west-1", "111122223333", queue_url_base="http://127.0.0.1:9")


def resolved(path: Path, **parameters: object) -> Template:
    return Template.from_file(path, CONTEXT, {"Required": "given", **parameters})


def test_short_tags_become_long_forms(mini_template: Path) -> None:
    document = load_template(mini_template)
    table_name = document["Resources"]["Table"]["Properties"]["TableName"]
    assert table_name == {"Fn::Sub": "${AWS::StackName}-items"}
    rule_target = document["Resources"]["CompletedJobs"]["Properties"]["Targets"][0]["Arn"]
    assert rule_target == {"Fn::GetAtt": ["Serial", "Arn"]}


def test_outputs_resolve_every_intrinsic(mini_template: Path) -> None:
    spec = build_spec(resolved(mini_template))
    assert spec.outputs == {
        "TableName": "unit-stack-items",
        "TopicArn": spec.topics[0].arn,
        "Joined": "a-b",
        "Picked": "y",
        "Escaped": "${NotAVariable}-given",
    }
    assert spec.topics[0].arn.startswith("arn:aws:sns:eu-west-1:111122223333:unit-stack-Topic-")


def test_conditions_decide_resources_values_and_outputs(mini_template: Path) -> None:
    dev = build_spec(resolved(mini_template))
    prod = build_spec(resolved(mini_template, Env="prod"))
    assert [t.logical_id for t in dev.tables] == ["Table"]
    assert [t.logical_id for t in prod.tables] == ["Table", "ProdOnlyTable"]
    assert "EXTRA" not in dev.functions["Recorder"].environment  # AWS::NoValue drops the variable
    assert prod.functions["Recorder"].environment["EXTRA"] == "prod-only"
    assert "ProdOnly" in prod.outputs
    assert "ProdOnly" not in dev.outputs
    assert dev.functions["Recorder"].memory_mb == 256
    assert prod.functions["Recorder"].memory_mb == 1024


def test_parameters_are_checked(mini_template: Path) -> None:
    with pytest.raises(TemplateError, match="Env is 'staging'; allowed values: dev, prod"):
        resolved(mini_template, Env="staging")
    with pytest.raises(TemplateError, match="parameter Required has no default"):
        Template.from_file(mini_template, CONTEXT, {})
    with pytest.raises(TemplateError, match="no parameter Bogus"):
        resolved(mini_template, Bogus="x")


def test_typed_parameter_values_become_cloudformation_strings(mini_template: Path) -> None:
    template = resolved(mini_template, Roles=["x", "y", "z"])
    assert template.resolve({"Fn::Join": ["+", {"Ref": "Roles"}]}) == "x+y+z"
    assert template.parameters["Required"] == "given"


def test_table_with_its_index(mini_template: Path) -> None:
    (table,) = build_spec(resolved(mini_template)).tables
    assert table.name == "unit-stack-items"
    assert table.create["BillingMode"] == "PAY_PER_REQUEST"
    (index,) = table.create["GlobalSecondaryIndexes"]
    assert index["IndexName"] == "by_team"
    assert [k["AttributeName"] for k in index["KeySchema"]] == ["team", "rank"]


def test_functions_merge_globals_and_read_their_wiring(mini_template: Path) -> None:
    spec = build_spec(resolved(mini_template))
    recorder = spec.functions["Recorder"]
    assert recorder.environment["TABLE"] == "unit-stack-items"  # from Globals, resolved
    assert recorder.environment["STAGE"] == "dev"
    assert recorder.environment["QUEUE"] == next(q.name for q in spec.queues if q.logical_id == "Work")
    assert recorder.code_dir == mini_template.parent / "functions" / "recorder"
    assert (recorder.module, recorder.attribute) == ("app", "handler")
    assert recorder.max_retry_attempts == 1
    assert recorder.on_failure == next(q.arn for q in spec.queues if q.logical_id == "DeadLetters")
    assert spec.functions["Serial"].reserved_concurrency == 1
    assert spec.functions["Parallel"].reserved_concurrency is None


def test_every_event_source_is_read(mini_template: Path) -> None:
    spec = build_spec(resolved(mini_template))
    routes = {(r.method, r.path, r.function, r.api) for r in spec.routes}
    assert routes == {
        ("GET", "/hello/{name}", "Recorder", "ServerlessRestApi"),
        ("ANY", "/things", "Recorder", "ServerlessRestApi"),
        ("GET", "/hello/mine", "Recorder", "ServerlessRestApi"),
    }
    rules = {rule.logical_id: rule for rule in spec.rules}
    assert rules["RecorderCustom"].bus == "unit-stack-bus"
    assert rules["RecorderCustom"].pattern == {"source": ["test"], "detail-type": ["Ping"]}
    assert rules["RecorderTick"].schedule == "rate(5 minutes)"
    assert rules["RecorderTick"].enabled
    assert not rules["RecorderPaused"].enabled
    assert rules["CompletedJobs"].bus == "default"
    assert rules["CompletedJobs"].targets[0].function == "Serial"
    assert rules["Nightly"].schedule == "cron(30 2 * * ? *)"
    assert rules["Nightly"].targets[0].input == '{"kind": "nightly"}'
    assert [(s.topic_arn, s.function) for s in spec.subscriptions] == [(spec.topics[0].arn, "Recorder")]
    work_arn = next(q.arn for q in spec.queues if q.logical_id == "Work")
    assert [(s.queue_arn, s.function, s.batch_size) for s in spec.queue_sources] == [
        (work_arn, "Recorder", 5)
    ]
    (alarm,) = spec.alarms
    assert alarm.put["AlarmActions"] == [spec.topics[0].arn]
    assert alarm.put["Dimensions"] == [{"Name": "Host", "Value": "unit-stack/algo-1"}]
    assert alarm.put["AlarmDescription"] == "busy dev"


def test_unknown_intrinsics_and_references_are_named(mini_template: Path) -> None:
    template = resolved(mini_template)
    with pytest.raises(TemplateError, match="Ref to Nowhere"):
        template.resolve({"Ref": "Nowhere"})
    with pytest.raises(TemplateError, match="cannot resolve"):
        template.resolve({"Fn::ImportValue": "shared-vpc"})
    with pytest.raises(TemplateError, match="condition Missing is not declared"):
        template.condition("Missing")


def test_the_stack_template_routes_and_rules() -> None:
    """The API's routes and the scheduler's triggers come from template.yaml itself."""
    template = Template.from_file(
        REPO / "template.yaml", CONTEXT, {"AllowedRoleArns": ["arn:aws:iam::111122223333:role/training"]}
    )
    spec = build_spec(template)
    routes = {(r.method, r.path) for r in spec.routes}
    assert {
        ("POST", "/jobs"),
        ("POST", "/add-job"),
        ("GET", "/jobs/{name}"),
        ("PUT", "/pools/{instanceType}"),
    } <= routes
    scheduler = next(f for f in spec.functions.values() if f.reserved_concurrency == 1)
    triggers = [rule for rule in spec.rules if any(t.function == scheduler.logical_id for t in rule.targets)]
    patterns = [rule.pattern for rule in triggers if rule.pattern]
    assert {
        "source": ["aws.sagemaker"],
        "detail-type": ["SageMaker Training Job State Change"],
        "account": [CONTEXT.account_id],
    } in patterns
    assert any(rule.schedule == "rate(1 minute)" for rule in triggers)
    assert spec.functions[scheduler.logical_id].environment["SAGEQUEUE_TABLE_NAME"] == spec.tables[0].name


def test_the_sam_transform_is_sam_s_own_and_leaves_only_cloudformation(mini_template: Path) -> None:
    """aws-sam-translator turns the SAM resources into what CloudFormation would create; the specs are
    read from those (a function's Events become rules, permissions, subscriptions and mappings)."""
    template = resolved(mini_template)
    kinds = {template.resource_type(logical_id) for logical_id in template.resources}
    assert not [kind for kind in kinds if kind.startswith("AWS::Serverless::")]
    assert {"AWS::Lambda::Function", "AWS::ApiGateway::RestApi", "AWS::Lambda::EventInvokeConfig"} <= kinds
    assert "Transform" not in template.document
    spec = build_spec(template)
    recorder = spec.functions["Recorder"]
    assert recorder.code_dir == (mini_template.parent / "functions" / "recorder").resolve()
    assert recorder.max_retry_attempts == 1  # from the EventInvokeConfig the translator made
    assert recorder.on_failure == spec.queues[0].arn


def test_a_template_the_sam_transform_refuses_is_named_with_the_reason(tmp_path: Path) -> None:
    broken = tmp_path / "template.yaml"
    broken.write_text(
        "Transform: AWS::Serverless-2016-10-31\n"
        "Resources:\n"
        "  Fn:\n"
        "    Type: AWS::Serverless::Function\n"
        "    Properties:\n"
        "      CodeUri: fn/\n"
        "      Handler: app.handler\n"
        "      Runtime: python3.12\n"
        "      Events:\n"
        "        Get: {Type: Api, Properties: {Path: /x}}\n"
    )
    with pytest.raises(TemplateError, match=r"the SAM transform refused the template: .*Fn.*Method"):
        Template.from_file(broken, CONTEXT)
