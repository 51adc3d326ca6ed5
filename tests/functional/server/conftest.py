"""The queue on real parts: the api and scheduler handlers, moto's server over HTTP (the table from
template.yaml, EventBridge with the template's QueueChanged rule feeding an SQS queue) and the SageMaker
emulator on a virtual clock. SageMaker's events are collected and handed to the scheduler the way
EventBridge would, so tests can also duplicate, drop or reorder them."""

from __future__ import annotations

import importlib.util
import json
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3
import pytest
from botocore.config import Config

from sagequeue.local import SageMakerEmulator, VirtualClock
from sagequeue.local.emulator import Kinder, aws_options
from sagequeue.local.template import load_template
from sagequeue_core import runtime
from sagequeue_core.config import Settings

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support.cfn_template import create_table

ROOT = Path(__file__).resolve().parents[3]
START = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
ACCOUNT = "123456789012"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/SageMakerTraining"
SUBMITTER = f"arn:aws:sts::{ACCOUNT}:assumed-role/ResearchTeam/research-session"
SUBMITTER_ROLE = f"arn:aws:iam::{ACCOUNT}:role/ResearchTeam"  # what the queue records as its owner
OTHER_USER = f"arn:aws:iam::{ACCOUNT}:user/other-user"
ADMIN = f"arn:aws:iam::{ACCOUNT}:role/QueueAdmin"
TRN1 = "ml.trn1.32xlarge"
TRN2 = "ml.trn2.48xlarge"
#: Phase lengths (simulated seconds); the stop grace is SageMaker's 120 s (the AWS profile's).
TIMINGS: dict[str, Any] = {
    "provisioning_seconds": 120,
    "warm_start_seconds": 10,
    "download_seconds": 30,
    "upload_seconds": 20,
    "default_duration_seconds": 600,
    "capacity_error_after_seconds": 900,
}


def plan_arn(pool: str) -> str:
    """The training plan ARN of a `plan:<name>` pool."""
    return f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:training-plan/{pool.split(':', 1)[1]}"


def aws_emulator(
    clock: VirtualClock,
    capacity: dict[str, int],
    *,
    region_capacity: dict[str, int] | None = None,
    warm_pool_quota: dict[str, int] | None = None,
    kinder: Kinder | None = None,
    **options: Any,
) -> SageMakerEmulator:
    """The SageMaker emulator as AWS documents it (profiles.aws_options), for the queue's pools `capacity`:
    the region can launch what the instance-type pools hold (`region_capacity` sets less or more), the
    warm-pool quota is 0 unless `warm_pool_quota` raises it, and each `plan:<name>` pool is a training plan
    registered with its instances. Anything kinder needs `kinder=Kinder(reason, departures...)`."""
    region = {TRN1: 0, TRN2: 0, **{p: n for p, n in capacity.items() if not p.startswith("plan:")}}
    region.update(region_capacity or {})
    emulator = SageMakerEmulator(
        **aws_options(
            region_capacity=region, warm_pool_quota=warm_pool_quota, clock=clock, kinder=kinder, **options
        )
    )
    for pool, instances in capacity.items():
        if pool.startswith("plan:"):
            emulator.add_training_plan(plan_arn(pool), instances)
    return emulator


def load_handler(function: str) -> ModuleType:
    """functions/<function>/app.py as Lambda loads it (the folder is the code's root, not a package)."""
    path = ROOT / "functions" / function / "app.py"
    spec = importlib.util.spec_from_file_location(f"sagequeue_function_{function}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class LambdaContext:
    function_name: str = "sagequeue-test"
    memory_limit_in_mb: int = 512
    invoked_function_arn: str = f"arn:aws:lambda:us-east-1:{ACCOUNT}:function:sagequeue-test"
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))


def training_request(
    name: str,
    *,
    priority: int | None = None,
    duration: int = 600,
    instance_type: str = TRN1,
    count: int = 1,
    role: str = ROLE,
    outcome: str | None = None,
    tags: dict[str, str] | None = None,
    volume: int = 100,
    keep_alive: int | None = None,
) -> dict[str, Any]:
    """A CreateTrainingJob request shaped like the SageMaker SDK's, with the emulator's behaviour knobs."""
    environment = {"SAGEQUEUE_SIM_DURATION": str(duration)}
    if outcome:
        environment["SAGEQUEUE_SIM_OUTCOME"] = outcome
    body: dict[str, Any] = {
        "TrainingJobName": name,
        "RoleArn": role,
        "AlgorithmSpecification": {
            "TrainingImage": f"{ACCOUNT}.dkr.ecr.us-east-1.amazonaws.com/neuron-train:2.21",
            "TrainingInputMode": "File",
        },
        "OutputDataConfig": {"S3OutputPath": "s3://sagequeue-test/output"},
        "ResourceConfig": {"InstanceType": instance_type, "InstanceCount": count, "VolumeSizeInGB": volume},
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
        "CheckpointConfig": {"S3Uri": f"s3://sagequeue-test/checkpoints/{name}"},
        "Environment": environment,
        "Tags": [{"Key": k, "Value": v} for k, v in (tags or {"team": "research"}).items()],
    }
    if keep_alive is not None:
        body["ResourceConfig"]["KeepAlivePeriodInSeconds"] = keep_alive
    if priority is not None:
        body["priority"] = priority
    return body


@dataclass
class QueueWorld:
    clock: VirtualClock
    emulator: SageMakerEmulator
    deps: runtime.Dependencies
    api_module: ModuleType
    scheduler_module: ModuleType
    sqs: Any
    queue_url: str
    audit_url: str
    sagemaker_events: list[dict[str, Any]] = field(default_factory=list)
    published: list[dict[str, Any]] = field(default_factory=list)
    reports: list[dict[str, Any]] = field(default_factory=list)
    last_tick: datetime | None = None
    #: what EventBridge does to SageMaker's events on their way (reorder, duplicate, lose); None: nothing
    mangle: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None

    # --- the API ---------------------------------------------------------------------------------------------

    def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        caller: str | None = SUBMITTER,
        query: dict[str, str] | None = None,
        raw_body: str | None = None,
    ) -> tuple[int, Any]:
        """Call the api handler with an API Gateway REST proxy event, as the IAM-authorised API would."""
        text = raw_body if raw_body is not None else (json.dumps(body) if body is not None else None)
        event = {
            "resource": path,
            "path": path,
            "httpMethod": method,
            "headers": {"content-type": "application/json"},
            "multiValueHeaders": {"content-type": ["application/json"]},
            "queryStringParameters": query,
            "multiValueQueryStringParameters": {k: [v] for k, v in query.items()} if query else None,
            "pathParameters": None,
            "stageVariables": None,
            "requestContext": {
                "resourcePath": path,
                "httpMethod": method,
                "path": f"/v1{path}",
                "stage": "v1",
                "requestId": str(uuid.uuid4()),
                "accountId": ACCOUNT,
                "apiId": "testapi",
                "identity": {"userArn": caller, "caller": caller, "accountId": ACCOUNT},
            },
            "body": text,
            "isBase64Encoded": False,
        }
        answer = self.api_module.handler(event, LambdaContext())
        payload = json.loads(answer["body"]) if answer.get("body") else None
        self.forward_queue_events()
        return answer["statusCode"], payload

    def submit(self, name: str, *, caller: str = SUBMITTER, **kwargs: Any) -> dict[str, Any]:
        status, body = self.api("POST", "/jobs", training_request(name, **kwargs), caller=caller)
        assert status == 201, body
        return body

    def job(self, name: str) -> dict[str, Any]:
        status, body = self.api("GET", f"/jobs/{name}")
        assert status == 200, body
        return body

    def state(self, name: str) -> str:
        return str(self.job(name)["state"])

    # --- the scheduler's triggers -----------------------------------------------------------------------------

    def schedule(self, event: dict[str, Any]) -> dict[str, Any]:
        report: dict[str, Any] = self.scheduler_module.handler(event, LambdaContext())
        self.reports.append(report)
        return report

    def timer(self) -> dict[str, Any]:
        return self.schedule(
            {
                "version": "0",
                "id": str(uuid.uuid4()),
                "detail-type": "Scheduled Event",
                "source": "aws.events",
                "account": ACCOUNT,
                "time": self.clock.now().strftime("%Y-%m-%dT%H:%M:%SZ"),
                "region": "us-east-1",
                "resources": [f"arn:aws:events:us-east-1:{ACCOUNT}:rule/reconcile"],
                "detail": {},
            }
        )

    def forward_queue_events(self) -> None:
        """Deliver what the template's QueueChanged rule routed from sagequeue's bus to the scheduler."""
        while True:
            messages = self.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10).get(
                "Messages", []
            )
            if not messages:
                return
            for message in messages:
                self.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"])
                event = json.loads(message["Body"])
                self.published.append(event)
                self.schedule(event)

    def audit(self) -> list[tuple[str, dict[str, Any]]]:
        """(detail-type, detail) of every event sagequeue published since the last call, in order."""
        seen: list[dict[str, Any]] = []
        while True:
            messages = self.sqs.receive_message(QueueUrl=self.audit_url, MaxNumberOfMessages=10).get(
                "Messages", []
            )
            if not messages:
                break
            for message in messages:
                self.sqs.delete_message(QueueUrl=self.audit_url, ReceiptHandle=message["ReceiptHandle"])
                seen.append(json.loads(message["Body"]))
        seen.sort(key=lambda e: e["time"])  # stable: equal times keep the order they were put in
        return [(e["detail-type"], e["detail"]) for e in seen]

    def take_sagemaker_events(self) -> list[dict[str, Any]]:
        self.emulator.deliver_pending()  # late, repeated, reordered: only the wait is cut short
        taken, self.sagemaker_events[:] = list(self.sagemaker_events), []
        return taken

    def deliver(self, events: list[dict[str, Any]] | None = None) -> None:
        """Hand SageMaker's events (those collected, or `events`) to the scheduler, each as one invocation;
        its own actions may cause more, which are delivered too."""
        pending = events if events is not None else self.take_sagemaker_events()
        while pending:
            if self.mangle is not None and events is None:
                pending = self.mangle(pending)
            for event in pending:
                self.schedule(event)
            self.forward_queue_events()
            pending = self.take_sagemaker_events()
            events = None

    def run(self, seconds: float, step: float = 30) -> None:
        """Let `seconds` of virtual time pass, delivering events as they happen; the reconcile timer ticks
        once a virtual minute, as its rate(1 minute) schedule would."""
        elapsed = 0.0
        while elapsed < seconds:
            self.emulator.advance(step)
            elapsed += step
            self.deliver()
            if self.last_tick is None or (self.clock.now() - self.last_tick).total_seconds() >= 60:
                self.last_tick = self.clock.now()
                self.timer()
                self.deliver()

    def run_until(self, done: Callable[[], bool], limit: float = 6 * 3600, step: float = 30) -> float:
        elapsed = 0.0
        while not done():
            assert elapsed < limit, f"not done after {limit} simulated seconds"
            self.run(step, step)
            elapsed += step
        return elapsed

    def sagemaker(self) -> Any:
        """A SageMaker client of the test's own (what a person with the console would see)."""
        return self.deps.sagemaker.client


def make_world(
    moto_endpoint: str | None,
    *,
    capacity: dict[str, int] | None = None,
    settings: dict[str, Any] | None = None,
    instance_limits: dict[str, int] | None = None,
    timings: dict[str, Any] | None = None,
    region_capacity: dict[str, int] | None = None,
    warm_pool_quota: dict[str, int] | None = None,
    kinder: Kinder | None = None,
    seed: int = 0,
) -> Iterator[QueueWorld]:
    """A world on moto's server at `moto_endpoint`, or, with None, on AWS's own endpoints for moto's
    in-process mock (`moto.mock_aws`, started by the caller) to answer: the same backends without HTTP, for
    benchmarks that run hundreds of worlds. SageMaker is the emulator as AWS documents it (`aws_emulator`:
    `region_capacity`, `warm_pool_quota`, and `kinder` for a test that needs less than AWS)."""
    suffix = uuid.uuid4().hex[:8]
    region = "us-east-1"
    dynamodb = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name=region)
    table = create_table(dynamodb, f"sagequeue-{suffix}")
    events = boto3.client("events", endpoint_url=moto_endpoint, region_name=region)
    bus = f"sagequeue-{suffix}"
    events.create_event_bus(Name=bus)
    sqs = boto3.client("sqs", endpoint_url=moto_endpoint, region_name=region)
    queue_url = sqs.create_queue(QueueName=f"scheduler-{suffix}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    # The scheduler's own trigger exactly as the template declares it.
    pattern = load_template(ROOT / "template.yaml")["Resources"]["SchedulerFunction"]["Properties"]["Events"][
        "QueueChanged"
    ]["Properties"]["Pattern"]
    events.put_rule(Name=f"queue-changed-{suffix}", EventBusName=bus, EventPattern=json.dumps(pattern))
    events.put_targets(
        Rule=f"queue-changed-{suffix}", EventBusName=bus, Targets=[{"Id": "scheduler", "Arn": queue_arn}]
    )
    # Everything sagequeue publishes, as a user's rule on the bus would see it.
    audit_url = sqs.create_queue(QueueName=f"audit-{suffix}")["QueueUrl"]
    audit_arn = sqs.get_queue_attributes(QueueUrl=audit_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    events.put_rule(
        Name=f"audit-{suffix}", EventBusName=bus, EventPattern=json.dumps({"source": ["sagequeue"]})
    )
    events.put_targets(Rule=f"audit-{suffix}", EventBusName=bus, Targets=[{"Id": "audit", "Arn": audit_arn}])
    clock = VirtualClock(START)
    collected: list[dict[str, Any]] = []
    pools = capacity if capacity is not None else {TRN1: 2}
    emulator = aws_emulator(
        clock,
        {p: n for p, n in pools.items() if isinstance(n, int)},
        region_capacity=region_capacity,
        warm_pool_quota=warm_pool_quota,
        kinder=kinder,
        seed=seed,
        on_event=collected.append,
        instance_limits=instance_limits,
        **(timings or TIMINGS),
    )
    emulator.start()
    values: dict[str, Any] = {
        "table_name": table,
        "event_bus_name": bus,
        "capacity": pools,
        "allowed_role_arns": (ROLE,),
        "admin_role_arns": (ADMIN,),
        "min_runtime_before_preemption_seconds": 0,
        "default_keep_alive_seconds": 0,
        "retry_backoff_seconds": 60,
    }
    values.update(settings or {})
    deps = runtime.build(
        Settings.build(**values),
        clock=clock,
        endpoints={
            **(
                {"dynamodb": moto_endpoint, "events": moto_endpoint, "s3": moto_endpoint}
                if moto_endpoint
                else {}
            ),
            "sagemaker": emulator.endpoint_url,
        },
        region=region,
        # botocore's own retries sleep in real time; the scheduler's handling of a refusal is under test
        clients={"sagemaker": emulator.client(config=Config(retries={"total_max_attempts": 1}))},
    )
    runtime.install(deps)
    world = QueueWorld(
        clock=clock,
        emulator=emulator,
        deps=deps,
        api_module=load_handler("api"),
        scheduler_module=load_handler("scheduler"),
        sqs=sqs,
        queue_url=queue_url,
        audit_url=audit_url,
        sagemaker_events=collected,
    )
    try:
        yield world
    finally:
        runtime.reset()
        emulator.stop()


@pytest.fixture
def world(moto_endpoint: str) -> Iterator[QueueWorld]:
    yield from make_world(moto_endpoint)
