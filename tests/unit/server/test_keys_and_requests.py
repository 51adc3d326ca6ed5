"""Pure pieces of the store and the scheduler: the queue's sort key and an attempt's request."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from sagequeue_core.domain import PRIORITY_MAX, PRIORITY_MIN, Job
from sagequeue_core.service.schedule import attempt_request
from sagequeue_core.store import queue_order

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
entries = st.tuples(
    st.integers(PRIORITY_MIN, PRIORITY_MAX),
    st.integers(0, 10**9).map(lambda ms: EPOCH + timedelta(milliseconds=ms)),
    st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True),
)


@given(st.lists(entries, min_size=2, max_size=30, unique_by=lambda e: e[2]))
def test_the_index_sort_key_is_the_queue_order(jobs: list[tuple[int, datetime, str]]) -> None:
    by_key = sorted(jobs, key=lambda j: queue_order(*j))
    by_rule = sorted(jobs, key=lambda j: (-j[0], j[1], j[2]))
    assert by_key == by_rule


def job(request_extra: dict[str, object] | None = None) -> Job:
    request = {
        "TrainingJobName": "train",
        "RoleArn": "arn:aws:iam::123456789012:role/R",
        "ResourceConfig": {"InstanceType": "ml.trn1.32xlarge", "InstanceCount": 1, "VolumeSizeInGB": 10},
        "CheckpointConfig": {"S3Uri": "s3://b/ckpt/train"},
        "Tags": [{"Key": "team", "Value": "research"}],
        **(request_extra or {}),
    }
    return Job(
        name="train",
        request=request,
        priority=1,
        owner="arn:aws:iam::123456789012:user/a",
        submitted_at=EPOCH,
    )


def test_a_later_attempt_has_its_own_name_the_same_checkpoints_and_the_queues_tags() -> None:
    request = attempt_request(job(), 3, None)
    assert request["TrainingJobName"] == "train--3"
    assert request["CheckpointConfig"] == {"S3Uri": "s3://b/ckpt/train"}
    assert {t["Key"]: t["Value"] for t in request["Tags"]} == {
        "team": "research",
        "sagequeue:job": "train",
        "sagequeue:attempt": "3",
        "sagequeue:submitted-by": "arn:aws:iam::123456789012:user/a",
    }
    assert "KeepAlivePeriodInSeconds" not in request["ResourceConfig"]


def test_the_scheduler_keep_alive_never_shortens_the_users() -> None:
    assert attempt_request(job(), 1, 600)["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 600
    longer = job(
        {
            "ResourceConfig": {
                "InstanceType": "ml.trn1.32xlarge",
                "InstanceCount": 1,
                "KeepAlivePeriodInSeconds": 1800,
            }
        }
    )
    assert attempt_request(longer, 1, 600)["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 1800


def test_building_an_attempt_leaves_the_stored_request_alone() -> None:
    queued = job()
    attempt_request(queued, 2, 600)
    assert queued.request["TrainingJobName"] == "train"
    assert "KeepAlivePeriodInSeconds" not in queued.request["ResourceConfig"]
    assert len(queued.request["Tags"]) == 1


def test_an_attempt_not_to_keep_warm_asks_for_no_warm_pool_whatever_was_submitted() -> None:
    submitted = job(
        {
            "ResourceConfig": {
                "InstanceType": "ml.trn1.32xlarge",
                "InstanceCount": 1,
                "VolumeSizeInGB": 10,
                "KeepAlivePeriodInSeconds": 1800,
            }
        }
    )
    request = attempt_request(submitted, 1, 600, keep_warm=False)
    assert "KeepAlivePeriodInSeconds" not in request["ResourceConfig"]
    assert submitted.request["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 1800  # the job is unchanged
