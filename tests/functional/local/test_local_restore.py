"""A queue restored with `--state` (LocalStack(state=...)) says at once what became of the jobs that were
starting or running: their training jobs died with the previous stack's emulator."""

from __future__ import annotations

from pathlib import Path

from sagequeue.local import LocalStack

POOL = "ml.trn1.32xlarge"


def request(stack: LocalStack, name: str) -> dict[str, object]:
    return {
        "TrainingJobName": name,
        "RoleArn": stack.training_role_arn,
        "AlgorithmSpecification": {
            "TrainingImage": "1.dkr.ecr.us-east-1.amazonaws.com/t:1",
            "TrainingInputMode": "File",
        },
        "OutputDataConfig": {"S3OutputPath": "s3://sagequeue-restore/out"},
        "ResourceConfig": {"InstanceType": POOL, "InstanceCount": 1, "VolumeSizeInGB": 64},
        "StoppingCondition": {"MaxRuntimeInSeconds": 36000},
        "Environment": {"SAGEQUEUE_SIM_DURATION": "30000"},
    }


def test_a_job_restored_in_starting_gets_a_reason_before_the_clock_moves(tmp_path: Path) -> None:
    state = tmp_path / "queue.json"
    # GIVEN a stack stopped while its job was starting
    with LocalStack(settings={"capacity": {POOL: 1}}, state=state) as first:
        first.client().submit(request(first, "long-runner"))
        first.run_until_idle()
        assert first.client().job("long-runner").state == "starting"
        account = first.account_id
    # WHEN a new stack of the same account (as `sagequeue local --state` is) restores the queue and
    # delivers what is pending, without moving its clock
    with LocalStack(settings={"capacity": {POOL: 1}}, state=state, account_id=account) as second:
        restored_at = second.now()
        second.run_until_idle()
        job = second.client().job("long-runner")
        # THEN the reconcile has already told the job what happened and started its next attempt
        assert second.now() == restored_at
        assert job.attempt == 2, job
        assert any("no longer exists" in (h.reason or "") for h in job.history), job.history
