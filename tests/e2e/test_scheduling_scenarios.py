"""Scheduling under pressure, end to end on the local stack's virtual clock.

Each scenario once went wrong (a livelock, inversion inside a pass, over-preemption, starvation at equal
priority, preemption before a victim trained, the checkpoint-less victim, a quota below capacity, a drained
pool). Every step of the clock checks SageMaker's side, not only the queue's: the instances the emulator
really holds per pool (live jobs and Available warm pools) never exceed the pool's capacity, and no queue
entry has two live training jobs.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sagequeue.client import QueueClient
from sagequeue.local import LocalStack
from sagequeue_core import runtime
from sagequeue_core.domain import parse_time

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from support.invariants import InvariantMonitor

POOL = "ml.trn1.32xlarge"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/neuron-train:2.21"
#: provisioning as SageMaker's for a trn1 cluster (minutes, not seconds), the documented 120 s stop grace
REALISTIC = {
    "provisioning_seconds": 480,
    "download_seconds": 30,
    "upload_seconds": 10,
    "stop_grace_seconds": 120,
}
LIVE_STATUSES = ("InProgress", "Stopping")


class Scenario:
    """A stack, its client, and a monitor of SageMaker's side run after every step of the clock."""

    def __init__(
        self,
        capacity: int,
        emulator: dict[str, Any] | None = None,
        *,
        monitored: bool = False,
        teams: dict[str, str] | None = None,
        **settings: Any,
    ) -> None:
        values = {
            "capacity": {POOL: capacity},
            "min_runtime_before_preemption_seconds": 600,
            "default_keep_alive_seconds": 600,
            # The forecast function runs hourly here, not every 5 minutes: it writes forecast items alone,
            # which no scheduling decision reads, and at 5 minutes it took a sixth of a scenario's time. Its
            # own rate is tested with the stored forecasts (test_forecast_stored.py).
            "forecast_schedule": "rate(1 hour)",
            **settings,
        }
        self.capacity = capacity
        # the account raised its warm-pool quota to the pool's size (AWS's default, 0, keeps no pool)
        warm = {"warm_pool_limits": {POOL: capacity}}
        self.stack = LocalStack(
            settings=values,
            emulator={**REALISTIC, **warm, **(emulator or {})},
            function_logs=False,
            teams=teams,
        )
        self.stack.start()
        self.queue: QueueClient = self.stack.client()
        self.preempted: Counter[str] = Counter()
        #: the invariant monitor on the scheduler's SageMaker client (support/invariants.py): checked after
        #: every SageMaker call the queue makes and every step of the clock
        self.monitor: InvariantMonitor | None = None
        if monitored:
            deps = runtime.dependencies()
            self.monitor = InvariantMonitor(self.stack.emulator, deps.store).attach(deps.sagemaker.client)

    def request(self, name: str, seconds: int, *, count: int = 1, checkpoint: bool = True) -> dict[str, Any]:
        body: dict[str, Any] = {
            "TrainingJobName": name,
            "RoleArn": self.stack.training_role_arn,
            "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
            "OutputDataConfig": {"S3OutputPath": "s3://sagequeue-e2e/output"},
            "ResourceConfig": {"InstanceType": POOL, "InstanceCount": count, "VolumeSizeInGB": 64},
            "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
            "Environment": {"SAGEQUEUE_SIM_DURATION": str(seconds)},
        }
        if checkpoint:
            body["CheckpointConfig"] = {"S3Uri": f"s3://sagequeue-e2e/checkpoints/{name}"}
        return body

    def submit(self, name: str, seconds: int, priority: int, **kw: Any) -> None:
        self.queue.submit(self.request(name, seconds, **kw), priority=priority)
        self.stack.run_until_idle()
        self.stack.advance(1)  # one submission per second: the queue's order is the submission order

    def states(self) -> dict[str, str]:
        return {job.name: job.state for job in self.queue.jobs()}

    def check_sagemaker(self) -> None:
        held = self.stack.emulator.instances_in_use().get(POOL, 0)
        assert held <= self.capacity, f"SageMaker holds {held} {POOL} on a pool of {self.capacity}"
        live: Counter[str] = Counter()
        sagemaker = self.stack.sagemaker
        for status in LIVE_STATUSES:
            for page in sagemaker.get_paginator("list_training_jobs").paginate(StatusEquals=status):
                for summary in page["TrainingJobSummaries"]:
                    live[_queue_entry(summary["TrainingJobName"])] += 1
        doubled = [name for name, n in live.items() if n > 1]
        assert not doubled, f"queue entries with two live training jobs: {doubled}"
        if self.monitor is not None:
            self.monitor.check_settled()
            assert self.monitor.violations == []

    def advance_until(self, done: Callable[[], bool], *, limit: int, step: int = 60) -> int:
        waited = 0
        while not done():
            assert waited < limit, f"not done after {limit} s: {self.states()}"
            self.stack.advance(step)
            waited += step
            self.check_sagemaker()
        return waited

    def job(self, name: str) -> Any:
        return self.queue.job(name)

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.detach()
            assert self.monitor.violations == []
        assert self.stack.failures == []
        self.stack.stop()


def _queue_entry(training_job_name: str) -> str:
    """The queue entry of an attempt name: `<job>` or `<job>--<n>` (a form no submission may take)."""
    return training_job_name.split("--", 1)[0]


@pytest.fixture
def scenario() -> Iterator[Callable[..., Scenario]]:
    made: list[Scenario] = []

    def make(capacity: int, **kw: Any) -> Scenario:
        made.append(Scenario(capacity, **kw))
        return made[-1]

    yield make
    for each in made:
        each.close()


@pytest.mark.slow
def test_a_wide_job_is_not_livelocked_by_small_jobs_and_their_warm_pools(
    scenario: Callable[..., Scenario],
) -> None:
    s = scenario(4)
    # GIVEN four 1-instance priority-5 jobs running and more of them queued (so each keeps its pool warm)
    for i in range(8):
        s.submit(f"small-{chr(97 + i)}", 3 * 3600, priority=5)
    s.advance_until(lambda: sum(st == "running" for st in s.states().values()) == 4, limit=1200)
    # WHEN a 4-instance priority-6 job arrives
    s.submit("wide", 1800, priority=6, count=4)
    # THEN it preempts the four running jobs once they trained 10 minutes, holds a reservation while their
    # instances come back (their warm pools included), and starts: within min runtime + stop grace +
    # provisioning, with slack
    promised: list[dict[str, Any]] = []

    def started() -> bool:
        wide = s.job("wide")
        if wide.raw.get("reservation"):
            promised.append(wide.raw["reservation"])
        return wide.state in ("starting", "running")

    waited = s.advance_until(started, limit=600 + 900 + 600)
    assert waited <= 600 + 120 + 480 + 300
    preempted = {j.name: j.preemptions for j in s.queue.jobs() if j.preemptions}
    assert len(preempted) == 4
    assert set(preempted.values()) == {1}, preempted
    assert promised
    assert promised[-1]["kind"] == "preempted"
    assert promised[-1]["instances"] == {POOL: 4}
    assert s.job("wide").raw.get("reservation") is None  # it started: the promise ended
    s.advance_until(lambda: s.states()["wide"] == "completed", limit=3 * 3600)


@pytest.mark.slow
def test_release_and_preemption_combine_for_one_job(scenario: Callable[..., Scenario]) -> None:
    s = scenario(2)
    # GIVEN a warm pool nobody queued wants (a finished job's keep-alive) and a priority-1 job running
    donor = s.request("donor", 300)
    donor["ResourceConfig"]["KeepAlivePeriodInSeconds"] = 3600
    s.queue.submit(donor, priority=3)
    s.submit("low", 4 * 3600, priority=1)
    s.advance_until(lambda: s.states()["donor"] == "completed", limit=1800)
    assert s.stack.emulator.instances_in_use()[POOL] == 2  # the low job and the donor's warm pool
    # WHEN a priority-9 job needing both instances arrives
    s.submit("urgent", 600, priority=9, count=2)
    # THEN it releases the warm pool AND preempts the low job in the same pass, and starts
    waited = s.advance_until(lambda: s.states()["urgent"] in ("starting", "running"), limit=1800)
    assert waited <= 600 + 120 + 300
    assert s.job("low").preemptions == 1
    warm = s.stack.sagemaker.describe_training_job(TrainingJobName="donor").get("WarmPoolStatus") or {}
    assert warm.get("Status") == "Terminated"


@pytest.mark.slow
def test_a_two_instance_job_preempts_exactly_two_victims_once(scenario: Callable[..., Scenario]) -> None:
    s = scenario(3)
    # GIVEN three 1-instance priority-1 jobs running, each kept warm for the others queued behind it
    for name in ("low-a", "low-b", "low-c", "low-d"):
        s.submit(name, 4 * 3600, priority=1)
    s.advance_until(lambda: sum(st == "running" for st in s.states().values()) == 3, limit=1200)
    # WHEN a 2-instance priority-5 job arrives
    s.submit("pair", 1200, priority=5, count=2)
    s.advance_until(lambda: s.states()["pair"] in ("starting", "running"), limit=2400)
    # THEN exactly two victims, each preempted once; no victim restarted on its own warm pool in its way
    preempted = {j.name: j.preemptions for j in s.queue.jobs() if j.preemptions}
    assert sorted(preempted.values()) == [1, 1], preempted
    s.advance_until(lambda: s.states()["pair"] == "completed", limit=3600)
    assert {j.name: j.preemptions for j in s.queue.jobs() if j.preemptions} == preempted


@pytest.mark.slow
def test_a_wide_job_is_not_starved_by_later_small_jobs_of_equal_priority(
    scenario: Callable[..., Scenario],
) -> None:
    s = scenario(4, reserve_after_seconds=600, lend_reserved_capacity=False)
    # GIVEN four small jobs running, a 4-instance job at the head, and small jobs of the same priority
    # arriving behind it (lending off: the drain alone; test_a_drain_lends_... covers loans)
    for i in range(4):
        s.submit(f"small-{chr(97 + i)}", 1800 + i * 300, priority=5)
    s.advance_until(lambda: sum(st == "running" for st in s.states().values()) == 4, limit=1200)
    s.submit("wide", 600, priority=5, count=4)
    for i in range(4, 12):
        s.submit(f"small-{chr(97 + i)}", 1800, priority=5)
    # THEN after waiting ReserveAfterSeconds at the head it reserves; small jobs stop overtaking it and
    # it starts once the running ones end (the last after 1800 + 900 s of training)
    s.advance_until(lambda: s.states()["wide"] in ("starting", "running"), limit=2 * 3600)
    assert s.job("wide").started_at is not None
    later = [s.job(f"small-{chr(97 + i)}") for i in range(4, 12)]
    assert all(job.started_at is None or job.started_at >= s.job("wide").started_at for job in later)
    assert not any(job.preemptions for job in s.queue.jobs())  # equal priority never preempts


@pytest.mark.slow
def test_a_drain_lends_its_idle_instances_and_takes_them_back_when_it_can_start(
    scenario: Callable[..., Scenario],
) -> None:
    s = scenario(4, reserve_after_seconds=600)
    # GIVEN a 4-instance priority-5 job waiting behind priority-7 work that ends at different times
    for i, hours in enumerate((1, 2, 3, 4)):
        s.submit(f"important-{i}", hours * 3600, priority=7)
    s.advance_until(lambda: sum(st == "running" for st in s.states().values()) == 4, limit=1200)
    s.submit("wide", 1800, priority=5, count=4)
    # and, behind it, jobs of its own priority (which no preemption could ever touch)
    for i in range(6):
        s.submit(f"small-{i}", 4 * 3600, priority=5)
    s.submit("fragile", 4 * 3600, priority=5, checkpoint=False)
    # WHEN the first important job ends, the wide job (reserved after 600 s at the head) holds its instance
    s.advance_until(lambda: s.states()["important-0"] == "completed", limit=2 * 3600)
    # THEN instances it holds while the others run are lent to checkpointing jobs, never left idle
    idle_while_lending: list[int] = []
    lent: set[str] = set()

    def watch() -> bool:
        jobs = {job.name: job for job in s.queue.jobs()}
        for job in jobs.values():
            if job.raw.get("on_loan_for"):
                assert job.raw["on_loan_for"] == "wide"
                lent.add(job.name)
        assert "fragile" not in lent, "a job without checkpoints borrowed"
        held = s.stack.emulator.instances_in_use().get(POOL, 0)
        if jobs["wide"].state == "queued" and jobs["important-3"].state == "running":
            idle_while_lending.append(4 - held)
        return jobs["wide"].state in ("starting", "running")

    s.advance_until(watch, limit=5 * 3600)
    assert len(lent) >= 3
    # a borrower waits at most one pass for an instance the reservation holds: idle only between passes
    assert sum(1 for idle in idle_while_lending if idle > 0) <= 3
    # AND the wide job starts within stop grace + provisioning of the last important job's end: the loans
    # were preempted at once, whatever their runtime
    wide = s.job("wide")
    last = s.job("important-3")
    assert wide.started_at is not None
    assert last.ended_at is not None
    assert (wide.started_at - last.ended_at).total_seconds() <= 120 + 60 + 60
    borrowers = [s.job(name) for name in lent if s.job(name).state != "completed"]
    assert borrowers
    # taking a loan back counts apart from preemptions: the borrowers' preemption budgets are untouched
    for job in borrowers:
        assert (job.loans_taken_back, job.preemptions) == (1, 0), job
        assert any("taken back by wide" in (h.reason or "") for h in job.history), job.history
    # AND the borrowers resume afterwards; nothing was preempted for them
    s.advance_until(
        lambda: all(s.states()[n] in ("starting", "running", "completed") for n in lent), limit=4 * 3600
    )


@pytest.mark.slow
def test_min_runtime_counts_from_training_not_from_create(scenario: Callable[..., Scenario]) -> None:
    s = scenario(1)
    s.submit("victim", 4 * 3600, priority=1)
    s.submit("important", 600, priority=9)
    s.advance_until(lambda: s.states()["victim"] == "preempting", limit=3600)
    victim = s.job("victim")
    created = victim.started_at
    trained = victim.raw.get("training_started_at")
    assert created is not None
    assert trained is not None
    # THEN the victim was stopped after ten minutes of training, not ten minutes after its create
    stopped_at = s.stack.now()
    trained_at = parse_time(trained)
    assert trained_at is not None
    assert (stopped_at - trained_at).total_seconds() >= 600
    assert (trained_at - created).total_seconds() >= 480  # provisioning took minutes


@pytest.mark.slow
def test_the_victim_without_checkpoints_is_preempted_last(scenario: Callable[..., Scenario]) -> None:
    s = scenario(2)
    s.submit("resumable", 4 * 3600, priority=1)
    s.submit("fragile", 4 * 3600, priority=1, checkpoint=False)
    s.advance_until(lambda: set(s.states().values()) == {"running"}, limit=1200)
    s.submit("urgent", 600, priority=5)
    s.advance_until(lambda: s.states()["urgent"] in ("starting", "running"), limit=2400)
    assert s.job("resumable").preemptions == 1
    assert s.job("fragile").preemptions == 0


@pytest.mark.slow
def test_a_quota_below_capacity_is_learned_and_preempted_against(scenario: Callable[..., Scenario]) -> None:
    # GIVEN a pool of 4 on an account whose quota is 3, and a priority-5 job holding 3 instances
    s = scenario(4, emulator={"instance_limits": {POOL: 3}})
    s.submit("holder", 4 * 3600, priority=5, count=3)
    s.advance_until(lambda: s.states()["holder"] == "running", limit=1200)
    # WHEN a priority-9 job needing one instance arrives: the pass sees one free, SageMaker refuses
    s.submit("urgent", 600, priority=9)
    pools = {p.instance_type: p for p in s.queue.pools()}
    assert pools[POOL].raw["quota"] == 3
    assert "ResourceLimitExceeded" in (pools[POOL].raw["warning"] or "")
    # THEN the pass plans with the quota, preempts the holder and the urgent job starts
    s.advance_until(lambda: s.states()["urgent"] in ("starting", "running"), limit=2400)
    assert s.job("holder").preemptions == 1
    # AND an admin raising the capacity above the known quota is warned
    answer = s.stack.client("admin").set_capacity(POOL, 6)
    assert "quota" in (answer.raw.get("warning") or "")


@pytest.mark.slow
def test_a_drained_pool_queues_and_says_so(scenario: Callable[..., Scenario]) -> None:
    s = scenario(2)
    s.stack.client("admin").set_capacity(POOL, 0)
    s.submit("patient", 600, priority=5)
    assert s.states()["patient"] == "queued"
    assert s.job("patient").reason == f"pool drained: {POOL} has capacity 0"
    s.stack.client("admin").set_capacity(POOL, 1)
    s.stack.run_until_idle()
    s.submit("wide", 600, priority=5, count=1)
    s.advance_until(lambda: s.states()["patient"] in ("starting", "running"), limit=600)


def test_jobs_that_can_never_fit_do_not_fill_the_window(scenario: Callable[..., Scenario]) -> None:
    s = scenario(4, queue_lookahead=2)
    admin = s.stack.client("admin")
    # GIVEN a running job and two 4-instance jobs waiting behind it, then the pool lowered to 2
    s.submit("runner", 4 * 3600, priority=5)
    s.submit("wide-a", 600, priority=5, count=4)
    s.submit("wide-b", 600, priority=5, count=4)
    admin.set_capacity(POOL, 2)
    s.stack.run_until_idle()
    # WHEN a small job arrives behind them (the window holds two jobs)
    s.submit("small-a", 600, priority=5)
    # THEN the wide jobs say they can never fit, and the small one starts in the free instance
    assert s.states()["small-a"] in ("starting", "running")
    assert s.job("wide-a").reason == f"can never fit: needs 4 {POOL}, the pool's capacity is 2"
    # AND jobs beyond the window are told their position rather than nothing
    for name in ("small-b", "small-c", "small-d"):
        s.submit(name, 600, priority=5)
    beyond = s.job("small-d")
    assert beyond.position == 5
    assert beyond.reason is not None
    assert beyond.reason.startswith("waiting: position 5")
    s.advance_until(lambda: s.states()["small-d"] == "completed", limit=4 * 3600)
