"""sagequeue_core.snapshot: the one construction of the policy's snapshot, shared by the scheduler service
and the simulator."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sagequeue_core.domain import PRIORITY_MAX, Job, JobState, ResourceKey
from sagequeue_core.policy import PolicySettings
from sagequeue_core.snapshot import build_snapshot, policy_settings

NOW = datetime(2026, 3, 2, 12, tzinfo=UTC)
POOL = "ml.trn1.32xlarge"


def job(
    name: str, state: JobState = JobState.QUEUED, *, count: int = 1, priority: int = 5, **fields: object
) -> Job:
    request = {
        "TrainingJobName": name,
        "RoleArn": "arn:aws:iam::123456789012:role/train",
        "ResourceConfig": {"InstanceType": POOL, "InstanceCount": count, "VolumeSizeInGB": 64},
    }
    out = Job(name=name, request=request, priority=priority, owner="o", submitted_at=NOW - timedelta(hours=1))
    out.state = state
    for key, value in fields.items():
        setattr(out, key, value)
    return out


@dataclass(frozen=True)
class External:
    training_job_name: str
    demand: dict[str, int]
    started_at: datetime


@dataclass(frozen=True)
class Warm:
    training_job_name: str
    resource_key: ResourceKey
    expires_at: datetime
    job_name: str | None = None


def test_queued_jobs_carry_demand_key_and_backoff() -> None:
    backing_off = NOW + timedelta(minutes=5)
    snapshot = build_snapshot(
        now=NOW, capacity={POOL: 4}, queued=[job("q", count=2, not_before=backing_off)], live=[]
    )
    (queued,) = snapshot.queued
    assert queued.demand == {POOL: 2}
    assert queued.not_before == backing_off
    assert queued.resource_key == ResourceKey("arn:aws:iam::123456789012:role/train", POOL, 2, 64)


def test_live_jobs_stopping_only_when_preempting_or_stopping() -> None:
    started = NOW - timedelta(minutes=20)
    live = [
        job("starting", JobState.STARTING, training_job_name="starting", started_at=started),
        job("running", JobState.RUNNING, training_job_name="running-2", started_at=started),
        job("preempting", JobState.PREEMPTING, training_job_name="preempting"),
        job("stopping", JobState.STOPPING, training_job_name="stopping"),
    ]
    snapshot = build_snapshot(now=NOW, capacity={POOL: 4}, queued=[], live=live)
    by_name = {a.job_name: a for a in snapshot.running}
    assert {n for n, a in by_name.items() if a.stopping} == {"preempting", "stopping"}
    assert by_name["running"].training_job_name == "running-2"
    assert by_name["running"].started_at == started
    # a live job with no start recorded counts as started now: it has not run long enough to be preempted
    assert by_name["stopping"].started_at == NOW
    assert all(a.preemptible for n, a in by_name.items() if n in ("starting", "running"))


def test_external_attempts_count_at_the_top_and_are_never_preemptible() -> None:
    snapshot = build_snapshot(
        now=NOW,
        capacity={POOL: 4},
        queued=[],
        live=[],
        external=[External("by-hand", {POOL: 2}, NOW)],
    )
    (attempt,) = snapshot.running
    assert attempt.priority == PRIORITY_MAX
    assert not attempt.preemptible


def test_warm_pools_past_their_keep_alive_are_left_out() -> None:
    key = ResourceKey("r", POOL, 1, 64)
    snapshot = build_snapshot(
        now=NOW,
        capacity={POOL: 4},
        queued=[],
        live=[],
        warm_pools=[Warm("alive", key, NOW + timedelta(seconds=1)), Warm("gone", key, NOW)],
    )
    assert [w.training_job_name for w in snapshot.warm_pools] == ["alive"]


def test_policy_settings_from_the_scheduler_settings() -> None:
    @dataclass
    class Settings:
        min_runtime_before_preemption_seconds: int = 123
        default_keep_alive_seconds: int = 45
        max_preemptions_per_job: int = 2
        reserve_after_seconds: int = 900
        lend_reserved_capacity: bool = False
        top_priority: int = 9
        top_priority_budget_factor: int = 3
        checkpoint_wait_seconds: int = 120

    assert policy_settings(Settings()) == PolicySettings(
        min_runtime_before_preemption_seconds=123,
        default_keep_alive_seconds=45,
        max_preemptions_per_job=2,
        reserve_after_seconds=900,
        lend_reserved_capacity=False,
        top_priority=9,
        top_priority_budget_factor=3,
        checkpoint_wait_seconds=120,
    )


def test_loans_and_the_pools_they_leave_name_their_lender() -> None:
    key = ResourceKey("r", POOL, 1, 64)
    borrower = job("borrower", JobState.RUNNING, training_job_name="borrower", started_at=NOW)
    borrower.on_loan_for = "wide"
    returned = job("returned")  # requeued after its loan was taken back: its pool is the lender's
    returned.on_loan_for = "wide"
    snapshot = build_snapshot(
        now=NOW,
        capacity={POOL: 4},
        queued=[returned, job("plain")],
        live=[borrower],
        warm_pools=[
            Warm("returned", key, NOW + timedelta(minutes=5), "returned"),
            Warm("plain", key, NOW + timedelta(minutes=5), "plain"),
            Warm("outside", key, NOW + timedelta(minutes=5)),
        ],
    )
    assert [a.on_loan_for for a in snapshot.running] == ["wide"]
    assert {w.training_job_name: w.lent_by for w in snapshot.warm_pools} == {
        "returned": "wide",
        "plain": None,
        "outside": None,
    }
