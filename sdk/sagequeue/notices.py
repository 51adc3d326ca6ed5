"""Job notices for their owner: subscribe an e-mail address, an https URL, an SQS queue or a Lambda function to
the stack's job notices topic, with a filter policy that lets through only the caller's own jobs' notices.

The owner a filter names is the one the API records for the caller (`whoami`'s identity, an assumed role's
sessions being the role), so the notices a subscription receives are those of the jobs the caller submits.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sagequeue.client import QueueClient, stack_outputs
from sagequeue.config import STACK_NAME_ENV
from sagequeue.exceptions import ConfigurationError, SageQueueError
from sagequeue_core.service.access import owner_of_caller

#: The stack output naming the topic.
NOTICES_OUTPUT = "JobNoticesTopicArn"
#: What a notice's `event` attribute may say (sagequeue_core.service.notices.NOTICE_KINDS).
NOTICE_KINDS = ("started", "preempted", "requeued", "finished", "failed", "cancelled", "idle_stopped")


class SubscriptionRefused(SageQueueError):
    """SNS refused the subscription; the message says why."""


@dataclass(frozen=True)
class Subscription:
    topic_arn: str
    protocol: str
    endpoint: str
    owner: str
    events: tuple[str, ...]
    subscription_arn: str

    @property
    def pending(self) -> bool:
        """An e-mail or https endpoint must confirm before it receives anything."""
        return self.protocol in ("email", "https")


def protocol_of(endpoint: str) -> str:
    """The SNS protocol of an endpoint, from its form."""
    if endpoint.startswith("https://"):
        return "https"
    if endpoint.startswith("arn:") and ":sqs:" in endpoint:
        return "sqs"
    if endpoint.startswith("arn:") and ":lambda:" in endpoint:
        return "lambda"
    if "@" in endpoint and " " not in endpoint and not endpoint.startswith("arn:"):
        return "email"
    raise ConfigurationError(
        f"{endpoint!r} is not an endpoint notices can go to: give an e-mail address, an https:// URL, or "
        "the ARN of an SQS queue or a Lambda function"
    )


def filter_policy(owner: str, events: Sequence[str] = ()) -> dict[str, list[str]]:
    unknown = sorted(set(events) - set(NOTICE_KINDS))
    if unknown:
        raise ConfigurationError(
            f"unknown notice event(s) {', '.join(unknown)}; known: {', '.join(NOTICE_KINDS)}"
        )
    policy = {"owner": [owner]}
    if events:
        policy["event"] = sorted(set(events))
    return policy


def notices_topic(client: QueueClient, topic: str | None, stack_name: str | None) -> str:
    """The topic to subscribe to: given, else the deployed stack's output, else the local stack's."""
    if topic:
        return topic
    name = stack_name or os.environ.get(STACK_NAME_ENV)
    if name:
        arn = stack_outputs(name, client._session(), client.region).get(NOTICES_OUTPUT)
        if not arn:
            raise ConfigurationError(f"stack {name!r} has no {NOTICES_OUTPUT} output; is it up to date?")
        return arn
    local = client._resolved.local
    if local is not None and local.job_notices_topic_arn:
        return local.job_notices_topic_arn
    raise ConfigurationError(
        f"which job notices topic? pass --topic (the stack's {NOTICES_OUTPUT} output) or --stack-name"
    )


def sns_client(client: QueueClient) -> Any:
    local = client._resolved.local
    if local is not None and local.aws_endpoint:
        import boto3

        # the local stack's SNS, with its keys (moto takes any)
        return boto3.client(
            "sns",
            endpoint_url=local.aws_endpoint,
            region_name=client.region,
            aws_access_key_id=local.access_key_id,
            aws_secret_access_key=local.secret_access_key,
        )
    return client._session().client("sns", region_name=client.region)


def subscribe(
    client: QueueClient,
    endpoint: str,
    *,
    events: Sequence[str] = (),
    topic: str | None = None,
    stack_name: str | None = None,
) -> Subscription:
    """Subscribe `endpoint` to the notices of the caller's own jobs (all events, or those named)."""
    from botocore.exceptions import BotoCoreError, ClientError

    protocol = protocol_of(endpoint)
    owner = owner_of_caller(client.whoami().arn)
    policy = filter_policy(owner, events)
    topic_arn = notices_topic(client, topic, stack_name)
    try:
        answer = sns_client(client).subscribe(
            TopicArn=topic_arn,
            Protocol=protocol,
            Endpoint=endpoint,
            Attributes={"FilterPolicy": json.dumps(policy)},
            ReturnSubscriptionArn=True,
        )
    except ClientError as exc:
        error = exc.response.get("Error", {})
        raise SubscriptionRefused(
            f"SNS refused to subscribe {endpoint} to {topic_arn}: {error.get('Code', 'Error')}: "
            f"{error.get('Message', exc)}"
        ) from exc
    except BotoCoreError as exc:
        raise SubscriptionRefused(f"cannot subscribe {endpoint} to {topic_arn}: {exc}") from exc
    return Subscription(
        topic_arn=topic_arn,
        protocol=protocol,
        endpoint=endpoint,
        owner=owner,
        events=tuple(policy.get("event", ())),
        subscription_arn=str(answer.get("SubscriptionArn", "")),
    )
