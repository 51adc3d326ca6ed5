"""Send CreateTrainingJob to the queue from any boto3 SageMaker client: plain boto3, SDK v3, SDK v2.

    import sagequeue
    sagequeue.install(boto3_session_or_client_or_sagemaker_session)

botocore lets a `before-call` handler answer an operation without sending it. Once installed:

- CreateTrainingJob is submitted to the queue and answered with a TrainingJobArn, as SageMaker would.
- DescribeTrainingJob of a queued job is answered with status InProgress, SecondaryStatus Pending and a
  message giving the queue position; once an attempt runs, the call is sent to SageMaker for that attempt
  and the answer carries the name the caller asked for, so waiters and `TrainingJob.wait()` keep working.
- StopTrainingJob of a queued job cancels it in the queue (and stops its attempt if one runs).

Names the queue does not know go to SageMaker untouched. Handlers registered on a boto3 Session apply to
the clients it creates afterwards; install on a client to change one that already exists.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sagequeue.client import Job, QueueClient
from sagequeue.exceptions import (
    ApiError,
    Conflict,
    Forbidden,
    NotFound,
    SageQueueError,
    ServerError,
    Throttled,
    ValidationError,
)

if TYPE_CHECKING:  # pragma: no cover
    from botocore.awsrequest import AWSResponse

__all__ = ["QueueHook", "install", "passthrough", "uninstall"]

logger = logging.getLogger("sagequeue")

_SERVICE = "sagemaker"
_UNIQUE_PREFIX = "sagequeue-hook"
_CONTEXT_REQUEST = "sagequeue_request"
_CONTEXT_ANSWER = "sagequeue_answer"
_CONTEXT_ASKED_NAME = "sagequeue_asked_name"
#: requests remembered to fill in descriptions of queued jobs (which the API does not return)
_REMEMBERED_REQUESTS = 256
#: request fields a description of a queued job repeats, as SageMaker's DescribeTrainingJob would
_DESCRIBED_FIELDS = (
    "AlgorithmSpecification",
    "RoleArn",
    "InputDataConfig",
    "OutputDataConfig",
    "ResourceConfig",
    "VpcConfig",
    "StoppingCondition",
    "HyperParameters",
    "EnableNetworkIsolation",
    "EnableInterContainerTrafficEncryption",
    "EnableManagedSpotTraining",
    "CheckpointConfig",
    "DebugHookConfig",
    "ExperimentConfig",
    "TensorBoardOutputConfig",
    "ProfilerConfig",
    "Environment",
    "RetryStrategy",
    "RemoteDebugConfig",
    "InfraCheckConfig",
)

_local = threading.local()


@contextlib.contextmanager
def passthrough() -> Iterator[None]:
    """Within this block (in this thread) installed hooks step aside and calls go to SageMaker as made.
    Used to describe one specific attempt by its own name."""
    previous = getattr(_local, "passthrough", False)
    _local.passthrough = True
    try:
        yield
    finally:
        _local.passthrough = previous


def _bypassed() -> bool:
    return bool(getattr(_local, "passthrough", False))


class QueueHook:
    """The handlers installed on one event emitter, sharing one QueueClient."""

    def __init__(
        self,
        client: QueueClient | None = None,
        *,
        priority: int | None = None,
        report: Callable[[str], None] | None = None,
    ) -> None:
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
            raise TypeError(f"priority must be an int, got {priority!r}")
        self._client = client
        self.priority = priority
        #: told, once per change, where a waiting job stands when it is described (default: logged)
        self.report = report or (lambda line: logger.info("%s", line))
        self._lock = threading.Lock()
        self._requests: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._unknown: set[str] = set()
        self._reported: OrderedDict[str, tuple[Any, ...]] = OrderedDict()

    @property
    def client(self) -> QueueClient:
        # resolved on first use so installing never fails for want of an endpoint until a job is sent
        if self._client is None:
            self._client = QueueClient()
        return self._client

    # -- what the handlers do -------------------------------------------------------------------------------

    def submit(self, request: Mapping[str, Any], priority: int | None = None) -> Job:
        """Queue a CreateTrainingJob request, remembering it to describe the job while it waits."""
        job = self.client.submit(request, priority if priority is not None else self.priority)
        with self._lock:
            self._unknown.discard(job.name)
            self._requests[job.name] = dict(request)
            self._requests.move_to_end(job.name)
            while len(self._requests) > _REMEMBERED_REQUESTS:
                self._requests.popitem(last=False)
        if job.position is None and job.waiting:
            # the submit answer has no position; the job's detail does
            with contextlib.suppress(SageQueueError):
                job = self.client.job(job.name)
        # said once, through the one channel the installer chose (printed by QueueSession, else logged)
        self.report(
            f"sagequeue: queued training job {job.name} for {job.pool} with priority {job.priority}"
            + (f", position {job.position}" if job.position else "")
        )
        return job

    def lookup(self, name: str) -> Job | None:
        """The queue's job of this name, or None when the queue does not know it."""
        with self._lock:
            if name in self._unknown:
                return None
        try:
            return self.client.job(name)
        except NotFound:
            with self._lock:
                self._unknown.add(name)
            return None

    def remembered_request(self, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._requests.get(name)

    def describe_waiting(self, job: Job, region: str | None) -> dict[str, Any]:
        """A DescribeTrainingJob answer for a job that has no attempt to describe."""
        return describe_queued_job(job, self.remembered_request(job.name), region)

    def _report_change(self, job: Job) -> None:
        key = (job.state, job.position, job.attempt, forecast_key(job))
        with self._lock:
            changed = self._reported.get(job.name) != key
            self._reported[job.name] = key
            self._reported.move_to_end(job.name)
            while len(self._reported) > _REMEMBERED_REQUESTS:
                self._reported.popitem(last=False)
        if changed:
            self.report(f"sagequeue: {job.name}: {queue_message(job)}")

    # -- botocore handlers ----------------------------------------------------------------------------------

    def _remember_params(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        if not _bypassed():
            context[_CONTEXT_REQUEST] = params

    def _on_create(self, context: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        request = context.get(_CONTEXT_REQUEST)
        if request is None or _bypassed():
            return None
        region = context.get("client_region")
        try:
            job = self.submit(request)
        except ApiError as exc:
            return _error_response(exc, create=True)
        return _response({"TrainingJobArn": training_job_arn(job.name, job.owner, region)})

    def _on_describe_params(
        self, params: dict[str, Any], context: dict[str, Any], **_: Any
    ) -> dict[str, Any] | None:
        if _bypassed():
            return None
        name = params.get("TrainingJobName")
        if not isinstance(name, str) or not name:
            return None
        job = self.lookup(name)
        if job is None:
            return None
        if job.training_job_name is None or job.waiting:
            context[_CONTEXT_ANSWER] = _response(self.describe_waiting(job, context.get("client_region")))
            if job.waiting:
                self._report_change(job)
            return None
        context[_CONTEXT_ASKED_NAME] = name
        if job.training_job_name == name:
            return None
        # a new dict: the caller's keyword arguments stay as they were
        return {**params, "TrainingJobName": job.training_job_name}

    def _on_describe(self, context: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        answer = context.get(_CONTEXT_ANSWER)
        return answer if isinstance(answer, tuple) else None

    def _after_describe(self, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        asked = context.get(_CONTEXT_ASKED_NAME)
        if asked and isinstance(parsed, dict) and "TrainingJobName" in parsed:
            parsed["TrainingJobName"] = asked

    def _on_stop(self, context: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        params = context.get(_CONTEXT_REQUEST)
        if params is None or _bypassed():
            return None
        name = params.get("TrainingJobName")
        if not isinstance(name, str) or self.lookup(name) is None:
            return None
        try:
            job = self.client.cancel(name)
        except ApiError as exc:
            return _error_response(exc, create=False)
        logger.info("Cancelled queued training job %s (now %s)", name, job.state)
        return _response({})

    # -- registration ---------------------------------------------------------------------------------------

    def _handlers(self) -> list[tuple[str, Any]]:
        return [
            (f"before-parameter-build.{_SERVICE}.CreateTrainingJob", self._remember_params),
            (f"before-call.{_SERVICE}.CreateTrainingJob", self._on_create),
            (f"provide-client-params.{_SERVICE}.DescribeTrainingJob", self._on_describe_params),
            (f"before-call.{_SERVICE}.DescribeTrainingJob", self._on_describe),
            (f"after-call.{_SERVICE}.DescribeTrainingJob", self._after_describe),
            (f"before-parameter-build.{_SERVICE}.StopTrainingJob", self._remember_params),
            (f"before-call.{_SERVICE}.StopTrainingJob", self._on_stop),
        ]

    def register(self, emitter: Any) -> None:
        _unregister(emitter)
        for event, handler in self._handlers():
            emitter.register(event, handler, unique_id=_unique_id(event))

    def register_on(self, target: Any) -> QueueHook:
        """Register on every emitter of a boto3 client or Session or a SageMaker SDK session."""
        for emitter in _emitters(target):
            self.register(emitter)
        return self


def _unique_id(event: str) -> str:
    return f"{_UNIQUE_PREFIX}:{event}"


def _event_names() -> list[str]:
    return [event for event, _ in QueueHook()._handlers()]


def _unregister(emitter: Any) -> None:
    for event in _event_names():
        emitter.unregister(event, unique_id=_unique_id(event))


def _emitters(target: Any) -> list[Any]:
    """The event emitters to register on for a boto3 client or Session, a botocore Session, or a
    SageMaker SDK session (v2 Session, v3 / sagemaker-core Session)."""
    found: list[Any] = []
    meta = getattr(target, "meta", None)
    if meta is not None and hasattr(getattr(meta, "events", None), "register"):
        # a boto3/botocore client: only SageMaker's matter
        service = getattr(getattr(meta, "service_model", None), "service_name", None)
        if service != _SERVICE:
            raise TypeError(f"install() needs a SageMaker client, got a {service!r} client")
        found.append(meta.events)
        return found
    if hasattr(target, "sagemaker_client") or hasattr(target, "boto_session"):
        # SageMaker SDK session: its own client, and its boto3 Session for the clients created later
        # (sagemaker-core creates its SageMaker client from the boto3 Session)
        client = getattr(target, "sagemaker_client", None)
        if client is not None:
            found.extend(_emitters(client))
        boto_session = getattr(target, "boto_session", None)
        if boto_session is not None:
            found.extend(_emitters(boto_session))
        if found:
            return found
    events = getattr(target, "events", None)  # boto3.Session
    if hasattr(events, "register"):
        return [events]
    get_component = getattr(target, "get_component", None)  # botocore Session
    if callable(get_component):
        return [get_component("event_emitter")]
    raise TypeError(
        "install() takes a boto3 Session, a boto3 SageMaker client or a SageMaker SDK session, "
        f"got {type(target).__name__}"
    )


def install(
    session_or_client: Any,
    *,
    client: QueueClient | None = None,
    priority: int | None = None,
    report: Callable[[str], None] | None = None,
) -> QueueHook:
    """Route CreateTrainingJob (and DescribeTrainingJob, StopTrainingJob of queued jobs) through the
    queue for this boto3 Session, SageMaker client or SageMaker SDK session.

    `client` is the QueueClient to use (default: one resolved from the environment on first use);
    `priority` applies to every job submitted through this hook (default: the request's `priority` tag,
    else the queue's default). `report` is told where a waiting job stands each time that changes and
    the job is described (default: logged at INFO on the "sagequeue" logger). Installing again replaces
    the previous hook.
    """
    return QueueHook(client, priority=priority, report=report).register_on(session_or_client)


def uninstall(session_or_client: Any) -> None:
    """Remove the handlers `install` registered; calls go straight to SageMaker again."""
    for emitter in _emitters(session_or_client):
        _unregister(emitter)


# --- answers -------------------------------------------------------------------------------------------------


def training_job_arn(name: str, owner: str | None, region: str | None) -> str:
    """The ARN SageMaker gives a training job (names are lower-cased in ARNs), in the submitter's account."""
    partition, account = "aws", "000000000000"
    parts = (owner or "").split(":")
    if len(parts) > 5 and parts[0] == "arn":
        partition = parts[1] or partition
        account = parts[4] or account
    return f"arn:{partition}:sagemaker:{region or 'us-east-1'}:{account}:training-job/{name.lower()}"


def queue_message(job: Job) -> str:
    """What a person waiting on the job should read."""
    if job.state == "held":
        return f"Held in the sagequeue queue for {job.pool}; `sagequeue release {job.name}` lets it start."
    where = (
        f"position {job.position} in the queue for {job.pool}" if job.position else f"queued for {job.pool}"
    )
    again = f" again after attempt {job.attempt} was preempted" if job.attempt and job.preemptions else ""
    told = f"Waiting in the sagequeue queue{again}: {where}, priority {job.priority}."
    predicted = forecast_message(job)
    return f"{told} {predicted}" if predicted else told


def forecast_message(job: Job) -> str | None:
    """The stack's forecast start of a queued job, when GET /jobs/{name} gave one: P50 and P10-P90 range."""
    made = job.forecast if job.state == "queued" else None
    if made is None or made.p50 is None:
        return None
    upper = _clock(made.p90) if made.p90 is not None else "later"
    return f"Forecast start {_clock(made.p50)} (P10-P90 {_clock(made.p10)} to {upper})."


def forecast_key(job: Job) -> bool:
    """What of the forecast changes the waiting line: that one is there. The line says it once when it
    first comes (the forecast function runs every few minutes) and again with every change of place, not
    every time the P50 moves, which a forecast made from random runs does a little each time."""
    return forecast_message(job) is not None


def _clock(moment: datetime | None) -> str:
    return "-" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def describe_queued_job(job: Job, request: Mapping[str, Any] | None, region: str | None) -> dict[str, Any]:
    """A DescribeTrainingJob answer for a job without an attempt to describe: waiting in the queue
    (InProgress/Pending), or ended before it ever started (cancelled: Stopped; refused: Failed)."""
    now = datetime.now(UTC)
    created = job.submitted_at or now
    answer: dict[str, Any] = {}
    if request:
        answer.update({key: request[key] for key in _DESCRIBED_FIELDS if key in request})
    answer.setdefault("ResourceConfig", {"InstanceType": job.pool, "InstanceCount": job.instances or 1})
    answer.setdefault("AlgorithmSpecification", {"TrainingInputMode": "File"})
    answer.setdefault("StoppingCondition", {"MaxRuntimeInSeconds": 86400})
    answer.update(
        {
            "TrainingJobName": job.name,
            "TrainingJobArn": training_job_arn(job.name, job.owner, region),
            "CreationTime": created,
            "LastModifiedTime": job.ended_at or now,
        }
    )
    if job.waiting or not job.terminal:
        message = queue_message(job)
        answer.update(
            {
                "TrainingJobStatus": "InProgress",
                "SecondaryStatus": "Pending",
                "SecondaryStatusTransitions": [
                    {"Status": "Pending", "StartTime": created, "StatusMessage": message}
                ],
            }
        )
        return answer
    ended = job.ended_at or now
    if job.state == "failed":
        status, secondary = "Failed", "Failed"
        answer["FailureReason"] = job.reason or "Refused by the sagequeue queue before it started"
    elif job.state == "completed":
        status, secondary = "Completed", "Completed"
    else:
        status, secondary = "Stopped", "Stopped"
    answer.update(
        {
            "TrainingJobStatus": status,
            "SecondaryStatus": secondary,
            "TrainingEndTime": ended,
            "SecondaryStatusTransitions": [
                {
                    "Status": "Pending",
                    "StartTime": created,
                    "EndTime": ended,
                    "StatusMessage": "Waited in the sagequeue queue.",
                },
                {
                    "Status": secondary,
                    "StartTime": ended,
                    "EndTime": ended,
                    "StatusMessage": job.reason or f"{job.state} in the sagequeue queue before it started.",
                },
            ],
        }
    )
    return answer


def _response(body: dict[str, Any], status: int = 200) -> tuple[AWSResponse, dict[str, Any]]:
    from botocore.awsrequest import AWSResponse

    parsed = dict(body)
    parsed["ResponseMetadata"] = {
        "RequestId": "sagequeue",
        "HTTPStatusCode": status,
        "HTTPHeaders": {"x-sagequeue": "answered"},
        "RetryAttempts": 0,
    }
    return AWSResponse("sagequeue://", status, {"x-sagequeue": "answered"}, None), parsed


# The queue's errors as the SageMaker error codes a boto3 caller already handles.
_SAGEMAKER_CODES: dict[type[ApiError], str] = {
    ValidationError: "ValidationException",
    Forbidden: "AccessDeniedException",
    NotFound: "ResourceNotFound",
    Throttled: "ThrottlingException",
    ServerError: "InternalFailure",
}


def _error_response(exc: ApiError, *, create: bool) -> tuple[AWSResponse, dict[str, Any]]:
    if isinstance(exc, Conflict):
        code = "ResourceInUse" if create else "ValidationException"
    else:
        code = next((c for cls, c in _SAGEMAKER_CODES.items() if isinstance(exc, cls)), "ValidationException")
    status = 500 if isinstance(exc, ServerError) else 400
    answer = {"Error": {"Code": code, "Message": f"sagequeue: {exc.message}"}}
    return _response(answer, status)
