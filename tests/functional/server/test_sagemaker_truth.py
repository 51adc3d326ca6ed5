"""The queue stays true to SageMaker: each scenario where it used to lose track (late events re-tracking a
reused warm pool, SageMaker picking another pool than the one named, a cancel or hold racing a pass, an item
growing without bound, a crash or a lagging index between steps, a job stopped or a table lost outside
sagequeue) runs on the local stack with an invariant monitor checking SageMaker's side after every
SageMaker operation."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import ADMIN, ROLE, START, SUBMITTER, TRN1, QueueWorld, make_world, training_request

from sagequeue.local.emulator.events import state_change_event
from sagequeue_core.defaults import ATTEMPT_TAG, JOB_TAG, SEAL_TAG
from sagequeue_core.domain import UNVERIFIED_OWNER, InvalidTransition, Job, JobState, attempt_name
from sagequeue_core.service import jobs
from sagequeue_core.store import TrackedWarmPool

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from support.cfn_template import create_table
from support.delivery import AdversarialDelivery
from support.invariants import InvariantMonitor, advance, monitored

#: The account raised its warm-pool quota (AWS's default, 0, retains no pool): these tests are about pools.
RAISED = {TRN1: 3}


def _event_now(world: QueueWorld, name: str) -> dict[str, Any]:
    """SageMaker's state-change event for `name` as it would be sent now (to deliver later, or twice)."""
    tags = world.emulator.backend._jobs[name].tags
    return state_change_event(
        world.emulator.backend.describe(name),
        tags,
        world.clock.now(),
        region="us-east-1",
        account_id="123456789012",
    )


@pytest.fixture
def one_trn1(moto_endpoint: str) -> Iterator[tuple[QueueWorld, InvariantMonitor]]:
    yield from monitored(make_world(moto_endpoint, capacity={TRN1: 1}, warm_pool_quota=RAISED))


@pytest.fixture
def two_trn1(moto_endpoint: str) -> Iterator[tuple[QueueWorld, InvariantMonitor]]:
    yield from monitored(make_world(moto_endpoint, capacity={TRN1: 2}, warm_pool_quota=RAISED))


@pytest.fixture
def three_trn1(moto_endpoint: str) -> Iterator[tuple[QueueWorld, InvariantMonitor]]:
    yield from monitored(make_world(moto_endpoint, capacity={TRN1: 3}, warm_pool_quota=RAISED))


# --- 1. warm pools -------------------------------------------------------------------------------------------


def test_a_late_stopped_event_does_not_bring_back_a_reused_warm_pool(
    one_trn1: tuple[QueueWorld, InvariantMonitor],
) -> None:
    world, monitor = one_trn1
    # GIVEN a finished job's warm pool, reused by the next job of the same key
    world.submit("first", duration=120, keep_alive=900)
    advance(world, monitor, until=lambda: world.state("first") == "completed")
    advance(world, monitor, 30)
    late = _event_now(world, "first")
    assert late["detail"]["WarmPoolStatus"]["Status"] == "Available"
    world.submit("second", duration=1200)
    assert world.sagemaker().describe_training_job(TrainingJobName="first")["WarmPoolStatus"]["Status"] != (
        "Available"
    )
    # WHEN the first job's end event, which still says Available, arrives again late (twice), and a third
    # job of the same key is waiting
    world.submit("third", duration=120)
    world.deliver([late, late])
    advance(world, monitor, 120)

    # THEN the pool is not counted again, nothing is started "warm" on it, and SageMaker holds 1 instance
    assert world.state("third") == "queued"
    status, pools = world.api("GET", "/pools")
    assert status == 200
    assert pools["pools"][0]["warm"] == 0
    assert monitor.violations == []
    advance(world, monitor, until=lambda: world.state("third") == "completed")
    assert monitor.violations == []


def test_a_start_planned_on_a_pool_that_is_gone_is_deferred_not_made_cold(
    two_trn1: tuple[QueueWorld, InvariantMonitor],
) -> None:
    world, monitor = two_trn1
    # GIVEN a warm pool already reused on SageMaker ("second" runs on it)
    world.submit("first", duration=60, keep_alive=1800)
    advance(world, monitor, until=lambda: world.state("first") == "completed")
    advance(world, monitor, 30)
    world.submit("second", duration=3600)
    advance(world, monitor, 60)
    pool = world.sagemaker().describe_training_job(TrainingJobName="first")["WarmPoolStatus"]
    assert pool["Status"] == "Reused"
    key = world.deps.store.get_job("first").resource_key
    assert key is not None
    phantom = TrackedWarmPool("first", key, world.clock.now() + timedelta(minutes=30), "first")
    # WHEN, twice, a late event brings the reused pool back (while Describe still leaves WarmPoolStatus out,
    # nothing tells it apart from an Available one) just before a job of its key is submitted
    for name in ("third", "fourth"):
        world.deps.store.track_warm_pool(phantom)
        world.submit(name, duration=3600)
        advance(world, monitor, 60)
    # THEN no start planned on the phantom becomes a cold start the ledger did not count: SageMaker never
    # holds more than the pool's 2 instances, and one of the two waits for capacity
    assert monitor.violations == []
    assert world.emulator.instances_in_use()[TRN1] == 2
    states = sorted([world.state("third"), world.state("fourth")])
    assert states[0] == "queued"
    assert states[1] in ("starting", "running")
    assert world.deps.store.warm_pools() == []


def test_sagemaker_choosing_another_same_key_pool_is_followed(
    three_trn1: tuple[QueueWorld, InvariantMonitor],
) -> None:
    world, monitor = three_trn1
    # GIVEN two Available pools of one key (p1 older than p2)
    world.submit("p1", duration=60, keep_alive=1800)
    advance(world, monitor, 60)
    world.submit("p2", duration=60, keep_alive=1800)
    advance(world, monitor, until=lambda: world.state("p2") == "completed")
    advance(world, monitor, 30)
    held = world.emulator.instances_in_use()[TRN1]
    assert held == 2

    # WHEN a job of that key and two of another key are submitted
    world.submit("warm", duration=1200)
    world.submit("cold1", duration=1200, volume=500)
    world.submit("cold2", duration=1200, volume=500)
    advance(world, monitor, 180)

    # THEN the queue knows which pool SageMaker gave and keeps the other counted: one cold job waits
    warm = world.job("warm")
    donor = world.sagemaker().describe_training_job(TrainingJobName="p1")["WarmPoolStatus"]
    assert donor.get("ReusedByJob") == "warm", "SageMaker takes the oldest pool"
    assert warm["history"][1]["reason"] == "on warm pool of p1"
    p2 = world.sagemaker().describe_training_job(TrainingJobName="p2")["WarmPoolStatus"]["Status"]
    waiting = [world.state("cold1"), world.state("cold2")].count("queued")
    # the other pool is either still held (one cold job waits) or released for the second cold job
    assert (p2, waiting) in (("Available", 1), ("Terminated", 0))
    assert world.emulator.instances_in_use()[TRN1] == 3
    assert monitor.violations == []
    reused = [detail["warm_pool_of"] for kind, detail in world.audit() if kind == "WarmPoolReused"]
    assert reused == ["p1"]


def test_the_reconcile_adopts_an_available_pool_nobody_tracks(
    one_trn1: tuple[QueueWorld, InvariantMonitor],
) -> None:
    world, monitor = one_trn1
    # GIVEN a warm pool SageMaker holds that the queue lost track of (its tracking item lost)
    world.submit("first", duration=60, keep_alive=1800)
    advance(world, monitor, until=lambda: world.state("first") == "completed")
    assert world.deps.store.forget_warm_pool("first")
    # WHEN the timer reconciles
    report = world.timer()
    # THEN the Available pool is counted again
    assert "first: untracked warm pool adopted" in report["applied"]
    assert [w.training_job_name for w in world.deps.store.warm_pools()] == ["first"]
    # and a job of another key gets the instance only once the pool is released
    world.submit("other", duration=60, volume=500)
    advance(world, monitor, until=lambda: world.state("other") == "completed")
    assert world.sagemaker().describe_training_job(TrainingJobName="first")["WarmPoolStatus"]["Status"] == (
        "Terminated"
    )
    assert monitor.violations == []


# --- 2. cancel and hold racing the pass ------------------------------------------------------------------------


@contextlib.contextmanager
def before_sagemaker(world: QueueWorld, operation: str, action: Any) -> Iterator[None]:
    """Run `action` once, just before the scheduler's next `operation` reaches SageMaker."""
    client = world.deps.sagemaker.client
    done: list[bool] = []

    def hook(**_: Any) -> None:
        if not done:
            done.append(True)
            action()

    client.meta.events.register(f"before-call.sagemaker.{operation}", hook)
    try:
        yield
    finally:
        client.meta.events.unregister(f"before-call.sagemaker.{operation}", hook)


def test_a_cancel_between_the_pass_and_its_create_stops_what_was_created(
    one_trn1: tuple[QueueWorld, InvariantMonitor],
) -> None:
    world, monitor = one_trn1
    # GIVEN the user cancels the job after the pass decided to start it, before CreateTrainingJob
    with before_sagemaker(world, "CreateTrainingJob", lambda: jobs.cancel(world.deps, "racy", SUBMITTER)):
        world.submit("racy", duration=3600)
    world.submit("next", duration=120)

    # THEN the attempt that was created is stopped, the job ends cancelled and the instance is free again
    advance(world, monitor, until=lambda: world.state("racy") == "cancelled")
    assert world.sagemaker().describe_training_job(TrainingJobName="racy")["TrainingJobStatus"] in (
        "Stopping",
        "Stopped",
    )
    advance(world, monitor, until=lambda: world.state("next") == "completed")
    assert world.sagemaker().describe_training_job(TrainingJobName="racy")["TrainingJobStatus"] == "Stopped"
    assert monitor.violations == []


def test_a_hold_that_wins_the_race_leaves_nothing_to_start(
    one_trn1: tuple[QueueWorld, InvariantMonitor],
) -> None:
    world, monitor = one_trn1
    store = world.deps.store.client
    done: list[bool] = []

    def hold_first(**_: Any) -> None:
        # the first transaction on the job once it exists is the pass's intent; the hold goes first
        if not done and world.deps.store.find_job("racy") is not None:
            done.append(True)
            jobs.change(world.deps, "racy", SUBMITTER, held=True)

    store.meta.events.register("before-call.dynamodb.TransactWriteItems", hold_first)
    try:
        status, _ = world.api("POST", "/jobs", training_request("racy", duration=3600))
    finally:
        store.meta.events.unregister("before-call.dynamodb.TransactWriteItems", hold_first)
    assert status == 201
    assert done
    advance(world, monitor, 300)
    assert world.state("racy") == "held"
    names = [s["TrainingJobName"] for s in world.sagemaker().list_training_jobs()["TrainingJobSummaries"]]
    assert "racy" not in names
    assert monitor.violations == []


def test_a_hold_that_loses_the_race_is_refused(one_trn1: tuple[QueueWorld, InvariantMonitor]) -> None:
    world, monitor = one_trn1
    refused: list[Exception] = []

    def hold() -> None:
        try:
            jobs.change(world.deps, "racy", SUBMITTER, held=True)
        except InvalidTransition as exc:
            refused.append(exc)

    with before_sagemaker(world, "CreateTrainingJob", hold):
        world.submit("racy", duration=120)
    assert refused, "the start was recorded first: a hold can no longer apply"
    advance(world, monitor, until=lambda: world.state("racy") == "completed")
    assert monitor.violations == []


def test_a_create_sagemaker_throttles_puts_the_job_back_and_the_next_start_uses_a_new_name(
    one_trn1: tuple[QueueWorld, InvariantMonitor],
) -> None:
    world, monitor = one_trn1
    # GIVEN SageMaker throttles the first CreateTrainingJob (the intent was already written)
    world.emulator.fail_next("CreateTrainingJob", "ThrottlingException")
    world.submit("throttled", duration=60)
    # THEN the intent is undone: the job waits, saying why
    job = world.job("throttled")
    assert job["state"] == "queued"
    assert job["reason"].startswith("SageMaker ThrottlingException")
    # and the next start uses the next attempt's name, so a create that went through anyway is never reused
    advance(world, monitor, until=lambda: world.state("throttled") == "completed")
    assert world.job("throttled")["training_job_name"] == attempt_name("throttled", 2)
    assert monitor.violations == []


def test_the_sweep_stops_an_attempt_of_ours_that_is_not_current(
    one_trn1: tuple[QueueWorld, InvariantMonitor],
) -> None:
    world, monitor = one_trn1
    world.submit("owner", duration=1200)
    advance(world, monitor, 60)
    # GIVEN a training job named, tagged and sealed as another attempt of the job (a create that answered an
    # error but went through), whose events are lost
    world.mangle = lambda events: []
    seal = world.deps.store.get_job("owner").seal("owner-7")
    assert seal is not None
    tags = {JOB_TAG: "owner", ATTEMPT_TAG: "7", SEAL_TAG: seal}
    request = training_request("owner-7", duration=1200, tags=tags)
    request.pop("priority", None)
    world.sagemaker().create_training_job(**request)
    # AND one tagged as an attempt of the job by someone else: without the seal, which only the scheduler
    # can make
    forged = training_request("owner-8", duration=1200, tags={JOB_TAG: "owner", ATTEMPT_TAG: "8"})
    forged.pop("priority", None)
    world.sagemaker().create_training_job(**forged)
    world.deliver()
    world.mangle = None
    # WHEN the timer reconciles
    world.timer()
    # THEN ours is stopped within that one period, and the other one is not the queue's to stop
    assert world.sagemaker().describe_training_job(TrainingJobName="owner-7")["TrainingJobStatus"] in (
        "Stopping",
        "Stopped",
    )
    assert world.sagemaker().describe_training_job(TrainingJobName="owner-8")["TrainingJobStatus"] == (
        "InProgress"
    )
    assert world.job("owner")["training_job_name"] == "owner"


# --- 3. bounded items, poisoned items ---------------------------------------------------------------------


def _item_bytes(world: QueueWorld, name: str) -> int:
    raw = world.deps.store.client.get_item(
        TableName=world.deps.store.table_name, Key={"pk": {"S": f"JOB#{name}"}, "sk": {"S": "JOB"}}
    )["Item"]
    # DynamoDB's item size: attribute names plus values (an upper bound for numbers)
    return sum(len(key) + len(json.dumps(value)) for key, value in raw.items())


@pytest.fixture
def one_trn1_no_budget(moto_endpoint: str) -> Iterator[tuple[QueueWorld, InvariantMonitor]]:
    # MaxPreemptionsPerJob 0: no budget, so a job preempted thousands of times may be preempted again
    yield from monitored(
        make_world(
            moto_endpoint, capacity={TRN1: 1}, settings={"max_preemptions_per_job": 0}, warm_pool_quota=RAISED
        )
    )


def _seconds_in_training(world: QueueWorld, training_job_name: str) -> int:
    """What SageMaker (the emulator's own record) says the attempt spent in its Training phase."""
    record = world.emulator.backend._jobs[training_job_name]
    spans = [t for t in record.transitions if t["Status"] == "Training"]
    return sum(round((t.get("EndTime", record.training_end) - t["StartTime"]).total_seconds()) for t in spans)


def test_a_job_preempted_5000_times_keeps_a_small_item_and_exact_counters(
    one_trn1_no_budget: tuple[QueueWorld, InvariantMonitor],
) -> None:
    world, monitor = one_trn1_no_budget
    # GIVEN a job that waits behind another, whose 4,997 earlier attempts were each preempted after 60 s of
    # training (recorded as the scheduler records an end: the move, the counters, the history entries)
    world.submit("blocker", duration=300, priority=5)
    world.submit("veteran", duration=3600, priority=1)
    job = world.deps.store.get_job("veteran")
    assert job.state is JobState.QUEUED
    moment = START
    for attempt in range(1, 4998):
        job.attempt = attempt
        for state in (JobState.STARTING, JobState.RUNNING, JobState.PREEMPTING):
            moment += timedelta(seconds=1)
            job.transition(state, moment, reason="x" * 200)
        job.preemptions += 1
        job.count_ended_attempt(60)
        job.transition(JobState.QUEUED, moment, reason="x" * 200)
    world.deps.store.save_job(job, was=JobState.QUEUED)

    # WHEN it runs and is preempted three more times, for real, while SageMaker's events reach the scheduler
    # duplicated, reordered, late or never
    seen: list[dict[str, Any]] = []
    delivery = AdversarialDelivery(14)

    def adversarial(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        seen.extend(events)
        return delivery(events)

    world.mangle = adversarial
    for round_ in range(3):
        advance(
            world, monitor, until=lambda: world.deps.store.get_job("veteran").training_started_at is not None
        )
        advance(world, monitor, 60 * (round_ + 1))
        world.submit(f"urgent-{round_}", duration=60, priority=9)
        advance(world, monitor, until=lambda r=round_: world.state(f"urgent-{r}") == "completed")
    advance(world, monitor, until=lambda: world.state("veteran") == "running")
    # and every event of its attempts arrives once more, late and in reverse order
    world.deliver(delivery.flush())
    world.mangle = None
    world.deliver(
        [event for event in reversed(seen) if event["detail"]["TrainingJobName"].startswith("veteran")]
    )
    world.timer()

    # THEN its item stays far below DynamoDB's limit, and its counters are exact: each real attempt counted
    # once, with the time SageMaker says it trained
    assert _item_bytes(world, "veteran") < 64 * 1024
    veteran = world.job("veteran")
    real = [attempt_name("veteran", n) for n in (4998, 4999, 5000)]
    assert veteran["training_job_name"] == attempt_name("veteran", 5001)
    assert veteran["preemptions"] == 5000
    assert veteran["attempts_ended"] == 5000
    trained = [_seconds_in_training(world, name) for name in real]
    assert all(seconds >= 60 for seconds in trained), trained
    assert veteran["seconds_trained"] == 4997 * 60 + sum(trained)
    assert len(veteran["history"]) == 40
    assert veteran["history"][0]["state"] == "queued", "the submission is kept"
    assert monitor.violations == []


@pytest.fixture
def one_trn1_min_runtime(moto_endpoint: str) -> Iterator[tuple[QueueWorld, InvariantMonitor]]:
    settings = {"min_runtime_before_preemption_seconds": 600, "max_preemptions_per_job": 0}
    yield from monitored(
        make_world(moto_endpoint, capacity={TRN1: 1}, settings=settings, warm_pool_quota=RAISED)
    )


def test_a_resumed_attempt_is_protected_by_the_minimum_runtime_of_its_own_training(
    one_trn1_min_runtime: tuple[QueueWorld, InvariantMonitor],
) -> None:
    world, monitor = one_trn1_min_runtime
    # GIVEN a job that trained past the minimum runtime, was preempted, and resumed
    world.submit("long", duration=7200, priority=1)
    advance(world, monitor, until=lambda: world.deps.store.get_job("long").training_started_at is not None)
    advance(world, monitor, 600)
    world.submit("first-urgent", duration=60, priority=9)
    advance(world, monitor, until=lambda: world.state("first-urgent") == "completed")
    advance(world, monitor, until=lambda: world.deps.store.get_job("long").training_started_at is not None)
    resumed = attempt_name("long", 2)
    assert world.job("long")["training_job_name"] == resumed

    # WHEN another urgent job arrives while the resumed attempt has trained for less than the minimum
    world.submit("second-urgent", duration=60, priority=9)
    advance(world, monitor, 300)

    # THEN the resumed attempt keeps running until it has trained the minimum runtime itself
    assert (world.state("long"), world.state("second-urgent")) == ("running", "queued")
    advance(world, monitor, until=lambda: world.state("second-urgent") != "queued")
    assert _seconds_in_training(world, resumed) >= 600
    assert monitor.violations == []


class RefusedWrites:
    """DynamoDB refusing every write of one job's existing item, as it refuses an item grown past 400 KB:
    PutItem and UpdateItem answer ValidationException; a transaction that changes the item is cancelled with
    a ValidationError for it. Creating the item (a put on condition that it does not exist) goes through."""

    MESSAGE = "Item size has exceeded the maximum allowed size"

    def __init__(self, world: QueueWorld, job_name: str) -> None:
        self.client = world.deps.store.client
        self.key = f"JOB#{job_name}"
        self.refused = 0

    def __enter__(self) -> RefusedWrites:
        self.client.meta.events.register("before-call.dynamodb.*", self)
        return self

    def __exit__(self, *_: Any) -> None:
        self.client.meta.events.unregister("before-call.dynamodb.*", self)

    def _names_item(self, request: Any) -> bool:
        return isinstance(request, dict) and (request.get("Key") or request.get("Item") or {}).get("pk") == {
            "S": self.key
        }

    def __call__(self, params: dict[str, Any], model: Any, **_: Any) -> Any:
        body = params.get("body") or b"{}"
        params = json.loads(body.decode() if isinstance(body, bytes) else body)  # the request as sent
        error: dict[str, Any]
        if model.name in ("PutItem", "UpdateItem", "DeleteItem") and self._names_item(params):
            error = {"Code": "ValidationException", "Message": self.MESSAGE}
        elif model.name == "TransactWriteItems":
            reasons = [
                {"Code": "ValidationError", "Message": self.MESSAGE}
                if any(self._names_item(one) and not _creates(kind, one) for kind, one in item.items())
                else {"Code": "None"}
                for item in params.get("TransactItems", [])
            ]
            if all(reason["Code"] == "None" for reason in reasons):
                return None
            error = {"Code": "TransactionCanceledException", "Message": "Transaction cancelled"}
            error["CancellationReasons"] = reasons
        else:
            return None
        self.refused += 1
        answer = {"Error": error, "ResponseMetadata": {"HTTPStatusCode": 400}}
        if "CancellationReasons" in error:
            answer["CancellationReasons"] = error.pop("CancellationReasons")
        return SimpleNamespace(status_code=400, headers={}), answer


def _creates(kind: str, request: dict[str, Any]) -> bool:
    return kind == "Put" and "attribute_not_exists" in request.get("ConditionExpression", "")


def _skipped_metric(output: str) -> float:
    """The ItemsSkippedOnError the handlers emitted (their EMF documents on stdout), in total."""
    total = 0.0
    for line in output.splitlines():
        if line.startswith('{"_aws"'):
            total += sum(json.loads(line).get("ItemsSkippedOnError", [0]))
    return total


def test_a_poisoned_job_does_not_stop_the_reconcile_for_the_others(
    three_trn1: tuple[QueueWorld, InvariantMonitor], capsys: pytest.CaptureFixture[str]
) -> None:
    world, monitor = three_trn1
    # GIVEN a live job whose item no longer reads (corrupted), a live job whose item DynamoDB refuses to
    # write, and a third job; the events of all three are lost, and all three end on SageMaker
    world.submit("poisoned", duration=60)
    world.submit("refused", duration=60)
    world.submit("lost", duration=60)
    world.mangle = lambda events: []
    advance(world, monitor, 30)
    client, table = world.deps.store.client, world.deps.store.table_name
    client.update_item(
        TableName=table,
        Key={"pk": {"S": "JOB#poisoned"}, "sk": {"S": "JOB"}},
        UpdateExpression="SET #r = :bad",
        ExpressionAttributeNames={"#r": "request"},
        ExpressionAttributeValues={":bad": {"S": "{not json"}},
    )
    world.emulator.advance(600)
    world.take_sagemaker_events()
    world.mangle = None
    capsys.readouterr()

    # WHEN the timer reconciles
    with RefusedWrites(world, "refused") as refused:
        report = world.timer()

    # THEN the third job's end is applied all the same; the two others are logged, counted and skipped
    assert refused.refused >= 1
    assert world.state("lost") == "completed"
    assert "lost: completed" in report["applied"]
    assert "refused: skipped (PutError)" in report["applied"]
    assert _skipped_metric(capsys.readouterr().out) >= 2  # the unreadable item and the refused write
    # and once its writes go through again, the refused job's end is applied by the next reconcile
    world.timer()
    assert world.state("refused") == "completed"
    assert monitor.violations == []


def test_a_poisoned_job_does_not_stop_the_pass_for_the_others(
    two_trn1: tuple[QueueWorld, InvariantMonitor], capsys: pytest.CaptureFixture[str]
) -> None:
    world, monitor = two_trn1
    capsys.readouterr()
    # GIVEN a wide job holding the pool, then a job DynamoDB refuses to write once created (the pass can
    # record neither why it waits nor its start), then two others
    world.submit("wide", duration=120, count=2, priority=9)
    with RefusedWrites(world, "poisoned") as refused:
        world.submit("poisoned", duration=60, priority=5)
        world.submit("healthy", duration=60, priority=1)
        world.submit("later", duration=60, priority=1)
        assert world.job("healthy")["reason"].startswith("waiting"), "the others' notes were written"

        # WHEN the wide job ends and passes run
        advance(world, monitor, until=lambda: world.state("later") == "completed")

    # THEN the poisoned job stays queued, and every failure on it was logged, counted and skipped: the
    # others start and finish, and no training job ever ran for it
    assert refused.refused >= 2
    assert world.state("poisoned") == "queued"
    assert world.state("healthy") == "completed"
    skipped = [entry for report in world.reports for entry in report["applied"] if "skipped" in entry]
    assert any(entry.startswith("poisoned: skipped") for entry in skipped), skipped
    assert _skipped_metric(capsys.readouterr().out) >= 2
    names = [s["TrainingJobName"] for s in world.sagemaker().list_training_jobs()["TrainingJobSummaries"]]
    assert not any(name.startswith("poisoned") for name in names)
    assert monitor.violations == []


# --- 4. crashes and index lag ------------------------------------------------------------------------------


class Crash(BaseException):
    """The process dying between two steps."""


def test_a_crash_between_an_end_and_its_warm_pool_never_leaves_the_pool_uncounted(
    two_trn1: tuple[QueueWorld, InvariantMonitor],
) -> None:
    world, monitor = two_trn1
    store = world.deps.store
    save = store.save_job
    crashed: list[bool] = []

    def dying_save(job: Job, *, was: JobState, **kw: Any) -> Job:
        if job.state is JobState.COMPLETED and not crashed:
            crashed.append(True)
            raise Crash("died between tracking the pool and recording the end")
        return save(job, was=was, **kw)

    # GIVEN a job with a keep-alive ends, and the scheduler dies right after counting its pool
    store.save_job = dying_save  # type: ignore[method-assign]
    world.submit("first", duration=60, keep_alive=1800)
    with pytest.raises(Crash):
        advance(world, monitor, 600)
    store.save_job = save  # type: ignore[method-assign]
    # WHEN two jobs of another key are submitted
    world.submit("a", duration=600, volume=500)
    world.submit("b", duration=600, volume=500)
    advance(world, monitor, 180)
    # THEN the pool was counted all along: one waits while it is held, or it was released first
    pool = world.sagemaker().describe_training_job(TrainingJobName="first")["WarmPoolStatus"]["Status"]
    waiting = [world.state("a"), world.state("b")].count("queued")
    assert (pool, waiting) in (("Available", 1), ("Terminated", 0))
    assert world.state("first") == "completed", "the reconcile applied the end"
    assert monitor.violations == []


class LaggingLiveIndex:
    """The live index answering as it stood one read earlier: the latest starts are missing from it."""

    def __init__(self, read: Any) -> None:
        self.read = read
        self.previous: list[Job] = []

    def __call__(self) -> list[Job]:
        answer, self.previous = self.previous, self.read()
        names = {job.name for job in self.previous}
        return [job for job in answer if job.name in names]


@pytest.fixture
def two_trn1_lagging(moto_endpoint: str) -> Iterator[tuple[QueueWorld, InvariantMonitor]]:
    for world, monitor in monitored(make_world(moto_endpoint, capacity={TRN1: 2}, warm_pool_quota=RAISED)):
        world.deps.store.live_jobs = LaggingLiveIndex(world.deps.store.live_jobs)  # type: ignore[method-assign]
        yield world, monitor


def test_a_pass_whose_live_index_lags_does_not_overbook(
    two_trn1_lagging: tuple[QueueWorld, InvariantMonitor],
) -> None:
    world, monitor = two_trn1_lagging
    # GIVEN the live index lags behind the table, and jobs arrive one by one, each triggering a pass
    for name in ("a", "b", "c", "d"):
        world.submit(name, duration=600)  # the monitor checks after each SageMaker call
    advance(world, monitor, 120)
    # THEN the passes count the starts the index does not show yet: two run, two wait
    states = [world.state(name) for name in ("a", "b", "c", "d")]
    assert states.count("queued") == 2
    assert world.emulator.instances_in_use()[TRN1] == 2
    assert monitor.violations == []


# --- 5. outside sagequeue ----------------------------------------------------------------------------------


def test_a_job_stopped_outside_sagequeue_ends_stopped_externally_and_frees_its_instance(
    one_trn1: tuple[QueueWorld, InvariantMonitor],
) -> None:
    world, monitor = one_trn1
    world.submit("victim", duration=3600)
    world.submit("next", duration=120)
    advance(world, monitor, until=lambda: world.state("victim") == "running")
    # GIVEN someone stops it from the console, and the Stopped event is lost
    world.mangle = lambda events: [e for e in events if e["detail"]["TrainingJobStatus"] != "Stopped"]
    world.sagemaker().stop_training_job(TrainingJobName="victim")
    advance(world, monitor, 60)
    world.mangle = None
    # THEN the reconcile ends it as stopped externally, and its instance goes to the next job
    advance(world, monitor, until=lambda: world.state("victim") == "cancelled")
    assert world.job("victim")["reason"] == "stopped externally"
    advance(world, monitor, until=lambda: world.state("next") == "completed")
    assert monitor.violations == []


def test_after_the_table_is_lost_the_reconcile_rebuilds_live_jobs_and_pools(
    three_trn1: tuple[QueueWorld, InvariantMonitor],
) -> None:
    world, monitor = three_trn1
    # GIVEN two running jobs and a warm pool
    world.submit("pool", duration=60, keep_alive=3600)
    advance(world, monitor, until=lambda: world.state("pool") == "completed")
    world.submit("a", duration=3600, volume=500, tags={"priority": "7"})
    world.submit("b", duration=3600, volume=500)
    advance(world, monitor, until=lambda: world.state("a") == "running" and world.state("b") == "running")
    assert world.emulator.instances_in_use()[TRN1] == 3

    # WHEN the table is deleted and created again empty (a restore from an old backup)
    client, table = world.deps.store.client, world.deps.store.table_name
    client.delete_table(TableName=table)
    create_table(client, table)
    report = world.timer()
    world.deliver()
    monitor.check_settled()
    assert "a: entered again as running, unverified" in report["applied"]

    # THEN the live attempts and the warm pool are counted again, at the lowest standing: their seals
    # cannot be verified without the secrets the lost table held (the priority tag of 7 counts nothing)
    a = world.job("a")
    assert (a["state"], a["training_job_name"], a["priority"]) == ("running", "a", 0)
    assert (a["owner"], a["team"]) == (UNVERIFIED_OWNER, None)
    assert world.state("b") == "running"
    assert [w.training_job_name for w in world.deps.store.warm_pools()] == ["pool"]
    # and a newcomer of another key starts only once the pool's instance is released for it
    world.submit("newcomer", duration=60, volume=500)
    monitor.check_settled()
    pool = world.sagemaker().describe_training_job(TrainingJobName="pool")["WarmPoolStatus"]["Status"]
    assert (pool, world.state("newcomer")) in (("Available", "queued"), ("Terminated", "starting"))
    advance(world, monitor, until=lambda: world.state("a") == "completed")
    assert monitor.violations == []


def test_a_training_job_forged_as_a_lost_attempt_is_entered_at_the_lowest_standing(
    one_trn1: tuple[QueueWorld, InvariantMonitor],
) -> None:
    """GIVEN someone allowed CreateTrainingJob who creates a training job tagged as an attempt of a queue
    entry the table does not have, with a top priority and another user as its submitter,
    WHEN the reconcile sweeps it (as it would after the table was lost),
    THEN it is entered with nothing its tags claim: the lowest priority, no team, no owner (the user it
    names cannot cancel it, an admin can), announced for an admin, and the next real job preempts it."""
    world, monitor = one_trn1
    victim = SUBMITTER.replace("sts::", "iam::").rsplit("/", 1)[0].replace("assumed-role", "role")
    forged = training_request(
        "ghost",
        duration=7200,
        tags={
            JOB_TAG: "ghost",
            ATTEMPT_TAG: "1",
            SEAL_TAG: "0" * 32,
            "priority": "1000",
            "team": "research",
            "sagequeue:submitted-by": victim,
        },
    )
    # its events are lost (they would make it a job outside the queue, counted but never entered)
    world.mangle = lambda events: []
    world.sagemaker().create_training_job(**forged)
    world.deliver()
    world.mangle = None
    report = world.timer()
    world.deliver()
    assert any(line.startswith("ghost: entered again as ") for line in report["applied"])
    ghost = world.job("ghost")
    assert (ghost["priority"], ghost["owner"], ghost["team"]) == (0, UNVERIFIED_OWNER, None)
    assert "its tags say owner" in ghost["reason"]
    assert "priority '1000'" in ghost["reason"]
    entered = [d for kind, d in world.audit() if kind == "JobEnteredAgain"]
    assert [(d["job"], d["tagged"]["priority"], d["tagged"]["owner"]) for d in entered] == [
        ("ghost", "1000", victim)
    ]
    status, _ = world.api("DELETE", "/jobs/ghost", caller=victim)
    assert status == 403
    # a real job of priority 5 outranks it on the one instance
    world.submit("real", priority=5, duration=600)
    advance(world, monitor, until=lambda: world.state("real") == "running", limit=3600)
    assert world.state("ghost") in ("queued", "preempting")
    status, _ = world.api("DELETE", "/jobs/ghost", caller=ADMIN)
    assert status == 200


@pytest.fixture
def one_trn1_role_of_vision(moto_endpoint: str) -> Iterator[tuple[QueueWorld, InvariantMonitor]]:
    settings = {"team_execution_roles": f"vision={ROLE}"}
    yield from monitored(
        make_world(moto_endpoint, capacity={TRN1: 1}, settings=settings, warm_pool_quota=RAISED)
    )


def test_a_lost_attempt_whose_execution_role_one_team_owns_is_entered_for_that_team_not_its_tags(
    one_trn1_role_of_vision: tuple[QueueWorld, InvariantMonitor],
) -> None:
    """GIVEN a live attempt the table lacks, running as the role TeamExecutionRoles gives to vision alone and
    tagged for team research, WHEN the reconcile enters it again, THEN its team is vision (an admin's word:
    only vision may pass the role), still at the lowest priority and with no owner."""
    world, _ = one_trn1_role_of_vision
    forged = training_request(
        "lost",
        duration=7200,
        tags={JOB_TAG: "lost", ATTEMPT_TAG: "1", SEAL_TAG: "0" * 32, "team": "research"},
    )
    world.mangle = lambda events: []
    world.sagemaker().create_training_job(**forged)
    world.deliver()
    world.mangle = None
    world.timer()
    world.deliver()
    lost = world.job("lost")
    assert (lost["priority"], lost["owner"], lost["team"]) == (0, UNVERIFIED_OWNER, "vision")
    assert "team 'vision' (its execution role's" in lost["reason"]
    entered = [d for kind, d in world.audit() if kind == "JobEnteredAgain"]
    assert [(d["job"], d["team"], d["tagged"]["team"]) for d in entered] == [("lost", "vision", "research")]
