"""GET /jobs?order=newest lists jobs newest first, page after page, and the forecast's run-time history is
the newest completed jobs, not the oldest (the table lists them by submission)."""

from __future__ import annotations

from datetime import timedelta

from conftest import SUBMITTER, TRN1, QueueWorld, training_request

from sagequeue.forecast.live import HISTORY_LIMIT, LiveQueue
from sagequeue_core.domain import Job, JobState

COMPLETED = HISTORY_LIMIT + 5


def completed_jobs(world: QueueWorld, count: int) -> list[str]:
    """`count` completed jobs submitted a minute apart (oldest first), loaded into the table."""
    start = world.clock.now() - timedelta(days=2)
    jobs = []
    for n in range(count):
        name = f"done-{n:03d}"
        job = Job(
            name=name,
            request=training_request(name),
            priority=1,
            owner=SUBMITTER,
            submitted_at=start + timedelta(minutes=n),
        )
        job.state = JobState.COMPLETED
        job.attempt = 1
        job.started_at = job.submitted_at + timedelta(minutes=1)
        job.ended_at = job.submitted_at + timedelta(minutes=30)
        jobs.append(job)
    world.deps.store.import_jobs(jobs)
    return [job.name for job in jobs]


def test_newest_first_pages_through_the_jobs_from_the_latest(world: QueueWorld) -> None:
    names = completed_jobs(world, 7)

    status, first = world.api("GET", "/jobs", query={"state": "completed", "limit": "3", "order": "newest"})
    assert status == 200, first
    assert [j["name"] for j in first["jobs"]] == names[::-1][:3]
    status, second = world.api(
        "GET",
        "/jobs",
        query={"state": "completed", "limit": "3", "order": "newest", "next_token": first["next_token"]},
    )
    assert [j["name"] for j in second["jobs"]] == names[::-1][3:6]

    status, oldest = world.api("GET", "/jobs", query={"state": "completed", "limit": "3"})
    assert [j["name"] for j in oldest["jobs"]] == names[:3]  # the default is unchanged
    status, explicit = world.api(
        "GET", "/jobs", query={"state": "completed", "limit": "3", "order": "oldest"}
    )
    assert [j["name"] for j in explicit["jobs"]] == names[:3]

    status, answer = world.api("GET", "/jobs", query={"state": "completed", "order": "latest"})
    assert status == 400
    assert "order" in answer["message"]


def test_the_forecast_reads_the_newest_completed_jobs_for_run_times(world: QueueWorld) -> None:
    # GIVEN more completed jobs than the forecast reads
    names = completed_jobs(world, COMPLETED)
    world.submit("waits", instance_type=TRN1)

    # WHEN the forecast function reads the queue
    queue = LiveQueue.from_store(world.deps)

    # THEN its run-time history is the newest HISTORY_LIMIT of them
    assert sorted(job.name for job in queue.completed) == names[-HISTORY_LIMIT:]
