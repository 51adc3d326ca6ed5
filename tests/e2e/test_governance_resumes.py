"""Governance resumes a job that failed on SageMaker's side, once per failure, never beyond max_resumes
(the local stack over HTTP, as tests/e2e/test_governance.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from test_governance import TRN1, advance_until, lineage, replay, request, status, unique

from sagequeue.local import LocalStack
from sagequeue.local.emulator import EventDelivery, Kinder, aws_options


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
