"""sagequeue's SageMaker training-job emulator: a local HTTP endpoint that boto3 talks to unchanged.

    with SageMakerEmulator(instance_limits={"ml.trn1.32xlarge": 4}) as emulator:
        sagemaker = boto3.client("sagemaker", endpoint_url=emulator.endpoint_url)
        ...
        emulator.advance(600)  # ten simulated minutes, every transition delivered in order

See docs/emulator.md for what it emulates and where it differs from SageMaker.
"""

from sagequeue.local.emulator.emulator import EmulatorNotRunning, SageMakerEmulator
from sagequeue.local.emulator.simulation import DURATION_ENV, OUTCOME_ENV, UTILIZATION_ENV, Timings

__all__ = [
    "DURATION_ENV",
    "OUTCOME_ENV",
    "UTILIZATION_ENV",
    "EmulatorNotRunning",
    "SageMakerEmulator",
    "Timings",
]
