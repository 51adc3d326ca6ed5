"""Governance resumes a job that failed on SageMaker's side, once per failure, never beyond max_resumes
(the local stack over HTTP, as tests/e2e/test_governance.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from test_governance import TRN1, advance_until, lineage, replay, request, status, unique

from sagequeue.local import LocalStack
from sagequeue.local.emulator import EventDelivery, Kinder, aws_options
from sagequeue_core.defaults import SEAL_TAG
from sagequeue_core.domain import tags_to_dict
from sagequeue_core.governance import CLONE_ATTEMPT_TAG, CLONE_OF_TAG, RESUMES_TAG


@pytest.fixture(scope="module")
def stack() -> Iterator[Any]:
    """The resume of a failed job rests on its Failed event: governance's reconcile looks at jobs in
    progress only, so a lost Failed event is a resume that never comes (docs/guardrails.md)."""
    settings = {"capacity": {TRN1: 16}, "max_resumes": 2, "resume_after_failure_min_runtime_seconds": 600}
    kinder = Kinder(
        "a failed job is resumed on its Failed event only: this test counts resumes", "event_loss"
    )
    emulator = {**aws_options(region_capacity={TRN1: 16}), "delivery": EventDelivery(), "kinder": kinder}
    with LocalStack(settings=settings, emulator=emulator) as running:
        yield running


def test_a_transient_failure_is_resumed_once_per_failure_and_never_beyond_max_resumes(
    stack: Any,
) -> None:
    root = unique("flaky")
    # trains 11 minutes, a little more than the 10 a resume needs, then fails on SageMaker's side
    env = {
        "SAGEQUEUE_SIM_DURATION": "660",
        "SAGEQUEUE_SIM_OUTCOME": "Failed:InternalServerError: We encountered an internal error.",
    }
    stack.sagemaker.create_training_job(**request(stack, root, env=env))

    advance_until(stack, lambda: status(stack, root)[0] == "Failed", limit=3600)
    stack.run_until_idle()
    assert lineage(stack, root) == [root, f"{root}--2"]
    replay(stack, root)  # the Failed event once more
    assert lineage(stack, root) == [root, f"{root}--2"]

    advance_until(
        stack,
        lambda: (
            all(status(stack, n)[0] == "Failed" for n in lineage(stack, root))
            and len(lineage(stack, root)) == 3
        ),
        limit=7200,
    )
    stack.advance(300)
    assert lineage(stack, root) == [root, f"{root}--2", f"{root}--3"]
    assert all(status(stack, n)[0] == "Failed" for n in lineage(stack, root))


def test_a_clone_name_created_ahead_under_clone_tags_neither_poses_as_the_clone_nor_blocks_the_resume(
    stack: Any,
) -> None:
    """GIVEN a job that will fail on SageMaker's side, and someone allowed CreateTrainingJob who created its
    clone's name `<job>--2` ahead, tagged as governance tags its clones (no seal that verifies),
    WHEN the job fails,
    THEN it is resumed all the same, under a random fallback name carrying a seal, and the stranger's job
    is not taken for the clone."""
    root = unique("squatted")
    env = {
        "SAGEQUEUE_SIM_DURATION": "660",
        "SAGEQUEUE_SIM_OUTCOME": "Failed:InternalServerError: We encountered an internal error.",
    }
    stack.sagemaker.create_training_job(**request(stack, root, env=env))
    squatter = f"{root}--2"
    forged = {CLONE_OF_TAG: root, CLONE_ATTEMPT_TAG: "2", RESUMES_TAG: "1", SEAL_TAG: "f" * 32}
    stack.sagemaker.create_training_job(
        **request(stack, squatter, env={"SAGEQUEUE_SIM_DURATION": "7200"}, tags=forged)
    )
    advance_until(stack, lambda: status(stack, root)[0] == "Failed", limit=3600)
    stack.run_until_idle()
    clones = [n for n in lineage(stack, root) if n not in (root, squatter)]
    assert len(clones) == 1
    assert re.fullmatch(rf"{root}--2x[0-9a-f]{{12}}", clones[0])
    replay(stack, root)  # the Failed event once more: the same clone, no second one
    assert [n for n in lineage(stack, root) if n not in (root, squatter)] == clones
    assert status(stack, clones[0])[0] == "InProgress"
    tags = tags_to_dict(
        stack.sagemaker.list_tags(
            ResourceArn=stack.sagemaker.describe_training_job(TrainingJobName=clones[0])["TrainingJobArn"]
        )["Tags"]
    )
    assert (tags[CLONE_OF_TAG], tags[RESUMES_TAG]) == (root, "1")
    assert tags[SEAL_TAG] != forged[SEAL_TAG]
    for name in (squatter, clones[0]):
        stack.sagemaker.stop_training_job(TrainingJobName=name)
