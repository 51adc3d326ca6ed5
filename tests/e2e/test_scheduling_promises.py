"""Promises to waiting jobs hold, end to end on the local stack's virtual clock, under the invariant monitor.

Each scenario is one way a promise once broke: a drain walked around through warm pools, loans that stopped
being their lender's when its reservation restarted, loans taken back whatever the priorities are now, a
quota learned as what the pool held instead of what SageMaker stated, two passes at once overbooking a pool,
a drained pool keeping its warm pools, the top priority waiting out a lower job's minimum runtime. The
monitor checks SageMaker's side (instances held per pool, one live training job per queue entry, nothing
untracked) after every SageMaker call the queue makes and every step of the clock. A second pass at every
step of the first is tests/functional/server/test_concurrent_passes.py, and hypothesis chooses the step and
the queues in tests/functional/server/test_concurrent_passes_property.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_scheduling_scenarios import POOL, Scenario

from sagequeue_core import runtime

pytestmark = pytest.mark.slow


@pytest.fixture
def scenario() -> Iterator[Callable[..., Scenario]]:
    made: list[Scenario] = []

    def make(capacity: int, **kw: Any) -> Scenario:
        made.append(Scenario(capacity, **kw))
        return made[-1]

    yield make
    for each in made:
        each.close()


def _submit_together(s: Scenario, jobs: list[tuple[str, int, int, int]]) -> None:
    """(name, seconds, priority, count) submitted in one go, so one pass sees them all."""
    for name, seconds, priority, count in jobs:
        s.queue.submit(s.request(name, seconds, count=count), priority=priority)
    s.stack.run_until_idle()


def test_a_drain_is_not_walked_around_through_warm_pools(scenario: Callable[..., Scenario]) -> None:
    # GIVEN a pool of 4 full of 1-instance priority-5 jobs submitted together with four more (so the
    # scheduler keeps each pool warm for the next), a 4-instance priority-5 job behind them, and 1-instance
    # priority-5 jobs arriving in sweeps
    s = scenario(4, monitored=True)
    _submit_together(s, [(f"first-{i}", 3600, 5, 1) for i in range(8)])
    assert sum(st == "starting" for st in s.states().values()) == 4
    s.stack.advance(1)
    s.submit("wide", 1800, priority=5, count=4)
    sweep = 0

    def sweeps() -> bool:
        nonlocal sweep
        if s.stack.now().minute % 15 == 0:
            sweep += 1
            s.submit(f"sweep-{sweep}", 3600, priority=5)
        return s.states()["wide"] in ("starting", "running")

    # THEN once the jobs submitted before it ran, the wide job (reserved after waiting at the head) takes
    # every instance they free, warm pools too (lent at most, and taken back), and starts within a stop and
    # a pass or two of the last one's end
    s.advance_until(sweeps, limit=5 * 3600)
    blockers = [s.job(f"first-{i}") for i in range(8)]
    ended = [job.ended_at for job in blockers]
    assert all(ended), [job.state for job in blockers]
    wide = s.job("wide")
    assert wide.started_at is not None
    assert (wide.started_at - max(e for e in ended if e)).total_seconds() <= 120 + 3 * 60
    # AND sweeps that ran on its instances meanwhile did so on loan
    assert any(job.loans_taken_back for job in s.queue.jobs() if job.name.startswith("sweep-"))


def _lender_with_loans(s: Scenario) -> None:
    """A 4-instance priority-5 job lending its idle instances to priority-5 jobs while two priority-7 jobs
    (1 h and 2 h) still hold half the pool."""
    for i, hours in enumerate((1, 2)):
        s.submit(f"important-{i}", hours * 3600, priority=7, count=2)
    s.advance_until(lambda: sum(st == "running" for st in s.states().values()) == 2, limit=1200)
    s.submit("wide", 1800, priority=5, count=4)
    for i in range(3):
        s.submit(f"small-{i}", 5 * 3600, priority=5)
    s.advance_until(
        lambda: sum(bool(job.raw.get("on_loan_for")) for job in s.queue.jobs()) >= 2, limit=3 * 3600
    )


def test_a_loan_stays_its_lenders_across_a_hold_and_release(scenario: Callable[..., Scenario]) -> None:
    s = scenario(4, monitored=True, reserve_after_seconds=600)
    _lender_with_loans(s)
    borrowers = [job.name for job in s.queue.jobs() if job.raw.get("on_loan_for") == "wide"]
    # WHEN the lender is held and released (its reservation ends and starts again)
    owner = s.queue
    owner.hold("wide")
    s.stack.run_until_idle()
    s.stack.advance(60)
    owner.release("wide")
    s.stack.run_until_idle()
    # THEN it still takes its loans back as soon as the last blocker ends, not after the borrowers' runs
    s.advance_until(lambda: s.states()["wide"] in ("starting", "running"), limit=3 * 3600)
    last = s.job("important-1")
    wide = s.job("wide")
    assert last.ended_at is not None
    assert wide.started_at is not None
    assert (wide.started_at - last.ended_at).total_seconds() <= 120 + 3 * 60
    for name in borrowers:
        assert s.job(name).loans_taken_back == 1
        assert s.job(name).preemptions == 0


def test_a_loan_ends_when_its_borrower_outranks_the_lender(scenario: Callable[..., Scenario]) -> None:
    s = scenario(4, monitored=True, reserve_after_seconds=600)
    _lender_with_loans(s)
    borrowers = sorted(job.name for job in s.queue.jobs() if job.raw.get("on_loan_for") == "wide")
    raised = borrowers[0]
    # WHEN an admin raises one borrower to priority 9, above its priority-5 lender
    s.stack.client("admin").set_priority(raised, 9)
    s.stack.run_until_idle()
    # THEN once the lender's blockers are gone it does not take that one back: it runs as an ordinary start,
    # and the lender, which cannot start while it runs, stops none of its other loans for nothing
    s.advance_until(lambda: s.states()["important-1"] == "completed", limit=3 * 3600)
    waited = 0
    while waited < 900:
        s.stack.advance(60)
        waited += 60
        s.check_sagemaker()
    job = s.job(raised)
    assert (job.loans_taken_back, job.preemptions) == (0, 0), job.history
    assert job.state == "running"
    assert s.states()["wide"] == "queued"
    for name in borrowers[1:]:
        other = s.job(name)
        assert (other.loans_taken_back, other.preemptions, other.state) == (0, 0, "running")
        assert other.raw.get("on_loan_for") == "wide"


def test_a_quota_is_learned_from_the_limit_sagemaker_states(scenario: Callable[..., Scenario]) -> None:
    # GIVEN a pool of 4 on an account whose quota is 3, and a priority-1 job holding one instance
    s = scenario(4, monitored=True, emulator={"instance_limits": {POOL: 3}})
    s.submit("low", 4 * 3600, priority=1)
    s.advance_until(lambda: s.states()["low"] == "running", limit=1200)
    # WHEN a 3-instance priority-5 job arrives: the pass sees 3 free, SageMaker refuses (3 allowed, 1 used)
    s.submit("urgent", 1800, priority=5, count=3)
    pools = {p.instance_type: p for p in s.queue.pools()}
    # THEN the queue plans with the quota SageMaker stated, not with what it held when refused
    assert pools[POOL].raw["quota"] == 3
    # AND the urgent job preempts the low one once it trained its minimum and starts, without more refusals
    s.advance_until(lambda: s.states()["urgent"] in ("starting", "running"), limit=600 + 120 + 600)
    assert s.job("low").preemptions == 1
    refusals = [h for h in s.job("urgent").history if "ResourceLimitExceeded" in (h.reason or "")]
    assert len(refusals) == 1, refusals


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_pass_run_inside_anothers_create_does_not_overbook_the_pool(
    scenario: Callable[..., Scenario], when: str
) -> None:
    # GIVEN a pool of 2 an admin drained, and two priority-5 jobs queued behind it
    s = scenario(2, monitored=True)
    admin = s.stack.client("admin")
    admin.set_capacity(POOL, 0)
    s.stack.run_until_idle()
    s.submit("first", 3600, priority=5)
    s.submit("second", 3600, priority=5)
    assert s.stack.emulator.instances_in_use().get(POOL, 0) == 0
    # WHEN the pool is given back, the pass that follows plans to start both; inside its first
    # CreateTrainingJob (before SageMaker has the job, or once it has it and before the pass hears back) a
    # priority-9 job is submitted and the timer's pass (reconcile, then pass) runs beside it
    inside: list[Any] = []

    def second_pass(**_: Any) -> None:
        if inside:
            return
        inside.append(s.stack.now())
        s.queue.submit(s.request("urgent", 600), priority=9)
        inside.append(s.stack.tick_beside())

    scheduler_sagemaker = runtime.dependencies().sagemaker.client
    scheduler_sagemaker.meta.events.register(f"{when}-call.sagemaker.CreateTrainingJob", second_pass)
    try:
        admin.set_capacity(POOL, 2)
        s.stack.run_until_idle()
        if not inside:
            s.stack.advance(60)  # the timer's pass, if giving the pool back ran none
    finally:
        scheduler_sagemaker.meta.events.unregister(f"{when}-call.sagemaker.CreateTrainingJob", second_pass)
    assert len(inside) == 2, "no pass started a job"
    assert inside[1]["started"] == ["urgent"], inside[1]
    # THEN SageMaker never held more than the pool (the monitor checked after every call of both passes),
    # the urgent job holds one of its two instances, and the first pass left one of its jobs queued
    assert s.monitor is not None
    assert s.monitor.violations == []
    s.check_sagemaker()
    assert s.stack.emulator.instances_in_use().get(POOL, 0) == 2
    states = s.states()
    assert states["urgent"] in ("starting", "running")
    assert sorted((states["first"], states["second"])).count("queued") == 1, states
    # AND the queue goes on from there: every job completes, and the pool is never overbooked
    s.advance_until(lambda: set(s.states().values()) == {"completed"}, limit=3 * 3600)


def test_a_drained_pool_releases_its_idle_warm_pools(scenario: Callable[..., Scenario]) -> None:
    s = scenario(2, monitored=True)
    # GIVEN a finished job's warm pool kept for an hour
    donor = s.request("donor", 300)
    donor["ResourceConfig"]["KeepAlivePeriodInSeconds"] = 3600
    s.queue.submit(donor, priority=3)
    s.stack.run_until_idle()
    s.advance_until(lambda: s.states()["donor"] == "completed", limit=1800)
    assert s.stack.emulator.instances_in_use()[POOL] == 1
    # WHEN an admin drains the pool
    s.stack.client("admin").set_capacity(POOL, 0)
    s.stack.run_until_idle()
    # THEN within a timer tick the warm pool is released: SageMaker holds nothing, nothing is billed
    s.advance_until(lambda: s.stack.emulator.instances_in_use().get(POOL, 0) == 0, limit=180)
    warm: dict[str, Any] = (
        s.stack.sagemaker.describe_training_job(TrainingJobName="donor").get("WarmPoolStatus") or {}
    )
    assert warm.get("Status") == "Terminated"


def test_the_top_priority_does_not_wait_out_a_lower_jobs_minimum_runtime(
    scenario: Callable[..., Scenario],
) -> None:
    # GIVEN a pool of 1 running a priority-1 job that has just begun to train, and TopPriority 9
    s = scenario(1, monitored=True, top_priority=9)
    s.submit("victim", 4 * 3600, priority=1)
    s.advance_until(lambda: s.job("victim").raw.get("training_started_at") is not None, limit=1200, step=30)
    # WHEN a priority-9 job arrives
    s.submit("top", 600, priority=9)
    # THEN the victim is stopped at once, long before its 600 s minimum runtime, and the top job starts
    # within the stop grace and a pass
    waited = s.advance_until(lambda: s.states()["top"] in ("starting", "running"), limit=600, step=30)
    assert waited <= 120 + 60
    assert s.job("victim").preemptions == 1
