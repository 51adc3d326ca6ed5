"""What a simulated training job does, read from its `Environment`, and how long each phase lasts.

A job tells the emulator how to behave through environment variables, so the same CreateTrainingJob
request that runs on SageMaker runs here unchanged; the variables are ignored by real training images.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sagequeue.local.emulator.errors import ValidationError

#: Seconds of training (the Training phase only), default `Timings.default_duration_seconds`.
DURATION_ENV = "SAGEQUEUE_SIM_DURATION"
#: `Completed` | `Failed:<FailureReason>` | `CapacityError` | `Idle` | `Interrupted:<n>`.
OUTCOME_ENV = "SAGEQUEUE_SIM_OUTCOME"
#: NeuronCore utilization (percent) a busy host reports, default `DEFAULT_UTILIZATION`.
UTILIZATION_ENV = "SAGEQUEUE_SIM_UTILIZATION"
#: Seconds at the start of Training spent compiling (0% utilization), default `Timings.compile_seconds`.
COMPILE_ENV = "SAGEQUEUE_SIM_COMPILE_SECONDS"
#: Seconds of Training between the checkpoints the job writes; unset: it writes none. Comma-separated, the
#: successive gaps, the last repeating ("600,600,900": an interval that drifts; "600,600,1e9": two, then no
#: more). Each puts the job image's marker (sagequeue_core.checkpoint_marker) under CheckpointConfig.S3Uri,
#: as SageMaker's sync does.
CHECKPOINT_ENV = "SAGEQUEUE_SIM_CHECKPOINT_SECONDS"
#: The training job the job's markers name; unset: its own. A job that lies: it reports for another.
CHECKPOINT_AS_ENV = "SAGEQUEUE_SIM_CHECKPOINT_AS"

DEFAULT_UTILIZATION = 85.0
MAX_INTERRUPTIONS = 100

#: The FailureReason SageMaker gives a job it could not find instances for.
CAPACITY_FAILURE_REASON = (
    "CapacityError: Unable to provision requested ML compute capacity. "
    "Please retry using a different ML instance type."
)


class Outcome(StrEnum):
    COMPLETED = "Completed"
    FAILED = "Failed"
    CAPACITY_ERROR = "CapacityError"
    IDLE = "Idle"
    INTERRUPTED = "Interrupted"


@dataclass(frozen=True)
class Timings:
    """How long the phases SageMaker controls last, in (simulated) seconds."""

    provisioning_seconds: float = 180.0
    warm_start_seconds: float = 20.0
    download_seconds: float = 100.0
    upload_seconds: float = 20.0
    stop_grace_seconds: float = 120.0
    default_duration_seconds: float = 600.0
    capacity_error_after_seconds: float = 1800.0
    spot_interruption_seconds: float = 120.0
    #: After a job ends, Describe and List leave WarmPoolStatus out this long before it shows again.
    warm_pool_status_lag_seconds: float = 5.0
    #: The first seconds of each Training phase report 0% NeuronCore utilization: a neuronx-cc compile.
    compile_seconds: float = 120.0

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative number of seconds, got {value!r}")
        if self.default_duration_seconds <= 0:
            raise ValueError("default_duration_seconds must be positive")


@dataclass(frozen=True)
class SimPlan:
    """The behaviour of one job: how long it trains, how it ends, how busy its NeuronCores are."""

    duration_seconds: float
    outcome: Outcome = Outcome.COMPLETED
    failure_reason: str = ""
    interruptions: int = 0
    utilization: float = DEFAULT_UTILIZATION
    compile_seconds: float = 0.0
    #: Training seconds between successive checkpoints, the last repeating; None: it writes none
    checkpoint_seconds: tuple[float, ...] | None = None
    checkpoint_as: str | None = None  # the training job its markers name; None: its own

    @property
    def reported_utilization(self) -> float:
        return 0.0 if self.outcome is Outcome.IDLE else self.utilization

    @classmethod
    def from_environment(cls, environment: Mapping[str, Any] | None, timings: Timings) -> SimPlan:
        env = environment or {}
        duration = _positive_number(env.get(DURATION_ENV), DURATION_ENV, timings.default_duration_seconds)
        utilization = _percent(env.get(UTILIZATION_ENV))
        compile_value = env.get(COMPILE_ENV)
        compile_seconds = (
            timings.compile_seconds
            if compile_value in (None, "")
            else _non_negative(compile_value, COMPILE_ENV)
        )
        checkpoint_value = env.get(CHECKPOINT_ENV)
        checkpoint_seconds = (
            None
            if checkpoint_value in (None, "")
            else tuple(
                _positive_number(part.strip(), CHECKPOINT_ENV, timings.default_duration_seconds)
                for part in str(checkpoint_value).split(",")
            )
        )
        outcome_text = str(env.get(OUTCOME_ENV) or Outcome.COMPLETED.value).strip()
        kind, _, argument = outcome_text.partition(":")
        try:
            outcome = Outcome(kind.strip())
        except ValueError:
            raise ValidationError(
                f"Environment {OUTCOME_ENV}={outcome_text!r} is not one of Completed, Failed:<FailureReason>, "
                "CapacityError, Idle, Interrupted:<n>"
            ) from None
        failure_reason = ""
        interruptions = 0
        if outcome is Outcome.FAILED:
            failure_reason = argument.strip() or "AlgorithmError: the training script exited with code 1"
        elif outcome is Outcome.INTERRUPTED:
            if not re.fullmatch(r"\s*\d+\s*", argument):
                raise ValidationError(
                    f"Environment {OUTCOME_ENV}={outcome_text!r}: Interrupted needs a count, e.g. Interrupted:2"
                )
            interruptions = int(argument)
            if interruptions > MAX_INTERRUPTIONS:
                raise ValidationError(
                    f"Environment {OUTCOME_ENV}={outcome_text!r}: at most {MAX_INTERRUPTIONS} interruptions"
                )
        elif argument.strip():
            raise ValidationError(f"Environment {OUTCOME_ENV}={outcome_text!r}: {kind} takes no argument")
        return cls(
            duration_seconds=duration,
            outcome=outcome,
            failure_reason=failure_reason,
            interruptions=interruptions,
            utilization=utilization,
            compile_seconds=compile_seconds,
            checkpoint_seconds=checkpoint_seconds,
            checkpoint_as=str(env.get(CHECKPOINT_AS_ENV) or "") or None,
        )


def _positive_number(value: Any, name: str, default: float) -> float:
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValidationError(f"Environment {name}={value!r} must be a number of seconds") from None
    if not math.isfinite(number) or number <= 0:
        raise ValidationError(f"Environment {name}={value!r} must be a positive number of seconds")
    return number


def _non_negative(value: Any, name: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValidationError(f"Environment {name}={value!r} must be a number of seconds") from None
    if not math.isfinite(number) or number < 0:
        raise ValidationError(f"Environment {name}={value!r} must be a non-negative number of seconds")
    return number


def _percent(value: Any) -> float:
    if value is None or value == "":
        return DEFAULT_UTILIZATION
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValidationError(f"Environment {UTILIZATION_ENV}={value!r} must be a percentage") from None
    if not 0 <= number <= 100:
        raise ValidationError(f"Environment {UTILIZATION_ENV}={value!r} must be between 0 and 100")
    return number
