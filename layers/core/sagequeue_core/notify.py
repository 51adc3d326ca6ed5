"""SNS notifier: tells people what governance did (a policy stop, an idle stop, a resume).

Messages are plain text for email subscribers, with the facts repeated as message attributes so that
subscription filter policies can route them (e.g. only idle stops to a team's channel).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from botocore.exceptions import ClientError

from sagequeue_core.errors import SageQueueError

#: SNS refuses subjects longer than this, and any that are not ASCII or hold a line break.
MAX_SUBJECT_LENGTH = 100


class NotificationError(SageQueueError):
    """Publishing a notification failed; the message names the topic and the cause."""


class Notifier(Protocol):
    def notify(
        self, subject: str, message: str, attributes: Mapping[str, str] | None = None
    ) -> str | None: ...


class NullNotifier:
    """Used when no notification topic is configured: notifications are dropped on purpose."""

    def notify(self, subject: str, message: str, attributes: Mapping[str, str] | None = None) -> str | None:
        return None


class SnsNotifier:
    def __init__(self, client: Any, topic_arn: str) -> None:
        if not topic_arn:
            raise ValueError("SnsNotifier needs a topic ARN; use NullNotifier when there is none")
        self._client = client
        self.topic_arn = topic_arn

    def notify(self, subject: str, message: str, attributes: Mapping[str, str] | None = None) -> str | None:
        """Publish; returns SNS's MessageId."""
        clean = " ".join(subject.split()).encode("ascii", "replace").decode("ascii")
        if len(clean) > MAX_SUBJECT_LENGTH:
            clean = clean[: MAX_SUBJECT_LENGTH - 3] + "..."
        kwargs: dict[str, Any] = {"TopicArn": self.topic_arn, "Subject": clean, "Message": message}
        if attributes:
            kwargs["MessageAttributes"] = {
                key: {"DataType": "String", "StringValue": value}
                for key, value in attributes.items()
                if value
            }
        try:
            return str(self._client.publish(**kwargs)["MessageId"])
        except ClientError as exc:
            error = exc.response.get("Error", {})
            raise NotificationError(
                f"cannot publish to {self.topic_arn}: {error.get('Code', 'error')}: {error.get('Message', '')}"
            ) from exc


def notifier_for(client: Any, topic_arn: str) -> Notifier:
    return SnsNotifier(client, topic_arn) if topic_arn else NullNotifier()


def notifier_of(deps: Any) -> Notifier:
    """The notifier of a `runtime.Dependencies`: the one installed, else SNS on the notification topic."""
    if deps.notifier is None:
        deps.notifier = notifier_for(deps.client("sns"), deps.settings.notification_topic_arn)
    notifier: Notifier = deps.notifier
    return notifier
