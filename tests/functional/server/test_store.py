"""The repository against moto's DynamoDB over HTTP, on the table template.yaml declares."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import boto3
import pytest
from conftest import OTHER_USER, START, SUBMITTER, TRN1, TRN2, training_request
from support.cfn_template import create_table

from sagequeue_core.domain import Job, JobState, Pool, ResourceKey
from sagequeue_core.errors import JobAlreadyExists, JobNotFound, PoolNotFound, StaleVersion
from sagequeue_core.store import ExternalAttempt, Repository, TrackedWarmPool


@pytest.fixture
def store(moto_endpoint: str) -> Iterator[Repository]:
    client = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")
    table = create_table(client, f"store-{uuid.uuid4().hex[:8]}")
    repository = Repository(table, host=moto_endpoint, region="us-east-1")
    repository.seed_pools({TRN1: 2, TRN2: 1})
    yield repository
    client.delete_table(TableName=table)


def job(name: str, priority: int = 0, minutes: int = 0, owner: str = SUBMITTER, pool: str = TRN1) -> Job:
    request = training_request(name, instance_type=pool)
    return Job(
        name=name,
        request=request,
        priority=priority,
        owner=owner,
        submitted_at=START + timedelta(minutes=minutes),
    )


def test_the_queue_index_orders_by_priority_then_submission(store: Repository) -> None:
    for name, priority, minutes in [
        ("late-high", 5, 3),
        ("early-low", 1, 0),
        ("early-high", 5, 1),
        ("mid", 3, 2),
    ]:
        store.create_job(job(name, priority, minutes))
    store.create_job(job("other-pool", 9, pool=TRN2))

    assert [j.name for j in store.queued_jobs(TRN1, 10)] == ["early-high", "late-high", "mid", "early-low"]
    assert [j.name for j in store.queued_jobs(TRN1, 2)] == ["early-high", "late-high"]
    assert store.queue_position(store.get_job("mid")) == 3
    assert {s.pool.instance_type: s.queued for s in store.pools()} == {TRN1: 4, TRN2: 1}


def test_a_write_on_a_stale_version_is_refused(store: Repository) -> None:
    store.create_job(job("contested"))
    first, second = store.get_job("contested"), store.get_job("contested")
    first.priority = 7
    store.save_job(first, was=JobState.QUEUED)

    second.priority = 1
    with pytest.raises(StaleVersion):
        store.save_job(second, was=JobState.QUEUED)
    assert store.get_job("contested").priority == 7


def test_leaving_and_entering_the_queue_moves_the_pools_counter_with_the_job(store: Repository) -> None:
    store.create_job(job("mover"))
    moving = store.get_job("mover")
    moving.transition(JobState.STARTING, START)
    moving.training_job_name = "mover"
    store.save_job(moving, was=JobState.QUEUED)
    assert store.get_pool(TRN1).queued == 0
    assert [j.name for j in store.live_jobs()] == ["mover"]
    assert store.find_job_by_training_job("mover") is not None

    moving.transition(JobState.QUEUED, START)
    store.save_job(moving, was=JobState.STARTING)
    assert store.get_pool(TRN1).queued == 1
    assert store.live_jobs() == []


def test_names_are_unique_and_unknown_names_are_named_errors(store: Repository) -> None:
    store.create_job(job("unique"))
    with pytest.raises(JobAlreadyExists):
        store.create_job(job("unique"))
    with pytest.raises(JobNotFound):
        store.get_job("missing")
    with pytest.raises(PoolNotFound):
        store.create_job(job("nowhere", pool="ml.p5.48xlarge"))
    assert store.find_job("nowhere") is None
    with pytest.raises(PoolNotFound):
        store.get_pool("ml.p5.48xlarge")


def test_seeding_keeps_capacity_changed_at_runtime(store: Repository) -> None:
    store.set_capacity(Pool(TRN1, 5))
    store.seed_pools({TRN1: 2})
    assert store.get_pool(TRN1).pool.capacity == 5


def test_listing_by_owner_state_and_pool_pages_with_a_token(store: Repository) -> None:
    for n in range(5):
        store.create_job(job(f"a{n}", minutes=n))
    store.create_job(job("b0", owner=OTHER_USER, minutes=9))
    page = store.list_jobs(owner=SUBMITTER, limit=3)
    assert [j.name for j in page.jobs] == ["a0", "a1", "a2"]
    rest = store.list_jobs(owner=SUBMITTER, limit=3, next_token=page.next_token)
    assert [j.name for j in rest.jobs] == ["a3", "a4"]
    assert [j.name for j in store.list_jobs(state=JobState.QUEUED, limit=10).jobs][-1] == "b0"
    assert len(store.list_jobs(pool=TRN1, limit=10).jobs) == 6
    with pytest.raises(ValueError, match="next_token"):
        store.list_jobs(owner=SUBMITTER, next_token="garbage!")


def test_external_attempts_and_warm_pools_are_listed_from_the_live_index(store: Repository) -> None:
    store.record_external_attempt(ExternalAttempt("by-hand", {TRN1: 1}, START))
    key = ResourceKey("arn:aws:iam::123456789012:role/R", TRN1, 1, 100)
    store.track_warm_pool(TrackedWarmPool("done", key, START + timedelta(minutes=10), "done"))

    assert [e.training_job_name for e in store.external_attempts()] == ["by-hand"]
    assert [(w.training_job_name, w.resource_key) for w in store.warm_pools()] == [("done", key)]
    assert store.live_jobs() == []

    assert store.forget_warm_pool("done") is True
    assert store.forget_warm_pool("done") is False, "a second taker learns it was gone"
    store.forget_external_attempt("by-hand")
    assert store.external_attempts() == []


def test_the_ledger_grants_a_claim_once(store: Repository) -> None:
    assert store.get_claim("idle-stop", "job-1") is None
    assert store.claim("idle-stop", "job-1", {"by": "alarm-a"}) is True
    assert store.claim("idle-stop", "job-1", {"by": "alarm-b"}) is False
    assert store.get_claim("idle-stop", "job-1") == {"by": "alarm-a"}
    assert store.claim("idle-stop", "job-2") is True


def _count_requests(store: Repository) -> Counter[str]:
    counts: Counter[str] = Counter()

    def before(model: Any, **_: Any) -> None:
        counts[model.name] += 1

    store.client.meta.events.register("before-call.dynamodb.*", before)
    return counts


@pytest.mark.parametrize("seed", [1, 2])
def test_reasons_are_written_in_batches_and_skip_jobs_changed_since_read(
    store: Repository, seed: int
) -> None:
    # GIVEN 230 queued jobs read by a pass, some of which a user changes before the pass writes reasons
    rng = random.Random(seed)
    store.import_jobs([job(f"wait-{n:03d}", minutes=n) for n in range(230)])
    read = {j.name: j for j in store.queued_jobs(TRN1, 1000)}
    assert len(read) == 230
    changed = set(rng.sample(sorted(read), rng.randint(1, 25)))
    for name in changed:
        fresh = store.get_job(name)
        fresh.priority = 9
        store.save_job(fresh, was=JobState.QUEUED)
    counts = _count_requests(store)

    # WHEN the pass notes why each job waits
    written = store.note_waiting(
        [(read[name], f"waiting for capacity ({name})", None) for name in sorted(read)]
    )

    # THEN every unchanged job has its reason, in a few requests, and no change of a user was lost
    assert sorted(written) == sorted(set(read) - changed)
    after = {j.name: j for j in store.queued_jobs(TRN1, 1000)}
    for name in sorted(read):
        stored = after[name]
        if name in changed:
            assert (stored.priority, stored.reason, stored.version) == (9, None, 2)
        else:
            assert (stored.priority, stored.reason, stored.version) == (
                0,
                f"waiting for capacity ({name})",
                1,
            )
    # 3 chunks of at most 100; a chunk holding a changed job is sent once more without it
    chunks_with_changes = len({sorted(read).index(name) // 100 for name in changed})
    assert counts["TransactWriteItems"] == 3 + chunks_with_changes
    assert counts["PutItem"] == counts["UpdateItem"] == 0


def test_a_reason_does_not_make_the_job_stale_for_its_next_change(store: Repository) -> None:
    store.create_job(job("patient"))
    held_by_user = store.get_job("patient")
    by_pass = store.get_job("patient")
    assert store.note_waiting([(by_pass, "waiting for capacity", None)]) == ["patient"]
    held_by_user.priority = 4
    store.save_job(held_by_user, was=JobState.QUEUED)  # no StaleVersion: the reason moved no version
    assert store.get_job("patient").priority == 4
    assert store.note_waiting([]) == []
