"""sagequeue's SageMaker training-job emulator: a local HTTP endpoint that boto3 talks to unchanged.

    with SageMakerEmulator(instance_limits={"ml.trn1.32xlarge": 4}) as emulator:
        sagemaker = boto3.client("sagemaker", endpoint_url=emulator.endpoint_url)
        ...
        emulator.advance(600)  # ten simulated minutes; events arrive as EventBridge delivers them

See docs/emulator.md for what it emulates and where it differs from SageMaker.
"""

from sagequeue.local.emulator.delivery import EventDelivery
from sagequeue.local.emulator.emulator import EmulatorNotRunning, SageMakerEmulator
from sagequeue.local.emulator.profiles import DEPARTURES, Kinder, aws_options
from sagequeue.local.emulator.simulation import (
    COMPILE_ENV,
    DURATION_ENV,
    OUTCOME_ENV,
    UTILIZATION_ENV,
    Timings,
)
from sagequeue.local.emulator.throttling import DEFAULT_RATES, Rate

__all__ = [
    "COMPILE_ENV",
    "DEFAULT_RATES",
    "DEPARTURES",
    "DURATION_ENV",
    "OUTCOME_ENV",
    "UTILIZATION_ENV",
    "EmulatorNotRunning",
    "EventDelivery",
    "Kinder",
    "Rate",
    "SageMakerEmulator",
    "Timings",
    "aws_options",
]
