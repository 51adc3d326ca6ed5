"""Run the stack's functions in process and deliver their events, as Lambda's event sources would.

- `FunctionHost` loads each function's handler from its CodeUri (the very `functions/<name>/app.py` that
  Lambda runs) and invokes it with a Lambda-like context. A function with reserved concurrency N never runs
  more than N invocations at once (the scheduler's 1 makes it strictly one at a time).
- `EventRouter` polls the SQS queue each function owns (its rules and SNS subscriptions deliver there; moto
  does the matching) and the SQS queues it consumes, invokes the function per event, retries a failing
  asynchronous event as Lambda does (`MaximumRetryAttempts`), then sends it to the function's on-failure
  destination, and fires the stack's schedules on the stack's clock (moto never fires them).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import re
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import ModuleType
from typing import Any

from sagequeue.local.template import FunctionSpec

logger = logging.getLogger("sagequeue.local.router")


class RunawayEvents(RuntimeError):
    """Events kept coming after the stack's drain limit: functions are probably triggering each other."""


# --- Functions -------------------------------------------------------------------------------------------------


@dataclass
class LambdaContext:
    """What a Python Lambda handler receives as `context`."""

    function_name: str
    invoked_function_arn: str
    memory_limit_in_mb: int
    timeout_seconds: int
    function_version: str = "$LATEST"
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    _started: float = field(default_factory=time.monotonic)

    @property
    def log_group_name(self) -> str:
        return f"/aws/lambda/{self.function_name}"

    @property
    def log_stream_name(self) -> str:
        return f"{datetime.now(UTC):%Y/%m/%d}/[$LATEST]{self.aws_request_id.replace('-', '')}"

    def get_remaining_time_in_millis(self) -> int:
        elapsed = time.monotonic() - self._started
        return max(0, int((self.timeout_seconds - elapsed) * 1000))


_invocation = threading.local()


def current_function() -> str | None:
    """The function whose handler the calling thread is running, if any."""
    return getattr(_invocation, "function", None)


class FunctionHost:
    """The stack's functions, loaded once and invoked in this process."""

    def __init__(
        self, functions: dict[str, FunctionSpec], on_error: Callable[[FunctionSpec], None] | None = None
    ) -> None:
        self.functions = functions
        #: Called after each invocation that raised, as Lambda counts it in the AWS/Lambda Errors metric.
        self.on_error = on_error
        self._handlers: dict[str, Callable[[Any, Any], Any]] = {}
        self._load_lock = threading.Lock()
        self._limits: dict[str, threading.BoundedSemaphore] = {
            logical_id: threading.BoundedSemaphore(spec.reserved_concurrency)
            for logical_id, spec in functions.items()
            if spec.reserved_concurrency
        }
        #: invocations per function, for tests and the demo's figures
        self.invocations: dict[str, int] = dict.fromkeys(functions, 0)
        self._count_lock = threading.Lock()

    def handler(self, logical_id: str) -> Callable[[Any, Any], Any]:
        with self._load_lock:
            loaded = self._handlers.get(logical_id)
            if loaded is None:
                loaded = self._load(self.functions[logical_id])
                self._handlers[logical_id] = loaded
            return loaded

    def load_all(self) -> None:
        for logical_id in self.functions:
            self.handler(logical_id)

    @staticmethod
    def _load(spec: FunctionSpec) -> Callable[[Any, Any], Any]:
        path = spec.code_dir / (spec.module.replace(".", "/") + ".py")
        if not path.is_file():
            raise FileNotFoundError(
                f"function {spec.logical_id}: handler file {path} does not exist (CodeUri + Handler)"
            )
        # Every function has an app.py: each gets its own module name so they do not replace each other.
        module_name = f"sagequeue_local_functions.{_identifier(spec.logical_id)}.{spec.module}"
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"function {spec.logical_id}: cannot load {path}")
        module: ModuleType = importlib.util.module_from_spec(module_spec)
        # As in Lambda, the function's folder is importable while its module loads (sibling modules).
        sys.path.insert(0, str(spec.code_dir))
        try:
            sys.modules[module_name] = module
            module_spec.loader.exec_module(module)
        finally:
            with contextlib.suppress(ValueError):
                sys.path.remove(str(spec.code_dir))
        handler = getattr(module, spec.attribute, None)
        if not callable(handler):
            raise AttributeError(f"function {spec.logical_id}: {path} has no callable {spec.attribute!r}")
        return handler

    def invoke(self, logical_id: str, event: Any, *, beside_reserved_concurrency: bool = False) -> Any:
        """Run the function's handler on `event` in this thread. An invocation of a function with reserved
        concurrency waits for a free slot, unless `beside_reserved_concurrency`: then it runs even while
        other invocations fill them, which reserved concurrency makes rare on Lambda, not impossible."""
        spec = self.functions.get(logical_id)
        if spec is None:
            raise KeyError(f"no function {logical_id}; the stack has {', '.join(sorted(self.functions))}")
        handler = self.handler(logical_id)
        context = LambdaContext(spec.name, spec.arn, spec.memory_mb, spec.timeout_seconds)
        limit = None if beside_reserved_concurrency else self._limits.get(logical_id)
        if limit is not None:
            limit.acquire()
        outer = current_function()
        _invocation.function = logical_id
        try:
            with self._count_lock:
                self.invocations[logical_id] += 1
            try:
                return handler(event, context)
            except Exception:
                if self.on_error is not None:
                    self._report_error(spec)
                raise
        finally:
            _invocation.function = outer
            if limit is not None:
                limit.release()

    def _report_error(self, spec: FunctionSpec) -> None:
        assert self.on_error is not None
        try:
            self.on_error(spec)
        except Exception:  # counting an error must not hide the error itself
            logger.exception("could not record the error of function %s", spec.logical_id)


def _identifier(text: str) -> str:
    return re.sub(r"\W", "_", text)


# --- Schedules -------------------------------------------------------------------------------------------------

_RATE = re.compile(r"^rate\(\s*(\d+)\s+(minute|minutes|hour|hours|day|days)\s*\)$")
_CRON = re.compile(r"^cron\((.+)\)$")
_UNIT_SECONDS = {"minute": 60, "hour": 3600, "day": 86400}


class ScheduleError(ValueError):
    """A schedule expression the local stack cannot fire."""


class Schedule:
    """When a schedule expression fires: rate(N unit) from its creation, or cron(...) in UTC."""

    def __init__(self, expression: str, created: datetime) -> None:
        self.expression = expression
        rate = _RATE.match(expression.strip())
        cron = _CRON.match(expression.strip())
        if rate:
            amount, unit = int(rate.group(1)), rate.group(2).rstrip("s")
            if amount < 1:
                raise ScheduleError(f"{expression}: the rate must be at least 1")
            self.rate: timedelta | None = timedelta(seconds=amount * _UNIT_SECONDS[unit])
            self.cron: _Cron | None = None
            self.next_due = created + self.rate
        elif cron:
            self.rate = None
            self.cron = _Cron(cron.group(1))
            self.next_due = self.cron.after(created)
        else:
            raise ScheduleError(f"{expression!r} is neither rate(N minutes|hours|days) nor cron(...)")

    def advance(self) -> None:
        if self.rate is not None:
            self.next_due += self.rate
        else:
            assert self.cron is not None
            self.next_due = self.cron.after(self.next_due)


class _Cron:
    """EventBridge cron: minutes hours day-of-month month day-of-week year, UTC."""

    _DAYS = {"SUN": 1, "MON": 2, "TUE": 3, "WED": 4, "THU": 5, "FRI": 6, "SAT": 7}
    _MONTHS = {
        m: i
        for i, m in enumerate(
            ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"], 1
        )
    }

    def __init__(self, text: str) -> None:
        fields = text.split()
        if len(fields) != 6:
            raise ScheduleError(
                f"cron({text}) needs 6 fields: minutes hours day-of-month month day-of-week year"
            )
        self.minutes = self._field(fields[0], 0, 59)
        self.hours = self._field(fields[1], 0, 23)
        self.days = self._field(fields[2], 1, 31)
        self.months = self._field(fields[3], 1, 12, self._MONTHS)
        self.weekdays = self._field(fields[4], 1, 7, self._DAYS)
        self.years = self._field(fields[5], 1970, 2199)

    @staticmethod
    def _field(text: str, low: int, high: int, names: dict[str, int] | None = None) -> set[int] | None:
        if text in ("*", "?"):
            return None
        values: set[int] = set()
        for part in text.split(","):
            step = 1
            if "/" in part:
                part, step_text = part.split("/", 1)
                step = int(step_text)
            if part in ("*", ""):
                start, end = low, high
            elif "-" in part:
                first, last = part.split("-", 1)
                start, end = _cron_value(first, names), _cron_value(last, names)
            else:
                start = _cron_value(part, names)
                end = high if step > 1 else start
            values.update(range(start, end + 1, step))
        if not values or min(values) < low or max(values) > high:
            raise ScheduleError(f"cron field {text!r} is outside {low}-{high}")
        return values

    def after(self, moment: datetime) -> datetime:
        candidate = moment.replace(second=0, microsecond=0) + timedelta(minutes=1)
        for _ in range(366 * 24 * 60):
            weekday = (candidate.isoweekday() % 7) + 1  # EventBridge: SUN=1 .. SAT=7
            if (
                (self.years is None or candidate.year in self.years)
                and (self.months is None or candidate.month in self.months)
                and (self.days is None or candidate.day in self.days)
                and (self.weekdays is None or weekday in self.weekdays)
                and (self.hours is None or candidate.hour in self.hours)
                and (self.minutes is None or candidate.minute in self.minutes)
            ):
                return candidate
            candidate += timedelta(minutes=1)
        raise ScheduleError("cron expression does not fire within a year")


def _cron_value(text: str, names: dict[str, int] | None) -> int:
    if names and text.upper() in names:
        return names[text.upper()]
    return int(text)


@dataclass
class ScheduledTarget:
    rule_name: str
    rule_arn: str
    function: str
    input: str | None
    schedule: Schedule


# --- Routing ---------------------------------------------------------------------------------------------------


@dataclass
class FailedInvocation:
    function: str
    event: Any
    error: str


class EventRouter:
    """Delivers the events waiting in the functions' queues, and fires schedules that fall due."""

    def __init__(
        self,
        host: FunctionHost,
        sqs: Any,
        *,
        inboxes: dict[str, str],
        sources: dict[str, list[tuple[str, int]]],
        queue_arns: dict[str, str],
        region: str,
        account_id: str,
        max_rounds: int = 10_000,
        peek: Callable[[str], bool] | None = None,
    ) -> None:
        self.host = host
        self.sqs = sqs
        self.inboxes = inboxes
        self.sources = sources
        self.queue_arns = queue_arns  # queue URL -> ARN
        self.region = region
        self.account_id = account_id
        self.max_rounds = max_rounds
        #: Says, without a request, whether a queue may hold messages; an empty queue is not polled.
        self.peek = peek
        self.schedules: list[ScheduledTarget] = []
        self.failures: list[FailedInvocation] = []
        self._drain_lock = threading.RLock()
        #: events delivered per function
        self.delivered: dict[str, int] = dict.fromkeys(host.functions, 0)

    # --- schedules --------------------------------------------------------------------------------------------

    def add_schedule(
        self,
        rule_name: str,
        rule_arn: str,
        function: str,
        expression: str,
        input_: str | None,
        created: datetime,
    ) -> None:
        self.schedules.append(
            ScheduledTarget(rule_name, rule_arn, function, input_, Schedule(expression, created))
        )

    def next_schedule_due(self) -> datetime | None:
        return min((target.schedule.next_due for target in self.schedules), default=None)

    def fire_due_schedules(self, now: datetime) -> int:
        """Send the Scheduled Event of every schedule due by `now` to its function's queue."""
        fired = 0
        for target in self.schedules:
            while target.schedule.next_due <= now:
                self._send_scheduled(target, target.schedule.next_due)
                target.schedule.advance()
                fired += 1
        return fired

    def fire_every_schedule(self, now: datetime) -> int:
        """Send every schedule's event once, now, leaving its timetable as it was: a stack restored from a
        saved queue reconciles at once instead of at its first tick."""
        for target in self.schedules:
            self._send_scheduled(target, now)
        return len(self.schedules)

    def _send_scheduled(self, target: ScheduledTarget, due: datetime) -> None:
        body = self._scheduled_body(target, due)
        self.sqs.send_message(QueueUrl=self.inboxes[target.function], MessageBody=body)

    def _scheduled_body(self, target: ScheduledTarget, due: datetime) -> str:
        """What the schedule's rule sends its target at `due`: its Input, or EventBridge's Scheduled Event."""
        if target.input is not None:
            return target.input
        return json.dumps(
            {
                "version": "0",
                "id": str(uuid.uuid4()),
                "detail-type": "Scheduled Event",
                "source": "aws.events",
                "account": self.account_id,
                "time": due.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "region": self.region,
                "resources": [target.rule_arn],
                "detail": {},
            }
        )

    def tick_beside(self, function: str, now: datetime) -> Any:
        """Invoke `function` at once with the event of its schedule, beside any invocation of it under way
        (reserved concurrency not waited for): a tick that overlaps a running invocation. Returns what the
        handler returns; the events it causes wait in the queues for the next drain."""
        target = next((t for t in self.schedules if t.function == function), None)
        if target is None:
            raise KeyError(f"function {function} has no schedule")
        event = self._event_from(self._scheduled_body(target, now))
        return self.host.invoke(function, event, beside_reserved_concurrency=True)

    # --- delivery ---------------------------------------------------------------------------------------------

    def drain(self) -> int:
        """Deliver until every queue is empty; returns the number of events delivered. One caller at a
        time: a second waits, so the functions see the events in order."""
        total = 0
        with self._drain_lock:
            for _ in range(self.max_rounds):
                delivered = self._round()
                total += delivered
                if delivered == 0:
                    return total
        raise RunawayEvents(
            f"still delivering after {self.max_rounds} rounds ({total} events): functions may be triggering "
            "each other without end"
        )

    def _round(self) -> int:
        delivered = 0
        for function, url in self.inboxes.items():
            delivered += self._drain_inbox(function, url)
        for function, queues in self.sources.items():
            for url, batch in queues:
                delivered += self._drain_source(function, url, batch)
        return delivered

    def _drain_inbox(self, function: str, url: str) -> int:
        if self.peek is not None and not self.peek(url):
            return 0
        answer = self.sqs.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0, VisibilityTimeout=30
        )
        messages = answer.get("Messages", [])
        for message in messages:
            self._invoke_async(function, self._event_from(message["Body"]))
        if messages:
            self.sqs.delete_message_batch(
                QueueUrl=url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
            )
        return len(messages)

    def _event_from(self, body: str) -> Any:
        """The Lambda event for one inbox message: an EventBridge event, or an SNS notification."""
        try:
            payload = json.loads(body)
        except json.JSONDecodeError:
            return body
        if isinstance(payload, dict) and payload.get("Type") == "Notification" and "TopicArn" in payload:
            return _sns_event(payload)
        if isinstance(payload, dict) and "detail-type" in payload:
            # moto's rule delivery drops `account`; EventBridge always sets it.
            payload.setdefault("account", self.account_id)
        return payload

    def _invoke_async(self, function: str, event: Any) -> None:
        spec = self.host.functions[function]
        attempts = spec.max_retry_attempts + 1
        for attempt in range(1, attempts + 1):
            try:
                self.host.invoke(function, event)
                self.delivered[function] += 1
                return
            except Exception as exc:
                logger.exception("function %s failed (attempt %d of %d)", function, attempt, attempts)
                last = exc
        self.failures.append(FailedInvocation(function, event, f"{type(last).__name__}: {last}"))
        self._send_to_failure_destination(spec, event, last, attempts)

    def _send_to_failure_destination(
        self, spec: FunctionSpec, event: Any, error: BaseException, attempts: int
    ) -> None:
        destination = spec.on_failure
        if not destination or ":sqs:" not in destination:
            return
        url = next((u for u, arn in self.queue_arns.items() if arn == destination), None)
        if url is None:
            return
        record = {
            "version": "1.0",
            "timestamp": datetime.now(UTC).isoformat(),
            "requestContext": {
                "requestId": str(uuid.uuid4()),
                "functionArn": f"{spec.arn}:$LATEST",
                "condition": "RetriesExhausted",
                "approximateInvokeCount": attempts,
            },
            "requestPayload": event,
            "responseContext": {
                "statusCode": 200,
                "executedVersion": "$LATEST",
                "functionError": "Unhandled",
            },
            "responsePayload": {
                "errorMessage": str(error),
                "errorType": type(error).__name__,
                "stackTrace": traceback.format_tb(error.__traceback__),
            },
        }
        self.sqs.send_message(QueueUrl=url, MessageBody=json.dumps(record, default=str))

    def _drain_source(self, function: str, url: str, batch: int) -> int:
        if self.peek is not None and not self.peek(url):
            return 0
        answer = self.sqs.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=min(batch, 10),
            WaitTimeSeconds=0,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        messages = answer.get("Messages", [])
        if not messages:
            return 0
        arn = self.queue_arns.get(url, "")
        event = {"Records": [_sqs_record(message, arn, self.region) for message in messages]}
        failed: set[str] = set()
        try:
            response = self.host.invoke(function, event)
            self.delivered[function] += 1
            if isinstance(response, dict):
                failed = {str(item.get("itemIdentifier")) for item in response.get("batchItemFailures") or []}
        except Exception as exc:
            logger.exception("function %s failed on a batch from %s", function, url)
            self.failures.append(FailedInvocation(function, event, f"{type(exc).__name__}: {exc}"))
            # As with a queue without redrive: the batch is not retried forever locally.
        for message in messages:
            if message["MessageId"] not in failed:
                self.sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        return len(messages)


def _sns_event(notification: dict[str, Any]) -> dict[str, Any]:
    """The Lambda event SNS delivers for one notification."""
    topic = str(notification.get("TopicArn", ""))
    return {
        "Records": [
            {
                "EventSource": "aws:sns",
                "EventVersion": "1.0",
                "EventSubscriptionArn": f"{topic}:{uuid.uuid4()}",
                "Sns": {
                    "Type": "Notification",
                    "MessageId": notification.get("MessageId"),
                    "TopicArn": topic,
                    "Subject": notification.get("Subject"),
                    "Message": notification.get("Message"),
                    "Timestamp": notification.get("Timestamp"),
                    "SignatureVersion": notification.get("SignatureVersion", "1"),
                    "Signature": notification.get("Signature", "EXAMPLE"),
                    "SigningCertUrl": notification.get("SigningCertURL", ""),
                    "UnsubscribeUrl": notification.get("UnsubscribeURL", ""),
                    "MessageAttributes": notification.get("MessageAttributes") or {},
                },
            }
        ]
    }


def _sqs_record(message: dict[str, Any], arn: str, region: str) -> dict[str, Any]:
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": message.get("Attributes") or {},
        "messageAttributes": {
            name: {
                "stringValue": value.get("StringValue"),
                "binaryValue": value.get("BinaryValue"),
                "stringListValues": [],
                "binaryListValues": [],
                "dataType": value.get("DataType"),
            }
            for name, value in (message.get("MessageAttributes") or {}).items()
        },
        "md5OfBody": message.get("MD5OfBody"),
        "eventSource": "aws:sqs",
        "eventSourceARN": arn,
        "awsRegion": region,
    }
