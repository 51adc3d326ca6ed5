"""The article's scenario again, with SageMaker's events shuffled, duplicated and lost on the way, as
EventBridge is allowed to do: every job still completes exactly once."""

from __future__ import annotations

import random
from typing import Any

import pytest
from conftest import QueueWorld

JOBS = {"job1": 1, "job2": 2, "job3": 1, "job4": 3, "job5": 2, "job6": 1}


def unreliable(seed: int) -> Any:
    rng = random.Random(seed)

    def mangle(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        delivered = []
        for event in events:
            if rng.random() < 0.15:
                continue  # lost: only the timer's DescribeTrainingJob will tell
            delivered.append(event)
            if rng.random() < 0.3:
                delivered.append(event)  # delivered twice
        rng.shuffle(delivered)
        return delivered

    return mangle


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_every_job_completes_once_whatever_happens_to_the_events(world: QueueWorld, seed: int) -> None:
    world.mangle = unreliable(seed)
    for name, priority in JOBS.items():
        world.submit(name, priority=priority, duration=300 + 100 * priority)
        world.run(120)

    world.run_until(lambda: all(world.state(name) == "completed" for name in JOBS), limit=4 * 3600)

    summaries = world.sagemaker().list_training_jobs(MaxResults=100)["TrainingJobSummaries"]
    completed = [s["TrainingJobName"] for s in summaries if s["TrainingJobStatus"] == "Completed"]
    owners = sorted(name.split("--", 1)[0] for name in completed)
    assert owners == sorted(JOBS), "each job has exactly one completed attempt"
    assert all(s["TrainingJobStatus"] in ("Completed", "Stopped") for s in summaries)
    for name in JOBS:
        job = world.job(name)
        assert job["attempt"] == job["preemptions"] + 1, f"{name}: every extra attempt is a preemption"
