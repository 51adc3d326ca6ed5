"""Read `template.yaml` and resolve what the embedded stack must create and run.

The local stack creates its tables, topics, queues, buses, rules and alarms from the very template that
`sam deploy` deploys, so the two cannot drift. This module parses the template (CloudFormation short tags
included), lets aws-sam-translator (the library `sam` itself runs) apply the SAM transform offline, so the
local stack provisions from the same CloudFormation that `sam deploy` would create, then resolves the
intrinsic functions the stack uses (Ref, Fn::Sub, Fn::GetAtt, Fn::If and the
condition functions, Fn::Join, Fn::Select, Fn::Split, Fn::FindInMap, ...) for given parameter values, and
describes the result as plain specs. It makes no AWS call: `sagequeue.local.provision` does.

Resolution is lazy: only the properties the local stack reads are resolved, so an IAM policy or a
dashboard body using an intrinsic this module does not know never stops the stack from starting.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml


class TemplateError(ValueError):
    """The template cannot be read or resolved; the message names the resource, property or function."""


#: The made-up bucket a local CodeUri is given to the SAM translator as.
LOCAL_CODE_BUCKET = "sagequeue-local-code"
#: SAM properties that may name a local folder.
_LOCAL_URI_PROPERTIES = {
    "AWS::Serverless::Function": ("CodeUri",),
    "AWS::Serverless::LayerVersion": ("ContentUri",),
}


def _is_sam(document: Mapping[str, Any]) -> bool:
    transform = document.get("Transform")
    names = transform if isinstance(transform, list) else [transform]
    return "AWS::Serverless-2016-10-31" in names


class _OfflineSession:
    """What the SAM translator asks of a boto3 session (its region and partition), without boto3."""

    def __init__(self, region: str) -> None:
        self.region_name = region

    def get_partition_for_region(self, region: str) -> str:
        return (
            "aws-cn"
            if region.startswith("cn-")
            else ("aws-us-gov" if region.startswith("us-gov-") else "aws")
        )


# --- Parsing ---------------------------------------------------------------------------------------------------

_BASE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _CfnLoader(_BASE_LOADER):  # type: ignore[valid-type,misc]
    """A safe YAML loader that understands CloudFormation's short-form tags (!Ref, !Sub, ...)."""


_SHORT_TAGS = {
    "Ref": "Ref",
    "Condition": "Condition",
    "Sub": "Fn::Sub",
    "GetAtt": "Fn::GetAtt",
    "Join": "Fn::Join",
    "If": "Fn::If",
    "Equals": "Fn::Equals",
    "Not": "Fn::Not",
    "And": "Fn::And",
    "Or": "Fn::Or",
    "Select": "Fn::Select",
    "Split": "Fn::Split",
    "FindInMap": "Fn::FindInMap",
    "Base64": "Fn::Base64",
    "GetAZs": "Fn::GetAZs",
    "ImportValue": "Fn::ImportValue",
    "Cidr": "Fn::Cidr",
    "ToJsonString": "Fn::ToJsonString",
    "Length": "Fn::Length",
}


def _construct_short_tag(loader: yaml.SafeLoader, tag_suffix: str, node: yaml.Node) -> dict[str, Any]:
    name = _SHORT_TAGS.get(tag_suffix)
    if name is None:
        raise TemplateError(f"unknown CloudFormation tag !{tag_suffix} at line {node.start_mark.line + 1}")
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    if name == "Fn::GetAtt" and isinstance(value, str):
        logical_id, _, attribute = value.partition(".")
        value = [logical_id, attribute]
    return {name: value}


_CfnLoader.add_multi_constructor("!", _construct_short_tag)


def load_template(path: str | Path) -> dict[str, Any]:
    """The template at `path` as a dictionary, short tags expanded to their long forms."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as exc:
        raise TemplateError(f"cannot read the template {source}: {exc.strerror or exc}") from exc
    try:
        document = yaml.load(text, Loader=_CfnLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise TemplateError(f"{source} is not valid YAML: {exc}") from exc
    if not isinstance(document, dict) or not isinstance(document.get("Resources"), dict):
        raise TemplateError(f"{source} has no Resources section")
    return document


# --- Resolution ------------------------------------------------------------------------------------------------


class _NoValue:
    """AWS::NoValue: the property it stands for is removed."""

    def __repr__(self) -> str:
        return "AWS::NoValue"


NO_VALUE = _NoValue()

# Which property names a resource's physical name, when the template gives one.
_NAME_PROPERTY = {
    "AWS::DynamoDB::Table": "TableName",
    "AWS::SNS::Topic": "TopicName",
    "AWS::SQS::Queue": "QueueName",
    "AWS::Events::EventBus": "Name",
    "AWS::Events::Rule": "Name",
    "AWS::Lambda::Function": "FunctionName",
    "AWS::CloudWatch::Alarm": "AlarmName",
    "AWS::IAM::Role": "RoleName",
    "AWS::Scheduler::Schedule": "Name",
    "AWS::Logs::LogGroup": "LogGroupName",
}
# Where a generated name must stay short (SQS: 80 characters, Lambda: 64).
_NAME_LIMIT = {"AWS::SQS::Queue": 80, "AWS::Lambda::Function": 64}

_SUB_VARIABLE = re.compile(r"\$\{([^}]*)\}")


@dataclass(frozen=True)
class StackContext:
    """Where the template is being resolved: the pseudo parameters and the moto endpoint for queue URLs."""

    stack_name: str
    region: str
    account_id: str
    partition: str = "aws"
    queue_url_base: str = "http://127.0.0.1"

    @property
    def stack_id(self) -> str:
        return (
            f"arn:{self.partition}:cloudformation:{self.region}:{self.account_id}:stack/{self.stack_name}/"
            f"{hashlib.sha256(self.stack_name.encode()).hexdigest()[:32]}"
        )


# --- translations, cached --------------------------------------------------------------------------------------

#: Translations made or read in this process, by key.
_TRANSLATED: dict[str, dict[str, Any]] = {}
#: Where translations are kept between processes (the user's cache folder by default); an empty value
#: turns keeping them off.
CACHE_DIR_ENV = "SAGEQUEUE_CACHE_DIR"


def _translation_key(sam: Mapping[str, Any], values: Mapping[str, Any]) -> str:
    """What a translation depends on: the template (code locations included), the parameter and pseudo
    parameter values, and the translator's version."""
    from importlib.metadata import version

    material = json.dumps([sam, values, version("aws-sam-translator")], sort_keys=True, default=str)
    return hashlib.sha256(material.encode()).hexdigest()


def _cache_dir() -> Path | None:
    import os

    configured = os.environ.get(CACHE_DIR_ENV)
    if configured is not None:
        return Path(configured) if configured else None
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("sagequeue")) / "sam-translations"


def _read_cached(key: str) -> dict[str, Any] | None:
    """A translation kept by an earlier process, or None (none kept, unreadable, or not a template)."""
    folder = _cache_dir()
    if folder is None:
        return None
    try:
        document = json.loads((folder / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) and isinstance(document.get("Resources"), dict) else None


def _write_cached(key: str, document: Mapping[str, Any]) -> None:
    """Keep a translation for later processes; a cache that cannot be written is no error (the next start
    translates again). Written whole, then renamed, so a reader never sees half a file."""
    import os
    import tempfile

    folder = _cache_dir()
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as out:
            json.dump(document, out)
        os.replace(out.name, folder / f"{key}.json")
    except (OSError, TypeError, ValueError):
        return


class Template:
    """A parsed template bound to a stack context and parameter values, resolving intrinsics on demand."""

    def __init__(
        self,
        document: Mapping[str, Any],
        context: StackContext,
        parameters: Mapping[str, Any] | None = None,
        *,
        base_dir: Path | None = None,
    ) -> None:
        self.document = document
        self.context = context
        self.base_dir = base_dir or Path.cwd()
        self.parameters = self._parameter_values(parameters or {})
        #: S3 key -> the local folder a function's CodeUri named (the translator wants S3 locations)
        self.code_dirs: dict[str, Path] = {}
        if _is_sam(document):
            self.document = self._translate(document)
        self.resources: dict[str, dict[str, Any]] = dict(self.document.get("Resources") or {})
        self._conditions: dict[str, bool] = {}
        self._physical: dict[str, str] = {}
        self._resolving: set[str] = set()

    @classmethod
    def from_file(
        cls, path: str | Path, context: StackContext, parameters: Mapping[str, Any] | None = None
    ) -> Template:
        source = Path(path)
        return cls(load_template(source), context, parameters, base_dir=source.parent)

    # --- the SAM transform ------------------------------------------------------------------------------------

    def _translate(self, document: Mapping[str, Any]) -> dict[str, Any]:
        """The template as CloudFormation sees it after `Transform: AWS::Serverless-2016-10-31`, by
        aws-sam-translator (the library `sam` runs), offline: local CodeUri folders become S3 locations
        remembered in `code_dirs`, the pseudo parameters are the stack's, no AWS call is made. Translating
        takes about a second (most of it importing the translator), so a translation is kept, keyed by
        everything it depends on (`_translation_key`), in this process and in the user's cache folder."""
        import copy

        sam = copy.deepcopy(dict(document))
        for where in [
            *((sam.get("Resources") or {}).values()),
            {"Type": "AWS::Serverless::Function", "Properties": (sam.get("Globals") or {}).get("Function")},
        ]:
            props = (where or {}).get("Properties")
            if not isinstance(props, dict):
                continue
            for key in _LOCAL_URI_PROPERTIES.get(str(where.get("Type")), ()):
                uri = props.get(key)
                if isinstance(uri, str) and not uri.startswith("s3://"):
                    s3_key = f"code/{len(self.code_dirs)}"
                    self.code_dirs[s3_key] = (self.base_dir / uri).resolve()
                    props[key] = f"s3://{LOCAL_CODE_BUCKET}/{s3_key}"
        values: dict[str, Any] = {
            name: ",".join(value) if isinstance(value, list) else value
            for name, value in self.parameters.items()
        }
        values.update(
            {
                "AWS::Region": self.context.region,
                "AWS::AccountId": self.context.account_id,
                "AWS::Partition": self.context.partition,
                "AWS::StackName": self.context.stack_name,
                "AWS::StackId": self.context.stack_id,
            }
        )
        key = _translation_key(sam, values)
        cached = _TRANSLATED.get(key) or _read_cached(key)
        if cached is not None:
            _TRANSLATED[key] = cached
            return copy.deepcopy(cached)
        try:
            from samtranslator.model.exceptions import InvalidDocumentException
            from samtranslator.parser.parser import Parser
            from samtranslator.translator.translator import Translator
        except ImportError as exc:
            raise TemplateError(
                "a SAM template needs aws-sam-translator to run locally: pip install 'sagequeue[local]'"
            ) from exc
        translator = Translator({}, Parser(), boto_session=_OfflineSession(self.context.region))
        try:
            translated = dict(translator.translate(sam, values, get_managed_policy_map=dict))
        except InvalidDocumentException as exc:
            causes = "; ".join(str(cause) for cause in exc.causes) or str(exc)
            raise TemplateError(f"the SAM transform refused the template: {causes}") from exc
        _TRANSLATED[key] = copy.deepcopy(translated)
        _write_cached(key, translated)
        return translated

    # --- parameters and conditions ---------------------------------------------------------------------------

    def _parameter_values(self, given: Mapping[str, Any]) -> dict[str, Any]:
        declared: Mapping[str, Any] = self.document.get("Parameters") or {}
        unknown = sorted(set(given) - set(declared))
        if unknown:
            raise TemplateError(
                f"the template declares no parameter {', '.join(unknown)}; "
                f"its parameters are {', '.join(sorted(declared)) or 'none'}"
            )
        values: dict[str, Any] = {}
        for name, spec in declared.items():
            spec = spec or {}
            if name in given:
                raw = given[name]
            elif "Default" in spec:
                raw = spec["Default"]
            else:
                raise TemplateError(f"parameter {name} has no default and no value was given")
            text = _parameter_text(raw)
            allowed = spec.get("AllowedValues")
            if allowed is not None and text not in [str(a) for a in allowed]:
                raise TemplateError(
                    f"parameter {name} is {text!r}; allowed values: {', '.join(str(a) for a in allowed)}"
                )
            pattern = spec.get("AllowedPattern")
            if pattern is not None and not re.fullmatch(pattern, text):
                raise TemplateError(f"parameter {name} is {text!r}, which does not match {pattern}")
            kind = str(spec.get("Type", "String"))
            if kind == "CommaDelimitedList" or kind.startswith("List<"):
                values[name] = [part.strip() for part in text.split(",")] if text else []
            else:
                values[name] = text
        return values

    def condition(self, name: str) -> bool:
        if name not in self._conditions:
            conditions: Mapping[str, Any] = self.document.get("Conditions") or {}
            if name not in conditions:
                raise TemplateError(f"condition {name} is not declared in Conditions")
            if name in self._resolving:
                raise TemplateError(f"condition {name} refers to itself")
            self._resolving.add(name)
            try:
                self._conditions[name] = bool(self.resolve(conditions[name], where=f"condition {name}"))
            finally:
                self._resolving.discard(name)
        return self._conditions[name]

    def included(self, logical_id: str) -> bool:
        """Whether the resource exists for these parameters (its Condition, if any, holds)."""
        condition = self.resources[logical_id].get("Condition")
        return condition is None or self.condition(str(condition))

    # --- resources -------------------------------------------------------------------------------------------

    def resource_type(self, logical_id: str) -> str:
        return str(self.resources[logical_id].get("Type", ""))

    def of_type(self, *types: str) -> Iterator[str]:
        """Logical ids of the included resources of the given types, in template order."""
        for logical_id, resource in self.resources.items():
            if resource.get("Type") in types and self.included(logical_id):
                yield logical_id

    def properties(self, logical_id: str) -> dict[str, Any]:
        """A resource's properties with every intrinsic resolved."""
        raw = self.resources[logical_id].get("Properties") or {}
        resolved = self.resolve(raw, where=logical_id)
        return resolved if isinstance(resolved, dict) else {}

    def raw_properties(self, logical_id: str) -> dict[str, Any]:
        return dict(self.resources[logical_id].get("Properties") or {})

    def physical_name(self, logical_id: str) -> str:
        """The resource's name: the one the template sets, or a stable one generated the way CloudFormation
        does (`<stack>-<logical id>-<suffix>`)."""
        if logical_id in self._physical:
            return self._physical[logical_id]
        if logical_id not in self.resources:
            raise TemplateError(f"no resource {logical_id} in the template")
        kind = self.resource_type(logical_id)
        name_property = _NAME_PROPERTY.get(kind)
        name: str | None = None
        raw = self.resources[logical_id].get("Properties") or {}
        if name_property and raw.get(name_property) is not None:
            key = f"name of {logical_id}"
            if key in self._resolving:
                raise TemplateError(f"the name of {logical_id} refers to itself")
            self._resolving.add(key)
            try:
                value = self.resolve(raw[name_property], where=f"{logical_id}.{name_property}")
            finally:
                self._resolving.discard(key)
            if value is not NO_VALUE:
                name = str(value)
        if name is None:
            suffix = hashlib.sha256(f"{self.context.stack_name}/{logical_id}".encode()).hexdigest()
            suffix = suffix[:12].upper()
            limit = _NAME_LIMIT.get(kind, 255)
            head = f"{self.context.stack_name}-{logical_id}"[: limit - len(suffix) - 1]
            name = f"{head}-{suffix}"
            if kind == "AWS::SQS::Queue" and _truthy(raw.get("FifoQueue")):
                name = name[: limit - 5] + ".fifo"
        self._physical[logical_id] = name
        return name

    def arn(self, service: str, resource: str, *, regional: bool = True) -> str:
        region = self.context.region if regional else ""
        return f"arn:{self.context.partition}:{service}:{region}:{self.context.account_id}:{resource}"

    def ref(self, logical_id: str) -> Any:
        if logical_id in self.parameters:
            return self.parameters[logical_id]
        pseudo = self._pseudo(logical_id)
        if pseudo is not None:
            return pseudo
        if logical_id not in self.resources:
            raise TemplateError(f"Ref to {logical_id}, which is neither a parameter nor a resource")
        kind = self.resource_type(logical_id)
        name = self.physical_name(logical_id)
        if kind == "AWS::SNS::Topic":
            return self.arn("sns", name)
        if kind == "AWS::SQS::Queue":
            return f"{self.context.queue_url_base}/{self.context.account_id}/{name}"
        if kind == "AWS::ApiGateway::RestApi":
            return hashlib.sha256(f"{self.context.stack_name}/{logical_id}".encode()).hexdigest()[:10]
        if kind == "AWS::Lambda::LayerVersion":
            return self.arn("lambda", f"layer:{name}:1")
        if kind == "AWS::Lambda::Alias":
            # an alias's Ref is its ARN: the function's, qualified by the alias name (SAM's
            # AutoPublishAlias points API integrations at it)
            props = self.properties(logical_id)
            function = str(self.resolve(props.get("FunctionName")))
            if not function.startswith("arn:"):
                function = self.arn("lambda", f"function:{function}")
            return f"{function}:{self.resolve(props.get('Name'))}"
        return name

    def _pseudo(self, name: str) -> Any:
        context = self.context
        return {
            "AWS::Region": context.region,
            "AWS::AccountId": context.account_id,
            "AWS::Partition": context.partition,
            "AWS::StackName": context.stack_name,
            "AWS::StackId": context.stack_id,
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::NoValue": NO_VALUE,
            "AWS::NotificationARNs": [],
        }.get(name)

    def get_att(self, logical_id: str, attribute: str) -> Any:
        if logical_id not in self.resources:
            raise TemplateError(f"Fn::GetAtt on {logical_id}.{attribute}: no such resource")
        kind = self.resource_type(logical_id)
        name = self.physical_name(logical_id)
        if kind == "AWS::DynamoDB::Table":
            arn = self.arn("dynamodb", f"table/{name}")
            return {"Arn": arn, "StreamArn": f"{arn}/stream/1970-01-01T00:00:00.000"}.get(attribute, arn)
        if kind == "AWS::SNS::Topic":
            return name if attribute == "TopicName" else self.arn("sns", name)
        if kind == "AWS::SQS::Queue":
            if attribute == "QueueName":
                return name
            if attribute == "QueueUrl":
                return self.ref(logical_id)
            return self.arn("sqs", name)
        if kind == "AWS::Events::EventBus":
            return name if attribute == "Name" else self.arn("events", f"event-bus/{name}")
        if kind == "AWS::Events::Rule":
            bus = self.resolve(
                self.raw_properties(logical_id).get("EventBusName", "default"), where=logical_id
            )
            bus_name = _bus_name(str(bus))
            path = f"rule/{name}" if bus_name == "default" else f"rule/{bus_name}/{name}"
            return self.arn("events", path)
        if kind == "AWS::Lambda::Function":
            return self.arn("lambda", f"function:{name}")
        if kind == "AWS::IAM::Role":
            return self.arn("iam", f"role/{name}", regional=False)
        if kind == "AWS::CloudWatch::Alarm":
            return self.arn("cloudwatch", f"alarm:{name}")
        if kind == "AWS::Logs::LogGroup":
            return self.arn("logs", f"log-group:{name}:*")
        # Attributes the local stack never reads still resolve, to a recognizable placeholder.
        return self.arn("local", f"{logical_id}/{attribute}")

    def resolve(self, value: Any, *, where: str = "template") -> Any:
        """`value` with every intrinsic function evaluated; AWS::NoValue entries are dropped."""
        if isinstance(value, list):
            items = [self.resolve(item, where=where) for item in value]
            return [item for item in items if item is not NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            ((key, argument),) = value.items()
            function = _FUNCTIONS.get(key)
            if function is not None:
                try:
                    return function(self, argument, where)
                except TemplateError:
                    raise
                except (TypeError, ValueError, IndexError, KeyError) as exc:
                    raise TemplateError(f"{where}: cannot evaluate {key} {argument!r}: {exc}") from exc
        out: dict[str, Any] = {}
        for key, item in value.items():
            resolved = self.resolve(item, where=f"{where}.{key}")
            if resolved is not NO_VALUE:
                out[key] = resolved
        return out

    # --- intrinsic functions ----------------------------------------------------------------------------------

    def _fn_ref(self, argument: Any, where: str) -> Any:
        return self.ref(str(argument))

    def _fn_condition(self, argument: Any, where: str) -> Any:
        return self.condition(str(argument))

    def _fn_get_att(self, argument: Any, where: str) -> Any:
        if isinstance(argument, str):
            argument = argument.split(".", 1)
        logical_id, attribute = argument
        return self.get_att(str(logical_id), str(self.resolve(attribute, where=where)))

    def _fn_sub(self, argument: Any, where: str) -> Any:
        variables: dict[str, Any] = {}
        if isinstance(argument, list):
            text, raw_variables = argument
            variables = {k: self.resolve(v, where=where) for k, v in (raw_variables or {}).items()}
        else:
            text = argument
        if not isinstance(text, str):
            raise TemplateError(f"{where}: Fn::Sub needs a string, got {text!r}")

        def substitute(match: re.Match[str]) -> str:
            inner = match.group(1)
            if inner.startswith("!"):
                return "${" + inner[1:] + "}"
            if inner in variables:
                return _as_text(variables[inner])
            if inner in self.parameters or self._pseudo(inner) is not None:
                return _as_text(self.ref(inner))
            logical_id, dot, attribute = inner.partition(".")
            if dot:
                return _as_text(self.get_att(logical_id, attribute))
            return _as_text(self.ref(inner))

        return _SUB_VARIABLE.sub(substitute, text)

    def _fn_join(self, argument: Any, where: str) -> Any:
        delimiter, items = argument
        items = self.resolve(items, where=where)
        return str(delimiter).join(_as_text(item) for item in items)

    def _fn_if(self, argument: Any, where: str) -> Any:
        name, when_true, when_false = argument
        chosen = when_true if self.condition(str(name)) else when_false
        return self.resolve(chosen, where=where)

    def _fn_equals(self, argument: Any, where: str) -> Any:
        left, right = (self.resolve(item, where=where) for item in argument)
        return _as_text(left) == _as_text(right)

    def _fn_not(self, argument: Any, where: str) -> Any:
        (operand,) = argument
        return not self.resolve(operand, where=where)

    def _fn_and(self, argument: Any, where: str) -> Any:
        return all(self.resolve(item, where=where) for item in argument)

    def _fn_or(self, argument: Any, where: str) -> Any:
        return any(self.resolve(item, where=where) for item in argument)

    def _fn_select(self, argument: Any, where: str) -> Any:
        index, items = argument
        return self.resolve(items, where=where)[int(self.resolve(index, where=where))]

    def _fn_split(self, argument: Any, where: str) -> Any:
        delimiter, text = argument
        return str(self.resolve(text, where=where)).split(str(delimiter))

    def _fn_find_in_map(self, argument: Any, where: str) -> Any:
        map_name, first, second = (self.resolve(item, where=where) for item in argument[:3])
        mappings: Mapping[str, Any] = self.document.get("Mappings") or {}
        try:
            return mappings[str(map_name)][str(first)][str(second)]
        except KeyError:
            if len(argument) > 3 and isinstance(argument[3], dict) and "DefaultValue" in argument[3]:
                return self.resolve(argument[3]["DefaultValue"], where=where)
            raise TemplateError(f"{where}: Fn::FindInMap found no {map_name}/{first}/{second}") from None

    def _fn_base64(self, argument: Any, where: str) -> Any:
        return base64.b64encode(_as_text(self.resolve(argument, where=where)).encode()).decode()

    def _fn_get_azs(self, argument: Any, where: str) -> Any:
        region = self.resolve(argument, where=where) or self.context.region
        return [f"{region}{zone}" for zone in "abc"]

    def _fn_to_json_string(self, argument: Any, where: str) -> Any:
        return json.dumps(self.resolve(argument, where=where), separators=(",", ":"))

    def _fn_length(self, argument: Any, where: str) -> Any:
        return len(self.resolve(argument, where=where))

    def _fn_unsupported(self, argument: Any, where: str) -> Any:
        raise TemplateError(f"{where}: the local stack cannot resolve {argument!r} (cross-stack or network)")


_FUNCTIONS: dict[str, Callable[[Template, Any, str], Any]] = {
    "Ref": Template._fn_ref,
    "Condition": Template._fn_condition,
    "Fn::GetAtt": Template._fn_get_att,
    "Fn::Sub": Template._fn_sub,
    "Fn::Join": Template._fn_join,
    "Fn::If": Template._fn_if,
    "Fn::Equals": Template._fn_equals,
    "Fn::Not": Template._fn_not,
    "Fn::And": Template._fn_and,
    "Fn::Or": Template._fn_or,
    "Fn::Select": Template._fn_select,
    "Fn::Split": Template._fn_split,
    "Fn::FindInMap": Template._fn_find_in_map,
    "Fn::Base64": Template._fn_base64,
    "Fn::GetAZs": Template._fn_get_azs,
    "Fn::ToJsonString": Template._fn_to_json_string,
    "Fn::Length": Template._fn_length,
    "Fn::ImportValue": Template._fn_unsupported,
    "Fn::Cidr": Template._fn_unsupported,
}


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(_as_text(item) for item in value)
    return str(value)


def _parameter_text(value: Any) -> str:
    """A parameter value as CloudFormation receives it: a string (lists comma-joined, mappings as
    `key=value` pairs, booleans lower-case)."""
    if isinstance(value, Mapping):
        return ",".join(f"{key}={_as_text(item)}" for key, item in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        return ",".join(_as_text(item) for item in value)
    if value is None:
        return ""
    return _as_text(value)


def _truthy(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _bus_name(name_or_arn: str) -> str:
    """An event bus name from a name or an ARN (`arn:aws:events:r:a:event-bus/<name>`)."""
    if name_or_arn.startswith("arn:"):
        return name_or_arn.rsplit("/", 1)[-1]
    return name_or_arn or "default"


# --- Specs: what the local stack creates and runs ------------------------------------------------------------


@dataclass(frozen=True)
class TableSpec:
    logical_id: str
    name: str
    #: CreateTable arguments (KeySchema, AttributeDefinitions, indexes, billing, stream).
    create: dict[str, Any]
    ttl_attribute: str | None = None


@dataclass(frozen=True)
class TopicSpec:
    logical_id: str
    name: str
    arn: str
    attributes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class QueueSpec:
    logical_id: str
    name: str
    arn: str
    attributes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BusSpec:
    logical_id: str
    name: str


@dataclass(frozen=True)
class FunctionSpec:
    """A Lambda function of the stack, run in process by the local stack."""

    logical_id: str
    name: str
    arn: str
    code_dir: Path
    module: str  # file name (without .py) inside code_dir
    attribute: str  # the handler function in that module
    environment: dict[str, str]
    reserved_concurrency: int | None
    timeout_seconds: int
    memory_mb: int
    #: Where an asynchronous event goes after its retries fail (an SQS or SNS ARN), if anywhere.
    on_failure: str | None
    max_retry_attempts: int


@dataclass(frozen=True)
class RouteSpec:
    """An API route: `method` (upper case, or ANY) and a path template such as /jobs/{name}."""

    function: str  # logical id
    method: str
    path: str
    api: str  # logical id of the AWS::ApiGateway::RestApi (ServerlessRestApi when SAM made it implicitly)


@dataclass(frozen=True)
class RuleTarget:
    """Where a rule sends what it matches: a function of the stack, or an SQS/SNS ARN moto delivers to."""

    target_id: str
    function: str | None = None
    arn: str | None = None
    input: str | None = None  # constant JSON replacing the event
    input_path: str | None = None
    input_transformer: dict[str, Any] | None = None


@dataclass(frozen=True)
class RuleSpec:
    """An EventBridge rule: an event pattern or a schedule expression, on a bus, with its targets."""

    logical_id: str
    name: str
    bus: str
    pattern: dict[str, Any] | None
    schedule: str | None
    enabled: bool
    targets: tuple[RuleTarget, ...]


@dataclass(frozen=True)
class SubscriptionSpec:
    """An SNS topic delivering to a function of the stack (protocol lambda)."""

    topic_arn: str
    function: str
    filter_policy: dict[str, Any] | None = None


@dataclass(frozen=True)
class QueueSourceSpec:
    """An SQS queue a function consumes (SQS event source)."""

    queue_arn: str
    function: str
    batch_size: int = 10


@dataclass(frozen=True)
class AlarmSpec:
    logical_id: str
    name: str
    #: PutMetricAlarm arguments.
    put: dict[str, Any]


@dataclass
class StackSpec:
    """Everything the local stack creates and runs, resolved for one set of parameters."""

    tables: list[TableSpec] = field(default_factory=list)
    topics: list[TopicSpec] = field(default_factory=list)
    queues: list[QueueSpec] = field(default_factory=list)
    buses: list[BusSpec] = field(default_factory=list)
    functions: dict[str, FunctionSpec] = field(default_factory=dict)
    routes: list[RouteSpec] = field(default_factory=list)
    rules: list[RuleSpec] = field(default_factory=list)
    subscriptions: list[SubscriptionSpec] = field(default_factory=list)
    #: SNS subscriptions moto delivers itself (topic ARN, protocol, endpoint), e.g. sqs.
    native_subscriptions: list[tuple[str, str, str]] = field(default_factory=list)
    queue_sources: list[QueueSourceSpec] = field(default_factory=list)
    alarms: list[AlarmSpec] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    #: What the template declares that the local stack does not run (resource or event, and why).
    skipped: list[str] = field(default_factory=list)

    def function_by_arn(self, arn: str) -> FunctionSpec | None:
        for spec in self.functions.values():
            if arn in (spec.arn, f"{spec.arn}:$LATEST") or arn.startswith(spec.arn + ":"):
                return spec
        return None


def build_spec(template: Template) -> StackSpec:
    """Resolve `template` into what the local stack creates and runs."""
    spec = StackSpec()
    _tables(template, spec)
    for logical_id in template.of_type("AWS::SNS::Topic"):
        props = template.properties(logical_id)
        attributes = {}
        if _truthy(props.get("FifoTopic")):
            attributes["FifoTopic"] = "true"
        spec.topics.append(
            TopicSpec(logical_id, template.physical_name(logical_id), template.ref(logical_id), attributes)
        )
    for logical_id in template.of_type("AWS::SQS::Queue"):
        props = template.properties(logical_id)
        attributes = {
            key: _as_text(props[key])
            for key in ("FifoQueue", "VisibilityTimeout", "MessageRetentionPeriod", "DelaySeconds")
            if key in props
        }
        if "RedrivePolicy" in props:
            attributes["RedrivePolicy"] = json.dumps(props["RedrivePolicy"])
        name = template.physical_name(logical_id)
        spec.queues.append(QueueSpec(logical_id, name, template.get_att(logical_id, "Arn"), attributes))
    for logical_id in template.of_type("AWS::Events::EventBus"):
        spec.buses.append(BusSpec(logical_id, template.physical_name(logical_id)))
    for logical_id in template.of_type("AWS::Lambda::Function"):
        function = _function(template, logical_id)
        if function is not None:
            spec.functions[logical_id] = function
        else:
            spec.skipped.append(f"{logical_id}: only functions whose CodeUri is a local folder run")
    _invoke_configs(template, spec)
    _routes(template, spec)
    _standalone_wiring(template, spec)
    for logical_id in template.of_type("AWS::CloudWatch::Alarm"):
        props = template.properties(logical_id)
        put = {key: value for key, value in props.items() if key in _ALARM_FIELDS}
        put["AlarmName"] = template.physical_name(logical_id)
        spec.alarms.append(AlarmSpec(logical_id, put["AlarmName"], put))
    outputs: Mapping[str, Any] = template.document.get("Outputs") or {}
    for name, output in outputs.items():
        condition = (output or {}).get("Condition")
        if condition is not None and not template.condition(str(condition)):
            continue
        try:
            spec.outputs[name] = template.resolve((output or {}).get("Value"), where=f"output {name}")
        except TemplateError as exc:
            spec.skipped.append(f"output {name}: {exc}")
    return spec


_ALARM_FIELDS = {
    "AlarmName",
    "AlarmDescription",
    "ActionsEnabled",
    "OKActions",
    "AlarmActions",
    "InsufficientDataActions",
    "MetricName",
    "Namespace",
    "Statistic",
    "ExtendedStatistic",
    "Dimensions",
    "Period",
    "Unit",
    "EvaluationPeriods",
    "DatapointsToAlarm",
    "Threshold",
    "ComparisonOperator",
    "TreatMissingData",
    "EvaluateLowSampleCountPercentile",
    "Metrics",
    "ThresholdMetricId",
}


def _tables(template: Template, spec: StackSpec) -> None:
    for logical_id in template.of_type("AWS::DynamoDB::Table"):
        props = template.properties(logical_id)
        name = template.physical_name(logical_id)
        create: dict[str, Any] = {
            "TableName": name,
            "KeySchema": props["KeySchema"],
            "AttributeDefinitions": props["AttributeDefinitions"],
            "BillingMode": props.get("BillingMode", "PROVISIONED"),
        }
        provisioned = props.get("ProvisionedThroughput")
        if create["BillingMode"] == "PROVISIONED":
            create["ProvisionedThroughput"] = _throughput(provisioned)
        for key in ("GlobalSecondaryIndexes", "LocalSecondaryIndexes"):
            if props.get(key):
                indexes = []
                for index in props[key]:
                    index = {k: v for k, v in index.items() if k != "ContributorInsightsSpecification"}
                    if create["BillingMode"] == "PROVISIONED" and key == "GlobalSecondaryIndexes":
                        index["ProvisionedThroughput"] = _throughput(index.get("ProvisionedThroughput"))
                    indexes.append(index)
                create[key] = indexes
        stream = props.get("StreamSpecification")
        if stream:
            create["StreamSpecification"] = {"StreamEnabled": True, **stream}
        ttl = props.get("TimeToLiveSpecification") or {}
        ttl_attribute = ttl.get("AttributeName") if _truthy(ttl.get("Enabled")) else None
        spec.tables.append(TableSpec(logical_id, name, create, ttl_attribute))


def _throughput(value: Any) -> dict[str, int]:
    value = value or {}
    return {
        "ReadCapacityUnits": int(value.get("ReadCapacityUnits", 5)),
        "WriteCapacityUnits": int(value.get("WriteCapacityUnits", 5)),
    }


def _function(template: Template, logical_id: str) -> FunctionSpec | None:
    """A Lambda function whose code is a local folder (a CodeUri the translator was given as S3)."""
    props = template.properties(logical_id)
    code = props.get("Code") or {}
    code_dir = (
        template.code_dirs.get(str(code.get("S3Key", "")))
        if code.get("S3Bucket") == LOCAL_CODE_BUCKET
        else None
    )
    handler = props.get("Handler")
    if code_dir is None or not isinstance(handler, str) or "." not in handler:
        return None
    module, _, attribute = handler.rpartition(".")
    variables = (props.get("Environment") or {}).get("Variables") or {}
    reserved = props.get("ReservedConcurrentExecutions")
    dead_letter = (props.get("DeadLetterConfig") or {}).get("TargetArn")
    return FunctionSpec(
        logical_id=logical_id,
        name=template.physical_name(logical_id),
        arn=template.get_att(logical_id, "Arn"),
        code_dir=code_dir,
        module=module.replace("/", "."),
        attribute=attribute,
        environment={str(k): _as_text(v) for k, v in variables.items()},
        reserved_concurrency=None if reserved in (None, NO_VALUE) else int(reserved),
        timeout_seconds=int(props.get("Timeout", 3)),
        memory_mb=int(props.get("MemorySize", 128)),
        on_failure=str(dead_letter) if dead_letter else None,
        max_retry_attempts=2,
    )


def _invoke_configs(template: Template, spec: StackSpec) -> None:
    """AWS::Lambda::EventInvokeConfig: retries and the on-failure destination of asynchronous events."""
    for logical_id in template.of_type("AWS::Lambda::EventInvokeConfig"):
        props = template.properties(logical_id)
        target = str(props.get("FunctionName", ""))
        function = spec.function_by_arn(target) or next(
            (f for f in spec.functions.values() if target in (f.name, f.logical_id)), None
        )
        if function is None:
            spec.skipped.append(f"{logical_id}: configures {target}, which is not a function of the stack")
            continue
        changes: dict[str, Any] = {}
        if props.get("MaximumRetryAttempts") is not None:
            changes["max_retry_attempts"] = int(props["MaximumRetryAttempts"])
        failure = ((props.get("DestinationConfig") or {}).get("OnFailure")) or {}
        if failure.get("Destination"):
            changes["on_failure"] = str(failure["Destination"])
        spec.functions[function.logical_id] = replace(function, **changes)


_INTEGRATION = re.compile(r"functions/(?P<arn>arn:[^/]+)/invocations")


def _routes(template: Template, spec: StackSpec) -> None:
    """The routes of each REST API: its OpenAPI body's Lambda proxy integrations (what the translator
    writes for `Api` events)."""
    for logical_id in template.of_type("AWS::ApiGateway::RestApi"):
        body = template.properties(logical_id).get("Body") or {}
        for path, methods in (body.get("paths") or {}).items():
            for method, operation in (methods or {}).items():
                integration = (operation or {}).get("x-amazon-apigateway-integration") or {}
                match = _INTEGRATION.search(str(integration.get("uri", "")))
                function = spec.function_by_arn(match.group("arn")) if match else None
                if function is None:
                    spec.skipped.append(f"{logical_id} {method.upper()} {path}: not a function of the stack")
                    continue
                verb = "ANY" if method == "x-amazon-apigateway-any-method" else method.upper()
                spec.routes.append(
                    RouteSpec(function=function.logical_id, method=verb, path=path, api=logical_id)
                )


def stage_name(template: Template, api_logical_id: str) -> str:
    """The stage an API is deployed to (its AWS::ApiGateway::Stage), `Prod` by SAM's default."""
    for logical_id in template.of_type("AWS::ApiGateway::Stage"):
        raw = template.raw_properties(logical_id)
        if raw.get("RestApiId") == {"Ref": api_logical_id}:
            name = template.resolve(raw.get("StageName"), where=logical_id)
            if isinstance(name, str) and name:
                return name
    return "Prod"


def _rule_state(props: Mapping[str, Any], default: bool = True) -> bool:
    if "State" in props:
        return str(props["State"]).upper() == "ENABLED"
    if "Enabled" in props:
        return _truthy(props["Enabled"]) or props["Enabled"] is True
    return default


def _standalone_wiring(template: Template, spec: StackSpec) -> None:
    """Rules, subscriptions, schedules and event source mappings declared as their own resources."""
    for logical_id in template.of_type("AWS::Events::Rule"):
        props = template.properties(logical_id)
        targets = []
        for target in props.get("Targets") or []:
            arn = str(target.get("Arn", ""))
            function = spec.function_by_arn(arn)
            targets.append(
                RuleTarget(
                    target_id=str(target.get("Id", logical_id)),
                    function=function.logical_id if function else None,
                    arn=None if function else arn,
                    input=target.get("Input"),
                    input_path=target.get("InputPath"),
                    input_transformer=target.get("InputTransformer"),
                )
            )
        schedule = props.get("ScheduleExpression")
        spec.rules.append(
            RuleSpec(
                logical_id=logical_id,
                name=template.physical_name(logical_id),
                bus=_bus_name(str(props.get("EventBusName") or "default")),
                pattern=props.get("EventPattern"),
                schedule=str(schedule) if schedule else None,
                enabled=_rule_state(props),
                targets=tuple(targets),
            )
        )
    for logical_id in template.of_type("AWS::Scheduler::Schedule"):
        props = template.properties(logical_id)
        target = props.get("Target") or {}
        function = spec.function_by_arn(str(target.get("Arn", "")))
        if function is None:
            spec.skipped.append(f"{logical_id}: only schedules that invoke a function of the stack run")
            continue
        spec.rules.append(
            RuleSpec(
                logical_id=logical_id,
                name=template.physical_name(logical_id),
                bus="default",
                pattern=None,
                schedule=str(props["ScheduleExpression"]),
                enabled=_rule_state(props),
                targets=(
                    RuleTarget(target_id=logical_id, function=function.logical_id, input=target.get("Input")),
                ),
            )
        )
    subscriptions: list[tuple[str, dict[str, Any]]] = []
    for logical_id in template.of_type("AWS::SNS::Topic"):
        topic_arn = template.ref(logical_id)
        for item in template.properties(logical_id).get("Subscription") or []:
            subscriptions.append((logical_id, {"TopicArn": topic_arn, **item}))
    for logical_id in template.of_type("AWS::SNS::Subscription"):
        subscriptions.append((logical_id, template.properties(logical_id)))
    for logical_id, props in subscriptions:
        protocol = str(props.get("Protocol", "")).lower()
        endpoint = str(props.get("Endpoint", ""))
        topic_arn = str(props.get("TopicArn", ""))
        if protocol == "lambda":
            function = spec.function_by_arn(endpoint)
            if function is None:
                spec.skipped.append(
                    f"{logical_id}: subscribes {endpoint}, which is not a function of the stack"
                )
                continue
            spec.subscriptions.append(
                SubscriptionSpec(topic_arn, function.logical_id, props.get("FilterPolicy"))
            )
        elif protocol == "sqs":
            spec.native_subscriptions.append((topic_arn, protocol, endpoint))
        else:
            spec.skipped.append(
                f"{logical_id}: {protocol or 'unknown'} subscriptions are not delivered locally"
            )
    for logical_id in template.of_type("AWS::Lambda::EventSourceMapping"):
        props = template.properties(logical_id)
        source = str(props.get("EventSourceArn", ""))
        target = str(props.get("FunctionName", ""))
        function = spec.function_by_arn(target) or next(
            (f for f in spec.functions.values() if target in (f.name, f.logical_id)), None
        )
        if function is None or ":sqs:" not in source:
            spec.skipped.append(f"{logical_id}: only SQS event sources of the stack's functions run")
            continue
        spec.queue_sources.append(
            QueueSourceSpec(source, function.logical_id, int(props.get("BatchSize", 10)))
        )
