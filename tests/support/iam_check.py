"""IAM for the functions' real calls: record every AWS request a function makes, turn it into the
authorization requests IAM evaluates (action, resource ARNs, request context), and evaluate them against the
function's role policy as template.yaml renders it.

- Recording: every botocore client made in the test process gets a `before-parameter-build` hook. A request
  belongs to a function when a frame of that function's code (`<CodeUri>/app.py`, or a built copy in
  `.aws-sam/build/<LogicalId>/`) is on the calling thread's stack; requests of tests, the emulator and the
  local stack's own plumbing belong to nobody and are not checked.
- Authorization requests: the action names, the ARN format of each resource type and the dependent
  actions come from policy_sentry's copy of the IAM service authorization reference. What the reference
  states only in prose is here, each with its rule: a request naming a DynamoDB index is authorized on the
  index ARN; TransactWriteItems is authorized item by item; CreateTrainingJob and PutMetricAlarm with tags
  need the tagging action too (`sagemaker:AddTags`, `cloudwatch:TagResource`); a RoleArn given to
  SageMaker is an `iam:PassRole` with `iam:PassedToService`.
- Policies: the function's role as the SAM transform makes it (policy templates such as
  SNSPublishMessagePolicy expanded), references resolved with the names the function ran with (its table,
  bus, topics, allowed roles), then evaluated with IAM's rules: an explicit Deny wins, else some Allow must
  match action (case-insensitive wildcards), resource (case-sensitive wildcards) and every condition.
  Condition keys missing from the request make a condition false unless the operator ends in IfExists;
  policy variables and unknown operators are refused, never guessed.
"""

from __future__ import annotations

import copy
import json
import re
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from sagequeue_core.defaults import NEURON_METRIC_NAMESPACE

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "template.yaml"
#: The account moto and the emulator use when nothing else names one.
DEFAULT_ACCOUNT = "123456789012"
#: Function Metadata naming the granted permissions no recorded call uses, each with the reason it stays.
UNEXERCISED_KEY = "UnexercisedPermissions"


#: Stands for the six random characters ending a secret's ARN (unknown when a request names it by name).
SECRET_SUFFIX = "Ab12Cd"


class CheckerError(RuntimeError):
    """The checker cannot tell what IAM would decide (an unknown operation or condition operator)."""


# --- the IAM reference (policy_sentry) ---------------------------------------------------------------------


@cache
def _service(prefix: str) -> dict[str, Any]:
    from policy_sentry.shared.iam_data import get_service_prefix_data

    data = get_service_prefix_data(prefix)
    if not data:
        raise CheckerError(f"the IAM reference has no service prefix {prefix!r}")
    return data


def _privilege(prefix: str, name: str) -> dict[str, Any] | None:
    data = _service(prefix)
    found = data["privileges"].get(name)
    if found is None:
        lowered = data["privileges_lower_name"].get(name.lower())
        found = data["privileges"].get(lowered) if lowered else None
    return found


def service_actions(prefix: str) -> list[str]:
    """Every action of a service prefix, as `prefix:Name`."""
    return [f"{prefix}:{name}" for name in _service(prefix)["privileges"]]


def _arn_pattern(arn_format: str) -> re.Pattern[str]:
    parts = re.split(r"(\$\{[^}]+\})", arn_format)
    return re.compile(
        "".join(
            ("[^:]*" if p in ("${Region}", "${Account}", "${Partition}") else ".+")
            if p.startswith("${")
            else re.escape(p)
            for p in parts
        )
        + "$"
    )


def _fill(arn_format: str, values: Mapping[str, str]) -> str | None:
    """The ARN format with every placeholder filled, or None when a value is missing."""
    missing = False

    def one(match: re.Match[str]) -> str:
        nonlocal missing
        value = values.get(match.group(1))
        if value is None:
            missing = True
            return ""
        return value

    filled = re.sub(r"\$\{([^}]+)\}", one, arn_format)
    return None if missing else filled


# --- authorization requests ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Authorization:
    """One authorization IAM makes for a request: an action on a resource, with the request context."""

    action: str
    resource: str
    context: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def context_dict(self) -> dict[str, list[str]]:
        return {key: list(values) for key, values in self.context}

    def to_json(self) -> dict[str, Any]:
        return {"action": self.action, "resource": self.resource, "context": self.context_dict()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Authorization:
        return cls(str(data["action"]), str(data["resource"]), _context(data.get("context") or {}))


def _context(values: Mapping[str, Iterable[str] | str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    out = []
    for key, value in sorted(values.items()):
        items = (value,) if isinstance(value, str) else tuple(str(v) for v in value)
        out.append((key, items))
    return tuple(out)


def _tags(params: Mapping[str, Any]) -> dict[str, str]:
    tags = params.get("Tags")
    if isinstance(tags, Mapping):
        return {str(k): str(v) for k, v in tags.items()}
    if isinstance(tags, list):
        return {str(t.get("Key")): str(t.get("Value", "")) for t in tags if isinstance(t, Mapping)}
    return {}


def _tag_context(tags: Mapping[str, str]) -> dict[str, Iterable[str] | str]:
    context: dict[str, Iterable[str] | str] = {f"aws:RequestTag/{k}": v for k, v in tags.items()}
    if tags:
        context["aws:TagKeys"] = sorted(tags)
    return context


def _arn_values(params: Any) -> Iterator[str]:
    """Every string in the request that is an ARN (TopicArn, ResourceArn, RoleArn, TrainingPlanArn, ...)."""
    if isinstance(params, Mapping):
        for value in params.values():
            yield from _arn_values(value)
    elif isinstance(params, list):
        for value in params:
            yield from _arn_values(value)
    elif isinstance(params, str) and params.startswith("arn:"):
        yield params


@dataclass(frozen=True)
class Where:
    region: str
    account: str
    partition: str = "aws"


#: Placeholders of ARN formats that a request names by a parameter of the same name.
_NAMED_BY = ("TrainingJobName", "TableName", "IndexName", "AlarmName")


def authorizations(
    prefix: str,
    operation: str,
    params: Mapping[str, Any],
    where: Where,
    resource_tags: Mapping[str, Mapping[str, str]] | None = None,
) -> list[Authorization]:
    """What IAM evaluates for `operation` of the service `prefix` called with `params`."""
    if prefix == "dynamodb" and operation in ("TransactWriteItems", "TransactGetItems"):
        # Not IAM actions: each item is authorized as the single-item action it performs.
        kinds = {
            "Put": "PutItem",
            "Update": "UpdateItem",
            "Delete": "DeleteItem",
            "ConditionCheck": "ConditionCheckItem",
            "Get": "GetItem",
        }
        out: list[Authorization] = []
        for item in params.get("TransactItems") or []:
            for kind, body in item.items():
                out.extend(authorizations(prefix, kinds[kind], body, where, resource_tags))
        return _unique(out)
    if prefix == "dynamodb" and operation in ("BatchWriteItem", "BatchGetItem") and "RequestItems" in params:
        # authorized on each table the request names (each then as a request naming that one table)
        return _unique(
            a
            for table in params.get("RequestItems") or {}
            for a in authorizations(prefix, operation, {"TableName": table}, where)
        )
    if prefix == "s3":
        return _s3_authorizations(operation, params, where)
    secret = params.get("SecretId")
    if prefix == "secretsmanager" and isinstance(secret, str) and not secret.startswith("arn:"):
        # a secret named by its name is authorized on its full ARN: the name, a dash and the six random
        # characters Secrets Manager appended when it made the secret
        arn = f"arn:{where.partition}:secretsmanager:{where.region}:{where.account}:secret:{secret}-{SECRET_SUFFIX}"
        return authorizations(prefix, operation, {**params, "SecretId": arn}, where, resource_tags)
    privilege = _privilege(prefix, operation)
    if privilege is None:
        raise CheckerError(
            f"{prefix}:{operation} is not an action in the IAM reference, and the checker knows no rule for it: "
            "teach tests/support/iam_check.authorizations how IAM authorizes it"
        )
    action = f"{prefix}:{privilege['privilege']}"
    values = {"Partition": where.partition, "Region": where.region, "Account": where.account}
    for placeholder in _NAMED_BY:
        if isinstance(params.get(placeholder), str):
            values[placeholder] = params[placeholder]
    names: list[str] = [n for n in params.get("AlarmNames") or [] if isinstance(n, str)]
    arns = list(_arn_values(params))
    resources: list[str] = []
    data = _service(prefix)
    types = privilege["resource_types"]
    for type_name, spec in types.items():
        if not type_name:
            continue
        arn_format = data["resources"][type_name.rstrip("*")]["arn"]
        pattern = _arn_pattern(arn_format)
        matched = [a for a in arns if pattern.match(a) and a.split(":")[2] == prefix]
        if matched:
            resources.extend(matched)
            continue
        if type_name == "alarm" and names:
            resources.extend(_fill(arn_format, {**values, "AlarmName": n}) or "" for n in names)
            continue
        if prefix == "events" and type_name == "event-bus":
            for entry in params.get("Entries") or []:
                bus = str(entry.get("EventBusName") or "default")
                resources.append(
                    bus
                    if bus.startswith("arn:")
                    else _fill(arn_format, {**values, "EventBusName": bus}) or ""
                )
            continue
        if prefix == "dynamodb" and type_name == "table" and "IndexName" in values:
            continue  # a request on an index is authorized on the index, not on its table
        filled = _fill(arn_format, values)
        if filled is not None:
            resources.append(filled)
        elif spec["required"]:
            # a list or describe call naming nothing: the request is for every resource of the type
            resources.append(re.sub(r"\$\{([^}]+)\}", lambda m: values.get(m.group(1), "*"), arn_format))
    if not resources:
        resources = ["*"]
    tags = _tags(params)
    context: dict[str, Iterable[str] | str] = dict(_tag_context(tags))
    if prefix == "sagemaker" and operation == "CreateTrainingJob":
        config = params.get("ResourceConfig") or {}
        types_used = [g.get("InstanceType") for g in config.get("InstanceGroups") or []] + [
            config.get("InstanceType")
        ]
        context["sagemaker:InstanceTypes"] = [t for t in types_used if t]
        stopping = params.get("StoppingCondition") or {}
        if "MaxRuntimeInSeconds" in stopping:
            context["sagemaker:MaxRuntimeInSeconds"] = str(stopping["MaxRuntimeInSeconds"])
    if prefix == "cloudwatch" and operation == "PutMetricData" and params.get("Namespace"):
        context["cloudwatch:namespace"] = str(params["Namespace"])
    if prefix == "events" and operation == "PutEvents":
        context["events:source"] = sorted({str(e.get("Source")) for e in params.get("Entries") or []})
        context["events:detail-type"] = sorted(
            {str(e.get("DetailType")) for e in params.get("Entries") or []}
        )
    required = [
        data["resources"][t.rstrip("*")]["arn"] for t, spec in types.items() if t and spec["required"]
    ]
    primary = [
        r
        for r in resources
        if any(_arn_pattern(f.replace("${Partition}", where.partition)).match(r) for f in required)
    ] or resources
    out = []
    for resource in resources:
        resource_context = dict(context)
        for key, value in ((resource_tags or {}).get(resource.split(":", 5)[-1]) or {}).items():
            resource_context[f"aws:ResourceTag/{key}"] = value
            resource_context[f"{prefix}:ResourceTag/{key}"] = value
        out.append(Authorization(action, resource, _context(resource_context)))
    # Dependent actions the reference lists, when this request brings them about.
    dependent = {d for spec in types.values() for d in spec.get("dependent_actions") or []}
    if tags and f"{prefix}:AddTags" in dependent:
        out.extend(Authorization(f"{prefix}:AddTags", r, _context(_tag_context(tags))) for r in primary)
    if tags and prefix == "cloudwatch" and operation == "PutMetricAlarm":
        out.extend(Authorization("cloudwatch:TagResource", r, _context(_tag_context(tags))) for r in primary)
    # a RoleArn in a request is a role passed to the service, whose principal is <prefix>.amazonaws.com
    if "iam:PassRole" in dependent:
        role = params.get("RoleArn")
        if isinstance(role, str):
            out.append(
                Authorization(
                    "iam:PassRole", role, _context({"iam:PassedToService": f"{prefix}.amazonaws.com"})
                )
            )
    return _unique(out)


#: S3 operations that are not IAM actions of their own, and the action each is authorized as (the S3 user
#: guide's "Amazon S3 actions and permissions" table): reads and heads are GetObject, the parts of an upload
#: are PutObject, listing and heading a bucket are ListBucket.
_S3_ACTIONS = {
    "GetObject": "GetObject",
    "HeadObject": "GetObject",
    "PutObject": "PutObject",
    "CreateMultipartUpload": "PutObject",
    "UploadPart": "PutObject",
    "CompleteMultipartUpload": "PutObject",
    "AbortMultipartUpload": "AbortMultipartUpload",
    "DeleteObject": "DeleteObject",
    "ListObjectsV2": "ListBucket",
    "ListObjects": "ListBucket",
    "HeadBucket": "ListBucket",
    "CreateBucket": "CreateBucket",
}


def _s3_authorizations(operation: str, params: Mapping[str, Any], where: Where) -> list[Authorization]:
    """S3 authorizes object operations on `arn:<partition>:s3:::<bucket>/<key>` and bucket operations on
    the bucket's ARN; DeleteObjects is one DeleteObject per key, and a copy reads its source (GetObject)
    and writes its target (PutObject)."""
    bucket = str(params.get("Bucket") or "")
    bucket_arn = f"arn:{where.partition}:s3:::{bucket}"
    if operation == "DeleteObjects":
        keys = [str(o.get("Key")) for o in (params.get("Delete") or {}).get("Objects") or []]
        return _unique(Authorization("s3:DeleteObject", f"{bucket_arn}/{key}") for key in keys)
    if operation in ("CopyObject", "UploadPartCopy"):
        source = params.get("CopySource")
        if isinstance(source, Mapping):
            source_arn = f"arn:{where.partition}:s3:::{source.get('Bucket')}/{source.get('Key')}"
        else:
            source_arn = f"arn:{where.partition}:s3:::{str(source).lstrip('/').split('?')[0]}"
        return [
            Authorization("s3:GetObject", source_arn),
            Authorization("s3:PutObject", f"{bucket_arn}/{params.get('Key')}"),
        ]
    action = _S3_ACTIONS.get(operation)
    if action is None:
        raise CheckerError(
            f"s3:{operation}: the checker knows no rule for how IAM authorizes it: "
            "teach tests/support/iam_check._S3_ACTIONS"
        )
    if action in ("ListBucket", "CreateBucket"):
        context: dict[str, Iterable[str] | str] = {}
        if action == "ListBucket" and isinstance(params.get("Prefix"), str):
            context["s3:prefix"] = params["Prefix"]
        if action == "ListBucket" and isinstance(params.get("Delimiter"), str):
            context["s3:delimiter"] = params["Delimiter"]
        return [Authorization(f"s3:{action}", bucket_arn, _context(context))]
    return [Authorization(f"s3:{action}", f"{bucket_arn}/{params.get('Key')}")]


def _unique(items: Iterable[Authorization]) -> list[Authorization]:
    return list(dict.fromkeys(items))


# --- policy evaluation ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Statement:
    """One statement of a function's role, with where it comes from."""

    function: str
    policy: str
    index: int
    body: Mapping[str, Any]

    @property
    def sid(self) -> str:
        return str(self.body.get("Sid") or f"{self.policy}#{self.index}")

    @property
    def name(self) -> str:
        return f"{self.function} role, policy {self.policy}, statement {self.sid}"

    def entries(self, key: str) -> list[str]:
        value = self.body.get(key)
        if value is None:
            return []
        return [str(v) for v in (value if isinstance(value, list) else [value])]


def _glob(pattern: str, value: str, *, case: bool = True) -> bool:
    if not case:
        pattern, value = pattern.lower(), value.lower()
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, flags=re.DOTALL) is not None


def _refuse_variables(text: str, statement: Statement) -> None:
    if "${" in text:
        raise CheckerError(f"{statement.name}: policy variables ({text}) are not evaluated by the checker")


def action_matches(statement: Statement, action: str) -> str | None:
    """The Action entry that matches `action` (None if none does; NotAction gives '<NotAction>')."""
    if "NotAction" in statement.body:
        if any(_glob(p, action, case=False) for p in statement.entries("NotAction")):
            return None
        return "<NotAction>"
    return next((p for p in statement.entries("Action") if _glob(p, action, case=False)), None)


def resource_matches(statement: Statement, resource: str) -> str | None:
    if "NotResource" in statement.body:
        if any(_glob(p, resource) for p in statement.entries("NotResource")):
            return None
        return "<NotResource>"
    for pattern in statement.entries("Resource"):
        _refuse_variables(pattern, statement)
        if _glob(pattern, resource):
            return pattern
    return None


_STRING_OPS = {
    "StringEquals": lambda v, p: v == p,
    "StringNotEquals": lambda v, p: v == p,
    "StringEqualsIgnoreCase": lambda v, p: v.lower() == p.lower(),
    "StringNotEqualsIgnoreCase": lambda v, p: v.lower() == p.lower(),
    "StringLike": lambda v, p: _glob(p, v),
    "StringNotLike": lambda v, p: _glob(p, v),
    "ArnEquals": lambda v, p: _glob(p, v),
    "ArnLike": lambda v, p: _glob(p, v),
    "ArnNotEquals": lambda v, p: _glob(p, v),
    "ArnNotLike": lambda v, p: _glob(p, v),
    "Bool": lambda v, p: v.lower() == p.lower(),
    "NumericEquals": lambda v, p: float(v) == float(p),
    "NumericNotEquals": lambda v, p: float(v) == float(p),
    "NumericLessThan": lambda v, p: float(v) < float(p),
    "NumericLessThanEquals": lambda v, p: float(v) <= float(p),
    "NumericGreaterThan": lambda v, p: float(v) > float(p),
    "NumericGreaterThanEquals": lambda v, p: float(v) >= float(p),
}
_NEGATED = {
    "StringNotEquals",
    "StringNotEqualsIgnoreCase",
    "StringNotLike",
    "ArnNotEquals",
    "ArnNotLike",
    "NumericNotEquals",
}


def _condition_holds(
    operator: str, key: str, wanted: list[str], context: Mapping[str, list[str]], statement: Statement
) -> bool:
    qualifier, _, op = operator.rpartition(":")
    if_exists = op.endswith("IfExists") and op != "IfExists"
    if if_exists:
        op = op[: -len("IfExists")]
    present = next((k for k in context if k.lower() == key.lower()), None)
    values = context[present] if present is not None else None
    if op == "Null":
        is_null = values is None
        return any((w.lower() == "true") == is_null for w in wanted)
    compare = _STRING_OPS.get(op)
    if compare is None or qualifier not in ("", "ForAllValues", "ForAnyValue"):
        raise CheckerError(f"{statement.name}: condition operator {operator} is not evaluated by the checker")
    for w in wanted:
        _refuse_variables(w, statement)
    negated = op in _NEGATED
    if values is None:
        # IAM: a missing key matches nothing, so a negated operator holds, as do IfExists and ForAllValues
        return if_exists or negated or qualifier == "ForAllValues"

    def one(value: str) -> bool:
        hit = any(compare(value, w) for w in wanted)
        return not hit if negated else hit

    if qualifier == "ForAllValues":
        return all(one(v) for v in values)
    if qualifier == "ForAnyValue":
        return any(one(v) for v in values)
    if len(values) != 1:
        # a multivalued key under a single-valued operator: IAM compares the set as one value, which
        # matches nothing; say so rather than guess
        return negated
    return one(values[0])


def conditions_hold(statement: Statement, context: Mapping[str, list[str]]) -> list[str]:
    """The conditions of `statement` that do not hold (empty: all hold)."""
    failed = []
    for operator, block in (statement.body.get("Condition") or {}).items():
        for key, wanted in block.items():
            values = [str(w) for w in (wanted if isinstance(wanted, list) else [wanted])]
            if not _condition_holds(operator, key, values, context, statement):
                failed.append(
                    f"{operator} {key} {values} (the request has {context.get(key, 'no such key')})"
                )
    return failed


@dataclass
class Decision:
    authorization: Authorization
    allowed: bool
    by: Statement | None = None
    action_entry: str | None = None
    resource_entry: str | None = None
    denied_by: Statement | None = None
    why: str = ""


def evaluate(statements: list[Statement], request: Authorization) -> Decision:
    context = request.context_dict()
    allow: Decision | None = None
    near: list[str] = []
    for statement in statements:
        action = action_matches(statement, request.action)
        if action is None:
            continue
        resource = resource_matches(statement, request.resource)
        if resource is None:
            if statement.body.get("Effect") == "Allow":
                near.append(
                    f"{statement.name} grants {request.action} but not on {request.resource} (its resources: {statement.entries('Resource') or statement.entries('NotResource')})"
                )
            continue
        failed = conditions_hold(statement, context)
        if failed:
            if statement.body.get("Effect") == "Allow":
                near.append(
                    f"{statement.name} grants {request.action} on {resource} but its condition fails: {'; '.join(failed)}"
                )
            continue
        if statement.body.get("Effect") == "Deny":
            return Decision(request, False, denied_by=statement, why=f"explicitly denied by {statement.name}")
        if allow is None:
            allow = Decision(request, True, by=statement, action_entry=action, resource_entry=resource)
    if allow is not None:
        return allow
    if near:
        why = "the statement that would have to change: " + " / ".join(near)
    else:
        same_service = [
            s.name
            for s in statements
            if any(
                e.split(":")[0].lower() == request.action.split(":")[0].lower() for e in s.entries("Action")
            )
        ]
        why = f"no statement grants {request.action}; add it to " + (
            f"{same_service[0]}" if same_service else "a new statement"
        )
    return Decision(request, False, why=why)


# --- the functions' roles, rendered from template.yaml ------------------------------------------------------


@dataclass(frozen=True)
class Binding:
    """The names a function ran with, which the template's references resolve to."""

    region: str
    account: str
    table_name: str
    event_bus_name: str
    alarm_topic_arn: str = ""
    notification_topic_arn: str = ""
    allowed_role_arns: tuple[str, ...] = ()
    job_notices_topic_arn: str = ""

    def topics(self) -> tuple[tuple[str, str], ...]:
        """The stack's topics this run named: (logical id, ARN)."""
        return (
            ("AlarmTopic", self.alarm_topic_arn),
            ("NotificationTopic", self.notification_topic_arn),
            ("JobNoticesTopic", self.job_notices_topic_arn),
        )

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "allowed_role_arns": list(self.allowed_role_arns)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Binding:
        return cls(**{**data, "allowed_role_arns": tuple(data.get("allowed_role_arns") or ())})


def binding_of(settings: Any, region: str) -> Binding:
    arns = [settings.alarm_topic_arn, settings.notification_topic_arn, *settings.allowed_role_arns]
    account = next(
        (a.split(":")[4] for a in arns if a and a.startswith("arn:") and a.split(":")[4]), DEFAULT_ACCOUNT
    )
    return Binding(
        region=region,
        account=account,
        table_name=settings.table_name,
        event_bus_name=settings.event_bus_name,
        alarm_topic_arn=settings.alarm_topic_arn,
        notification_topic_arn=settings.notification_topic_arn,
        allowed_role_arns=tuple(settings.allowed_role_arns),
        job_notices_topic_arn=getattr(settings, "job_notices_topic_arn", ""),
    )


@cache
def _translated(template_text: str) -> dict[str, Any]:
    from sagequeue.local.template import StackContext, Template, load_template

    context = StackContext(stack_name="sagequeue", region="us-east-1", account_id=DEFAULT_ACCOUNT)
    template = Template(
        load_template(TEMPLATE),
        context,
        {"AllowedRoleArns": "arn:aws:iam::123456789012:role/placeholder"},
        base_dir=TEMPLATE.parent,
    )
    return copy.deepcopy(dict(template.document))


def raw_template() -> dict[str, Any]:
    from sagequeue.local.template import load_template

    return load_template(TEMPLATE)


def functions() -> dict[str, Path]:
    """The template's functions: logical id -> code folder."""
    out = {}
    for logical_id, resource in (raw_template().get("Resources") or {}).items():
        if resource.get("Type") == "AWS::Serverless::Function":
            uri = (resource.get("Properties") or {}).get("CodeUri")
            if isinstance(uri, str):
                out[logical_id] = (TEMPLATE.parent / uri).resolve()
    return out


def unexercised_justified(function: str) -> dict[str, str]:
    resource = (raw_template().get("Resources") or {}).get(function) or {}
    return dict(((resource.get("Metadata") or {}).get(UNEXERCISED_KEY)) or {})


def role_statements(
    function: str, binding: Binding, document: Mapping[str, Any] | None = None
) -> list[Statement]:
    """The statements of `function`'s role policies, resolved for `binding`."""
    from sagequeue.local.template import StackContext, Template

    document = document if document is not None else _translated(TEMPLATE.read_text())
    context = StackContext(stack_name="sagequeue", region=binding.region, account_id=binding.account)
    template = Template(
        document, context, {"AllowedRoleArns": ",".join(binding.allowed_role_arns)}, base_dir=TEMPLATE.parent
    )
    physical = template._physical  # the names this run used, not the ones a deploy would generate
    physical["JobsTable"] = binding.table_name
    physical["EventBus"] = binding.event_bus_name
    for logical_id, arn in binding.topics():
        if arn:
            physical[logical_id] = arn.rsplit(":", 1)[-1]
    function_resource = template.resources.get(function)
    if function_resource is None:
        raise CheckerError(f"template.yaml has no function {function}")
    role = (function_resource.get("Properties") or {}).get("Role")
    role_id = role["Fn::GetAtt"][0] if isinstance(role, Mapping) and "Fn::GetAtt" in role else None
    if role_id is None:
        raise CheckerError(f"{function} has no role made by the template ({role!r})")
    statements: list[Statement] = []
    for policy in template.properties(role_id).get("Policies") or []:
        body = policy.get("PolicyDocument") or {}
        items = body.get("Statement") or []
        for index, statement in enumerate(items if isinstance(items, list) else [items]):
            statements.append(Statement(function, str(policy.get("PolicyName")), index, statement))
    return statements


# --- recording ----------------------------------------------------------------------------------------------


@dataclass
class Call:
    function: str
    operation: str
    binding: Binding
    authorizations: list[Authorization]
    test: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "function": self.function,
            "operation": self.operation,
            "test": self.test,
            "binding": self.binding.to_json(),
            "authorizations": [a.to_json() for a in self.authorizations],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Call:
        return cls(
            function=str(data["function"]),
            operation=str(data["operation"]),
            binding=Binding.from_json(data["binding"]),
            authorizations=[Authorization.from_json(a) for a in data["authorizations"]],
            test=str(data.get("test", "")),
        )


@dataclass
class Recorder:
    """Records the functions' AWS requests in this process."""

    calls: list[Call] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    resource_tags: dict[str, dict[str, str]] = field(default_factory=dict)
    test: str = ""
    _code_dirs: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    #: The job image's requests in this process, recorded while `job.enabled` (see JobRecorder).
    job_requests: list[JobRequest] = field(default_factory=list)
    job: JobRecorder | None = None

    def __post_init__(self) -> None:
        self._code_dirs = {str(path): logical_id for logical_id, path in functions().items()}

    def function_on_stack(self) -> str | None:
        frame = sys._getframe(2)
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename.endswith("app.py"):
                folder = str(Path(filename).parent)
                found = self._code_dirs.get(folder)
                if found is None and "/.aws-sam/build/" in folder:
                    found = Path(folder).name
                if found is not None:
                    return found
            frame = frame.f_back  # type: ignore[assignment]
        return None

    def before_call(self, params: Mapping[str, Any], model: Any, **_: Any) -> None:
        # botocore's service names are the IAM prefixes for every service the functions call (its endpoint
        # prefix is not: CloudWatch's is "monitoring"); authorizations() refuses a prefix it does not know
        prefix = str(model.service_model.service_name)
        operation = str(model.name)
        params = dict(params)
        self._remember_tags(prefix, operation, params)
        function = self.function_on_stack()
        if function is None:
            return
        from sagequeue_core import runtime

        deps = runtime._installed
        if deps is None:
            return
        binding = binding_of(deps.settings, deps.region)
        try:
            found = authorizations(
                prefix, operation, params, Where(binding.region, binding.account), self.resource_tags
            )
        except CheckerError as exc:
            with self._lock:
                self.errors.append(f"{function}: {exc}")
            return
        with self._lock:
            self.calls.append(Call(function, f"{prefix}:{operation}", binding, found, self.test))

    def _remember_tags(self, prefix: str, operation: str, params: Mapping[str, Any]) -> None:
        """Tags set on training jobs by anyone (the resource tags later requests are judged with)."""
        if prefix != "sagemaker":
            return
        if operation == "CreateTrainingJob" and isinstance(params.get("TrainingJobName"), str):
            # the account and region are the emulator's: any account matches, keyed by name
            self.resource_tags.setdefault(f"training-job/{params['TrainingJobName']}", {}).update(
                _tags(params)
            )
        elif operation == "AddTags" and isinstance(params.get("ResourceArn"), str):
            self.resource_tags.setdefault(params["ResourceArn"].split(":", 5)[-1], {}).update(_tags(params))

    def attach(self, client: Any) -> None:
        client.meta.events.register("before-parameter-build", self.before_call)


_installed: Recorder | None = None


def install() -> Recorder:
    """Record the requests of every botocore client made from now on in this process."""
    global _installed
    if _installed is not None:
        return _installed
    import botocore.client

    recorder = _installed = Recorder()
    original = botocore.client.ClientCreator.create_client

    def create_client(self: Any, *args: Any, **kwargs: Any) -> Any:
        client = original(self, *args, **kwargs)
        recorder.attach(client)
        return client

    botocore.client.ClientCreator.create_client = create_client  # type: ignore[method-assign]
    recorder.job = install_job_recorder(recorder.job_requests.append)
    return recorder


# --- verdicts ----------------------------------------------------------------------------------------------


class Policies:
    """Rendered role statements per (function, binding), made once each."""

    def __init__(self, document: Mapping[str, Any] | None = None) -> None:
        self.document = document
        self._made: dict[tuple[str, Binding], list[Statement]] = {}

    def of(self, function: str, binding: Binding) -> list[Statement]:
        key = (function, binding)
        if key not in self._made:
            self._made[key] = role_statements(function, binding, self.document)
        return self._made[key]


def denials(calls: Iterable[Call], policies: Policies) -> list[str]:
    """One message per distinct denied (function, action, resource shape)."""
    out: dict[tuple[str, str, str], str] = {}
    for call in calls:
        statements = policies.of(call.function, call.binding)
        for request in call.authorizations:
            decision = evaluate(statements, request)
            if not decision.allowed:
                key = (call.function, request.action, decision.why)
                out.setdefault(
                    key,
                    f"{call.function} may not {request.action} on {request.resource} "
                    f"(for {call.operation}{', in ' + call.test if call.test else ''}): {decision.why}",
                )
    return list(out.values())


@dataclass(frozen=True)
class Grant:
    """One action entry or one resource entry of one statement."""

    function: str
    sid: str
    kind: str  # "Action" or "Resource"
    entry: str


def used_grants(calls: Iterable[Call], policies: Policies) -> set[Grant]:
    used: set[Grant] = set()
    for call in calls:
        statements = policies.of(call.function, call.binding)
        for request in call.authorizations:
            decision = evaluate(statements, request)
            if decision.allowed and decision.by is not None:
                used.add(Grant(call.function, decision.by.sid, "Action", str(decision.action_entry)))
                used.add(
                    Grant(
                        call.function,
                        decision.by.sid,
                        "Resource",
                        generic(str(decision.resource_entry), call.binding),
                    )
                )
    return used


def generic(entry: str, binding: Binding) -> str:
    """A resource entry named the same whatever names a test gave the stack's resources."""
    if entry in binding.allowed_role_arns:
        return "<AllowedRoleArns>"
    entry = entry.replace(f":{binding.region}:{binding.account}:", ":<region>:<account>:")
    entry = entry.replace(f":table/{binding.table_name}", ":table/<JobsTable>")
    entry = entry.replace(f":event-bus/{binding.event_bus_name}", ":event-bus/<EventBus>")
    for logical_id, arn in binding.topics():
        if arn and entry == arn.replace(f":{binding.region}:{binding.account}:", ":<region>:<account>:"):
            return f"<{logical_id}>"
    return entry


def granted(function: str, binding: Binding, policies: Policies) -> set[Grant]:
    out: set[Grant] = set()
    for statement in policies.of(function, binding):
        if statement.body.get("Effect") != "Allow":
            continue
        out.update(Grant(function, statement.sid, "Action", a) for a in statement.entries("Action"))
        out.update(
            Grant(function, statement.sid, "Resource", generic(r, binding))
            for r in statement.entries("Resource")
        )
    return out


def unused_report(calls: list[Call], policies: Policies) -> list[Grant]:
    """Granted action and resource entries no recorded call used and the template does not justify."""
    used = used_grants(calls, policies)
    bindings = {c.function: c.binding for c in calls}
    out = []
    for function, binding in sorted(bindings.items()):
        # a justification names an action, or a statement as a whole (its Sid, or the policy SAM names)
        justified = set(unexercised_justified(function))
        for grant in sorted(
            granted(function, binding, policies) - used, key=lambda g: (g.sid, g.kind, g.entry)
        ):
            if {grant.entry, grant.sid, grant.sid.partition("#")[0]} & justified:
                continue
            out.append(grant)
    return out


def save(calls: Iterable[Call], path: Path) -> None:
    """Keep a representative call log: per (function, action, context keys, resource kind), one call."""
    kept: dict[tuple[Any, ...], dict[str, Any]] = {}
    for call in calls:
        for request in call.authorizations:
            kind = generic(request.resource, call.binding)
            kind = re.sub(r"(training-job|training-plan|alarm:sagequeue-idle)[-/].*$", r"\1", kind)
            key = (
                call.function,
                request.action,
                kind,
                tuple(k for k, _ in request.context),
            )
            if key not in kept:
                kept[key] = {**call.to_json(), "authorizations": [request.to_json()]}
    path.write_text(
        json.dumps(
            sorted(
                kept.values(),
                key=lambda c: (
                    c["function"],
                    c["authorizations"][0]["action"],
                    c["authorizations"][0]["resource"],
                ),
            ),
            indent=1,
        )
        + "\n"
    )


def load(path: Path) -> list[Call]:
    return [Call.from_json(c) for c in json.loads(path.read_text())]


def summary(grants: Iterable[Grant]) -> str:
    return "\n".join(f"  {g.function} statement {g.sid}: {g.kind} {g.entry}" for g in grants)


# --- the policies the docs give: the job image's execution role, operators' policies ----------------------

POLICIES = ROOT / "docs" / "policies"
#: The job image's execution role as the docs give it, one team's: its NEFF cache grants
#: (docs/neff-cache.md#trust-model) and its utilization metric (docs/guardrails.md).
JOB_ROLE_POLICIES = (
    "job-role-neff-cache.json",
    "job-role-utilization-metric.json",
    "job-role-hub-token.json",
)
#: The Hub token secret a rendered job role names when the test gave none: no secret has this name.
NO_SECRET = "no-hub-token-secret"


def documented_statements(name: str, values: Mapping[str, str], principal: str = "") -> list[Statement]:
    """The statements of docs/policies/<name> with its `${Placeholder}`s replaced by `values` (an empty
    `Prefix` takes its slash with it: the cache at the bucket's root)."""
    text = (POLICIES / name).read_text()
    if values.get("Prefix") == "":
        text = text.replace("${Prefix}/", "")

    def one(match: re.Match[str]) -> str:
        if match.group(1) not in values:
            raise CheckerError(f"docs/policies/{name}: no value given for ${{{match.group(1)}}}")
        return values[match.group(1)]

    document = json.loads(re.sub(r"\$\{([A-Za-z]+)\}", one, text))
    items = document["Statement"]
    return [Statement(principal or name, name, i, s) for i, s in enumerate(items)]


def job_role_statements(
    bucket: str,
    prefix: str,
    team: str,
    hub_token_secret: str = NO_SECRET,
    where: Where | None = None,
    metric_namespace: str = NEURON_METRIC_NAMESPACE,
) -> list[Statement]:
    """The documented job role of `team`'s jobs for the cache `s3://<bucket>/<prefix>`, whose Hub token
    is the secret named `hub_token_secret`, publishing utilization to `metric_namespace` (a team's role:
    its team's, team_metric_namespace; by default the namespace of jobs without a team, where the job
    image publishes when its environment names none)."""
    where = where or Where("us-east-1", DEFAULT_ACCOUNT)
    values = {
        "MetricNamespace": metric_namespace,
        "Bucket": bucket,
        "Prefix": prefix.strip("/"),
        "Team": team,
        "Region": where.region,
        "Account": where.account,
        "HubTokenSecret": hub_token_secret,
    }
    return [
        s
        for name in JOB_ROLE_POLICIES
        for s in documented_statements(name, values, principal=f"team {team}'s job")
    ]


# --- the job image's requests ---------------------------------------------------------------------------------

JOB_CODE = str(ROOT / "sdk" / "sagequeue" / "job") + "/"
#: Job-image modules a person runs with their own credentials (`sagequeue cache ...`), not a job's role.
_PEOPLES_COMMANDS = ("cache_cli.py", "torchneuron_cli.py")
#: Where a job-image process started by a test appends its requests, one JSON line each.
JOB_LOG_ENV = "SAGEQUEUE_IAM_JOB_LOG"
#: A folder to put first on such a process's PYTHONPATH: its sitecustomize records when JOB_LOG_ENV is set.
JOB_SITE = Path(__file__).resolve().parent / "iam_job_site"


@dataclass(frozen=True)
class JobRequest:
    """One request the job image made, with the cache handle (bucket, prefix, writer) it was made for."""

    service: str
    operation: str
    params: Mapping[str, Any]
    bucket: str = ""
    prefix: str = ""
    writer: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobRequest:
        return cls(**data)


def _plain(value: Any) -> Any:
    """What a request's parameters say that IAM can look at: strings and numbers (bodies and streams go)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if _plain(v) is not None}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, str | int | float | bool):
        return value
    return None


class JobRecorder:
    """Records the requests of botocore clients the job image's code makes (a frame of `sagequeue/job/`
    on the stack when the client is made, none of a person's `sagequeue cache` commands). A client an
    S3 cache handle makes is that handle's: its bucket, prefix and writer decide which team's role judges
    it. Creating the cache's bucket (`S3Remote.create`, run by an operator or a test's setup) is not the
    job's request."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.enabled = False

    def attach(self, client: Any) -> None:
        frame: Any = sys._getframe(1)
        remote = None
        in_job = False
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename.startswith(JOB_CODE):
                if filename[len(JOB_CODE) :] in _PEOPLES_COMMANDS:
                    return
                in_job = True
                candidate = frame.f_locals.get("self") if remote is None else None
                if candidate is not None and all(
                    hasattr(candidate, a) for a in ("bucket", "prefix", "writer")
                ):
                    remote = candidate
            frame = frame.f_back
        if not in_job:
            return

        def before_call(params: Mapping[str, Any], model: Any, **_: Any) -> None:
            if not self.enabled or _creating_the_bucket():
                return
            self.sink(
                JobRequest(
                    str(model.service_model.service_name),
                    str(model.name),
                    _plain(dict(params)),
                    str(getattr(remote, "bucket", "") or ""),
                    str(getattr(remote, "prefix", "") or ""),
                    getattr(remote, "writer", None),
                )
            )

        client.meta.events.register("before-parameter-build", before_call)


def _creating_the_bucket() -> bool:
    frame: Any = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "create" and frame.f_code.co_filename == JOB_CODE + "s3.py":
            return True
        frame = frame.f_back
    return False


#: The team a job that publishes under no writer folder is judged as (any team's grants cover its keys).
NO_WRITER_TEAM = "(no writer)"


def job_denials(requests: Iterable[JobRequest], where: Where, hub_token_secret: str = NO_SECRET) -> list[str]:
    """One message per distinct denied (team, action, statement) of the job image's requests, judged by the
    documented job role of the team each request's cache handle writes as (its Hub token in the secret
    `hub_token_secret`)."""
    out: dict[tuple[str, str, str], str] = {}
    rendered: dict[tuple[str, str, str], list[Statement]] = {}
    seen: set[tuple[Authorization, tuple[str, str, str]]] = set()
    for request in requests:
        team = request.writer or NO_WRITER_TEAM
        key = (request.bucket, request.prefix, team)
        if key not in rendered:
            rendered[key] = job_role_statements(
                request.bucket or "no-bucket", request.prefix, team, hub_token_secret, where
            )
        try:
            found = authorizations(request.service, request.operation, request.params, where)
        except CheckerError as exc:
            out.setdefault(("", request.operation, str(exc)), f"the job image: {exc}")
            continue
        for authorization in found:
            if (authorization, key) in seen:
                continue
            seen.add((authorization, key))
            decision = evaluate(rendered[key], authorization)
            if not decision.allowed:
                out.setdefault(
                    (team, authorization.action, decision.why),
                    f"the job role of team {team} (docs/policies/{', '.join(JOB_ROLE_POLICIES)}) may not "
                    f"{authorization.action} on {authorization.resource} (for {request.service}:"
                    f"{request.operation}): {decision.why}",
                )
    return list(out.values())


def install_job_recorder(sink: Any) -> JobRecorder:
    """Record the job image's requests from every botocore client made from now on in this process."""
    import botocore.client

    recorder = JobRecorder(sink)
    original = botocore.client.ClientCreator.create_client

    def create_client(self: Any, *args: Any, **kwargs: Any) -> Any:
        client = original(self, *args, **kwargs)
        recorder.attach(client)
        return client

    botocore.client.ClientCreator.create_client = create_client  # type: ignore[method-assign]
    return recorder
