"""Preemption at the checkpoint, end to end on the local stack's virtual clock, under the invariant monitor
(docs/adr/0025-checkpoint-reports.md).

The emulator does not run training scripts: a job asks it, through `SAGEQUEUE_SIM_CHECKPOINT_SECONDS`, to
checkpoint every so many seconds of training, and it then puts the job image's marker under the job's
CheckpointConfig.S3Uri in the stack's S3 as SageMaker's checkpoint sync would
(tests/standins/standin-checkpoint-train is the script the job image's own tests run for real).
`SAGEQUEUE_SIM_CHECKPOINT_AS` makes a job's image lie about whose checkpoint it wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_scheduling_scenarios import Scenario

from sagequeue.config import save_local_connection
from sagequeue_core import runtime
from sagequeue_core.events import EventType, Publisher

pytestmark = pytest.mark.slow

COMMAND = str(Path(sys.executable).with_name("sagequeue"))
TEAMS = {"user": "vision", "other": "speech"}


class Tee:
    """The stack's publisher, and a copy of every event for the test."""

    def __init__(self, inner: Publisher) -> None:
        self.inner = inner
        self.events: list[tuple[EventType, dict[str, Any]]] = []

    def publish(self, event_type: EventType, detail: Any) -> None:
        self.events.append((event_type, dict(detail)))
        self.inner.publish(event_type, detail)

    def of_type(self, event_type: EventType) -> list[dict[str, Any]]:
        return [detail for kind, detail in self.events if kind is event_type]


@pytest.fixture
def scenario() -> Iterator[Callable[..., Scenario]]:
    made: list[Scenario] = []
    tees: list[tuple[Any, Publisher]] = []

    def make(capacity: int, **kw: Any) -> Scenario:
        made.append(Scenario(capacity, monitored=True, **kw))
        deps = runtime.dependencies()
        tee = Tee(deps.publisher)
        tees.append((deps, deps.publisher))
        deps.publisher = tee
        made[-1].events = tee  # type: ignore[attr-defined]
        made[-1].bucket = f"sagequeue-e2e-{uuid.uuid4().hex[:8]}"  # type: ignore[attr-defined]
        return made[-1]

    yield make
    for deps, publisher in tees:
        deps.publisher = publisher
    for each in made:
        each.close()


def submit(
    s: Scenario,
    name: str,
    *,
    priority: int,
    every: int | str | None = None,
    lie_as: str | None = None,
    who: str = "user",
    checkpoint: bool = True,
) -> None:
    body = s.request(name, 6 * 3600, checkpoint=checkpoint)
    if checkpoint:
        # a bucket of the test's own: moto's S3 remembers bucket names across the stacks of one process
        body["CheckpointConfig"] = {"S3Uri": f"s3://{s.bucket}/checkpoints/{name}"}  # type: ignore[attr-defined]
    if every is not None:
        body["Environment"]["SAGEQUEUE_SIM_CHECKPOINT_SECONDS"] = str(every)
    if lie_as is not None:
        body["Environment"]["SAGEQUEUE_SIM_CHECKPOINT_AS"] = lie_as
    s.stack.client(who).submit(body, priority=priority)
    s.stack.run_until_idle()
    s.stack.advance(1)


def states(s: Scenario) -> dict[str, str]:
    """Every job's state: each team's member lists its team's jobs."""
    return {job.name: job.state for who in ("user", "other") for job in s.stack.client(who).jobs()}


def job(s: Scenario, name: str) -> Any:
    return s.stack.client("admin").job(name)


def training_for(s: Scenario, name: str) -> float:
    """Seconds the job's current attempt has been in SageMaker's Training phase (0 before it)."""
    from sagequeue_core.domain import parse_time

    at = parse_time(job(s, name).raw.get("training_started_at"))
    return 0.0 if at is None else (s.stack.now() - at).total_seconds()


def cli(s: Scenario, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("SAGEQUEUE_", "AWS_"))}
    environment["SAGEQUEUE_HOME"] = str(home)
    return subprocess.run(
        [COMMAND, *args], capture_output=True, text=True, env=environment, timeout=120, check=False
    )


def test_show_and_ls_give_each_running_jobs_last_checkpoint(
    scenario: Callable[..., Scenario], tmp_path: Path
) -> None:
    # GIVEN a job checkpointing every 5 minutes and one that has written no checkpoint
    s = scenario(2)
    submit(s, "steady", priority=5, every=300)
    submit(s, "silent", priority=5)
    s.advance_until(lambda: all(st == "running" for st in s.states().values()), limit=1800)
    s.advance_until(lambda: training_for(s, "steady") >= 13 * 60, limit=1800)
    save_local_connection(s.stack.connection("user"), tmp_path / "local.json")
    # WHEN the user lists the queue and shows the jobs
    table = cli(s, tmp_path, "ls")
    assert table.returncode == 0, table.stderr
    header, *rows = table.stdout.splitlines()
    column = header.index("CKPT")
    cells = {row.split()[0]: row[column:].split("  ")[0].strip() for row in rows}
    # THEN the job that checkpoints shows its last checkpoint's age (the one at 10 minutes, 3 minutes or
    # so ago, read within a pass or two), the other a dash
    assert cells["silent"] == "-"
    assert cells["steady"] in ("3m ago", "4m ago"), cells
    shown = cli(s, tmp_path, "show", "steady")
    assert shown.returncode == 0, shown.stderr
    line = next(line for line in shown.stdout.splitlines() if line.startswith("checkpoint"))
    assert line.split("  ", 1)[1].strip() in (
        "3m ago (step 600, every 5m00s)",
        "4m ago (step 600, every 5m00s)",
    )
    detail = json.loads(cli(s, tmp_path, "show", "steady", "--json").stdout)
    assert (detail["checkpoint"]["step"], detail["checkpoint"]["interval_seconds"]) == (600, 300.0)
    assert json.loads(cli(s, tmp_path, "show", "silent", "--json").stdout)["checkpoint"] is None


def test_a_job_cannot_report_another_jobs_checkpoint(scenario: Callable[..., Scenario]) -> None:
    # GIVEN two tenants' equal-priority jobs filling the pool: vision's job has trained an hour without a
    # checkpoint; speech's started 30 minutes later, and its image writes, every 5 minutes, markers that
    # say vision's job has just checkpointed (into its own prefix, the only one its role may write)
    s = scenario(2, teams=TEAMS)
    submit(s, "victim", priority=5)
    s.advance_until(lambda: states(s)["victim"] == "running", limit=1800)
    s.stack.advance(30 * 60)
    submit(s, "hostile", priority=5, every=300, lie_as="victim", who="other")
    s.advance_until(
        lambda: training_for(s, "victim") >= 3600 and states(s)["hostile"] == "running", limit=3600
    )
    s.stack.advance(20 * 60)
    s.stack.run_until_idle()
    # THEN neither job has a checkpoint: the forged reports changed nothing and were refused as such
    assert job(s, "victim").raw["checkpoint"] is None
    assert job(s, "hostile").raw["checkpoint"] is None
    store = runtime.dependencies().store
    victim_record = store.get_job("victim").checkpoint
    hostile_record = store.get_job("hostile").checkpoint
    assert victim_record is None or victim_record.at is None
    assert hostile_record is not None
    assert hostile_record.refused == "the marker names training job victim"
    # WHEN a more important job needs one instance
    submit(s, "urgent", priority=9)
    s.advance_until(lambda: states(s)["urgent"] in ("starting", "running"), limit=1800)
    # THEN the job preempted is the one that loses less by the truth: speech's, 30 minutes younger
    preempted = s.events.of_type(EventType.JOB_PREEMPTED)  # type: ignore[attr-defined]
    assert [e["name"] for e in preempted] == ["hostile"]
    assert job(s, "victim").preemptions == 0


def preempted_at(s: Scenario, name: str) -> float:
    """Seconds into its training the job's (first) attempt was preempted, by the job's history."""
    history = job(s, name).history
    at = next(h.at for h in history if h.state == "preempting")
    return (at - started_training(s, name)).total_seconds()


def started_training(s: Scenario, name: str) -> Any:
    found = getattr(s, "trained_from", {})
    return found[name]


def note_training(s: Scenario, *names: str) -> None:
    """Keep when each job's current attempt began to train (a requeue forgets it)."""
    from sagequeue_core.domain import parse_time

    s.trained_from = {n: parse_time(job(s, n).raw["training_started_at"]) for n in names}  # type: ignore[attr-defined]


def test_the_victim_with_the_freshest_checkpoint_is_chosen(scenario: Callable[..., Scenario]) -> None:
    # GIVEN three equal-priority jobs filling the pool, started in this order: one checkpointing every 10
    # minutes, one that never checkpoints, one every 25 minutes (started last: today's choice)
    s = scenario(3, checkpoint_wait_seconds=0)
    submit(s, "c-fresh", priority=5, every=600)
    submit(s, "b-never", priority=5)
    submit(s, "a-stale", priority=5, every=1500)
    s.advance_until(lambda: all(st == "running" for st in states(s).values()), limit=1800)
    # WHEN a more important job needs one instance 32 minutes into their training (c-fresh checkpointed at
    # 30 minutes, a-stale at 25, b-never not at all)
    s.advance_until(lambda: training_for(s, "a-stale") >= 32 * 60, limit=3600)
    submit(s, "urgent", priority=9)
    s.advance_until(lambda: states(s)["urgent"] in ("starting", "running"), limit=1800)
    # THEN the job stopped is the one with the freshest checkpoint, and it loses minutes, not half an hour
    preempted = s.events.of_type(EventType.JOB_PREEMPTED)  # type: ignore[attr-defined]
    assert [e["name"] for e in preempted] == ["c-fresh"]
    assert preempted[0]["work_lost_seconds"] <= 4 * 60
    assert [job(s, n).preemptions for n in ("b-never", "a-stale")] == [0, 0]


def test_a_preemption_waits_for_a_checkpoint_due_within_the_bound(scenario: Callable[..., Scenario]) -> None:
    # GIVEN a job checkpointing every 20 minutes holding the whole pool
    s = scenario(1, checkpoint_wait_seconds=300)
    submit(s, "victim", priority=5, every=1200)
    s.advance_until(lambda: states(s)["victim"] == "running", limit=1800)
    # WHEN a more important job arrives 56 minutes into its training: its next checkpoint is due in 4
    s.advance_until(lambda: training_for(s, "victim") >= 56 * 60, limit=5400)
    note_training(s, "victim")
    submit(s, "urgent", priority=9)
    assert "waiting for the checkpoint of victim" in (job(s, "urgent").reason or "")
    s.advance_until(lambda: states(s)["urgent"] in ("starting", "running"), limit=1800)
    # THEN the victim is stopped once it has written that checkpoint, within a pass of it, and loses
    # (nearly) nothing
    stopped = preempted_at(s, "victim")
    assert 60 * 60 <= stopped <= 62 * 60, stopped
    preempted = s.events.of_type(EventType.JOB_PREEMPTED)  # type: ignore[attr-defined]
    assert [e["name"] for e in preempted] == ["victim"]
    assert preempted[0]["work_lost_seconds"] <= 120


def test_a_checkpoint_that_does_not_come_within_the_bound_holds_the_preemptor_no_longer(
    scenario: Callable[..., Scenario],
) -> None:
    # GIVEN a job that checkpointed at 20 and 40 minutes and then writes no more (its interval drifted
    # beyond any bound)
    s = scenario(1, checkpoint_wait_seconds=300)
    submit(s, "victim", priority=5, every="1200,1200,1e9")
    s.advance_until(lambda: states(s)["victim"] == "running", limit=1800)
    # WHEN a more important job arrives 56 minutes into its training, the next checkpoint due in 4
    s.advance_until(lambda: training_for(s, "victim") >= 56 * 60, limit=5400)
    note_training(s, "victim")
    waits_from = training_for(s, "victim")
    submit(s, "urgent", priority=9)
    assert "waiting for the checkpoint of victim" in (job(s, "urgent").reason or "")
    s.advance_until(lambda: states(s)["urgent"] in ("starting", "running"), limit=1800)
    # THEN the victim is stopped at the bound (5 minutes after the job began to wait, plus at most a pass),
    # not later, and loses what it trained since its 40-minute checkpoint
    stopped = preempted_at(s, "victim")
    assert waits_from + 300 <= stopped <= waits_from + 300 + 90, (waits_from, stopped)
    preempted = s.events.of_type(EventType.JOB_PREEMPTED)  # type: ignore[attr-defined]
    assert [e["name"] for e in preempted] == ["victim"]
    assert abs(preempted[0]["work_lost_seconds"] - (stopped - 40 * 60)) <= 60
