"""Loans taken back in the table: an item written before `loans_taken_back` existed, and a stop under way
whose reason is a lender taking its loan back (moto over HTTP, the table template.yaml declares)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta

import boto3
import pytest
from conftest import START, SUBMITTER, TRN1, training_request
from support.cfn_template import create_table

from sagequeue_core.domain import Job, JobState, StopReason
from sagequeue_core.store import Repository, _job_pk


@pytest.fixture
def table(moto_endpoint: str) -> Iterator[tuple[Repository, str, object]]:
    client = boto3.client("dynamodb", endpoint_url=moto_endpoint, region_name="us-east-1")
    name = create_table(client, f"loans-{uuid.uuid4().hex[:8]}")
    repository = Repository(name, host=moto_endpoint, region="us-east-1")
    repository.seed_pools({TRN1: 4})
    yield repository, name, client
    client.delete_table(TableName=name)


def _job(name: str) -> Job:
    return Job(
        name=name,
        request=training_request(name, instance_type=TRN1),
        priority=3,
        owner=SUBMITTER,
        submitted_at=START,
    )


def test_an_item_from_before_loans_taken_back_reads_as_none_taken_back(
    table: tuple[Repository, str, object],
) -> None:
    store, name, client = table
    store.create_job(_job("older"))
    # GIVEN the item as an earlier version wrote it: no loans_taken_back attribute at all
    client.update_item(  # type: ignore[attr-defined]
        TableName=name,
        Key={"pk": {"S": _job_pk("older")}, "sk": {"S": "JOB"}},
        UpdateExpression="REMOVE loans_taken_back",
    )
    # THEN it reads, answers and saves again with none taken back
    job = store.get_job("older")
    assert job.loans_taken_back == 0
    assert job.to_api()["loans_taken_back"] == 0
    job.transition(JobState.STARTING, START + timedelta(minutes=1))
    store.save_job(job, was=JobState.QUEUED)
    assert store.get_job("older").loans_taken_back == 0


def test_a_loan_being_taken_back_keeps_its_reason_and_counts_once_requeued(
    table: tuple[Repository, str, object],
) -> None:
    store, _, _ = table
    job = _job("borrower")
    store.create_job(job)
    job = store.get_job("borrower")
    job.on_loan_for = "wide"
    job.transition(JobState.STARTING, START + timedelta(minutes=1))
    store.save_job(job, was=JobState.QUEUED)
    job = store.get_job("borrower")
    job.transition(JobState.RUNNING, START + timedelta(minutes=2))
    store.save_job(job, was=JobState.STARTING)
    # WHEN its lender takes it back, the stop under way is stored and read back as such
    job = store.get_job("borrower")
    job.stop_reason = StopReason.TAKEN_BACK
    job.transition(JobState.PREEMPTING, START + timedelta(minutes=3))
    store.save_job(job, was=JobState.RUNNING)
    job = store.get_job("borrower")
    assert job.stop_reason is StopReason.TAKEN_BACK
    # THEN once stopped and requeued it counts as a loan taken back, not a preemption
    job.count_requeue()
    job.stop_reason = None
    job.transition(JobState.QUEUED, START + timedelta(minutes=4))
    store.save_job(job, was=JobState.PREEMPTING)
    again = store.get_job("borrower")
    assert (again.loans_taken_back, again.preemptions) == (1, 0)
