"""The source article's scenario end to end, on the real handlers, moto and the SageMaker emulator."""

from __future__ import annotations

from datetime import datetime

from conftest import SUBMITTER_ROLE, TRN1, QueueWorld


def test_article_scenario_preempts_resumes_and_completes_every_job(world: QueueWorld) -> None:
    # GIVEN two instances and three jobs: two start, the third waits
    world.submit("job1", priority=1, duration=900)
    world.submit("job2", priority=2, duration=900)
    world.submit("job3", priority=1, duration=300)
    world.run(300)
    assert [world.state(n) for n in ("job1", "job2", "job3")] == ["running", "running", "queued"]
    assert world.job("job3")["reason"] == "waiting for capacity: needs 1 ml.trn1.32xlarge, 0 free"
    assert world.job("job1")["reason"] == "Downloading", "the secondary status it began running with"

    # WHEN a more important job arrives
    world.submit("job4", priority=3, duration=1800)

    # THEN the least important running job (job1, not job2) is preempted for it
    assert world.state("job1") == "preempting"
    assert world.state("job2") == "running"
    world.run(180)  # SageMaker's 120 s stop grace, then the upload of what job1 saved
    job1 = world.job("job1")
    assert job1["state"] == "queued"
    assert job1["preemptions"] == 1
    assert job1["position"] == 1, "a preempted job keeps its place: ahead of job3, submitted later"
    assert world.state("job4") in ("starting", "running")

    # WHEN job2 finishes, job1 resumes (a new attempt), not job3
    world.run_until(lambda: world.state("job2") == "completed")
    world.run(30)
    job1 = world.job("job1")
    assert job1["state"] in ("starting", "running")
    assert job1["attempt"] == 2
    assert job1["training_job_name"] == "job1--2"
    assert world.state("job3") == "queued"

    # THEN everything completes, job3 last, and nothing is lost
    world.run_until(lambda: all(world.state(n) == "completed" for n in ("job1", "job2", "job3", "job4")))
    sagemaker = world.sagemaker()
    summaries = {s["TrainingJobName"]: s for s in sagemaker.list_training_jobs()["TrainingJobSummaries"]}
    assert {name: s["TrainingJobStatus"] for name, s in summaries.items()} == {
        "job1": "Stopped",
        "job1--2": "Completed",
        "job2": "Completed",
        "job3": "Completed",
        "job4": "Completed",
    }
    created = sorted(summaries, key=lambda n: summaries[n]["CreationTime"])
    assert created[-1] == "job3"
    assert created.index("job1--2") > created.index("job4")

    # the resumed attempt trains from the same checkpoints and carries the queue's tags
    first = sagemaker.describe_training_job(TrainingJobName="job1")
    second = sagemaker.describe_training_job(TrainingJobName="job1--2")
    assert second["CheckpointConfig"] == first["CheckpointConfig"]
    tags = {t["Key"]: t["Value"] for t in sagemaker.list_tags(ResourceArn=second["TrainingJobArn"])["Tags"]}
    assert tags["sagequeue:job"] == "job1"
    assert tags["sagequeue:attempt"] == "2"
    assert tags["sagequeue:submitted-by"] == SUBMITTER_ROLE
    assert tags["team"] == "research"

    detail = world.job("job1")
    assert detail["attempts"] == ["job1", "job1--2"]
    assert [h["state"] for h in detail["history"]] == [
        "queued",
        "starting",
        "running",
        "preempting",
        "queued",
        "starting",
        "running",
        "completed",
    ]
    published = world.audit()
    about_job1 = [kind for kind, detail in published if detail.get("name") == "job1"]
    assert about_job1 == [
        "JobQueued",
        "JobStarted",
        "JobPreempted",
        "JobRequeued",  # the attempt stopped and the job waits again
        "JobResumed",
        "JobFinished",
    ]
    assert [kind for kind, _ in published].count("JobFinished") == 4
    preempted = [detail for kind, detail in published if kind == "JobPreempted"]
    assert [{k: v for k, v in d.items() if k != "work_lost_seconds"} for d in preempted] == [
        {"name": "job1", "training_job_name": "job1", "for_job": "job4", "taken_back": False}
    ]
    # job1 reported no checkpoint: the stop threw away everything it trained (from when SageMaker says it
    # entered the Training phase to the preemption the history records)
    described = world.sagemaker().describe_training_job(TrainingJobName="job1")
    trained_from = next(
        t["StartTime"] for t in described["SecondaryStatusTransitions"] if t["Status"] == "Training"
    )
    stopped_at = next(h["at"] for h in world.job("job1")["history"] if h["state"] == "preempting")
    assert preempted[0]["work_lost_seconds"] == round(
        (datetime.fromisoformat(stopped_at) - trained_from).total_seconds()
    )

    status, pools = world.api("GET", "/pools")
    assert status == 200
    assert pools["pools"] == [
        {
            "instance_type": TRN1,
            "capacity": 2,
            "used": 0,
            "queued": 0,
            "warm": 0,
            "free": 2,
            "quota": None,
            "warm_quota": None,
            "warning": None,
        }
    ]
