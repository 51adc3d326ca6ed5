"""Tag and policy rules for training jobs: pure checks shared by the API (reject at submit) and the
governance function (stop jobs started outside the queue that break them).

The same rules run on a CreateTrainingJob request and on a DescribeTrainingJob-shaped event detail, since
the fields they read (ResourceConfig, StoppingCondition, Tags) have the same shape in both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sagequeue_core.defaults import EXEMPT_TAG
from sagequeue_core.domain import DomainError, demand_of, tags_to_dict

#: What SageMaker uses when StoppingCondition.MaxRuntimeInSeconds is absent (one day).
SAGEMAKER_DEFAULT_MAX_RUNTIME_SECONDS = 86_400


@dataclass(frozen=True)
class Violation:
    rule: str  # required_tags | allowed_instance_types | max_instances_per_job | max_runtime_seconds
    message: str


@dataclass(frozen=True)
class PolicyRules:
    #: tag key -> regular expression its value must match in full (None: any value, only presence)
    required_tags: Mapping[str, str | None] = field(default_factory=dict)
    #: empty: every instance type is allowed
    allowed_instance_types: frozenset[str] = frozenset()
    max_instances_per_job: int | None = None
    max_runtime_seconds: int | None = None
    exempt_tag: str = EXEMPT_TAG

    def __post_init__(self) -> None:
        for key, pattern in self.required_tags.items():
            if pattern is not None:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise DomainError(f"required tag {key!r}: invalid pattern {pattern!r}: {exc}") from exc


def parse_required_tags(spec: str) -> dict[str, str | None]:
    """`team,project=^[a-z-]+$,cost-center` -> {team: None, project: '^[a-z-]+$', cost-center: None}.

    Entries are separated by commas; a key may carry `=<regex>` that its value must match.
    """
    rules: dict[str, str | None] = {}
    for raw in spec.split(","):
        entry = raw.strip()
        if not entry:
            continue
        key, sep, pattern = entry.partition("=")
        key = key.strip()
        if not key:
            raise DomainError(f"required tag entry {entry!r} has no key")
        rules[key] = pattern.strip() if sep else None
    return rules


def is_exempt(tags: Mapping[str, str], rules: PolicyRules) -> bool:
    return tags.get(rules.exempt_tag, "").strip().lower() == "true"


def check_policy(
    job: Mapping[str, Any], rules: PolicyRules, tags: Mapping[str, str] | None = None
) -> list[Violation]:
    """Every rule `job` breaks, in a stable order; empty when it complies or carries the exempt tag.

    `job` is a CreateTrainingJob request or a DescribeTrainingJob detail; `tags` overrides the job's own
    Tags (an event's tags may arrive separately, as a dict or a list).
    """
    tag_map = dict(tags) if tags is not None else tags_to_dict(job.get("Tags"))
    if is_exempt(tag_map, rules):
        return []
    violations: list[Violation] = []
    for key, pattern in rules.required_tags.items():
        value = tag_map.get(key)
        if value is None or value == "":
            violations.append(Violation("required_tags", f"missing required tag {key!r}"))
        elif pattern is not None and not re.fullmatch(pattern, value):
            violations.append(
                Violation("required_tags", f"tag {key!r} value {value!r} does not match {pattern!r}")
            )
    try:
        demand = demand_of(job)
    except DomainError as exc:
        violations.append(Violation("allowed_instance_types", str(exc)))
        demand = {}
    if rules.allowed_instance_types:
        for instance_type in demand:
            if instance_type not in rules.allowed_instance_types:
                allowed = ", ".join(sorted(rules.allowed_instance_types))
                violations.append(
                    Violation(
                        "allowed_instance_types",
                        f"instance type {instance_type} is not allowed (allowed: {allowed})",
                    )
                )
    instances = sum(demand.values())
    if rules.max_instances_per_job is not None and instances > rules.max_instances_per_job:
        violations.append(
            Violation(
                "max_instances_per_job",
                f"{instances} instances requested; at most {rules.max_instances_per_job} per job",
            )
        )
    if rules.max_runtime_seconds is not None:
        stopping = job.get("StoppingCondition") or {}
        # SageMaker applies its own default when the request has none, so that is what the job may run.
        runtime = int(stopping.get("MaxRuntimeInSeconds") or SAGEMAKER_DEFAULT_MAX_RUNTIME_SECONDS)
        if runtime > rules.max_runtime_seconds:
            violations.append(
                Violation(
                    "max_runtime_seconds",
                    f"MaxRuntimeInSeconds {runtime} exceeds the limit of {rules.max_runtime_seconds}",
                )
            )
    return violations
