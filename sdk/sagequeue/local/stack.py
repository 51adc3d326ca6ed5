"""`LocalStack`: sagequeue's whole stack in one process, with no AWS account.

    with LocalStack(settings={"capacity": {"ml.trn1.32xlarge": 2}}) as stack:
        queue = stack.client()
        queue.submit(request, priority=1)
        stack.run_until_idle()      # deliver every pending event to the functions
        stack.advance(600)          # ten virtual minutes: SageMaker moves, schedules and alarms fire

It starts moto's server on 127.0.0.1 (DynamoDB, EventBridge, SNS, SQS, CloudWatch, S3) and the SageMaker
emulator, creates what `template.yaml` declares, serves the API on localhost (SigV4-authorized, each request
turned into the API Gateway proxy event), and runs the template's functions in process: the same handlers
Lambda runs, with their dependencies installed through `sagequeue_core.runtime`. Events reach the functions
whose rules match them (moto matches; see `sagequeue.local.router`); schedules fire and alarms are evaluated
on the stack's clock. See docs/local-stack.md.
"""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, TextIO

from sagequeue.local.clock import Clock, RealClock, VirtualClock
from sagequeue.local.identities import (
    DEFAULT_IDENTITY,
    Identity,
    IdentityTable,
    default_identities,
    user_identity,
)
from sagequeue.local.template import StackContext, StackSpec, Template, TemplateError, build_spec, stage_name

logger = logging.getLogger("sagequeue.local")

#: The training role local jobs may pass, unless `allowed_role_arns` says otherwise.
LOCAL_TRAINING_ROLE = "sagequeue-local-training"
DEFAULT_STACK_NAME = "sagequeue-local"
DEFAULT_REGION = "us-east-1"
#: CloudWatch evaluates alarms once a minute.
ALARM_EVALUATION_SECONDS = 60
#: Credentials the in-process clients use when the environment has none (moto accepts any).
_LOCAL_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "sagequeue-local",
    "AWS_SECRET_ACCESS_KEY": "sagequeue-local",
}

#: The functions log through Powertools under the service name (sagequeue_core.observability).
_FUNCTION_LOGGER = "sagequeue"

_accounts = itertools.count(1)
#: The version of the file `state=` names.
_STATE_FORMAT = 1
_active_lock = threading.Lock()
_active: LocalStack | None = None


class LocalStackError(RuntimeError):
    """The local stack cannot start or was used wrongly; the message says what to do."""


class FunctionFailed(LocalStackError):
    """A function of the stack raised while handling an event (after its retries)."""


def default_template_path() -> Path:
    """SAGEQUEUE_TEMPLATE, else template.yaml of the source checkout this package runs from, else the copy
    an installed wheel carries (sagequeue/local/stack_files/, with the functions' code beside it)."""
    override = os.environ.get("SAGEQUEUE_TEMPLATE")
    if override:
        return Path(override)
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "template.yaml"
        if candidate.is_file() and (parent / "functions").is_dir():
            return candidate
    packaged = here.parent / "stack_files" / "template.yaml"
    if packaged.is_file() and (packaged.parent / "functions").is_dir():
        return packaged
    raise LocalStackError(
        f"cannot find template.yaml: neither a source checkout above {here.parent} nor the copy a wheel "
        "installs (sagequeue/local/stack_files) has one; pass template= (CLI: --template) or set "
        "SAGEQUEUE_TEMPLATE"
    )


def parameter_name(setting: str) -> str:
    """`min_runtime_before_preemption_seconds` -> `MinRuntimeBeforePreemptionSeconds`."""
    return "".join(part[:1].upper() + part[1:] for part in setting.split("_"))


@dataclass(frozen=True)
class _Moto:
    server: Any
    thread: threading.Thread
    endpoint: str


_namespace_filter = threading.local()


def _metric_queries_keep_to_their_namespace() -> None:
    """Make moto's GetMetricData read a query's metric in the query's namespace only, as CloudWatch does:
    moto drops the namespace when the query names dimensions, so data another tenant published for the
    same host in another namespace would be read as the host's (team namespaces, docs/guardrails.md)."""
    from moto.cloudwatch.models import CloudWatchBackend

    if getattr(CloudWatchBackend, "_sagequeue_namespaced", False):
        return
    every_metric = CloudWatchBackend.get_all_metrics
    get_metric_data = CloudWatchBackend.get_metric_data

    def get_all_metrics(self: Any) -> Any:
        data = every_metric(self)
        namespace = getattr(_namespace_filter, "namespace", None)
        return data if namespace is None else [d for d in data if d.namespace == namespace]

    def get_metric_data_by_namespace(self: Any, queries: Any, *args: Any, **kwargs: Any) -> Any:
        namespaces = {q["MetricStat"]["Metric"].get("Namespace") for q in queries if "MetricStat" in q}
        expressions = [q for q in queries if "MetricStat" not in q]
        if len(namespaces) > 1 and expressions:
            return get_metric_data(self, queries, *args, **kwargs)  # one call's math spans namespaces
        results: list[Any] = []
        for namespace in sorted(namespaces, key=str) or [None]:
            mine = [
                q
                for q in queries
                if "MetricStat" in q and q["MetricStat"]["Metric"].get("Namespace") == namespace
            ]
            _namespace_filter.namespace = namespace
            try:
                results.extend(get_metric_data(self, mine + expressions, *args, **kwargs))
            finally:
                _namespace_filter.namespace = None
        return results

    CloudWatchBackend.get_all_metrics = get_all_metrics  # type: ignore[method-assign]
    CloudWatchBackend.get_metric_data = get_metric_data_by_namespace  # type: ignore[method-assign]
    CloudWatchBackend._sagequeue_namespaced = True  # type: ignore[attr-defined]


def _start_moto(account_id: str) -> _Moto:
    """moto's server on a free port of 127.0.0.1, every request in `account_id`.

    moto keeps its state per account in the process, so a stack in its own account never sees the
    resources of another stack (or of a test's own moto server) in the same process.
    """
    _metric_queries_keep_to_their_namespace()
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    application = DomainDispatcherApplication(create_backend_app)

    class QuietHandler(MotoRequestHandler):
        # Keep-alive: a new connection per AWS call costs more than the call.
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        # One log line per AWS call drowns the stack's own output and costs time.
        def log_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    def in_account(environ: dict[str, Any], start_response: Any) -> Any:
        environ["HTTP_X_MOTO_ACCOUNT_ID"] = account_id
        return application(environ, start_response)

    server = make_server("127.0.0.1", 0, in_account, threaded=True, request_handler=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="sagequeue-local-moto", daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    return _Moto(server, thread, f"http://{host!s}:{port}")


_session_lock = threading.Lock()
_session: Any = None


def _shared_session() -> Any:
    """One boto3 session for every client the local stacks of this process make: its loader reads each
    service model once (reading them is most of what a new client costs)."""
    global _session
    with _session_lock:
        if _session is None:
            import boto3

            _session = boto3.session.Session()
        return _session


def _moto_queue_peek(account_id: str, region: str) -> Any:
    """Whether a queue of the account holds messages, read from moto's state in this process.

    Receiving from every empty queue after every event would be most of the stack's work; a look at
    moto's own queue saves the request. Anything unexpected answers True, so the queue is polled.
    """
    try:
        from moto.sqs.models import sqs_backends
    except ImportError:
        return None

    def peek(url: str) -> bool:
        try:
            queue = sqs_backends[account_id][region].queues.get(url.rsplit("/", 1)[-1])
            return queue is None or bool(queue.messages)
        except Exception:  # noqa: BLE001 - a moto that changed shape: fall back to polling
            return True

    return peek


def _forget_account(account_id: str) -> None:
    """Drop moto's state for the account (memory), once the stack is stopped."""
    try:
        from moto.backends import get_backend
    except ImportError:
        return
    for service in ("dynamodb", "sqs", "sns", "events", "cloudwatch", "s3", "iam"):
        try:
            get_backend(service).pop(account_id, None)
        except Exception:  # noqa: BLE001 - best effort: a moto without the service keeps its state
            logger.debug("could not forget moto %s state of account %s", service, account_id)


class LocalStack:
    """sagequeue on moto and the SageMaker emulator, its functions run in process. A context manager.

    `settings` use the names of the stack parameters in snake_case (`capacity`, `allowed_role_arns`,
    `min_runtime_before_preemption_seconds`, ...), or of any other `Settings` field; values may be typed
    (`{"ml.trn1.32xlarge": 2}`, a list of ARNs) or strings as CloudFormation takes them.
    `clock` is "virtual" (time moves only with `advance()`), "real" (wall time times `speed`) or a clock.
    `emulator` passes options to `SageMakerEmulator` (e.g. `provisioning_seconds`, `instance_limits`)
    over the AWS profile it runs by default (`emulator.aws_options`): the region can launch what the pools
    hold, the warm-pool quota is 0 (`warm_pool_limits` raises it), each `plan:<name>` pool is a training
    plan with its instances, stops take 120 s, events come late, repeated or not at all, and a few requests
    answer 5xx. Kinder settings go in `emulator` too (with `kinder=Kinder(reason, ...)` in the test suites).
    `teams` maps local identities to teams (`{"vision-user": "vision"}`) through the TeamRoles parameter;
    a name that is not a default identity becomes an IAM user of that name.
    """

    def __init__(
        self,
        settings: Mapping[str, Any] | None = None,
        *,
        clock: str | Clock = "virtual",
        speed: float = 1.0,
        port: int = 0,
        template: str | Path | None = None,
        region: str = DEFAULT_REGION,
        account_id: str | None = None,
        stack_name: str = DEFAULT_STACK_NAME,
        start: datetime | None = None,
        emulator: Mapping[str, Any] | None = None,
        raise_function_errors: bool | None = None,
        poll_interval: float = 0.1,
        function_logs: bool = True,
        state: str | Path | None = None,
        aws: str = "http",
        teams: Mapping[str, str] | None = None,
    ) -> None:
        if isinstance(clock, str):
            if clock == "virtual":
                self.clock: Clock = VirtualClock(start or datetime(2026, 1, 5, 9, 0, tzinfo=UTC))
            elif clock == "real":
                self.clock = RealClock(speed)
            else:
                raise ValueError(f"clock must be 'virtual', 'real' or a clock object, got {clock!r}")
        else:
            self.clock = clock
        self.virtual = isinstance(self.clock, VirtualClock)
        if aws not in ("http", "in-process"):
            raise ValueError(f"aws must be 'http' (moto's server) or 'in-process', got {aws!r}")
        #: "http": moto's server on localhost, which other processes reach too; "in-process": the stack's
        #: clients are served by moto's handlers in this process, without HTTP (`sagequeue demo`).
        self.aws = aws
        self.region = region
        self.account_id = account_id or f"{100000000000 + next(_accounts):012d}"
        self.stack_name = stack_name
        self.template_path = Path(template) if template else default_template_path()
        self.requested_settings = dict(settings or {})
        self.emulator_options = dict(emulator or {})
        self.port = port
        #: raise FunctionFailed from run_until_idle/advance when a function fails; default: on a virtual
        #: clock (tests, the demo), not on a real one (a server keeps serving).
        self.raise_function_errors = self.virtual if raise_function_errors is None else raise_function_errors
        self.poll_interval = poll_interval
        #: False: the functions' INFO logs and EMF metric documents (what Lambda sends to CloudWatch Logs)
        #: are not printed; warnings and errors still are.
        self.function_logs = function_logs
        #: A JSON file the stack's tables are restored from at start and saved to at stop (None: the queue
        #: lives as long as the stack).
        self.state_path = Path(state) if state is not None else None
        #: Items restored from `state_path` at start, per table logical id.
        self.restored: dict[str, int] = {}
        self._log_filter: logging.Filter | None = None
        self._log_formats: list[logging.Handler] = []
        self._stdout: _FunctionStdout | None = None
        self._warnings: warnings.catch_warnings[None] | None = None
        self.identities = IdentityTable(default_identities(self.account_id).values())
        #: Local identity -> team, as an admin maps principals to teams with TeamRoles; an identity not
        #: among the defaults is made an IAM user of that name.
        self.teams = dict(teams or {})
        for name in self.teams:
            if name not in {identity.name for identity in self.identities}:
                self.identities.add(user_identity(self.account_id, name))
        self.training_role_arn = f"arn:aws:iam::{self.account_id}:role/{LOCAL_TRAINING_ROLE}"
        self.startup_seconds: float | None = None
        self.spec: StackSpec | None = None
        self.settings: Any = None
        self._moto: _Moto | None = None
        self._in_process: Any = None
        self._aws_endpoint: str | None = None
        self._emulator: Any = None
        self._api: Any = None
        self._router: Any = None
        self._alarms: Any = None
        self._host: Any = None
        self._clients: dict[str, Any] = {}
        self._next_alarm_evaluation: datetime | None = None
        self._pump: threading.Thread | None = None
        self._stopping = threading.Event()
        self._saved_env: dict[str, str | None] = {}
        self._failures_seen = 0
        self._started = False

    # --- lifecycle ----------------------------------------------------------------------------------------

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> LocalStack:
        global _active
        if self._started:
            return self
        with _active_lock:
            if _active is not None:
                raise LocalStackError(
                    "another LocalStack is running in this process; the functions share one set of "
                    "dependencies (sagequeue_core.runtime), so stop it first"
                )
            _active = self
        began = time.perf_counter()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.perf_counter() - began
        logger.debug("local stack up in %.2f s at %s", self.startup_seconds, self.endpoint)
        return self

    def _start(self) -> None:
        self._started = True
        if not os.environ.get("AWS_ACCESS_KEY_ID"):
            # pynamodb and boto3 need some credentials to sign; moto accepts any.
            for name, value in _LOCAL_CREDENTIALS.items():
                self._saved_env[name] = os.environ.get(name)
                os.environ[name] = value
        if not self.function_logs:
            self._quiet_functions()
        if self.virtual:
            _parse_jsonpaths_once()  # on a real clock the event pump does it, once the stack answers
        if self.aws == "in-process":
            from sagequeue.local.inprocess import InProcessMoto

            self._in_process = InProcessMoto(self.account_id, self.region)
            self._aws_endpoint = self._in_process.endpoint
        else:
            self._moto = _start_moto(self.account_id)
            self._aws_endpoint = self._moto.endpoint
        template = self._template(self._aws_endpoint)
        self.spec = spec = build_spec(template)
        from sagequeue.local.provision import provision

        provisioned = provision(spec, self.stack_name, self.aws_client)
        self.settings = self._settings(spec)
        if self.state_path is not None:
            self._restore_state(self.state_path)

        from sagequeue.local.emulator import SageMakerEmulator, aws_options
        from sagequeue_core.domain import PLAN_POOL_PREFIX

        pools = dict(self.settings.capacity)
        emulator_options = aws_options(
            region_capacity={pool: n for pool, n in pools.items() if not pool.startswith(PLAN_POOL_PREFIX)},
            region=self.region,
            account_id=self.account_id,
            **self.emulator_options,
        )
        self._emulator = SageMakerEmulator(
            clock=self.clock,
            events_client=self.aws_client("events"),
            cloudwatch_client=self.aws_client("cloudwatch"),
            s3_client=self.aws_client("s3"),
            **emulator_options,
        ).start()
        for pool, instances in pools.items():
            if pool.startswith(PLAN_POOL_PREFIX):
                plan = pool.removeprefix(PLAN_POOL_PREFIX)
                arn = f"arn:aws:sagemaker:{self.region}:{self.account_id}:training-plan/{plan}"
                self._emulator.add_training_plan(arn, instances)

        from sagequeue_core import runtime

        endpoints = dict.fromkeys(runtime.SERVICES, self._aws_endpoint)
        endpoints["sagemaker"] = self._emulator.endpoint_url
        # The handlers' own clients, made from the stack's session so service models load once; served in
        # process, every client of theirs is made (and attached) here rather than on first use.
        handler_services = ("sagemaker", "events") if self._in_process is None else runtime.SERVICES
        handler_clients = {
            service: self._attached(
                self._boto_session().client(
                    service,
                    endpoint_url=endpoints[service],
                    region_name=self.region,
                    config=runtime.CLIENT_CONFIG,
                )
            )
            for service in handler_services
        }
        deps = runtime.build(
            self.settings, clock=self.clock, endpoints=endpoints, region=self.region, clients=handler_clients
        )
        if self._in_process is not None:
            self._attached(deps.store.client)  # made now (over HTTP it is made on first use)
        runtime.install(deps)

        from sagequeue.local.router import EventRouter, FunctionHost

        self._host = FunctionHost(spec.functions, on_error=self._count_error)
        self._host.load_all()
        self._router = EventRouter(
            self._host,
            self.aws_client("sqs"),
            inboxes=provisioned.inbox_urls,
            sources=provisioned.source_urls,
            queue_arns={url: arn for arn, url in provisioned.queue_urls.items()},
            region=self.region,
            account_id=self.account_id,
            peek=_moto_queue_peek(self.account_id, self.region),
        )
        now = self.clock.now()
        for rule_name, function, input_ in provisioned.schedules:
            rule = next(r for r in spec.rules if r.name == rule_name)
            assert rule.schedule is not None
            arn = f"arn:aws:events:{self.region}:{self.account_id}:rule/{rule_name}"
            self._router.add_schedule(rule_name, arn, function, rule.schedule, input_, now)
        if any(self.restored.values()):
            # attempts restored as starting or running died with the last emulator: the reconcile says so
            # (and requeues them) now, not at its first tick a minute on
            self._router.fire_every_schedule(now)

        from sagequeue.local.alarms import AlarmEvaluator

        self._alarms = AlarmEvaluator(
            self.aws_client("cloudwatch"),
            self.aws_client("sns"),
            region=self.region,
            account_id=self.account_id,
        )
        self._next_alarm_evaluation = _next_minute(now)

        api_functions = {route.function for route in spec.routes}
        if not spec.routes:
            raise LocalStackError(f"{self.template_path} declares no Api events: there is no API to serve")
        from sagequeue.local.apigw import LocalApiGateway

        self._api = LocalApiGateway(
            routes=spec.routes,
            identities=self.identities,
            invoke=self._host.invoke,
            region=self.region,
            account_id=self.account_id,
            now=self.clock.now,
            api_id=template.ref(spec.routes[0].api) if spec.routes[0].api in template.resources else "local",
            stage=stage_name(template, spec.routes[0].api),
            port=self.port,
        )
        self._api.start()
        logger.debug("API functions: %s", ", ".join(sorted(api_functions)))
        if not self.virtual:
            self._stopping.clear()
            self._pump = threading.Thread(
                target=self._pump_forever, name="sagequeue-local-events", daemon=True
            )
            self._pump.start()

    def _count_error(self, function: Any) -> None:
        """The AWS/Lambda Errors datapoint Lambda records for a failed invocation, so the template's error
        alarms see it."""
        self.aws_client("cloudwatch").put_metric_data(
            Namespace="AWS/Lambda",
            MetricData=[
                {
                    "MetricName": "Errors",
                    "Dimensions": [{"Name": "FunctionName", "Value": function.name}],
                    "Timestamp": self.clock.now(),
                    "Value": 1.0,
                    "Unit": "Count",
                }
            ],
        )

    def stop(self) -> None:
        """Stop serving and forget the stack's state; safe to call twice."""
        global _active
        self._stopping.set()
        if self._pump is not None:
            self._pump.join(timeout=10)
            self._pump = None
        if self._api is not None:
            self._api.stop()
            self._api = None
            if self.state_path is not None and self._aws_endpoint is not None:
                # the API served, so the tables were restored (or new): what they hold now is the state
                self.save_state(self.state_path)
        if self._emulator is not None:
            self._emulator.stop()
            self._emulator = None
        if self._started:
            from sagequeue_core import runtime

            runtime.reset()
        if self._moto is not None:
            self._moto.server.shutdown()
            self._moto.server.server_close()
            self._moto.thread.join(timeout=5)
            self._moto = None
        if self._aws_endpoint is not None:
            self._aws_endpoint = None
            self._in_process = None
            _forget_account(self.account_id)
        self._restore_output()
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_env.clear()
        self._clients.clear()
        self._started = False
        with _active_lock:
            if _active is self:
                _active = None

    def _quiet_functions(self) -> None:
        """Keep the functions' INFO logs and EMF documents (Lambda sends both to CloudWatch Logs) out of
        this process's output; warnings and errors still show."""
        import sagequeue_core.observability  # noqa: F401 - creates the functions' logger and its handler

        self._log_filter = _BelowWarning()
        # On the handlers, not the logger: records of child loggers reach them by propagation.
        for handler in logging.getLogger(_FUNCTION_LOGGER).handlers:
            handler.addFilter(self._log_filter)
            # a terminal reads a line, not the JSON document CloudWatch Logs would index; the handler keeps
            # its formatter, which Powertools keeps the logger's keys in
            handler.format = _ReadableRecord(handler).format  # type: ignore[method-assign]
            self._log_formats.append(handler)
        self._stdout = _FunctionStdout(sys.stdout)
        sys.stdout = self._stdout
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        # Powertools warns on every invocation that adds no metric; Lambda would log it, not show it.
        warnings.filterwarnings("ignore", message="No application metrics to publish")

    def _restore_output(self) -> None:
        if self._log_filter is not None:
            for handler in logging.getLogger(_FUNCTION_LOGGER).handlers:
                handler.removeFilter(self._log_filter)
            self._log_filter = None
        for handler in self._log_formats:
            vars(handler).pop("format", None)  # the class's format again
        self._log_formats.clear()
        if self._stdout is not None:
            if sys.stdout is self._stdout:
                sys.stdout = self._stdout.target
            self._stdout = None
        if self._warnings is not None:
            self._warnings.__exit__(None, None, None)
            self._warnings = None

    # --- state ------------------------------------------------------------------------------------------

    def save_state(self, path: str | Path) -> Path:
        """Write every item of the stack's tables to `path` (JSON, DynamoDB's typed form), atomically."""
        import json
        import tempfile

        spec = self._require(self.spec, "saving its state")
        dynamodb = self.aws_client("dynamodb")
        tables: dict[str, list[Any]] = {}
        for table in spec.tables:
            items: list[Any] = []
            for page in dynamodb.get_paginator("scan").paginate(TableName=table.name, ConsistentRead=True):
                items.extend(page.get("Items", []))
            tables[table.logical_id] = items
        document = {"format": _STATE_FORMAT, "saved_at": self.clock.now().isoformat(), "tables": tables}
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".state-", suffix=".json", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(document, handle)
            os.chmod(tmp, 0o600)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target

    def _restore_state(self, path: Path) -> None:
        import json

        assert self.spec is not None
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return  # a first start: the file is written at stop
        except OSError as exc:
            raise LocalStackError(f"cannot read the state file {path}: {exc.strerror or exc}") from exc
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise LocalStackError(
                f"the state file {path} is not valid JSON ({exc.msg} at line {exc.lineno}); it was left as is"
            ) from exc
        if not isinstance(document, dict) or document.get("format") != _STATE_FORMAT:
            raise LocalStackError(
                f"{path} is not a sagequeue local state file (format {_STATE_FORMAT}); it was left as is"
            )
        tables = document.get("tables")
        if not isinstance(tables, dict):
            raise LocalStackError(f"the state file {path} has no tables; it was left as is")
        by_id = {table.logical_id: table for table in self.spec.tables}
        unknown = sorted(set(tables) - set(by_id))
        if unknown:
            raise LocalStackError(
                f"the state file {path} holds table(s) {', '.join(unknown)} that the template does not "
                f"declare ({', '.join(sorted(by_id))}); it was left as is"
            )
        saved_at = document.get("saved_at")
        if isinstance(saved_at, str) and hasattr(self.clock, "advance_to"):
            # the queue's times stay in order: a clock that ran fast before the stop resumes where it was.
            # A virtual one resumes no sooner than a create in flight at the stop could have landed, so the
            # reconcile calls the attempts the last emulator took with it lost at once (a real clock has
            # moved on by then, or soon does).
            from sagequeue_core.defaults import INTENT_IN_FLIGHT_SECONDS

            pause = timedelta(seconds=INTENT_IN_FLIGHT_SECONDS if self.virtual else 0)
            with contextlib.suppress(ValueError):
                self.clock.advance_to(datetime.fromisoformat(saved_at) + pause)
        dynamodb = self.aws_client("dynamodb")
        for logical_id, items in tables.items():
            name = by_id[logical_id].name
            for start in range(0, len(items), 25):
                requests = [{"PutRequest": {"Item": item}} for item in items[start : start + 25]]
                pending: dict[str, Any] = {name: requests}
                while pending:
                    pending = dynamodb.batch_write_item(RequestItems=pending).get("UnprocessedItems") or {}
            self.restored[logical_id] = len(items)

    # --- configuration ------------------------------------------------------------------------------------

    def _template(self, aws_endpoint: str) -> Template:
        from sagequeue.local.template import load_template

        document = load_template(self.template_path)
        declared: Mapping[str, Any] = document.get("Parameters") or {}
        parameters: dict[str, Any] = {}
        self._direct_settings: dict[str, Any] = {}
        for key, value in self.requested_settings.items():
            name = parameter_name(key)
            if name in declared:
                parameters[name] = value
            else:
                self._direct_settings[key] = value
        if "AllowedRoleArns" in declared and "AllowedRoleArns" not in parameters:
            parameters["AllowedRoleArns"] = [self.training_role_arn]
        if "AdminRoleArns" in declared:
            admins = _as_list(parameters.get("AdminRoleArns"))
            parameters["AdminRoleArns"] = [
                *admins,
                *(a for a in self.identities.admin_arns() if a not in admins),
            ]
        if "TeamRoles" in declared and self.teams:
            given = parameters.get("TeamRoles")
            mapped = (
                [f"{arn}={team}" for arn, team in given.items()]
                if isinstance(given, Mapping)
                else _as_list(given)
            )
            for name, team in self.teams.items():
                who = self.identities[name]
                mapped.append(f"{who.role_arn or who.arn}={team}")
            parameters["TeamRoles"] = mapped
        context = StackContext(
            stack_name=self.stack_name,
            region=self.region,
            account_id=self.account_id,
            queue_url_base=aws_endpoint,
        )
        try:
            return Template(document, context, parameters, base_dir=self.template_path.parent)
        except TemplateError as exc:
            raise LocalStackError(f"{self.template_path}: {exc}") from exc

    def _settings(self, spec: StackSpec) -> Any:
        """Settings as the functions would read them from the environment the template gives them, plus the
        settings that are not stack parameters."""
        from sagequeue_core.config import Settings, env_name

        environment: dict[str, str] = {}
        for function in spec.functions.values():
            for name, value in function.environment.items():
                if name in environment and environment[name] != value and name.startswith("SAGEQUEUE_"):
                    raise LocalStackError(
                        f"functions disagree on {name} ({environment[name]!r} vs {value!r}); the local stack "
                        "runs every function with one set of settings"
                    )
                environment[name] = value
        values: dict[str, Any] = {
            field: environment[env_name(field)]
            for field in Settings.field_names()
            if env_name(field) in environment
        }
        unknown = sorted(set(self._direct_settings) - set(Settings.field_names()))
        if unknown:
            raise LocalStackError(
                f"unknown setting(s) {', '.join(unknown)}; settings are the stack parameters in snake_case: "
                + ", ".join(sorted(Settings.field_names()))
            )
        values.update(self._direct_settings)
        return Settings.build(**values)

    # --- access -------------------------------------------------------------------------------------------

    def _require(self, value: Any, what: str) -> Any:
        if value is None:
            raise LocalStackError(f"the local stack is not running: start it (or use `with`) before {what}")
        return value

    @property
    def endpoint(self) -> str:
        """The API's base URL (http://127.0.0.1:<port>)."""
        return str(self._require(self._api, "asking its endpoint").endpoint)

    @property
    def moto_endpoint(self) -> str:
        """moto's URL (http://127.0.0.1:<port>); with `aws="in-process"`, an address only this process's
        attached clients can use."""
        return str(self._require(self._aws_endpoint, "asking moto's endpoint"))

    @property
    def emulator(self) -> Any:
        """The SageMaker emulator (`sagequeue.local.SageMakerEmulator`)."""
        return self._require(self._emulator, "using the emulator")

    @property
    def sagemaker(self) -> Any:
        """A boto3 SageMaker client on the emulator."""
        if "sagemaker" not in self._clients:
            self._clients["sagemaker"] = self._attached(
                self._boto_session().client(
                    "sagemaker",
                    endpoint_url=self.emulator.endpoint_url,
                    region_name=self.region,
                    aws_access_key_id=_LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                    aws_secret_access_key=_LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                )
            )
        return self._clients["sagemaker"]

    def aws_client(self, service: str) -> Any:
        """A boto3 client of `service` on the stack's moto (dynamodb, events, sqs, sns, cloudwatch, s3)."""
        if service not in self._clients:
            endpoint = self._require(self._aws_endpoint, f"creating a {service} client")
            self._clients[service] = self._attached(
                self._boto_session().client(
                    service,
                    endpoint_url=endpoint,
                    region_name=self.region,
                    aws_access_key_id=_LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                    aws_secret_access_key=_LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                )
            )
        return self._clients[service]

    def _attached(self, client: Any) -> Any:
        """`client`, served in this process when the stack runs so (a no-op over HTTP): by the emulator
        for SageMaker, by moto for the rest."""
        if self._in_process is not None:
            # Nothing in this process checks a signature; signing is most of what botocore does per call.
            client.meta.events.register_first("choose-signer", _unsigned)
            if client.meta.service_model.service_name == "sagemaker":
                self.emulator.attach(client)
            else:
                self._in_process.attach(client)
        return client

    def _boto_session(self) -> Any:
        return _shared_session()

    def identity(self, name: str = DEFAULT_IDENTITY) -> Identity:
        return self.identities[name]

    def client(self, identity: str = DEFAULT_IDENTITY, **options: Any) -> Any:
        """A `sagequeue.client.QueueClient` on this stack's API, signing as the named local identity
        (`user`, `other` or `admin`)."""
        from sagequeue.client import QueueClient

        who = self.identities[identity]
        return QueueClient(
            endpoint=self.endpoint,
            region=self.region,
            credentials=(who.access_key_id, who.secret_access_key),
            **options,
        )

    def connection(self, identity: str = DEFAULT_IDENTITY) -> Any:
        """What `sagequeue local` saves so other processes find this stack."""
        from sagequeue.config import LocalConnection

        who = self.identities[identity]
        return LocalConnection(
            endpoint=self.endpoint,
            region=self.region,
            access_key_id=who.access_key_id,
            secret_access_key=who.secret_access_key,
            sagemaker_endpoint=self.emulator.endpoint_url,
            # in process, moto has no address another process can use
            aws_endpoint=self.moto_endpoint if self._in_process is None else None,
            job_notices_topic_arn=(self.spec.outputs.get("JobNoticesTopicArn") if self.spec else None),
            pid=os.getpid(),
        )

    def now(self) -> datetime:
        return self.clock.now()

    @property
    def invocations(self) -> dict[str, int]:
        """Handler invocations per function (logical id) since start."""
        return dict(self._require(self._host, "counting invocations").invocations)

    @property
    def failures(self) -> list[Any]:
        """Events a function failed on after its retries."""
        return list(self._require(self._router, "listing failures").failures)

    # --- time and events ----------------------------------------------------------------------------------

    def run_until_idle(self) -> int:
        """Deliver every pending event to the functions, and the events those cause, until nothing is left.
        Returns how many were delivered. On a virtual clock, time does not move."""
        router = self._require(self._router, "delivering events")
        delivered = int(router.drain())
        self._check_failures()
        return delivered

    def advance(self, seconds: float) -> datetime:
        """Move the virtual clock forward by `seconds`, stopping at every moment something falls due (a
        SageMaker step, a schedule, an alarm evaluation) to deliver what it caused. Returns the new time."""
        if not self.virtual:
            raise LocalStackError("advance() needs the virtual clock; this stack runs on a real clock")
        if seconds < 0:
            raise ValueError(f"cannot advance by a negative time ({seconds} s)")
        emulator = self.emulator
        router = self._router
        self.run_until_idle()
        target = self.clock.now() + timedelta(seconds=seconds)
        while True:
            now = self.clock.now()
            candidates = [target]
            for due in (emulator.next_due(), router.next_schedule_due(), self._next_alarm_evaluation):
                if due is not None:
                    candidates.append(max(due, now))
            step_to = min(candidates)
            emulator.advance((step_to - now).total_seconds())
            self._on_time(step_to)
            if step_to >= target:
                return self.clock.now()

    def tick_beside(self, function: str = "SchedulerFunction") -> Any:
        """Run `function`'s schedule (the scheduler's one-minute timer by default) now, in this thread, even
        while an invocation of it is under way: two scheduler passes at once, which its reserved
        concurrency of 1 makes rare on Lambda, not impossible (an invocation timed out while its
        CreateTrainingJob was in flight, then retried). Returns what the handler returns; the events it
        causes are delivered by the next `run_until_idle()`."""
        router = self._require(self._router, "running a schedule")
        return router.tick_beside(function, self.clock.now())

    def _on_time(self, now: datetime) -> None:
        """Everything due at `now`: schedules, alarm evaluations, and the events they cause."""
        self._router.fire_due_schedules(now)
        if self._next_alarm_evaluation is not None and now >= self._next_alarm_evaluation:
            # Alarm actions publish to SNS; their events wait in the queues for the drain below.
            self.run_until_idle()
            self._alarms.run(now)
            self._next_alarm_evaluation = _next_minute(now)
        self.run_until_idle()

    def evaluate_alarms(self) -> list[Any]:
        """Evaluate every alarm now (as CloudWatch does each minute) and deliver what their actions cause."""
        evaluator = self._require(self._alarms, "evaluating alarms")
        changes = list(evaluator.run(self.clock.now()))
        self.run_until_idle()
        return changes

    def _check_failures(self) -> None:
        failures = self._router.failures
        if len(failures) > self._failures_seen:
            new = failures[self._failures_seen :]
            self._failures_seen = len(failures)
            if self.raise_function_errors:
                described = "; ".join(f"{f.function}: {f.error}" for f in new)
                raise FunctionFailed(f"{len(new)} event(s) failed after retries: {described}")

    def _pump_forever(self) -> None:
        """On a real clock: fire schedules and evaluate alarms as they fall due, and deliver events."""
        _parse_jsonpaths_once()
        while not self._stopping.wait(self.poll_interval):
            try:
                now = self.clock.now()
                self._on_time(now)
            except Exception:  # the pump must outlive one failing event
                logger.exception("local stack: delivering events failed")

    def __repr__(self) -> str:
        where = self._api.endpoint if self._api is not None else "stopped"
        return f"LocalStack({where}, account {self.account_id}, clock {self.clock!r})"


class _BelowWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


#: what every LogRecord carries; anything else on a record is a key a function logged with it
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class _ReadableRecord(logging.Formatter):
    """A function's warning as one line a person reads: `<function> WARNING: <message> (key=value, ...)`,
    with the keys it was logged with and an exception as its type and message (no JSON, no traceback)."""

    def __init__(self, handler: logging.Handler) -> None:
        super().__init__()
        self.handler = handler

    def _function(self, record: logging.LogRecord) -> str:
        # Powertools keeps the invocation's keys (function_name among them) in the handler's formatter
        keys = getattr(self.handler.formatter, "log_format", None) or {}
        name = str(keys.get("function_name") or record.name)
        # `<stack>-<logical id>-<suffix>`, as the local stack names functions: the logical id says which
        parts = name.split("-")
        return parts[-2] if len(parts) >= 3 else name

    def format(self, record: logging.LogRecord) -> str:
        keys = {
            name: value
            for name, value in vars(record).items()
            if name not in _RECORD_ATTRIBUTES and not name.startswith("_") and value not in (None, "")
        }
        line = f"{self._function(record)} {record.levelname}: {record.getMessage()}"
        if keys:
            line += " (" + ", ".join(f"{name}={value}" for name, value in sorted(keys.items())) + ")"
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            line += f": {type(error).__name__}: {' '.join(str(error).split())}"
        return line


class _FunctionStdout(io.TextIOBase):
    """stdout that drops what a function prints while it runs (its EMF metric documents) and passes
    everything else through."""

    def __init__(self, target: TextIO) -> None:
        self.target = target

    def write(self, text: str) -> int:
        from sagequeue.local.router import current_function

        if current_function() is not None:
            return len(text)
        return self.target.write(text)

    def flush(self) -> None:
        self.target.flush()

    def isatty(self) -> bool:
        return self.target.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self.target, "encoding", "utf-8"))

    def fileno(self) -> int:
        return self.target.fileno()


def _next_minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0) + timedelta(minutes=1)


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return [str(item) for item in value]


def _unsigned(**_: Any) -> Any:
    from botocore import UNSIGNED

    return UNSIGNED


def _parse_jsonpaths_once() -> None:
    """moto's EventBridge parses the JSON paths of its input template for every event and target it
    delivers, and jsonpath_ng builds a new parser (a yacc table) for each parse: most of a PutEvents. The
    paths are a handful of constants and a parsed path is never changed by use, so each is parsed once."""
    try:
        import jsonpath_ng.ext as jsonpath
    except ImportError:
        return
    if not hasattr(jsonpath.parse, "cache_info"):
        jsonpath.parse = functools.lru_cache(maxsize=256)(jsonpath.parse)
