"""Create template.yaml's DynamoDB table (read with the local stack's template reader), so tests use
exactly the table the stack deploys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sagequeue.local.template import load_template

TEMPLATE = Path(__file__).resolve().parents[2] / "template.yaml"


def table_properties(logical_id: str = "JobsTable") -> dict[str, Any]:
    props: dict[str, Any] = load_template(TEMPLATE)["Resources"][logical_id]["Properties"]
    return props


def table_definition(logical_id: str = "JobsTable") -> dict[str, Any]:
    """The create_table arguments of a table in the template (its deployed schema)."""
    props = table_properties(logical_id)
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
    ttl = table_properties(logical_id).get("TimeToLiveSpecification")
    if ttl:
        dynamodb_client.update_time_to_live(TableName=table_name, TimeToLiveSpecification=ttl)
    return table_name
