"""`sagequeue demo`: the queue doing its job on the local stack, checked at every step.

Part 1 is a priority scenario (two ml.trn1.32xlarge instances; job1 priority 1, job2 priority 2, job3
priority 1, then job4 priority 3): job1 is preempted for job4, resumes when job2 finishes, job3 runs
last, nothing is lost. Part 2 shows a queued job starting on the warm instances a finished job left behind,
and an idle job (0% NeuronCore utilization) stopped by its idle alarm while a busy one trains on.

Every step is checked against the expected queue; a difference raises DemoFailed naming the step, what was
expected and what the queue holds. The queue is read and changed only through the public client over
signed HTTP, exactly as a user's CLI would; `sagequeue demo` runs the stack behind it with its AWS services
in process (`LocalStack(aws="in-process")`, docs/adr/0013-the-demo-serves-aws-in-process.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

POOL = "ml.trn1.32xlarge"
CAPACITY = 2
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training-neuronx:2.1.2-neuronx-py310-sdk2.20.0"
#: Emulated SageMaker phases, shortened so the demo spans minutes of virtual time (seconds).
TIMINGS = {"provisioning_seconds": 30, "download_seconds": 5, "upload_seconds": 5, "stop_grace_seconds": 15}
#: Settings of the demo's stack: preemption allowed at once, a 3-minute idle window.
SETTINGS: dict[str, Any] = {
    "capacity": {POOL: CAPACITY},
    "min_runtime_before_preemption_seconds": 0,
    "idle_period_seconds": 60,
    "idle_periods": 3,
}
_LIVE = {"starting", "running", "preempting", "stopping"}
_WAITING = {"queued", "held"}


class DemoFailed(RuntimeError):
    """The scheduler did not do what the scenario expects; the message says where and how."""


@dataclass
class Row:
    name: str
    state: str
    priority: int
    attempt: int
    pool: str
    waited: float
    ran: float
    preemptions: int


@dataclass
class Summary:
    elapsed: float = 0.0
    instance_seconds: float = 0.0
    waits: dict[str, float] = field(default_factory=dict)
    preemptions: int = 0
    #: (training job that started on warm instances, training job that left them), in start order
    warm_pool_reuses: list[tuple[str, str]] = field(default_factory=list)
    idle_stops: int = 0
    jobs: int = 0
    completed: int = 0


def settings(scale: float = 1.0) -> dict[str, Any]:
    """The demo stack's settings, the idle window stretched by `scale` like every other duration."""
    return {**SETTINGS, "idle_period_seconds": max(60, int(60 * scale))}


def timings(scale: float = 1.0) -> dict[str, Any]:
    """The demo's emulator: SageMaker as AWS documents it but on a fast clock (every phase, the stop grace
    included, shortened), in an account that raised its warm-pool quota to the pool's size (Part 2)."""
    from sagequeue.local.emulator import Kinder

    return {
        **{name: value * scale for name, value in TIMINGS.items()},
        "warm_pool_limits": {POOL: CAPACITY},
        "kinder": Kinder(
            "the demo runs on a fast clock: every phase, the stop grace too, is shortened", "stop_grace"
        ),
    }


def training_request(
    name: str,
    role_arn: str,
    seconds: int,
    *,
    keep_alive: int = 0,
    outcome: str | None = None,
    volume_gb: int = 64,
) -> dict[str, Any]:
    """A CreateTrainingJob request as the SageMaker SDK builds it; the Environment tells the emulator how
    long the job trains and how it ends."""
    environment = {"SAGEQUEUE_SIM_DURATION": str(seconds)}
    if outcome:
        environment["SAGEQUEUE_SIM_OUTCOME"] = outcome
    resources: dict[str, Any] = {"InstanceType": POOL, "InstanceCount": 1, "VolumeSizeInGB": volume_gb}
    if keep_alive:
        resources["KeepAlivePeriodInSeconds"] = keep_alive
    return {
        "TrainingJobName": name,
        "RoleArn": role_arn,
        "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
        "OutputDataConfig": {"S3OutputPath": "s3://sagequeue-demo/output"},
        "ResourceConfig": resources,
        "CheckpointConfig": {"S3Uri": f"s3://sagequeue-demo/checkpoints/{name}"},
        "StoppingCondition": {"MaxRuntimeInSeconds": 7200},
        "Environment": environment,
        "Tags": [{"Key": "team", "Value": "demo"}],
    }


def _parse(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def time_in_states(job: Any, states: set[str], now: datetime) -> float:
    """Seconds `job` spent in `states`, from its history (state changes with their times)."""
    entries = [(at, entry.state) for entry in job.history if (at := _parse(entry.at)) is not None]
    submitted = _parse(job.submitted_at)
    if submitted is not None and (not entries or entries[0][1] != "queued"):
        entries.insert(0, (submitted, "queued"))
    total = 0.0
    for index, (at, state) in enumerate(entries):
        until = entries[index + 1][0] if index + 1 < len(entries) else now
        if state in states and until > at:
            total += (until - at).total_seconds()
    return total


def _clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes}:{rest:02d}"


class Demo:
    """Runs the scenario on a started LocalStack and prints what happens."""

    def __init__(
        self, stack: Any, out: Callable[[str], None] = print, *, step_seconds: int = 30, scale: float = 1.0
    ) -> None:
        self.stack = stack
        self.out = out
        self.queue = stack.client()
        self.step_seconds = step_seconds
        #: Stretches every duration: on a real clock the queue's own latency must stay small beside them.
        self.scale = scale
        self.started_at = stack.now()
        self.steps = 0

    def seconds(self, value: float) -> int:
        return int(value * self.scale)

    # --- time --------------------------------------------------------------------------------------------

    def wait_until(self, what: str, done: Callable[[dict[str, str]], bool], *, limit: float) -> None:
        """Let time pass (virtual: advance; real: wait) until `done(states)`, checking capacity on the way.

        Only a function changes the queue, so on the virtual clock the queue is read again only after a
        step in which some function ran: a step where nothing happened cannot have changed what it said."""
        deadline = self.stack.now() + timedelta(seconds=limit * self.scale)
        states = self.states()
        while True:
            self.check_capacity(states)
            if done(states):
                return
            if self.stack.now() >= deadline:
                raise DemoFailed(
                    f"{what}: still not true after {limit * self.scale:.0f} s; the queue: {states}"
                )
            if self.stack.virtual:
                ran = self.invocations()
                self.stack.advance(self.step_seconds)
                if self.invocations() == ran:
                    continue
            else:
                time.sleep(0.2)
            states = self.states()

    def invocations(self) -> int:
        return sum(self.stack.invocations.values())

    def settle(self) -> None:
        if self.stack.virtual:
            self.stack.run_until_idle()

    # --- reading the queue -----------------------------------------------------------------------------------

    def states(self) -> dict[str, str]:
        return {job.name: job.state for job in self.queue.jobs(limit=100)}

    def check_capacity(self, states: Mapping[str, str]) -> None:
        live = sorted(name for name, state in states.items() if state in _LIVE)
        if len(live) > CAPACITY:
            raise DemoFailed(f"{len(live)} jobs hold instances on a pool of {CAPACITY}: {', '.join(live)}")

    def expect(self, step: str, expected: Mapping[str, str], *, preempted: Iterable[str] = ()) -> None:
        """Print the queue table and check it against `expected` (name -> state)."""
        self.steps += 1
        rows = self.rows(expected)
        self.out("")
        self.out(f"[{_clock((self.stack.now() - self.started_at).total_seconds())}] {step}")
        self.out(render(rows))
        actual = {row.name: row.state for row in rows}
        if actual != dict(expected):
            differences = ", ".join(
                f"{name}: expected {state}, got {actual.get(name, 'missing')}"
                for name, state in expected.items()
                if actual.get(name) != state
            )
            raise DemoFailed(f"step {self.steps} ({step}): {differences}")
        for name in preempted:
            row = next(r for r in rows if r.name == name)
            if row.preemptions < 1:
                raise DemoFailed(f"step {self.steps} ({step}): {name} should have been preempted")

    def rows(self, names: Iterable[str]) -> list[Row]:
        now = self.stack.now()
        rows = []
        for name in names:
            job = self.queue.job(name)
            rows.append(
                Row(
                    name=job.name,
                    state=job.state,
                    priority=job.priority,
                    attempt=job.attempt,
                    pool=job.pool,
                    waited=time_in_states(job, _WAITING, now),
                    ran=time_in_states(job, {"running", "preempting", "stopping"}, now),
                    preemptions=job.preemptions,
                )
            )
        rows.sort(key=lambda r: (-r.priority, r.name))
        return rows

    # --- the scenario ----------------------------------------------------------------------------------------

    def submit(self, name: str, priority: int, seconds: int, **options: Any) -> None:
        self.queue.submit(
            training_request(name, self.stack.training_role_arn, seconds, **options), priority=priority
        )

    def priorities(self) -> None:
        self.out(f"Part 1: priorities and a preemption, {CAPACITY} x {POOL}")
        self.submit("job1", 1, self.seconds(180))
        self.submit("job2", 2, self.seconds(90))
        self.submit("job3", 1, self.seconds(60))
        self.settle()
        self.wait_until(
            "job1 and job2 start",
            lambda s: s.get("job1") == "running" and s.get("job2") == "running",
            limit=600,
        )
        self.expect(
            "job1 (priority 1), job2 (2), job3 (1) submitted: two run, job3 waits",
            {"job2": "running", "job1": "running", "job3": "queued"},
        )
        self.submit("job4", 3, self.seconds(180))
        self.settle()
        self.wait_until("job4 starts", lambda s: s.get("job4") == "running", limit=600)
        self.expect(
            "job4 (priority 3) submitted: job1 is preempted for it and waits again",
            {"job4": "running", "job2": "running", "job1": "queued", "job3": "queued"},
            preempted=["job1"],
        )
        self.wait_until("job2 finishes", lambda s: s.get("job2") == "completed", limit=900)
        self.wait_until("job1 resumes", lambda s: s.get("job1") == "running", limit=600)
        self.expect(
            "job2 finished: job1 resumes (attempt 2, from its checkpoints)",
            {"job4": "running", "job2": "completed", "job1": "running", "job3": "queued"},
        )
        if self.queue.job("job1").attempt != 2:
            raise DemoFailed("job1 should be on its second attempt after its preemption")
        self.wait_until("job4 finishes", lambda s: s.get("job4") == "completed", limit=900)
        self.wait_until("job3 starts", lambda s: s.get("job3") == "running", limit=600)
        self.expect(
            "job4 finished: job3 runs at last",
            {"job4": "completed", "job2": "completed", "job1": "running", "job3": "running"},
        )
        names = ["job1", "job2", "job3", "job4"]
        self.wait_until(
            "every job completes", lambda s: all(s.get(n) == "completed" for n in names), limit=1800
        )
        self.expect("every job completed: nothing lost", dict.fromkeys(names, "completed"))

    def warm_and_idle(self) -> None:
        self.out("")
        self.out("Part 2: warm instances reused, an idle job stopped")
        self.submit("warm-1", 1, self.seconds(60), keep_alive=self.seconds(600))
        # A different volume size: the idle job never matches warm-1's warm pool.
        self.submit("idle-1", 1, self.seconds(3600), outcome="Idle", volume_gb=128)
        self.settle()
        self.wait_until("warm-1 finishes", lambda s: s.get("warm-1") == "completed", limit=900)
        self.expect(
            f"warm-1 finished and keeps its instances warm (keep-alive {self.seconds(600)} s)",
            {"warm-1": "completed", "idle-1": "running"},
        )
        pool = (
            self.stack.sagemaker.describe_training_job(TrainingJobName="warm-1").get("WarmPoolStatus") or {}
        )
        if pool.get("Status") != "Available":
            raise DemoFailed(f"warm-1 should have left an Available warm pool, got {pool or 'none'}")
        self.submit("warm-2", 1, self.seconds(240))
        self.settle()
        self.wait_until("warm-2 starts", lambda s: s.get("warm-2") == "running", limit=600)
        reused = (
            self.stack.sagemaker.describe_training_job(TrainingJobName="warm-1").get("WarmPoolStatus") or {}
        )
        if reused.get("ReusedByJob") != "warm-2":
            raise DemoFailed(f"warm-2 should have started on warm-1's warm instances, got {reused or 'none'}")
        self.expect(
            "warm-2 (same resources) starts on warm-1's instances: no provisioning",
            {"warm-1": "completed", "warm-2": "running", "idle-1": "running"},
        )
        self.wait_until(
            "the idle job is stopped",
            lambda s: s.get("idle-1") == "idle_stopped",
            limit=1200,
        )
        self.expect(
            "idle-1 reported 0% NeuronCore utilization through its idle window: its idle alarm stopped it",
            {"warm-1": "completed", "warm-2": "running", "idle-1": "idle_stopped"},
        )
        reason = self.queue.job("idle-1").reason or ""
        if "idle" not in reason:
            raise DemoFailed(f"idle-1 should record why it was stopped, got reason {reason!r}")
        self.out(f"  idle-1: {reason}")
        self.wait_until("warm-2 finishes", lambda s: s.get("warm-2") == "completed", limit=900)

    def summary(self) -> Summary:
        now = self.stack.now()
        summary = Summary(elapsed=(now - self.started_at).total_seconds())
        for job in self.queue.jobs(limit=100):
            detail = self.queue.job(job.name)
            summary.jobs += 1
            summary.completed += job.state == "completed"
            summary.idle_stops += job.state == "idle_stopped"
            summary.preemptions += job.preemptions
            summary.waits[job.name] = time_in_states(detail, _WAITING, now)
            summary.instance_seconds += job.instances * time_in_states(detail, _LIVE, now)
        paginator = self.stack.sagemaker.get_paginator("list_training_jobs")
        for page in paginator.paginate():
            for item in page["TrainingJobSummaries"]:
                warm = item.get("WarmPoolStatus") or {}
                if warm.get("Status") == "Reused":
                    summary.warm_pool_reuses.append((str(warm.get("ReusedByJob")), item["TrainingJobName"]))
        summary.warm_pool_reuses.sort()
        return summary

    def run(self) -> Summary:
        self.priorities()
        self.warm_and_idle()
        result = self.summary()
        self.out("")
        self.out(render_summary(result))
        if self.stack.failures:
            raise DemoFailed(
                f"functions failed on {len(self.stack.failures)} event(s): {self.stack.failures}"
            )
        return result


def render(rows: list[Row]) -> str:
    """The demo's queue in `sagequeue ls`'s table and duration style."""
    from sagequeue.queue_cli import duration_text, table_text

    table = table_text(
        ("NAME", "STATE", "PRIORITY", "ATTEMPT", "POOL", "WAITED", "RAN"),
        [
            (
                r.name,
                r.state + (" (preempted)" if r.state == "queued" and r.preemptions else ""),
                r.priority,
                r.attempt,
                r.pool,
                duration_text(r.waited),
                duration_text(r.ran),
            )
            for r in rows
        ],
    )
    return "\n".join("  " + line for line in table.splitlines())


def render_summary(summary: Summary) -> str:
    from sagequeue.queue_cli import duration_text

    capacity_seconds = CAPACITY * summary.elapsed
    utilization = summary.instance_seconds / capacity_seconds if capacity_seconds else 0.0
    waits = list(summary.waits.values())
    mean_wait = sum(waits) / len(waits) if waits else 0.0
    longest = max(summary.waits.items(), key=lambda item: item[1]) if waits else ("-", 0.0)
    return "\n".join(
        [
            f"Summary ({duration_text(summary.elapsed)} of simulated time on {CAPACITY} x {POOL})",
            f"  jobs: {summary.jobs} ({summary.completed} completed, {summary.idle_stops} stopped idle), none lost",
            f"  instance utilization: {utilization:.0%} (instances held by jobs / instances available)",
            f"  waits: mean {duration_text(mean_wait)}, longest {duration_text(longest[1])} ({longest[0]})",
            f"  preemptions: {summary.preemptions}",
            f"  warm-pool reuses: {len(summary.warm_pool_reuses)}"
            + "".join(
                f"\n    {reuser} started on {left}'s warm instances"
                for reuser, left in summary.warm_pool_reuses
            ),
            f"  idle stops: {summary.idle_stops}",
        ]
    )
