"""`QueueSession`: a SageMaker SDK session whose training jobs go to the sagequeue queue.

    from sagequeue import QueueSession
    estimator = PyTorch(..., sagemaker_session=QueueSession())   # SDK v2
    estimator.fit()          # queued; waits while queued, then follows the attempt that runs

With SDK v2, `Session.train()` hands its CreateTrainingJob request to `_intercept_create_request`, which
this class overrides to submit "train" requests to the queue; every other request is left alone. Waiting
(`fit(wait=True)`, `logs_for_job`, `wait_for_job`) prints one line per change of the job's queue state and
position while it waits; once an attempt runs on SageMaker it hands that attempt to the SDK's own loop (its
status, logs and Training / Billable seconds), and after a preemption waits in the queue again, until the
job ends.

SDK v3 has no such path (`ModelTrainer.train()` calls sagemaker-core's `TrainingJob.create` on a boto3
client of the session's boto3 Session), so the v3 `QueueSession` installs the botocore hook
(`sagequeue.hook`) on the session's client and boto3 Session; `TrainingJob.wait()` then works unchanged.

This is the only sagequeue module that imports the SageMaker SDK (`pip install 'sagequeue[sagemaker]'`).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from sagequeue.client import Job, QueueClient
from sagequeue.exceptions import EndpointUnreachable, ServerError, Throttled
from sagequeue.hook import QueueHook, forecast_key, install, passthrough, queue_message
from sagequeue_core.retry import backoff_seconds, botocore_config

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

#: How long a wait rides out a queue it cannot reach before giving up, in seconds.
_QUEUE_OUTAGE_SECONDS = 300.0
#: How long after SageMaker reports an attempt ended a wait trusts SageMaker over a queue that has not
#: caught up (its events are normally seconds behind), in seconds.
_QUEUE_LAG_SECONDS = 600.0
#: The longest pause between two reads of a queue that does not answer, in seconds.
_OUTAGE_PAUSE_SECONDS = 30.0


def _telemetry_off(config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The SDK defaults config (given, or what SDK v2 loaded from its config files) with the SDK's usage
    telemetry turned off, unless it chooses itself (`SageMaker.PythonSDK.Modules.TelemetryOptOut`, the only
    switch SDK v2 reads). Otherwise every `fit()` sends a request naming the account to an AWS bucket (even
    when the job goes to a local stack), and prints a long traceback where AWS cannot be reached. Copied,
    so the caller's dictionary is left as it was. (Costs a schema validation per config lookup in SDK v2,
    as any SageMaker config does: about 0.1 s each, a second or two of CPU a fit.)"""
    merged: dict[str, Any] = copy.deepcopy(dict(config or {}))
    merged.setdefault("SchemaVersion", "1.0")
    modules = merged.setdefault("SageMaker", {}).setdefault("PythonSDK", {}).setdefault("Modules", {})
    modules.setdefault("TelemetryOptOut", True)
    return merged


class _CourtesyLogs:
    """The CloudWatch Logs client the SDK's log loop reads with, best effort: logs are a courtesy, the
    status is the truth. A logs endpoint that fails (unreachable, refusing the keys) is reported once and
    from then on reads as a job that has written no logs, so the SDK's loop goes on following the status
    to its summary instead of ending the wait."""

    def __init__(self, factory: Callable[[], Any], out: Callable[[str], None]) -> None:
        self._factory = factory
        self._client: Any = None
        self._out = out
        self._failed = False
        self._lock = threading.Lock()

    def describe_log_streams(self, **kwargs: Any) -> Any:
        return self._call("describe_log_streams", kwargs, {"logStreams": []})

    def get_log_events(self, **kwargs: Any) -> Any:
        return self._call(
            "get_log_events", kwargs, {"events": [], "nextForwardToken": kwargs.get("nextToken")}
        )

    def _call(self, operation: str, kwargs: dict[str, Any], empty: dict[str, Any]) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        if self._failed:
            return empty
        try:
            with self._lock:
                if self._client is None:
                    self._client = self._factory()
            return getattr(self._client, operation)(**kwargs)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
                raise  # no logs yet: the SDK waits for the container to write some
            self._fail(exc)
        except BotoCoreError as exc:
            self._fail(exc)
        return empty

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self._failed:
                return
            self._failed = True
        self._out(f"sagequeue: cannot read the training logs ({exc}); following the job's status only")


class _LogsFrom:
    """The session's boto3 Session, except that its CloudWatch Logs client is the one given: the SDK's
    log loop asks `boto_session.client("logs")` for it. Everything else is the wrapped Session's."""

    def __init__(self, session: Any, logs: Any) -> None:
        self._session = session
        self._logs = logs

    def client(self, service_name: str, *args: Any, **kwargs: Any) -> Any:
        if service_name == "logs":
            return self._logs
        return self._session.client(service_name, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


if SDK_MAJOR == 2:

    class QueueSession(_SdkSession):
        """SDK v2 Session that queues training jobs instead of creating them.

        `queue_client` (default: resolved from SAGEQUEUE_ENDPOINT, the saved local stack, ...) is where
        jobs go; `priority` applies to every job (default: the estimator's `priority` tag, else the
        queue's default). `poll_seconds` overrides how often waiting polls (default: the SDK's interval);
        `logs_client` is the CloudWatch Logs client the SDK reads training logs with (default: one of the
        boto3 session). The other arguments are `sagemaker.session.Session`'s.

        While the job waits in the queue, waiting prints one line per change of its queue state or
        position; once an attempt runs on SageMaker, the SDK's own loop follows it (status, logs, and the
        Training and Billable seconds at the end); after a preemption the job waits again, and so on.
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
            self._queue_hook = QueueHook(queue_client, priority=priority, report=_print)
            self._poll_seconds = poll_seconds
            #: what was last printed about each job's place in the queue, so a wait does not repeat it
            self._announced: dict[str, tuple[Any, ...]] = {}
            super().__init__(boto_session, sagemaker_client, *args, **kwargs)
            # the SDK's usage telemetry off: the config it set up (given, or loaded from its files) + opt-out
            self.sagemaker_config: dict[str, Any] = _telemetry_off(getattr(self, "sagemaker_config", None))
            boto = self.boto_session

            def logs() -> Any:
                # the retry policy's client, with few tries: a courtesy must not stall the wait
                return logs_client or boto.client("logs", config=botocore_config(attempts=2, read_timeout=20))

            self.boto_session: Any = _LogsFrom(boto, _CourtesyLogs(logs, _print))
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
            job = self._queue_hook.submit(request)  # which prints where the job stands
            self._announced[job.name] = _queue_key(job)
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
            interval = self._interval(poll)

            def follow(attempt: str, remaining: float | None) -> Any:
                return super(QueueSession, self).logs_for_job(
                    attempt, wait=wait, poll=interval, log_type=log_type, timeout=remaining
                )

            return self._follow(job, follow, wait=wait, poll=interval, timeout=timeout)

        def wait_for_job(self, job: str, poll: float = 5) -> Any:
            queued = self._queue_hook.lookup(job)
            if queued is None:
                return super().wait_for_job(job, poll=poll)
            interval = self._interval(poll)

            def follow(attempt: str, remaining: float | None) -> Any:
                return super(QueueSession, self).wait_for_job(attempt, poll=interval)

            return self._follow(queued, follow, wait=True, poll=interval, timeout=None)

        def _interval(self, poll: float) -> float:
            return self._poll_seconds if self._poll_seconds is not None else poll

        def _refresh(self, job: Job, interval: float) -> Job:
            """The job's current state. A queue that is briefly unreachable or overloaded does not end a
            wait that may last days: the read is tried again, with the retry policy's pauses (never shorter
            than the poll interval), for a few minutes; then the error is raised."""
            failures = 0
            began = time.monotonic()
            while True:
                try:
                    return self.queue.job(job.name)
                except (EndpointUnreachable, ServerError, Throttled) as exc:
                    failures += 1
                    if time.monotonic() - began >= _QUEUE_OUTAGE_SECONDS:
                        raise
                    if failures == 1:
                        _print(f"sagequeue: cannot ask the queue about {job.name} ({exc}); trying again")
                    time.sleep(
                        max(interval, backoff_seconds(failures, base=interval, cap=_OUTAGE_PAUSE_SECONDS))
                    )

        def _describe_attempt(self, job: Job, attempt: str) -> dict[str, Any]:
            with passthrough():
                description = dict(self.sagemaker_client.describe_training_job(TrainingJobName=attempt))
            description["TrainingJobName"] = job.name
            return description

        def _follow(
            self,
            job: Job,
            follow_attempt: Callable[[str, float | None], Any],
            *,
            wait: bool,
            poll: float,
            timeout: float | None,
        ) -> dict[str, Any]:
            """Report the job while it waits in the queue; hand each attempt that runs it to the SDK's own
            loop (`follow_attempt`); return the last description (by the queue's name) once the job ends,
            or at once when not waiting."""
            deadline = None if timeout is None else time.monotonic() + timeout
            region = self.boto_region_name
            while True:
                if job.training_job_name is None or job.waiting:
                    key = _queue_key(job)
                    if self._announced.get(job.name) != key:
                        _print(f"sagequeue: {job.name}: {_describe_wait(job)}")
                        self._announced[job.name] = key
                    if job.terminal or not wait:
                        description = self._queue_hook.describe_waiting(job, region)
                        if wait:
                            _check_outcome(job, description)
                        return description
                    if deadline is not None and time.monotonic() >= deadline:
                        _print(
                            f"sagequeue: stopped waiting for {job.name} after {timeout:g} s; it is {job.state}"
                        )
                        return self._queue_hook.describe_waiting(job, region)
                    time.sleep(poll)
                    job = self._refresh(job, poll)
                    continue
                attempt = job.training_job_name
                if self._announced.get(job.name) != ("attempt", attempt):
                    _print(f"sagequeue: {job.name}: attempt {job.attempt} runs as training job {attempt}")
                    self._announced[job.name] = ("attempt", attempt)
                remaining = None if deadline is None else max(deadline - time.monotonic(), 0.001)
                failure: Exception | None = None
                with passthrough():
                    try:
                        follow_attempt(attempt, remaining)
                    except Exception as exc:
                        from sagemaker.exceptions import UnexpectedStatusException

                        if not isinstance(exc, UnexpectedStatusException):
                            raise
                        failure = exc  # the attempt failed; the queue may run the job again
                timed_out = deadline is not None and time.monotonic() >= deadline
                if not wait or timed_out:
                    if failure is not None:
                        raise failure
                    return self._describe_attempt(job, attempt)
                ran = job
                job = self._after(job, attempt, poll)
                # the job ended with this attempt (or runs it still); a later attempt, even one that already
                # ended while this one was being followed, is followed in its turn
                if job.training_job_name == attempt and (job.terminal or not job.waiting):
                    if failure is not None:
                        raise failure
                    if job.state in ("cancelled", "idle_stopped"):
                        # the SDK saw "Stopped"; the queue knows who stopped it and why
                        stopped = "cancelled" if job.state == "cancelled" else "stopped as idle"
                        _print(
                            f"sagequeue: {job.name}: {stopped}" + (f": {job.reason}" if job.reason else "")
                        )
                    return self._describe_attempt(job, attempt)
                # the attempt ended, the job did not: preempted, or requeued after a retryable failure
                why = "was preempted" if job.preemptions > ran.preemptions else "ended"
                _print(f"sagequeue: {job.name}: attempt {ran.attempt} {why}; the queue runs the job again")

        def _after(self, job: Job, attempt: str, poll: float) -> Job:
            """The job once the queue has recorded the end of `attempt` (normally seconds after
            SageMaker); after `_QUEUE_LAG_SECONDS` without it, the job as the queue last said."""
            since = time.monotonic()
            while True:
                job = self._refresh(job, poll)
                if job.terminal or job.waiting or job.training_job_name != attempt:
                    return job
                if time.monotonic() - since > _QUEUE_LAG_SECONDS:
                    logger.warning("the queue has not recorded the end of %s; going by SageMaker", attempt)
                    return job
                time.sleep(poll)

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
    # the SDK reports training progress on stdout; queue progress belongs next to it, printed once
    print(line, flush=True)


def _queue_key(job: Job) -> tuple[Any, ...]:
    return ("queue", job.state, job.position, job.attempt, forecast_key(job))


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
