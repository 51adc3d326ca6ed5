"""Read template.yaml (with its CloudFormation short-form tags) and create its DynamoDB table, so tests
use exactly the table the stack deploys."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml

TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"


class _Tag:
    """A CloudFormation intrinsic (`!Ref`, `!Sub`, ...) kept as data: tests only read literal properties."""

    def __init__(self, tag: str, value: Any) -> None:
        self.tag = tag
        self.value = value

    def __repr__(self) -> str:
        return f"{self.tag} {self.value!r}"


class _Loader(yaml.SafeLoader):
    pass


def _construct(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> _Tag:
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    return _Tag("!" + suffix, value)


_Loader.add_multi_constructor("!", _construct)


@cache
def load_template(path: Path = TEMPLATE) -> dict[str, Any]:
    data: dict[str, Any] = yaml.load(path.read_text(), Loader=_Loader)  # noqa: S506 - SafeLoader subclass
    return data


def table_definition(logical_id: str = "JobsTable", path: Path = TEMPLATE) -> dict[str, Any]:
    """The create_table arguments of a table in the template (what the deployed table's schema is)."""
    props = load_template(path)["Resources"][logical_id]["Properties"]
    args: dict[str, Any] = {
        "AttributeDefinitions": props["AttributeDefinitions"],
        "KeySchema": props["KeySchema"],
        "BillingMode": props["BillingMode"],
    }
    if props.get("GlobalSecondaryIndexes"):
        args["GlobalSecondaryIndexes"] = props["GlobalSecondaryIndexes"]
    return args


def create_table(dynamodb_client: Any, table_name: str, logical_id: str = "JobsTable") -> str:
    dynamodb_client.create_table(TableName=table_name, **table_definition(logical_id))
    ttl = load_template()["Resources"][logical_id]["Properties"].get("TimeToLiveSpecification")
    if ttl:
        dynamodb_client.update_time_to_live(TableName=table_name, TimeToLiveSpecification=ttl)
    return table_name
