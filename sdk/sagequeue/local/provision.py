"""Create a resolved stack's resources in moto, over HTTP, in the order CloudFormation would.

Every rule that targets a function of the stack gets, instead of the function, an SQS queue owned by that
function (`<stack>-fn-<function>`): moto matches the event patterns and delivers to the queue, and the
local router polls the queues and invokes the handlers. SNS topics subscribed by functions deliver to the
same queues. So moto, not this code, decides which event goes where.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sagequeue.local.template import StackSpec


@dataclass
class Provisioned:
    """What was created: the queue each function listens on, and the queues it consumes as a source."""

    #: function logical id -> URL of the queue its rules and subscriptions deliver to
    inbox_urls: dict[str, str] = field(default_factory=dict)
    #: function logical id -> [(queue URL, batch size)] of SQS event sources
    source_urls: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    #: queue ARN -> queue URL, for every queue of the stack
    queue_urls: dict[str, str] = field(default_factory=dict)
    #: function logical id -> schedule rules that invoke it (fired by the local clock)
    schedules: list[tuple[str, str, str | None]] = field(default_factory=list)


def inbox_name(stack_name: str, function_logical_id: str) -> str:
    return f"{stack_name}-fn-{function_logical_id}"[:80]


def provision(spec: StackSpec, stack_name: str, clients: Any) -> Provisioned:
    """Create tables, topics, queues, buses, rules, subscriptions and alarms. `clients(service)` returns a
    boto3 client on moto."""
    out = Provisioned()
    dynamodb = clients("dynamodb")
    for table in spec.tables:
        dynamodb.create_table(**table.create)
        if table.ttl_attribute:
            dynamodb.update_time_to_live(
                TableName=table.name,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": table.ttl_attribute},
            )
    sqs = clients("sqs")
    redrives: list[tuple[str, str]] = []
    for queue in spec.queues:
        attributes = {k: v for k, v in queue.attributes.items() if k != "RedrivePolicy"}
        url = sqs.create_queue(QueueName=queue.name, Attributes=attributes)["QueueUrl"]
        out.queue_urls[queue.arn] = url
        if "RedrivePolicy" in queue.attributes:
            redrives.append((url, queue.attributes["RedrivePolicy"]))
    # A redrive policy names its dead-letter queue by ARN, which must exist first.
    for url, policy in redrives:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": policy})
    # Only functions something delivers to get an inbox: the router polls each inbox every round.
    fed = {t.function for rule in spec.rules for t in rule.targets if t.function} | {
        s.function for s in spec.subscriptions
    }
    for logical_id in spec.functions:
        if logical_id in fed:
            url = sqs.create_queue(QueueName=inbox_name(stack_name, logical_id))["QueueUrl"]
            out.inbox_urls[logical_id] = url
    sns = clients("sns")
    for topic in spec.topics:
        sns.create_topic(Name=topic.name, Attributes=topic.attributes)
    events = clients("events")
    for bus in spec.buses:
        events.create_event_bus(Name=bus.name)
    for rule in spec.rules:
        _put_rule(events, rule, out, stack_name, sqs)
    for subscription in spec.subscriptions:
        queue_arn = _queue_arn(sqs, out.inbox_urls[subscription.function])
        filters: dict[str, str] = {}
        if subscription.filter_policy:
            filters["FilterPolicy"] = json.dumps(subscription.filter_policy)
        sns.subscribe(TopicArn=subscription.topic_arn, Protocol="sqs", Endpoint=queue_arn, Attributes=filters)
    for topic_arn, protocol, endpoint in spec.native_subscriptions:
        sns.subscribe(TopicArn=topic_arn, Protocol=protocol, Endpoint=endpoint)
    for source in spec.queue_sources:
        url = out.queue_urls.get(source.queue_arn)
        if url is None:
            raise ValueError(
                f"function {source.function} consumes {source.queue_arn}, which is not a queue of the stack"
            )
        out.source_urls.setdefault(source.function, []).append((url, source.batch_size))
    cloudwatch = clients("cloudwatch")
    for alarm in spec.alarms:
        cloudwatch.put_metric_alarm(**alarm.put)
    return out


def _queue_arn(sqs: Any, url: str) -> str:
    # A queue URL ends in <account>/<name>; its ARN follows from them and the client's region.
    account, name = url.rstrip("/").rsplit("/", 2)[-2:]
    return f"arn:aws:sqs:{sqs.meta.region_name}:{account}:{name}"


def _put_rule(events: Any, rule: Any, out: Provisioned, stack_name: str, sqs: Any) -> None:
    arguments: dict[str, Any] = {
        "Name": rule.name,
        "EventBusName": rule.bus,
        "State": "ENABLED" if rule.enabled else "DISABLED",
    }
    if rule.pattern is not None:
        arguments["EventPattern"] = json.dumps(rule.pattern)
    if rule.schedule is not None:
        arguments["ScheduleExpression"] = rule.schedule
    events.put_rule(**arguments)
    if not rule.enabled:
        return  # a disabled rule delivers nothing: without targets, neither moto nor the clock can
    if rule.schedule is not None:
        # moto never fires schedules: the local stack does, on its clock. Nor may moto have the targets:
        # it treats a rule without a pattern as matching every event, where EventBridge matches none, so
        # the target would receive every event of the bus besides its schedule.
        for target in rule.targets:
            if target.function is not None:
                out.schedules.append((rule.name, target.function, target.input))
        if rule.pattern is None:
            return
    targets = []
    for target in rule.targets:
        if target.function is not None:
            arn = _queue_arn(sqs, out.inbox_urls[target.function])
        elif target.arn is not None:
            arn = target.arn
        else:
            continue
        entry: dict[str, Any] = {"Id": target.target_id[:64], "Arn": arn}
        # moto applies only InputTransformer to what it delivers, so a constant Input or an InputPath is
        # given to it as the transformer that means the same.
        if target.input_transformer:
            entry["InputTransformer"] = target.input_transformer
        elif target.input is not None:
            entry["InputTransformer"] = {"InputTemplate": target.input}
        elif target.input_path is not None:
            entry["InputTransformer"] = {
                "InputPathsMap": {"value": target.input_path},
                "InputTemplate": "<value>",
            }
        targets.append(entry)
    if targets:
        events.put_targets(Rule=rule.name, EventBusName=rule.bus, Targets=targets)
