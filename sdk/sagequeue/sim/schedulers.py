"""The schedulers a simulation can run: sagequeue's own policy and the baselines it is measured against.

- `sagequeue`: the real `sagequeue_core.policy.plan`, on the snapshot `sagequeue_core.snapshot` builds for
  the scheduler service, from the same lookahead window, live jobs and tracked warm pools.
- `fifo`: each pool's jobs in submission order, the head blocks the rest (no backfill, no preemption);
  warm pools are reused when they match and released when they stand in the head's way.
- `priority`: the same, in priority order (then submission): priority without preemption.
- `naive`: the preemptive scheduler of the original article (docs/simulator.md): counts the instances of
  InProgress and Stopping jobs against the capacity and ignores warm pools (so its creates can be refused
  while warm pools hold the instances), starts jobs in priority order and stops at the first that does not
  fit, and preempts at most one lower-priority job per pass, with no minimum runtime.
- `easy`: a clairvoyant EASY backfill (Slurm's), the reference the held-in-use target is set against. Each
  pool's jobs in priority order (then submission); the first that cannot start gets a reservation at the
  earliest time enough instances come back, computed from every live attempt's true remaining time (it
  knows the trace's training times, which no real scheduler does); a later job starts now if it fits and
  either ends before that time or uses only instances the reserved job will not need. No preemption; warm
  pools are reused when they match and released when they stand in a start's way.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from sagequeue.sim.engine import Scheduler, SimJob
from sagequeue_core.domain import JobState
from sagequeue_core.policy import Preempt, ReleaseWarmPool, RunningAttempt, Snapshot, Start, plan
from sagequeue_core.quotas import NO_TEAM, UsageCounter
from sagequeue_core.snapshot import build_snapshot, policy_settings

if TYPE_CHECKING:
    from sagequeue.sim.engine import Simulation

Action = Start | Preempt | ReleaseWarmPool
_TIMELESS = datetime(1970, 1, 1, tzinfo=UTC)


class TrackedPool:
    """An Available warm pool as the scheduler service tracks it (`store.TrackedWarmPool`)."""

    __slots__ = ("expires_at", "job_name", "resource_key", "training_job_name")

    def __init__(self, sim: Simulation, name: str) -> None:
        warm = sim.sagemaker.warm[name]
        self.training_job_name = name
        self.resource_key = warm.resource_key
        self.expires_at = sim.at(warm.expires)
        self.job_name = warm.job_name


class SagequeuePolicy(Scheduler):
    """The real policy on the service's snapshot.

    `plan` is pure: on a snapshot equal to the last one but for `now`, after a plan that did nothing, it
    does nothing again until the clock reaches the simulation's next threshold (`Simulation.wake`). Such a
    pass is skipped, whatever triggered it (the whole snapshot is compared, so whatever a policy comes to
    read through it is covered); `exact=True` decides every pass."""

    name = "sagequeue"

    def __init__(self) -> None:
        self._last: Snapshot | None = None
        self._idle = False
        self.usage: UsageCounter | None = None  # the fair-share counter the service keeps in its table

    def decide(self, sim: Simulation) -> list[Action] | None:
        usage: dict[str, float] = {}
        if sim.settings.team_quotas:
            holding: Counter[str] = Counter()
            for held in sim.live.values():
                holding[held.team or NO_TEAM] += sum(held.demand.values())
            self.usage = (self.usage or UsageCounter(as_of=sim.now_dt)).advance(
                sim.now_dt, holding, sim.settings.fair_share_half_life_seconds
            )
            usage = dict(self.usage.hours)
        snapshot = build_snapshot(
            now=sim.now_dt,
            capacity=sim.settings.capacity,
            queued=[job for pool in sim.queued for job in sim.window(pool)],
            live=list(sim.live.values()),
            warm_pools=[TrackedPool(sim, name) for name in sim.sagemaker.warm],
            team_quotas=sim.settings.team_quotas,
            team_usage=usage,
        )
        if sim.settings.checkpoint_reports:
            snapshot = dataclasses.replace(snapshot, running=[_reported(sim, a) for a in snapshot.running])
        timeless = dataclasses.replace(snapshot, now=_TIMELESS)
        if not sim.exact and self._idle and sim.now < sim.wake and timeless == self._last:
            return None
        decided = plan(
            snapshot,
            dataclasses.replace(
                policy_settings(sim.settings), victims_by_work_lost=sim.settings.victims_by_work_lost
            ),
        )
        # a wait for a checkpoint ends with a checkpoint or at its bound: the timer's passes look again, as
        # the service's do every minute
        self.awaiting_checkpoint = bool(decided.checkpoint_waits)
        actions = list(decided.actions)
        # what the service stores with each waiting job: the reservation it holds after this pass
        for queued in snapshot.queued:
            job = sim.queued_job(queued.name)
            reservation = decided.reservations.get(queued.name)
            if job is not None and job.reservation != reservation:
                job.reservation = reservation
                sim.changes += 1
        self._last = timeless
        self._idle = not actions
        return actions


def _reported(sim: Simulation, attempt: RunningAttempt) -> RunningAttempt:
    """A live attempt with the checkpoints it has reported by now (docs/adr/0023): the time of its last,
    the interval between its last two (of an earlier attempt, before this one wrote two)."""
    run = sim.by_attempt.get(attempt.training_job_name)
    if run is None or run.attempt is None:
        return attempt
    last, interval = run.attempt.checkpoints(sim.now)
    interval = interval if interval is not None else run.checkpoint_interval
    if last is None and interval is None:
        return attempt
    return dataclasses.replace(
        attempt,
        last_checkpoint_at=sim.at(last) if last is not None else None,
        checkpoint_interval_seconds=interval,
    )


class _HeadOfLine(Scheduler):
    """Start each pool's jobs in `order` until the first that cannot start; never preempt."""

    order: Callable[[SimJob], tuple[object, ...]]

    def decide(self, sim: Simulation) -> list[Action]:
        actions: list[Action] = []
        now = sim.now_dt
        for pool, queued in sim.queued.items():
            if not queued:
                continue
            used = sum(job.demand.get(pool, 0) for job in sim.live.values())
            warm = [w for w in sim.sagemaker.warm.values() if w.pool == pool]
            free = sim.settings.capacity[pool] - used - sum(w.instances for w in warm)
            for job in sorted(queued.values(), key=type(self).order):
                if job.not_before is not None and job.not_before > now:
                    break
                need = job.demand[pool]
                match = next((w for w in warm if w.resource_key == job.resource_key), None)
                if match is not None:
                    warm.remove(match)
                    actions.append(Start(job.name, warm_pool=match.training_job_name))
                    continue
                releasable = sum(w.instances for w in warm)
                if free + releasable < need:
                    break
                while free < need:
                    victim = warm.pop(0)
                    free += victim.instances
                    actions.append(ReleaseWarmPool(victim.training_job_name, for_job=job.name))
                free -= need
                actions.append(Start(job.name))
        return actions


class Fifo(_HeadOfLine):
    name = "fifo"

    @staticmethod
    def order(job: SimJob) -> tuple[object, ...]:
        return (job.submitted_at, job.name)


class PriorityNoPreemption(_HeadOfLine):
    name = "priority"

    @staticmethod
    def order(job: SimJob) -> tuple[object, ...]:
        return (-job.priority, job.submitted_at, job.name)


class Naive(Scheduler):
    """The article's `manage_queue`, per pool, with instances in place of its one-instance jobs."""

    name = "naive"

    def decide(self, sim: Simulation) -> list[Action]:
        actions: list[Action] = []
        for pool, queued in sim.queued.items():
            if not queued:
                continue
            capacity = sim.settings.capacity[pool]
            pending = sorted(queued.values(), key=lambda j: (-j.priority, j.submitted_at, j.name))[:capacity]
            live = [job for job in sim.live.values() if pool in job.demand]
            stopping = sum(
                j.demand[pool] for j in live if j.state in (JobState.PREEMPTING, JobState.STOPPING)
            )
            running = [j for j in live if j.state in (JobState.STARTING, JobState.RUNNING)]
            free = capacity - sum(j.demand[pool] for j in live)
            started = 0
            for job in pending:
                if job.demand[pool] > free:
                    break
                free -= job.demand[pool]
                actions.append(Start(job.name))
                started += 1
            still_pending = pending[started:]
            # the instances already stopping will go to the first pending jobs: skip those
            covered = 0
            contenders = []
            for job in still_pending:
                if covered + job.demand[pool] <= stopping:
                    covered += job.demand[pool]
                    continue
                contenders.append(job)
            if not contenders or not running:
                continue
            victim = min(running, key=lambda j: (j.priority, j.started_at))
            if contenders[0].priority > victim.priority:
                assert victim.training_job_name is not None
                actions.append(Preempt(victim.name, victim.training_job_name, for_job=contenders[0].name))
        return actions


class ClairvoyantEasy(Scheduler):
    """EASY backfill with known run times (see the module's docstring)."""

    name = "easy"

    def _ends_at(self, sim: Simulation, job: SimJob) -> float:
        """When a live job's instances come back, from its attempt's true remaining work."""
        run = sim.runs[job.name]
        attempt = run.attempt
        timings = sim.timings
        if attempt is None:
            return sim.now + timings.provisioning_seconds + run.spec.duration_seconds
        phase = attempt.phase.value
        if phase == "Stopping":
            return attempt.phase_since + timings.stop_grace_seconds
        if phase == "Uploading":
            return attempt.phase_since + timings.upload_seconds
        if phase == "Training" and attempt.training_since is not None:
            return attempt.training_since + attempt.remaining_work + timings.upload_seconds
        start = timings.warm_start_seconds if attempt.reused else timings.cold_start_seconds
        before = (start + timings.download_seconds) if phase == "Starting" else timings.download_seconds
        return attempt.phase_since + before + attempt.remaining_work + timings.upload_seconds

    def _runs_for(self, sim: Simulation, job: SimJob, warm: bool) -> float:
        run = sim.runs[job.name]
        timings = sim.timings
        start = timings.warm_start_seconds if warm else timings.cold_start_seconds
        left = max(run.spec.duration_seconds - run.saved_work, 0.0)
        return start + timings.download_seconds + left + timings.upload_seconds

    def decide(self, sim: Simulation) -> list[Action]:
        actions: list[Action] = []
        now = sim.now_dt
        for pool, queued in sim.queued.items():
            if not queued:
                continue
            live = [job for job in sim.live.values() if pool in job.demand]
            warm = sorted(
                (w for w in sim.sagemaker.warm.values() if w.pool == pool), key=lambda w: w.training_job_name
            )
            free = (
                sim.settings.capacity[pool]
                - sum(j.demand[pool] for j in live)
                - sum(w.instances for w in warm)
            )
            ends = sorted((self._ends_at(sim, job), job.demand[pool]) for job in live)
            shadow: float | None = None  # when the first job that cannot start will (its reservation)
            extra = 0  # instances free at the shadow time beyond what the reserved job needs
            for job in sorted(queued.values(), key=PriorityNoPreemption.order):
                if job.not_before is not None and job.not_before > now:
                    continue
                need = job.demand[pool]
                match = next((w for w in warm if w.resource_key == job.resource_key), None)
                room = free + sum(w.instances for w in warm if w is not match)
                if shadow is not None:
                    ends_in_time = sim.now + self._runs_for(sim, job, match is not None) <= shadow
                    if not ends_in_time and need > extra:
                        continue
                if match is None and room < need:
                    if shadow is None:
                        # the reserved job: the earliest time its instances are back
                        available, shadow = room, float("inf")
                        for end, instances in ends:
                            available += instances
                            if available >= need:
                                shadow = end
                                break
                        extra = max(available - need, 0)
                    continue
                if shadow is not None and not (
                    sim.now + self._runs_for(sim, job, match is not None) <= shadow
                ):
                    extra -= need  # backfilled on instances the reserved job will not need
                if match is not None:
                    warm.remove(match)
                    actions.append(Start(job.name, warm_pool=match.training_job_name))
                    ends.append((sim.now + self._runs_for(sim, job, True), need))
                    continue
                while free < need:
                    victim = warm.pop(0)
                    free += victim.instances
                    actions.append(ReleaseWarmPool(victim.training_job_name, for_job=job.name))
                free -= need
                actions.append(Start(job.name))
                ends.append((sim.now + self._runs_for(sim, job, False), need))
                ends.sort()
        return actions


SCHEDULERS: dict[str, type[Scheduler]] = {
    "fifo": Fifo,
    "priority": PriorityNoPreemption,
    "naive": Naive,
    "easy": ClairvoyantEasy,
    "sagequeue": SagequeuePolicy,
}

__all__ = [
    "SCHEDULERS",
    "ClairvoyantEasy",
    "Fifo",
    "Naive",
    "PriorityNoPreemption",
    "SagequeuePolicy",
    "TrackedPool",
]
