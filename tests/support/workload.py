"""A seeded random workload on the local stack, with adversarial delivery and the invariant monitor.

Users submit jobs (priorities, durations, one or two instances, trn1 and trn2, heterogeneous clusters,
managed spot with interruptions, their own warm-pool keep-alives), cancel them, hold and release them and
change their priorities, while SageMaker's events reach the scheduler duplicated, reordered, late or never.
After every SageMaker operation and every step of the clock the monitor checks SageMaker's side.

Used by tests/functional/server/test_random_workload.py (a handful of seeds) and
bench/bench_consistency.py (hundreds of seeds).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from support.delivery import AdversarialDelivery
from support.invariants import InvariantMonitor

TRN1 = "ml.trn1.32xlarge"
TRN2 = "ml.trn2.48xlarge"
CAPACITY = {TRN1: 3, TRN2: 2}
TERMINAL = ("completed", "failed", "cancelled", "idle_stopped")


@dataclass
class WorkloadResult:
    seed: int
    user_operations: int = 0
    sagemaker_checks: int = 0
    violations: list[str] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)
    submitted: int = 0
    #: unfinished jobs that do not say why they wait ("<name> (<state>)"): each should have a reason
    without_reason: list[str] = field(default_factory=list)


def _request(
    rng: random.Random, name: str, role: str, account: str, plan: str | None = None
) -> dict[str, Any]:
    duration = rng.choice((60, 120, 300, 600, 900))
    environment = {"SAGEQUEUE_SIM_DURATION": str(duration)}
    config: dict[str, Any] = {"VolumeSizeInGB": rng.choice((100, 100, 500))}
    shape = rng.random()
    body: dict[str, Any] = {
        "TrainingJobName": name,
        "RoleArn": role,
        "AlgorithmSpecification": {
            "TrainingImage": f"{account}.dkr.ecr.us-east-1.amazonaws.com/neuron-train:2.21",
            "TrainingInputMode": "File",
        },
        "OutputDataConfig": {"S3OutputPath": "s3://sagequeue-test/output"},
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
        "CheckpointConfig": {"S3Uri": f"s3://sagequeue-test/checkpoints/{name}"},
        "Environment": environment,
        "Tags": [{"Key": "team", "Value": "research"}],
        "priority": rng.randint(1, 9),
    }
    if shape < 0.1:
        config["InstanceGroups"] = [
            {"InstanceGroupName": "trn1", "InstanceType": TRN1, "InstanceCount": 1},
            {"InstanceGroupName": "trn2", "InstanceType": TRN2, "InstanceCount": 1},
        ]
    else:
        config["InstanceType"] = TRN1 if shape < 0.7 else TRN2
        config["InstanceCount"] = 2 if rng.random() < 0.2 else 1
    if shape >= 0.1 and rng.random() < 0.15:
        body["EnableManagedSpotTraining"] = True
        body["StoppingCondition"]["MaxWaitTimeInSeconds"] = 86400
        if rng.random() < 0.5:
            environment["SAGEQUEUE_SIM_OUTCOME"] = "Interrupted:1"
    elif shape >= 0.1 and rng.random() < 0.3:
        config["KeepAlivePeriodInSeconds"] = rng.choice((300, 600, 900))
    elif plan is not None and shape >= 0.1 and rng.random() < 0.4:
        config["InstanceType"] = TRN1
        config["TrainingPlanArn"] = plan
        if rng.random() < 0.5:
            body["StoppingCondition"]["MaxPendingTimeInSeconds"] = 7200
    body["ResourceConfig"] = config
    return body


def _unfinished(world: Any, names: list[str]) -> list[str]:
    """The jobs not yet in a final state, read from the table (the API's answer holds the same state)."""
    return [name for name in names if world.deps.store.get_job(name).state.value not in TERMINAL]


def run_workload(
    world: Any,
    seed: int,
    *,
    operations: int = 25,
    admin: str,
    submitter: str,
    role: str,
    account: str,
    settle_seconds: float = 4 * 3600,
    delivery: AdversarialDelivery | None = None,
    plan: str | None = None,
) -> WorkloadResult:
    """Drive `world` (a server-test QueueWorld built with CAPACITY) through a random workload; SageMaker's
    events go through `delivery` (by default adversarial, drawn from `seed`). With `plan` (the ARN of a
    training plan the world has a pool for), some jobs run on it."""
    rng = random.Random(seed)
    delivery = delivery if delivery is not None else AdversarialDelivery(seed)
    world.mangle = delivery
    monitor = InvariantMonitor(world.emulator, world.deps.store).attach(world.deps.sagemaker.client)
    result = WorkloadResult(seed)
    names: list[str] = []

    def step(seconds: float) -> None:
        world.run(seconds, 60)
        if rng.random() < 0.3:
            world.deliver(delivery.flush())  # what was held back arrives late
        monitor.check_settled()

    try:
        for index in range(operations):
            roll = rng.random()
            if roll < 0.45 or not names:
                name = f"s{seed}-j{index}"
                request = _request(rng, name, role, account, plan)
                status, _ = world.api("POST", "/jobs", request, caller=submitter)
                if status == 201:
                    names.append(name)
                    result.submitted += 1
            elif roll < 0.55:
                world.api("DELETE", f"/jobs/{rng.choice(names)}", caller=submitter)
            elif roll < 0.65:
                world.api("PATCH", f"/jobs/{rng.choice(names)}", {"held": True}, caller=submitter)
            elif roll < 0.72:
                world.api("PATCH", f"/jobs/{rng.choice(names)}", {"held": False}, caller=submitter)
            elif roll < 0.82:
                body = {"priority": rng.randint(1, 9)}
                world.api("PATCH", f"/jobs/{rng.choice(names)}", body, caller=admin)
            result.user_operations += 1
            step(rng.choice((30, 60, 120, 240)))
        # release whatever is held so that every job can end, then let the queue drain
        for name in names:
            world.api("PATCH", f"/jobs/{name}", {"held": False}, caller=admin)
        world.deliver(delivery.flush())
        waited = 0.0
        while waited < settle_seconds and _unfinished(world, names):
            step(600)
            waited += 600
        result.unfinished = _unfinished(world, names)
        for name in result.unfinished:
            job = world.deps.store.get_job(name)
            if not job.reason:
                result.without_reason.append(f"{name} ({job.state.value})")
    finally:
        monitor.detach()
        world.mangle = None
    result.violations = list(monitor.violations)
    result.sagemaker_checks = monitor.checks
    return result


#: A scarce region: fewer instances than the pools hold (trn2's 2-instance jobs never launch), and a plan
#: pool of 2 whose plan has 1 instance left.
SCARCE_REGION = {TRN1: 2, TRN2: 1}
PLAN_POOL = "plan:research-a"
PLAN_ARN = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/research-a"


def scarce_world(seed: int) -> dict[str, Any]:
    """make_world's arguments for a scarce seed: the region below the pools, a warm-pool quota of 0 on even
    seeds and 1 on odd ones (trn1), and a training-plan pool."""
    return {
        "capacity": {**CAPACITY, PLAN_POOL: 2},
        "region_capacity": dict(SCARCE_REGION),
        "warm_pool_quota": {TRN1: seed % 2},
        "seed": seed,
    }


def shrink_plan(world: Any) -> None:
    """The plan has 1 instance left on SageMaker's side while its pool says 2: plan jobs wait in Pending."""
    world.emulator.add_training_plan(PLAN_ARN, 1)
