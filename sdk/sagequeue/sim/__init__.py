"""`sagequeue simulate`: a capacity simulator on sagequeue's real scheduling policy.

A discrete-event simulation of the queue, a modelled SageMaker and the scheduler's passes, on a generated
or imported workload, with baselines (FIFO, priority without preemption, the original article's naive
preemptive scheduler) run on the same trace. docs/simulator.md describes the model, the trace format and
the metrics.
"""

from __future__ import annotations

from sagequeue.sim.engine import SimSettings, Simulation
from sagequeue.sim.run import Result, Variant, baselines, simulate
from sagequeue.sim.sagemaker import Timings
from sagequeue.sim.trace import Trace, TraceError, TraceJob, load_trace
from sagequeue.sim.workload import WorkloadSpec, generate

__all__ = [
    "Result",
    "SimSettings",
    "Simulation",
    "Timings",
    "Trace",
    "TraceError",
    "TraceJob",
    "Variant",
    "WorkloadSpec",
    "baselines",
    "generate",
    "load_trace",
    "simulate",
]
