"""`SageMakerEmulator`: the emulated training-job API on localhost, its clock, and event delivery.

Delivery order is the order things happened in. Outputs go through one outbox drained by one thread at a
time; a thread that finds another draining leaves its outputs to it instead of waiting, so a subscriber
that calls the emulator back over HTTP never deadlocks it.
"""

from __future__ import annotations

import collections
import logging
import random
import threading
import uuid
import weakref
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

from sagequeue.local.clock import Clock, VirtualClock
from sagequeue.local.emulator.backend import Outputs, SageMakerBackend
from sagequeue.local.emulator.delivery import DeliveryQueue, EventDelivery, log_line
from sagequeue.local.emulator.errors import ERRORS_BY_CODE, SageMakerError, UnknownOperation
from sagequeue.local.emulator.events import EventBridgeForwarder
from sagequeue.local.emulator.metrics import CheckpointSync, CloudWatchPublisher
from sagequeue.local.emulator.profiles import AWS_STOP_GRACE_SECONDS, Kinder
from sagequeue.local.emulator.server import CONTENT_TYPE, ServerThread, answer, encode
from sagequeue.local.emulator.simulation import Timings
from sagequeue.local.emulator.throttling import DEFAULT_RATES, Rate, Throttle

logger = logging.getLogger("sagequeue.local.emulator")

EventSubscriber = Callable[[dict[str, Any]], None]

#: Every emulator started in this process, in start order (weakly held): the test suites' guard reads it.
STARTED: weakref.WeakSet[SageMakerEmulator] = weakref.WeakSet()


class EmulatorNotRunning(RuntimeError):
    """The emulator's HTTP server is not started (use it as a context manager or call start())."""


class SageMakerEmulator:
    """SageMaker's training-job API on 127.0.0.1, driven by a virtual or a real clock.

    Defaults (simulated seconds): provisioning 180, warm start 20, download 100, upload 20, stop grace 120 (SIGTERM, then the kill),
    training 600 (a job's SAGEQUEUE_SIM_DURATION overrides it), capacity failure after 1800, spot restart
    after 120. Instance types missing from `instance_limits` are unlimited. Unknown jobs answer
    ValidationException "Requested resource not found." as SageMaker does; `not_found_code="ResourceNotFound"`
    answers what the service model declares instead. `duplicate_events`
    sends every event twice (distinct ids), as SageMaker may, to exercise idempotent consumers.

    Events are delivered as EventBridge does by default (`EventDelivery()`: late, some more than once,
    not in order), drawn from `seed`; `exactly_once_in_order=True` is the kind exception a test must
    justify.
    """

    def __init__(
        self,
        clock: Clock | None = None,
        instance_limits: Mapping[str, int] | None = None,
        provisioning_seconds: float = 180.0,
        warm_start_seconds: float = 20.0,
        stop_grace_seconds: float = 120.0,
        default_duration_seconds: float = 600.0,
        capacity_error_after_seconds: float = 1800.0,
        download_seconds: float = 100.0,
        upload_seconds: float = 20.0,
        spot_interruption_seconds: float = 120.0,
        warm_pool_status_lag_seconds: float = 5.0,
        compile_seconds: float = 120.0,
        warm_pool_limits: Mapping[str, int] | None = None,
        on_event: EventSubscriber | None = None,
        events_client: Any = None,
        event_bus_name: str = "default",
        cloudwatch_client: Any = None,
        s3_client: Any = None,
        region: str = "us-east-1",
        account_id: str = "123456789012",
        host: str = "127.0.0.1",
        port: int = 0,
        tick_seconds: float = 0.05,
        not_found_code: str = "ValidationException",
        duplicate_events: bool = False,
        seed: int = 0,
        delivery: EventDelivery | None = None,
        exactly_once_in_order: bool = False,
        capacity: Mapping[str, int] | None = None,
        rates: Mapping[str, Rate] | None = DEFAULT_RATES,
        transient_error_share: float = 0.0,
        default_warm_pool_limit: int | None = None,
        kinder: Kinder | None = None,
    ) -> None:
        self.clock: Clock = clock if clock is not None else VirtualClock()
        if exactly_once_in_order and delivery is not None:
            raise ValueError("give either delivery or exactly_once_in_order=True, not both")
        self.seed = seed
        self.delivery = (
            EventDelivery.exactly_once_in_order() if exactly_once_in_order else (delivery or EventDelivery())
        )
        self._events = DeliveryQueue(self.delivery, random.Random(f"events:{seed}"))
        #: Every event delivered, in delivery order, as canonical JSON lines (see `event_log_bytes`).
        self.event_log: list[str] = []
        self.timings = Timings(
            provisioning_seconds=provisioning_seconds,
            warm_start_seconds=warm_start_seconds,
            download_seconds=download_seconds,
            upload_seconds=upload_seconds,
            stop_grace_seconds=stop_grace_seconds,
            default_duration_seconds=default_duration_seconds,
            capacity_error_after_seconds=capacity_error_after_seconds,
            spot_interruption_seconds=spot_interruption_seconds,
            warm_pool_status_lag_seconds=warm_pool_status_lag_seconds,
            compile_seconds=compile_seconds,
        )
        self.region = region
        self.account_id = account_id
        self.backend = SageMakerBackend(
            self.clock, self.timings, instance_limits, region, account_id, not_found_code=not_found_code
        )
        self.on_event = on_event
        self._forwarder = (
            EventBridgeForwarder(events_client, event_bus_name) if events_client is not None else None
        )
        self._metrics = CloudWatchPublisher(cloudwatch_client) if cloudwatch_client is not None else None
        self._checkpoints = CheckpointSync(s3_client) if s3_client is not None else None
        # the per-minute marks carry checkpoints too: kept when either has somewhere to go
        self.backend.metrics_enabled = self._metrics is not None or self._checkpoints is not None
        self.backend.duplicate_events = duplicate_events
        self.backend.new_event_id = self._events.new_id
        if capacity:
            self.backend.set_capacity(capacity)
        self.backend.warm_pool_limits = dict(warm_pool_limits or {})
        if default_warm_pool_limit is not None and (
            isinstance(default_warm_pool_limit, bool)
            or not isinstance(default_warm_pool_limit, int)
            or default_warm_pool_limit < 0
        ):
            raise ValueError(
                f"default_warm_pool_limit must be a non-negative integer, got {default_warm_pool_limit!r}"
            )
        self.backend.default_warm_pool_limit = default_warm_pool_limit
        #: The departures from AWS this emulator is allowed, and why (profiles.Kinder); None: none.
        self.kinder = kinder
        self._rates = rates
        self._transient_error_share = transient_error_share
        self._throttle = Throttle(rates, transient_error_share, random.Random(f"faults:{seed}"))
        self._host = host
        self._port = port
        self._tick_seconds = tick_seconds
        self._server: ServerThread | None = None
        self._ticker: threading.Thread | None = None
        self._stopping = threading.Event()
        self._outbox: collections.deque[Outputs] = collections.deque()
        self._deliver_lock = threading.Lock()
        self._delivering = threading.local()
        self._advance_lock = threading.RLock()  # a subscriber may advance from inside an advance
        self._faults_lock = threading.Lock()
        self._faults: dict[str, collections.deque[SageMakerError]] = {}

    # --- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> SageMakerEmulator:
        if self._server is not None:
            return self
        self._stopping.clear()
        STARTED.add(self)
        self._server = ServerThread(self._host, self._port, self._dispatch)
        if not isinstance(self.clock, VirtualClock):
            # A real clock moves by itself, so something must notice when steps fall due.
            self._ticker = threading.Thread(target=self._tick, name="sagemaker-emulator-clock", daemon=True)
            self._ticker.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5)
            self._ticker = None
        if self._server is not None:
            self._server.close()
            self._server = None

    def __enter__(self) -> SageMakerEmulator:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def endpoint_url(self) -> str:
        if self._server is None:
            raise EmulatorNotRunning("the SageMaker emulator is not running: call start() or use `with`")
        host, port = self._server.address
        return f"http://{host}:{port}"

    def attach(self, client: Any) -> Any:
        """Answer `client`'s requests for this emulator in this process, without HTTP: botocore still
        serializes, signs, retries and parses them, and the answers are those the server gives
        (`server.answer`). Returns the client. The HTTP server keeps serving every other client."""
        client.meta.events.register("before-send", self._answer_in_process)
        return client

    def _answer_in_process(self, request: Any, **_: Any) -> Any:
        if self._server is None or not str(request.url).startswith(self.endpoint_url):
            return None
        from botocore.awsrequest import AWSResponse

        from sagequeue.local.inprocess import ResponseBody

        body = request.body or b""
        if isinstance(body, str):
            body = body.encode("utf-8")
        elif not isinstance(body, bytes):
            body = body.read()
        target = request.headers.get("X-Amz-Target") or b""
        if isinstance(target, bytes):
            target = target.decode("utf-8", "replace")
        status, payload = answer(self._dispatch, target, body)
        headers = {"Content-Type": CONTENT_TYPE, "x-amzn-RequestId": str(uuid.uuid4())}
        return AWSResponse(request.url, status, headers, ResponseBody(encode(payload)))

    def client(self, **kwargs: Any) -> Any:
        """A boto3 SageMaker client for this emulator (any credentials work; none are checked)."""
        import boto3

        options: dict[str, Any] = {
            "endpoint_url": self.endpoint_url,
            "region_name": self.region,
            "aws_access_key_id": "emulator",
            "aws_secret_access_key": "emulator",
        }
        options.update(kwargs)
        return boto3.client("sagemaker", **options)

    @property
    def running(self) -> bool:
        return self._server is not None

    def departures_from_aws(self) -> set[str]:
        """Every way this emulator was kinder than SageMaker as AWS documents it, so far (names from
        `profiles.DEPARTURES`): its settings, and the instance types and plans its jobs used."""
        found: set[str] = set()
        if self.timings.stop_grace_seconds < AWS_STOP_GRACE_SECONDS:
            found.add("stop_grace")
        delivery = self.delivery
        if (
            delivery.immediate
            or delivery.duplicate_share == 0
            or delivery.max_delay_seconds == delivery.min_delay_seconds
        ):
            found.add("event_delivery")
        if delivery.loss_share == 0:
            found.add("event_loss")
        if self._transient_error_share == 0:
            found.add("faults")
        if self._rates is None:
            found.add("throttling")
        found |= self.backend.departures_from_aws()
        return found

    # --- time ------------------------------------------------------------------------------------------

    def now(self) -> datetime:
        return self.clock.now()

    def advance(self, seconds: float) -> datetime:
        """Moves the virtual clock forward, stopping at every due step so that each event is delivered
        with the clock showing its time; subscribers may call the emulator while it advances."""
        if not isinstance(self.clock, VirtualClock):
            raise TypeError(f"advance() needs a VirtualClock; this emulator runs on {self.clock!r}")
        if seconds < 0:
            raise ValueError(f"cannot advance by a negative time ({seconds} s)")
        clock = self.clock
        with self._advance_lock:
            target = clock.advance(0) + timedelta(seconds=seconds)
            while True:
                due = self.next_due()
                if due is None or due > target:
                    break
                clock.advance_to(due)
                self._process_until(due)
                self._deliver(raise_errors=True)
            clock.advance_to(target)
            self._process_until(target)
            self._deliver(raise_errors=True)
            return clock.now()

    def next_due(self) -> datetime | None:
        """When the next timed step (phase change, stopping condition, warm-pool expiry) or the next event
        delivery falls due, or None."""
        with self.backend.lock:
            moments = [m for m in (self.backend.next_due(), self._events.next_due()) if m is not None]
        return min(moments) if moments else None

    def deliver_pending(self) -> int:
        """Delivers every event still waiting for its delivery time, now, in the order they would have
        come (duplicates and reordering stay). For test harnesses that hand events to handlers themselves
        at moments of their choosing; the clock does not move. Returns how many were delivered."""
        with self.backend.lock:
            due = self._events.pop_due(datetime.max.replace(tzinfo=self.clock.now().tzinfo))
            if due:
                self.event_log.extend(log_line(event) for event in due)
                self._outbox.append(Outputs(events=due))
        self._deliver(raise_errors=True)
        return len(due)

    @property
    def lost_events(self) -> list[dict[str, Any]]:
        """Events dropped on purpose (`EventDelivery.loss_share`), in the order they happened."""
        return list(self._events.lost)

    def pending_events(self) -> int:
        """Events produced but not delivered yet (they wait for their delivery time)."""
        with self.backend.lock:
            return len(self._events)

    def event_log_bytes(self) -> bytes:
        """The delivered events, one canonical JSON line each: the same seed and requests give the same
        bytes."""
        return "".join(line + "\n" for line in self.event_log).encode()

    def set_capacity(self, capacity: Mapping[str, int | None]) -> None:
        """How many instances of each type the region can launch from now on (None: unlimited). A create
        beyond it stays in Starting, "Insufficient capacity error from EC2 while launching instances,
        retrying!", until capacity frees up or `capacity_error_after_seconds` passes (then CapacityError)."""
        self.backend.set_capacity(capacity)

    def add_training_plan(self, arn: str, instance_count: int) -> None:
        """Registers a training plan with `instance_count` reserved instances. Its jobs (ResourceConfig.
        TrainingPlanArn) share them; beyond them a job waits InProgress/Pending, at most its
        StoppingCondition.MaxPendingTimeInSeconds. Jobs naming a plan not registered run on the region's
        capacity."""
        with self.backend.lock:
            self._enqueue(self.backend.add_training_plan(arn, instance_count))
        self._deliver(raise_errors=True)

    def end_warm_pool(self, name: str) -> None:
        """Ends a job's Available warm pool now, as SageMaker does when it patches or replaces unhealthy
        instances: the pool is Terminated before its keep-alive ran out."""
        with self.backend.lock:
            self.backend.end_warm_pool(name, self.clock.now())

    def instances_in_use(self) -> dict[str, int]:
        """Instances held per type right now: live jobs plus Available warm pools (what the limits count)."""
        return self.backend.instances_in_use()

    def process_due(self) -> None:
        """Runs every step due by the clock's time now (for a clock moved by someone else)."""
        self._process_until(self.clock.now())
        self._deliver(raise_errors=True)

    def _process_until(self, moment: datetime) -> None:
        # Queued under the state lock, so that outputs enter the outbox in the order they happened even
        # when a request thread processes steps at the same moment.
        with self.backend.lock:
            self._enqueue(self.backend.process_due(moment))
            self._release_events(moment)

    def _tick(self) -> None:
        while not self._stopping.wait(self._tick_seconds):
            try:
                self._process_until(self.clock.now())
                self._deliver(raise_errors=False)
            except Exception:  # the ticker must outlive a failing subscriber or a bug
                logger.exception("SageMaker emulator failed while processing due steps")

    # --- faults ----------------------------------------------------------------------------------------

    def fail_next(
        self, operation: str, code: str = "ThrottlingException", times: int = 1, message: str | None = None
    ) -> None:
        """Answers the next `times` calls of `operation` with error `code` (e.g. to test retries)."""
        if operation not in self.backend.operations:
            raise ValueError(f"{operation!r} is not an emulated operation: {sorted(self.backend.operations)}")
        error_class = ERRORS_BY_CODE.get(code)
        if error_class is None:
            raise ValueError(f"unknown error code {code!r}: one of {sorted(ERRORS_BY_CODE)}")
        text = message or ("Rate exceeded" if code == "ThrottlingException" else f"Injected {code}")
        with self._faults_lock:
            queue = self._faults.setdefault(operation, collections.deque())
            queue.extend(error_class(text) for _ in range(times))

    # --- requests --------------------------------------------------------------------------------------

    def _dispatch(self, operation: str, request: Any) -> dict[str, Any]:
        if operation not in self.backend.operations:
            raise UnknownOperation(
                f"Operation {operation} is not supported by the sagequeue SageMaker emulator."
            )
        with self._faults_lock:
            queue = self._faults.get(operation)
            fault = queue.popleft() if queue else None
        if fault is not None:
            raise fault
        with self.backend.lock:
            refusal = self._throttle.admit(operation, self.clock.now())
        if refusal is not None:
            raise refusal
        outputs = Outputs()
        try:
            with self.backend.lock:
                try:
                    return self.backend.call(operation, request, outputs)
                finally:
                    self._enqueue(outputs)
                    # Events whose delivery time has come go out now; this request's own come later
                    # (unless delivery is immediate), never before the client has its answer.
                    self._release_events(self.clock.now())
        finally:
            # What is due goes out before the answer: with immediate delivery, this request's own events.
            self._deliver(raise_errors=False)

    # --- delivery --------------------------------------------------------------------------------------

    def _enqueue(self, outputs: Outputs) -> None:
        """Metric data goes to the outbox at once; events wait in the delivery queue (under the state lock,
        so the seeded draws happen in the order the changes did)."""
        if outputs.metric_data:
            self._outbox.append(Outputs(metric_data=outputs.metric_data))
        if outputs.checkpoints:
            self._outbox.append(Outputs(checkpoints=outputs.checkpoints))
        for event, changed_at in zip(outputs.events, outputs.event_times, strict=True):
            self._events.add(event, changed_at)

    def _release_events(self, now: datetime) -> None:
        due = self._events.pop_due(now)
        if due:
            self.event_log.extend(log_line(event) for event in due)
            self._outbox.append(Outputs(events=due))

    def _deliver(self, *, raise_errors: bool) -> None:
        if getattr(self._delivering, "active", False):
            return  # a subscriber called back into this thread's delivery; the outer loop sends the rest
        while self._outbox:
            if not self._deliver_lock.acquire(blocking=raise_errors):
                return  # another thread is delivering and will drain what this one queued
            self._delivering.active = True
            try:
                while self._outbox:
                    self._send(self._outbox.popleft(), raise_errors=raise_errors)
            finally:
                self._delivering.active = False
                self._deliver_lock.release()

    def _send(self, outputs: Outputs, *, raise_errors: bool) -> None:
        steps: list[tuple[str, Callable[[], None]]] = []
        if outputs.events:
            if self.on_event is not None:
                subscriber = self.on_event
                for event in outputs.events:
                    steps.append(("on_event", lambda e=event: subscriber(e)))  # type: ignore[misc]
            if self._forwarder is not None:
                forwarder = self._forwarder
                steps.append(("EventBridge", lambda: forwarder.put(outputs.events)))
        if outputs.metric_data and self._metrics is not None:
            publisher = self._metrics
            steps.append(("CloudWatch", lambda: publisher.put(outputs.metric_data)))
        if outputs.checkpoints and self._checkpoints is not None:
            sync = self._checkpoints
            steps.append(("S3", lambda: sync.put(outputs.checkpoints)))
        for what, step in steps:
            try:
                step()
            except Exception:
                if raise_errors:
                    raise
                logger.exception("SageMaker emulator could not deliver to %s", what)
