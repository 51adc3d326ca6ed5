"""Warm pools: kept for the next matching job, reused before any cold start, released when in the way."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import ACCOUNT, OTHER_USER, ROLE, SUBMITTER, TRN1, QueueWorld, make_world

from sagequeue_core.service.access import owner_of_caller

#: These worlds' account asked AWS for a warm-pool quota (the default, 0, retains no pool).
RAISED = {TRN1: 2}
#: The two-team world's: room for every pool it may keep
RAISED_THREE = {TRN1: 3}


@pytest.fixture
def world(moto_endpoint: str) -> Iterator[QueueWorld]:
    yield from make_world(moto_endpoint, warm_pool_quota=RAISED)


@pytest.fixture
def one_instance(moto_endpoint: str) -> Iterator[QueueWorld]:
    yield from make_world(
        moto_endpoint,
        capacity={TRN1: 1},
        settings={"default_keep_alive_seconds": 600},
        warm_pool_quota=RAISED,
    )


@pytest.fixture
def no_warm_quota(moto_endpoint: str) -> Iterator[QueueWorld]:
    # AWS's default: a warm-pool quota of 0 per instance type
    yield from make_world(moto_endpoint, capacity={TRN1: 1}, settings={"default_keep_alive_seconds": 600})


def test_the_warm_pool_quota_is_learned_and_no_keep_alive_is_planned_beyond_it(
    no_warm_quota: QueueWorld,
) -> None:
    world = no_warm_quota
    sagemaker = world.sagemaker()
    # GIVEN two matching jobs queued behind a busy instance: the first is started with a keep-alive for
    # the second
    world.submit("blocker", duration=120, volume=500)
    world.submit("first", duration=120)
    world.submit("second", duration=120)
    world.run_until(lambda: world.state("first") in ("starting", "running"))
    assert sagemaker.describe_training_job(TrainingJobName="first")["ResourceConfig"][
        "KeepAlivePeriodInSeconds"
    ]
    # WHEN the first ends, SageMaker does not retain its pool (quota 0)
    world.run_until(lambda: world.state("first") == "completed")
    world.run(60)
    assert (
        sagemaker.describe_training_job(TrainingJobName="first")["WarmPoolStatus"]["Status"] == "Terminated"
    )
    # THEN the scheduler has learned the warm-pool quota, and `sagequeue pools` shows it
    pool = world.api("GET", "/pools")[1]["pools"][0]
    assert (pool["warm_quota"], pool["warm"]) == (0, 0)
    # AND the second, started cold, is given no keep-alive for the third it matches: it would not be kept
    world.submit("third", duration=120)
    world.run_until(lambda: world.state("second") in ("starting", "running"))
    config = sagemaker.describe_training_job(TrainingJobName="second")["ResourceConfig"]
    assert not config.get("KeepAlivePeriodInSeconds")
    world.run_until(lambda: world.state("third") == "completed")


def test_a_finished_jobs_warm_pool_is_reused_rather_than_a_cold_start(world: QueueWorld) -> None:
    # GIVEN a job that asked for a warm pool has finished, with a free instance in the pool as well
    world.submit("prep", duration=120, keep_alive=900)
    world.run_until(lambda: world.state("prep") == "completed")
    world.run(30)
    status, pools = world.api("GET", "/pools")
    assert status == 200
    assert pools["pools"][0] == {
        "instance_type": TRN1,
        "capacity": 2,
        "used": 0,
        "queued": 0,
        "warm": 1,
        "free": 1,
        "quota": None,
        "warm_quota": None,
        "warning": None,
    }

    # WHEN a job with the same resource key is submitted
    world.submit("train", duration=120)

    # THEN it starts on the warm pool, not on the free instance
    sagemaker = world.sagemaker()
    prep = sagemaker.describe_training_job(TrainingJobName="prep")
    assert prep["WarmPoolStatus"]["Status"] in ("InUse", "Reused")
    assert prep["WarmPoolStatus"].get("ReusedByJob") == "train"
    job = world.job("train")
    assert job["history"][-1]["reason"] == "on warm pool of prep"
    reused = [detail for kind, detail in world.audit() if kind == "WarmPoolReused"]
    assert reused == [{"name": "train", "attempt": 1, "training_job_name": "train", "warm_pool_of": "prep"}]
    status, pools = world.api("GET", "/pools")
    assert status == 200
    assert pools["pools"][0]["used"] == 1
    assert pools["pools"][0]["warm"] == 0
    world.run_until(lambda: world.state("train") == "completed")


def test_a_job_with_a_different_key_does_not_take_the_warm_pool(world: QueueWorld) -> None:
    world.submit("prep", duration=120, keep_alive=900)
    world.run_until(lambda: world.state("prep") == "completed")
    world.run(30)

    world.submit("other", duration=120, volume=500)  # another volume size: SageMaker would not reuse it

    sagemaker = world.sagemaker()
    assert sagemaker.describe_training_job(TrainingJobName="prep")["WarmPoolStatus"]["Status"] == "Available"
    assert world.job("other")["history"][-1]["reason"] is None
    status, pools = world.api("GET", "/pools")
    assert status == 200
    assert (pools["pools"][0]["used"], pools["pools"][0]["warm"]) == (1, 1)


def test_the_scheduler_keeps_instances_warm_for_the_next_matching_job(one_instance: QueueWorld) -> None:
    world = one_instance
    # GIVEN one busy instance and two queued jobs with the same resource key
    world.submit("blocker", duration=120, volume=500)
    world.submit("first", duration=120)
    world.submit("second", duration=120)

    # WHEN the instance frees up, the first starts with the configured keep-alive: the second would match it
    world.run_until(lambda: world.state("first") in ("starting", "running"))
    sagemaker = world.sagemaker()
    blocker = sagemaker.describe_training_job(TrainingJobName="blocker")
    assert "KeepAlivePeriodInSeconds" not in blocker["ResourceConfig"], "no queued job matched it"
    first = sagemaker.describe_training_job(TrainingJobName="first")
    assert first["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 600

    # WHEN it finishes, the second starts on its warm pool
    world.run_until(lambda: world.state("second") in ("starting", "running"))
    first = sagemaker.describe_training_job(TrainingJobName="first")
    assert first["WarmPoolStatus"].get("ReusedByJob") == "second"
    second = sagemaker.describe_training_job(TrainingJobName="second")
    assert "KeepAlivePeriodInSeconds" not in second["ResourceConfig"], "nothing queued would reuse it"
    world.run_until(lambda: world.state("second") == "completed")


def test_an_idle_warm_pool_is_released_for_a_job_that_needs_its_instance(one_instance: QueueWorld) -> None:
    world = one_instance
    # GIVEN the only instance is held by a warm pool no queued job matches
    world.submit("prep", duration=120, keep_alive=1800)
    world.run_until(lambda: world.state("prep") == "completed")
    world.run(30)

    # WHEN a job with another key needs the instance
    world.submit("other", duration=120, volume=500)

    # THEN the pool is released (keep-alive 0) and the job starts
    sagemaker = world.sagemaker()
    assert sagemaker.describe_training_job(TrainingJobName="prep")["WarmPoolStatus"]["Status"] == "Terminated"
    assert world.state("other") in ("starting", "running")
    world.run_until(lambda: world.state("other") == "completed")


def test_a_release_that_fails_holds_back_the_start_it_was_for(one_instance: QueueWorld) -> None:
    world = one_instance
    world.submit("prep", duration=120, keep_alive=1800)
    world.run_until(lambda: world.state("prep") == "completed")
    world.run(30)

    # WHEN SageMaker fails the release (keep-alive 0) once
    world.emulator.fail_next("UpdateTrainingJob", "InternalFailure")
    world.submit("other", duration=120, volume=500)

    # THEN the job does not start over the pool's capacity, and the next pass releases and starts it
    assert world.state("other") == "queued"
    assert world.reports[-1]["waiting"]["other"] == "waiting for a warm pool to be released"
    world.timer()
    assert world.state("other") == "starting"
    sagemaker = world.sagemaker()
    assert sagemaker.describe_training_job(TrainingJobName="prep")["WarmPoolStatus"]["Status"] == "Terminated"


# --- warm pools between teams ---------------------------------------------------------------------------------

#: An execution role only the research team may pass (TeamExecutionRoles); ROLE any caller may pass.
RESEARCH_ROLE = f"arn:aws:iam::{ACCOUNT}:role/research-data"


@pytest.fixture
def two_teams(moto_endpoint: str) -> Iterator[QueueWorld]:
    yield from make_world(
        moto_endpoint,
        capacity={TRN1: 3},
        settings={
            "default_keep_alive_seconds": 600,
            "allowed_role_arns": (ROLE, RESEARCH_ROLE),
            "team_roles": {owner_of_caller(SUBMITTER): "research", OTHER_USER: "vision"},
            "team_execution_roles": {"research": [RESEARCH_ROLE]},
        },
        warm_pool_quota=RAISED_THREE,
    )


def test_with_two_teams_only_a_role_of_one_team_keeps_a_warm_pool(two_teams: QueueWorld) -> None:
    """GIVEN two teams, a role any caller may pass and a role only research may pass,
    WHEN research runs jobs asking for warm pools (their own KeepAlivePeriodInSeconds, and the scheduler's
    keep-alive for a matching job queued behind) under each role,
    THEN only the pool of research's own role is kept: SageMaker would hand the other to vision's next job
    of the same resources, with what the pool's cache directory holds."""
    world = two_teams
    sagemaker = world.sagemaker()
    world.submit("own", duration=120, keep_alive=3600, role=RESEARCH_ROLE)
    world.submit("open", duration=120, keep_alive=3600)
    world.submit("open-next", duration=120)  # matches "open": the scheduler would keep its pool for it
    world.run_until(lambda: world.state("open") == "completed" and world.state("own") == "completed")
    world.run(60)
    open_job = sagemaker.describe_training_job(TrainingJobName="open")
    assert "KeepAlivePeriodInSeconds" not in open_job["ResourceConfig"]
    assert (open_job.get("WarmPoolStatus") or {}).get("Status") in (None, "Terminated")
    own = sagemaker.describe_training_job(TrainingJobName="own")
    assert own["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 3600
    assert own["WarmPoolStatus"]["Status"] == "Available"
    assert [w.training_job_name for w in world.deps.store.warm_pools()] == ["own"]
