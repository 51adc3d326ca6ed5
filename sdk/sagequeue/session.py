"""`QueueSession`: a SageMaker SDK session whose training jobs go to the sagequeue queue.

    from sagequeue import QueueSession
    estimator = PyTorch(..., sagemaker_session=QueueSession())   # SDK v2
    estimator.fit()          # queued; waits while queued, then follows the attempt that runs

With SDK v2, `Session.train()` hands its CreateTrainingJob request to `_intercept_create_request`, which
this class overrides to submit "train" requests to the queue; every other request is left alone. Waiting
(`fit(wait=True)`, `logs_for_job`, `wait_for_job`) reports the job's queue state and position while it
waits, then follows the SageMaker attempt that runs it, again after a preemption, until the job ends.

SDK v3 has no such path (`ModelTrainer.train()` calls sagemaker-core's `TrainingJob.create` on a boto3
client of the session's boto3 Session), so the v3 `QueueSession` installs the botocore hook
(`sagequeue.hook`) on the session's client and boto3 Session; `TrainingJob.wait()` then works unchanged.

This is the only sagequeue module that imports the SageMaker SDK (`pip install 'sagequeue[sagemaker]'`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from sagequeue.client import Job, QueueClient
from sagequeue.exceptions import EndpointUnreachable, SageQueueError, ServerError, Throttled
from sagequeue.hook import QueueHook, install, passthrough, queue_message

if TYPE_CHECKING:
    # checked without the SDK installed, and the same with v2 or v3: the base is opaque to the checker
    _SdkSession = Any
    SDK_MAJOR: int
else:
    try:  # SDK v2: Session.train() -> _intercept_create_request(request, create, "train")
        from sagemaker.session import Session as _SdkSession

        SDK_MAJOR = 2
    except ImportError:
        try:  # SDK v3: the session lives in sagemaker-core
            from sagemaker.core.helper.session_helper import Session as _SdkSession

            SDK_MAJOR = 3
        except ImportError as exc:
            raise ImportError(
                "sagequeue.QueueSession needs the SageMaker Python SDK: pip install 'sagequeue[sagemaker]' "
                "(SDK v2), or 'sagemaker>=3' for SDK v3. Without the SDK, use sagequeue.install(boto3_client)."
            ) from exc

__all__ = ["SDK_MAJOR", "QueueSession"]

logger = logging.getLogger("sagequeue")

_ENDED = frozenset({"Completed", "Failed", "Stopped"})
#: How long a wait rides out a queue it cannot reach before giving up, in seconds.
_QUEUE_OUTAGE_SECONDS = 300.0
#: How long after SageMaker reports an attempt ended a wait trusts SageMaker over a queue that has not
#: caught up (its events are normally seconds behind), in seconds.
_QUEUE_LAG_SECONDS = 600.0
_LOG_GROUP = "/aws/sagemaker/TrainingJobs"


class _AttemptLogs:
    """Tails the CloudWatch log streams of one attempt, best effort: a stack without CloudWatch Logs (or
    without the attempt's streams yet) just prints nothing, and a failing logs endpoint is reported once."""

    def __init__(self, client_factory: Callable[[], Any], out: Callable[[str], None]) -> None:
        self._factory = client_factory
        self._client: Any = None
        self._out = out
        self._disabled = False
        self._attempt: str | None = None
        self._tokens: dict[str, str | None] = {}

    def follow(self, attempt: str) -> None:
        if attempt != self._attempt:
            self._attempt = attempt
            self._tokens = {}

    def flush(self) -> None:
        if self._disabled or self._attempt is None:
            return
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            if self._client is None:
                self._client = self._factory()
            streams = self._client.describe_log_streams(
                logGroupName=_LOG_GROUP, logStreamNamePrefix=self._attempt + "/", orderBy="LogStreamName"
            ).get("logStreams", [])
            for stream in streams:
                self._print_stream(stream["logStreamName"])
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
                return  # no logs yet: the container has not written any
            self._disable(exc)
        except BotoCoreError as exc:
            self._disable(exc)

    def _print_stream(self, stream: str) -> None:
        while True:
            kwargs: dict[str, Any] = {
                "logGroupName": _LOG_GROUP,
                "logStreamName": stream,
                "startFromHead": True,
            }
            token = self._tokens.get(stream)
            if token:
                kwargs["nextToken"] = token
            answer = self._client.get_log_events(**kwargs)
            self._tokens[stream] = answer.get("nextForwardToken")
            events = answer.get("events") or []
            for event in events:
                self._out(f"[{stream.rsplit('/', 1)[-1]}] {event.get('message', '').rstrip()}")
            if not events or answer.get("nextForwardToken") == token:
                return

    def _disable(self, exc: BaseException) -> None:
        self._disabled = True
        self._out(f"sagequeue: cannot read the training logs ({exc}); following the job's status only")


if SDK_MAJOR == 2:

    class QueueSession(_SdkSession):
        """SDK v2 Session that queues training jobs instead of creating them.

        `queue_client` (default: resolved from SAGEQUEUE_ENDPOINT, the saved local stack, ...) is where
        jobs go; `priority` applies to every job (default: the estimator's `priority` tag, else the
        queue's default). `poll_seconds` overrides how often waiting polls (default: the SDK's interval);
        `logs_client` reads training logs (default: a CloudWatch Logs client of the boto3 session).
        The other arguments are `sagemaker.session.Session`'s.
        """

        def __init__(
            self,
            boto_session: Any = None,
            sagemaker_client: Any = None,
            *args: Any,
            queue_client: QueueClient | None = None,
            priority: int | None = None,
            poll_seconds: float | None = None,
            logs_client: Any = None,
            **kwargs: Any,
        ) -> None:
            self._queue_hook = QueueHook(queue_client, priority=priority)
            self._poll_seconds = poll_seconds
            self._logs_client = logs_client
            super().__init__(boto_session, sagemaker_client, *args, **kwargs)
            # DescribeTrainingJob and StopTrainingJob by the queue's name keep working on this session's
            # client (estimator.latest_training_job.describe(), .stop(), model_data)
            self._queue_hook.register_on(self.sagemaker_client)

        @property
        def queue(self) -> QueueClient:
            return self._queue_hook.client

        # -- submitting -------------------------------------------------------------------------------------

        def _intercept_create_request(
            self, request: dict[str, Any], create: Any, func_name: str | None = None
        ) -> Any:
            if func_name != "train":
                return super()._intercept_create_request(request, create, func_name)
            job = self._queue_hook.submit(request)
            if job.position is None and job.waiting:
                # the submit answer has no position; the job's detail does
                with contextlib.suppress(SageQueueError):
                    job = self.queue.job(job.name)
            _print(
                f"sagequeue: queued training job {job.name} for {job.pool} with priority {job.priority}"
                + (f", position {job.position}" if job.position else "")
            )
            return None

        # -- waiting ----------------------------------------------------------------------------------------

        def logs_for_job(
            self,
            job_name: str,
            wait: bool = False,
            poll: float = 10,
            log_type: Any = "All",
            timeout: float | None = None,
        ) -> Any:
            job = self._queue_hook.lookup(job_name)
            if job is None:
                return super().logs_for_job(
                    job_name, wait=wait, poll=poll, log_type=log_type, timeout=timeout
                )
            show_logs = log_type not in ("None", False, "Rules")
            return self._follow(job, wait=wait, poll=poll, logs=show_logs, timeout=timeout)

        def wait_for_job(self, job: str, poll: float = 5) -> Any:
            queued = self._queue_hook.lookup(job)
            if queued is None:
                return super().wait_for_job(job, poll=poll)
            return self._follow(queued, wait=True, poll=poll, logs=False, timeout=None)

        def _refresh(self, job: Job, interval: float) -> Job:
            """The job's current state; a queue that is briefly unreachable or overloaded does not end a
            wait that may last days: retried for a few minutes, then the error is raised."""
            failures = 0
            while True:
                try:
                    return self.queue.job(job.name)
                except (EndpointUnreachable, ServerError, Throttled) as exc:
                    failures += 1
                    if failures * max(interval, 1.0) >= _QUEUE_OUTAGE_SECONDS:
                        raise
                    if failures == 1:
                        _print(f"sagequeue: cannot ask the queue about {job.name} ({exc}); trying again")
                    time.sleep(max(interval, 1.0))

        def _logs(self) -> Any:
            if self._logs_client is not None:
                return self._logs_client
            from botocore.config import Config

            # fail fast where CloudWatch Logs is unreachable: logs are a courtesy, the status is the truth
            config = Config(connect_timeout=5, read_timeout=20, retries={"max_attempts": 2})
            return self.boto_session.client("logs", config=config)

        def _follow(
            self, job: Job, *, wait: bool, poll: float, logs: bool, timeout: float | None
        ) -> dict[str, Any]:
            """Report the job while it waits, follow each attempt that runs it, and return the last
            description (by the queue's name) once the job ends, or at once when not waiting."""
            interval = self._poll_seconds if self._poll_seconds is not None else poll
            deadline = None if timeout is None else time.monotonic() + timeout
            region = self.boto_region_name
            tail = _AttemptLogs(self._logs, _print) if logs else None
            announced: tuple[Any, ...] | None = None
            status_seen: tuple[Any, ...] | None = None
            description: dict[str, Any]
            ended_since: tuple[str, float] | None = None
            while True:
                if job.training_job_name is None or job.waiting:
                    description = self._queue_hook.describe_waiting(job, region)
                    key = ("queue", job.state, job.position, job.attempt)
                    if key != announced:
                        _print(f"sagequeue: {job.name}: {_describe_wait(job)}")
                        announced = key
                    if job.terminal or not wait:
                        break
                else:
                    attempt = job.training_job_name
                    if ("attempt", attempt) != announced:
                        _print(f"sagequeue: {job.name}: attempt {job.attempt} runs as training job {attempt}")
                        announced = ("attempt", attempt)
                        if tail is not None:
                            tail.follow(attempt)
                    with passthrough():
                        description = dict(
                            self.sagemaker_client.describe_training_job(TrainingJobName=attempt)
                        )
                    status = (description.get("TrainingJobStatus"), description.get("SecondaryStatus"))
                    if status != status_seen:
                        _print(f"sagequeue: {attempt}: {status[0]} - {status[1]}")
                        status_seen = status
                    if tail is not None:
                        tail.flush()
                    if not wait:
                        break
                    if description.get("TrainingJobStatus") in _ENDED:
                        # an ended attempt may not end the job (a preemption, a retried capacity or
                        # internal failure): the queue decides, once it has seen the attempt end
                        if job.terminal:
                            break
                        ended_since = ended_since or (attempt, time.monotonic())
                        if (
                            ended_since[0] == attempt
                            and time.monotonic() - ended_since[1] > _QUEUE_LAG_SECONDS
                        ):
                            logger.warning(
                                "the queue has not recorded the end of %s; going by SageMaker", attempt
                            )
                            break
                    else:
                        ended_since = None
                if deadline is not None and time.monotonic() >= deadline:
                    _print(
                        f"sagequeue: stopped waiting for {job.name} after {timeout:g} s; it is {job.state}"
                    )
                    break
                time.sleep(interval)
                job = self._refresh(job, interval)
            description["TrainingJobName"] = job.name
            if wait and (deadline is None or time.monotonic() < deadline):
                _check_outcome(job, description)
            return description

else:

    class QueueSession(_SdkSession):  # type: ignore[no-redef]
        """SDK v3 (sagemaker-core) Session whose CreateTrainingJob calls go to the queue.

        `ModelTrainer(sagemaker_session=QueueSession(...))`: the botocore hook is installed on this
        session's SageMaker client and on its boto3 Session, from which sagemaker-core creates the client
        that `TrainingJob.create` and `TrainingJob.wait` use. Waiting while queued shows InProgress/Pending.
        """

        def __init__(
            self,
            boto_session: Any = None,
            sagemaker_client: Any = None,
            *args: Any,
            queue_client: QueueClient | None = None,
            priority: int | None = None,
            **kwargs: Any,
        ) -> None:
            super().__init__(boto_session, sagemaker_client, *args, **kwargs)
            # TrainingJob.wait() shows only "InProgress": say where the job stands next to it
            self._queue_hook = install(self, client=queue_client, priority=priority, report=_print)

        @property
        def queue(self) -> QueueClient:
            return self._queue_hook.client


def _print(line: str) -> None:
    # the SDK reports training progress on stdout; queue progress belongs next to it
    print(line, flush=True)
    logger.debug(line)


def _describe_wait(job: Job) -> str:
    if job.state in ("queued", "held"):
        return queue_message(job)
    if job.state == "cancelled":
        return "cancelled in the queue before it started" + (f": {job.reason}" if job.reason else "")
    if job.state == "failed":
        return "refused by the queue before it started" + (f": {job.reason}" if job.reason else "")
    return f"{job.state}" + (f": {job.reason}" if job.reason else "")


def _check_outcome(job: Job, description: Mapping[str, Any]) -> None:
    """Raise as the SDK does when the job did not complete; a stop (cancel, idle stop) only warns."""
    from sagemaker.exceptions import CapacityError, UnexpectedStatusException

    status = description.get("TrainingJobStatus")
    if job.state == "failed" or status == "Failed":
        reason = description.get("FailureReason") or job.reason or "(no reason given)"
        message = f"Error for training job {job.name}: Failed. Reason: {reason}"
        error = CapacityError if "CapacityError" in str(reason) else UnexpectedStatusException
        raise error(message=message, allowed_statuses=["Completed", "Stopped"], actual_status="Failed")
    if status == "Stopped" or job.state in ("cancelled", "idle_stopped"):
        logger.warning(
            "Job %s ended %s rather than completed%s",
            job.name,
            job.state,
            f": {job.reason}" if job.reason else "",
        )
