"""How a simulated job reads its behaviour from its Environment, and the phase timings' checks."""

from __future__ import annotations

import pytest

from sagequeue.local.emulator.errors import ValidationError
from sagequeue.local.emulator.simulation import CAPACITY_FAILURE_REASON, Outcome, SimPlan, Timings

TIMINGS = Timings(default_duration_seconds=600, compile_seconds=0)  # compile is read in its own test


def plan(**environment: str) -> SimPlan:
    return SimPlan.from_environment(environment, TIMINGS)


def test_no_environment_means_a_busy_job_that_completes_after_the_default_duration() -> None:
    assert SimPlan.from_environment(None, TIMINGS) == SimPlan(duration_seconds=600, outcome=Outcome.COMPLETED)
    assert plan().reported_utilization == 85.0


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        ("Completed", SimPlan(600, Outcome.COMPLETED)),
        ("Failed:AlgorithmError: OOM", SimPlan(600, Outcome.FAILED, failure_reason="AlgorithmError: OOM")),
        (
            "Failed",
            SimPlan(
                600, Outcome.FAILED, failure_reason="AlgorithmError: the training script exited with code 1"
            ),
        ),
        ("CapacityError", SimPlan(600, Outcome.CAPACITY_ERROR)),
        ("Idle", SimPlan(600, Outcome.IDLE)),
        ("Interrupted:3", SimPlan(600, Outcome.INTERRUPTED, interruptions=3)),
        (" Interrupted: 2 ", SimPlan(600, Outcome.INTERRUPTED, interruptions=2)),
    ],
)
def test_each_outcome_is_read_from_sagequeue_sim_outcome(outcome: str, expected: SimPlan) -> None:
    assert plan(SAGEQUEUE_SIM_OUTCOME=outcome) == expected


def test_duration_and_utilization_are_read_and_idle_reports_zero() -> None:
    busy = plan(SAGEQUEUE_SIM_DURATION="90.5", SAGEQUEUE_SIM_UTILIZATION="40")
    assert busy.duration_seconds == 90.5
    assert busy.reported_utilization == 40
    assert plan(SAGEQUEUE_SIM_OUTCOME="Idle", SAGEQUEUE_SIM_UTILIZATION="40").reported_utilization == 0


@pytest.mark.parametrize(
    ("environment", "fragment"),
    [
        ({"SAGEQUEUE_SIM_DURATION": "soon"}, "must be a number"),
        ({"SAGEQUEUE_SIM_DURATION": "0"}, "positive"),
        ({"SAGEQUEUE_SIM_DURATION": "inf"}, "positive"),
        ({"SAGEQUEUE_SIM_UTILIZATION": "120"}, "between 0 and 100"),
        ({"SAGEQUEUE_SIM_OUTCOME": "Crashed"}, "is not one of"),
        ({"SAGEQUEUE_SIM_OUTCOME": "Interrupted"}, "needs a count"),
        ({"SAGEQUEUE_SIM_OUTCOME": "Interrupted:101"}, "at most 100"),
        ({"SAGEQUEUE_SIM_OUTCOME": "Idle:yes"}, "takes no argument"),
    ],
)
def test_unreadable_values_are_validation_errors_naming_the_variable(
    environment: dict[str, str], fragment: str
) -> None:
    with pytest.raises(ValidationError, match=fragment) as caught:
        SimPlan.from_environment(environment, TIMINGS)
    assert next(iter(environment)) in caught.value.message


def test_timings_refuse_negative_or_non_numeric_values() -> None:
    with pytest.raises(ValueError, match="provisioning_seconds"):
        Timings(provisioning_seconds=-1)
    with pytest.raises(ValueError, match="default_duration_seconds must be positive"):
        Timings(default_duration_seconds=0)


def test_the_capacity_failure_reason_is_sagemakers() -> None:
    assert CAPACITY_FAILURE_REASON.startswith(
        "CapacityError: Unable to provision requested ML compute capacity."
    )


def test_the_compile_phase_comes_from_the_timings_or_the_environment() -> None:
    assert SimPlan.from_environment(None, Timings(compile_seconds=300)).compile_seconds == 300
    assert plan(SAGEQUEUE_SIM_COMPILE_SECONDS="900").compile_seconds == 900
    assert plan(SAGEQUEUE_SIM_COMPILE_SECONDS="0").compile_seconds == 0
    for bad in ("-1", "soon", "nan"):
        with pytest.raises(ValidationError, match="SAGEQUEUE_SIM_COMPILE_SECONDS"):
            plan(SAGEQUEUE_SIM_COMPILE_SECONDS=bad)


def test_checkpoints_are_read_as_successive_gaps_the_last_repeating() -> None:
    assert plan().checkpoint_seconds is None
    assert plan(SAGEQUEUE_SIM_CHECKPOINT_SECONDS="300").checkpoint_seconds == (300.0,)
    drifting = plan(SAGEQUEUE_SIM_CHECKPOINT_SECONDS="600, 600,900", SAGEQUEUE_SIM_CHECKPOINT_AS="other")
    assert (drifting.checkpoint_seconds, drifting.checkpoint_as) == ((600.0, 600.0, 900.0), "other")
    with pytest.raises(ValidationError, match="SAGEQUEUE_SIM_CHECKPOINT_SECONDS"):
        plan(SAGEQUEUE_SIM_CHECKPOINT_SECONDS="600,soon")
    with pytest.raises(ValidationError, match="SAGEQUEUE_SIM_CHECKPOINT_SECONDS"):
        plan(SAGEQUEUE_SIM_CHECKPOINT_SECONDS="0")
