"""`sagequeue ls` shows the queue as squeue does: every job the caller may see, whoever submitted it, and
its filters narrow the list to what they name. Run as separate processes against the local stack, as a
user, as another user and as an admin, on a queue holding several users' jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sagequeue.config import save_local_connection
from sagequeue.local import LocalStack

POOL = "ml.trn1.32xlarge"
IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/neuron-train:2.21"
COMMAND = str(Path(sys.executable).with_name("sagequeue"))
AWS_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


@pytest.fixture(scope="module")
def stack() -> Iterator[Any]:
    # each user's team comes from its identity (TeamRoles); the jobs' team tags confirm it
    with LocalStack(settings={"capacity": {POOL: 1}}, teams={"user": "vision", "other": "speech"}) as running:
        yield running


@pytest.fixture(scope="module")
def homes(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for who in ("user", "other", "admin"):
        home = tmp_path_factory.mktemp(f"{who}-home")
        save_local_connection(stack.connection(who), home / "local.json")
        out[who] = home
    return out


def sagequeue(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith("SAGEQUEUE_") and k not in AWS_KEYS
    }
    environment["SAGEQUEUE_HOME"] = str(home)
    return subprocess.run(
        [COMMAND, *args], capture_output=True, text=True, env=environment, timeout=60, check=False
    )


def listed(home: Path, *args: str) -> list[str]:
    done = sagequeue(home, "ls", "--json", *args)
    assert done.returncode == 0, done.stderr
    return [job["name"] for job in json.loads(done.stdout)["jobs"]]


def request(stack: Any, name: str, team: str) -> dict[str, Any]:
    return {
        "TrainingJobName": name,
        "RoleArn": stack.training_role_arn,
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": "s3://sagequeue-e2e/output"},
        "ResourceConfig": {"InstanceType": POOL, "InstanceCount": 1, "VolumeSizeInGB": 64},
        "StoppingCondition": {"MaxRuntimeInSeconds": 7200},
        "Environment": {"SAGEQUEUE_SIM_DURATION": "3600"},
        "Tags": [{"Key": "team", "Value": team}],
    }


@pytest.fixture(scope="module")
def queue(stack: Any) -> dict[str, str]:
    """GIVEN a queue with jobs of two users and two teams: one running, three waiting, one cancelled."""
    tag = uuid.uuid4().hex[:4]
    names = {
        key: f"{key}-{tag}" for key in ("user-run", "user-wait", "user-gone", "other-wait", "other-late")
    }
    user, other = stack.client("user"), stack.client("other")
    user.submit(request(stack, names["user-run"], "vision"), priority=9)
    stack.run_until_idle()
    user.submit(request(stack, names["user-wait"], "vision"), priority=5)
    user.submit(request(stack, names["user-gone"], "vision"), priority=1)
    other.submit(request(stack, names["other-wait"], "speech"), priority=7)
    other.submit(request(stack, names["other-late"], "speech"), priority=0)
    user.cancel(names["user-gone"])
    stack.run_until_idle()
    return names


def test_every_caller_sees_the_whole_queue_highest_priority_first(
    queue: dict[str, str], homes: dict[str, Path]
) -> None:
    whole = [queue[k] for k in ("user-run", "other-wait", "user-wait", "other-late")]
    # WHEN a user, another user and an admin each list the queue
    # THEN each sees every job that has not ended, whoever submitted it (the admin too, who has none)
    for who in ("user", "other", "admin"):
        assert listed(homes[who]) == whole, who
    # AND the table says whose job each is
    table = sagequeue(homes["admin"], "ls").stdout.splitlines()
    assert table[0].split()[:2] == ["NAME", "USER"]
    users = {line.split()[0]: line.split()[1] for line in table[1:]}
    assert users[queue["other-wait"]] == "sagequeue-local-other"
    assert users[queue["user-run"]] == "sagequeue-local-user"


def test_the_filters_narrow_the_queue_to_what_they_name(
    stack: Any, queue: dict[str, str], homes: dict[str, Path]
) -> None:
    user = homes["user"]
    mine = [queue["user-run"], queue["user-wait"]]
    theirs = [queue["other-wait"], queue["other-late"]]

    assert listed(user, "--mine") == mine
    assert listed(homes["other"], "--mine") == theirs
    assert listed(homes["admin"], "--mine") == []
    assert listed(user, "--user", "sagequeue-local-other") == theirs
    assert listed(user, "--user", stack.identity("other").arn) == theirs
    assert listed(user, "--owner", stack.identity("other").arn) == theirs
    assert listed(user, "--team", "speech") == theirs
    assert listed(user, "--team", "vision", "--state", "queued") == [queue["user-wait"]]
    assert listed(user, "--state", "queued") == [queue["other-wait"], queue["user-wait"], queue["other-late"]]
    assert listed(user, "--limit", "2") == [queue["user-run"], queue["other-wait"]]
    # ended jobs only when asked for
    assert queue["user-gone"] not in listed(user)
    assert queue["user-gone"] in listed(user, "--all")
    assert listed(homes["other"], "--state", "cancelled", "--user", "sagequeue-local-user") == [
        queue["user-gone"]
    ]
    assert listed(user, "--mine", "--all") == [queue["user-run"], queue["user-wait"], queue["user-gone"]]


def test_contradictory_filters_are_bad_usage(homes: dict[str, Path]) -> None:
    for args, message in (
        (("--mine", "--user", "x"), "--mine and --user cannot be used together"),
        (("--all", "--state", "queued"), "--all and --state cannot be used together"),
        (("--team", "no spaces allowed"), "--team"),
    ):
        done = sagequeue(homes["user"], "ls", *args)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
