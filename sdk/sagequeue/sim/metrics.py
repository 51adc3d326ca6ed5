"""What a simulation measured: per job (waits, preemptions, work lost) and per pool (how its capacity was
spent over time), and the summary the report prints.

Definitions (docs/simulator.md repeats them):

- wait: submission to the first attempt's creation; a job that never started waits until the end.
- held in use while backlog: while a pool has a queued job, the share of its capacity not left free
  (training, starting, stopping or kept warm); training while backlog: the share training.
- idle while a waiting job fits: of the same capacity-time, the share left free while a queued job (not
  backing off) would have fitted in the free instances. The rest of the free share is idle that no start
  could fill: only jobs wider than what is free wait (a drain, or a gang behind more important work).
  It is split by the most startable of the jobs that fit: one that resumes from a checkpoint and may still
  borrow (a loan could have run it), one whose lenders took loans back as often as the preemption budget
  allows (it borrows no more), or only jobs without a CheckpointConfig (a loan taken back would restart
  them from zero).
- idle while no waiting job fits: the rest of the free share, split by what holds the pool. Behind equal
  or higher priority: no waiting job fits the free and warm instances together, and every attempt on the
  pool (a stopping one included) runs a job at least as important as the most important job waiting for
  it, so in that state no start, release or preemption the policy's rules allow (preempt only strictly
  lower priority) could fill the free instances: only the scheduler's earlier choices could have led to
  another state. Behind lower priority or a warm pool: everything else (less important work still inside
  its minimum runtime or budget, being stopped, or whose preemption would not make room; a warm pool whose
  release would; any idle while team quotas are set, since a team under its quota reclaims other teams'
  work whatever its priority). Idle while only jobs backing off, or jobs that can never fit, wait is in
  neither.
- training share, warm idle share: of the pool's capacity over the whole run (first submission to the end).
- warm reuse: attempts created on a warm pool, of all attempts.
- preemptions: stops of a job's attempt for another job, within the preemption budget; loans taken back,
  counted apart within a budget of the same size: stops of an attempt that ran on loan, for its lender or
  a job more important than the lender (Preempt.taken_back).
- work lost: training time discarded by preemptions and loans taken back (since the last checkpoint), in
  instance-hours, and as a share of all the trace's work; per stop: each stopped attempt's loss (mean, p95).
- top-priority p95 wait ÷ (stop grace + provisioning): provisioning is creation to Training on a cold start.
- makespan ÷ lower bound: (end of the last job - first submission) over the largest per-pool bound, that
  pool's instance-seconds of training over its capacity, or a job's submission plus provisioning and training.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sagequeue.sim.sagemaker import OCCUPANCY, Attempt, Outcome
from sagequeue_core.domain import StopReason, never_fits
from sagequeue_core.quotas import team_label

if TYPE_CHECKING:
    from sagequeue.sim.engine import JobRun, SimJob, Simulation

STATES = ("training", "starting", "stopping", "warm", "free")
#: why a queued job that fits the free instances may still wait, most startable first
FITTING = ("resumable", "loans spent", "no checkpoint")
#: what holds the rest of a pool while capacity idles and no queued job fits it
NOT_FITTING = ("behind equal or higher priority", "behind lower priority or a warm pool")


@dataclass
class JobRecord:
    name: str
    priority: int
    pool: str
    instances: int
    gang: bool
    submitted: float
    duration: float
    first_start: float | None = None
    ended: float | None = None
    outcome: str | None = None
    attempts: int = 0
    warm_starts: int = 0
    preemptions: int = 0
    loans_taken_back: int = 0
    work_lost: float = 0.0  # training seconds lost (per instance)
    #: training seconds each stop of an attempt threw away (per instance): the time since its last
    #: checkpoint, or since its training start without one
    lost_per_stop: list[float] = field(default_factory=list)
    lost_on_loans: float = 0.0  # of work_lost, what loans taken back lost
    last_stop_taken_back: bool = False
    team: str | None = None
    checkpointed: bool = True  # it resumes from checkpoints


@dataclass
class PoolRecord:
    capacity: int
    totals: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STATES, 0.0))
    backlog_seconds: float = 0.0
    backlog_free: float = 0.0
    backlog_training: float = 0.0
    backlog_fitting_free: float = 0.0
    state: dict[str, int] = field(default_factory=dict)
    backlog: bool = False
    fitting: str | None = None  # the kind (FITTING) of the most startable queued job that fits, if any
    backlog_fitting_by: dict[str, float] = field(default_factory=dict)
    blocked: str | None = None  # the kind (NOT_FITTING) of idle while no queued job fits, if it idles so
    backlog_blocked_by: dict[str, float] = field(default_factory=dict)
    since: float = 0.0
    timeline: list[tuple[float, int, int, int, int, int]] = field(default_factory=list)


class Recorder:
    def __init__(
        self, capacity: Mapping[str, int], *, timeline: bool = True, preemption_budget: int | None = None
    ) -> None:
        self.preemption_budget = preemption_budget
        self.jobs: dict[str, JobRecord] = {}
        self.pools = {
            pool: PoolRecord(cap, state={**dict.fromkeys(STATES, 0), "free": cap})
            for pool, cap in capacity.items()
        }
        self.finished: set[str] = set()
        self.keep_timeline = timeline
        self.first_submit: float | None = None
        self.end = 0.0
        self.passes = 0
        self.refused_creates = 0
        #: instances each team's attempts hold on SageMaker now, instance-seconds held so far, and the
        #: changes over time (at, {team: instances}) when jobs have teams
        self.team_state: dict[str, int] = {}
        self.team_totals: dict[str, float] = {}
        self.team_since = 0.0
        self.team_timeline: list[tuple[float, dict[str, int]]] = []
        self.has_teams = False

    # --- what happened ---------------------------------------------------------------------------------------

    def submitted(self, run: JobRun, at: float) -> None:
        spec = run.spec
        self.jobs[spec.name] = JobRecord(
            spec.name,
            spec.priority,
            spec.instance_type,
            spec.instance_count,
            spec.gang,
            at,
            spec.duration_seconds,
            team=spec.team,
            checkpointed=bool(spec.checkpoint_minutes),
        )
        self.has_teams = self.has_teams or spec.team is not None
        if self.first_submit is None:
            self.first_submit = at

    def started(self, run: JobRun, attempt: Attempt, at: float) -> None:
        record = self.jobs[run.spec.name]
        record.attempts += 1
        if attempt.reused:
            record.warm_starts += 1
        if record.first_start is None:
            record.first_start = at

    def preempted(self, run: JobRun, at: float) -> None:
        record = self.jobs[run.spec.name]
        record.last_stop_taken_back = run.job.stop_reason is StopReason.TAKEN_BACK
        if record.last_stop_taken_back:
            record.loans_taken_back += 1
        else:
            record.preemptions += 1

    def ended(self, run: JobRun, attempt: Attempt, lost: float, at: float) -> None:
        record = self.jobs[run.spec.name]
        record.work_lost += lost
        if attempt.outcome is Outcome.STOPPED:
            record.lost_per_stop.append(lost)
            if record.last_stop_taken_back:
                record.lost_on_loans += lost
        if run.job.state.is_terminal:
            record.ended = at
            record.outcome = "completed" if attempt.outcome is Outcome.COMPLETED else "failed"
            self.finished.add(run.spec.name)

    def occupancy(self, sim: Simulation, pool: str, at: float) -> None:
        record = self.pools[pool]
        self._accumulate(record, at)
        state = dict.fromkeys(STATES, 0)
        for attempt in sim.sagemaker.live.values():
            if attempt.pool == pool:
                state[OCCUPANCY[attempt.phase]] += attempt.instances
        for warm in sim.sagemaker.warm.values():
            if warm.pool == pool:
                state["warm"] += warm.instances
        state["free"] = max(record.capacity - sum(state.values()), 0)
        self._teams(sim, at)
        record.state = state
        record.backlog = bool(sim.queued[pool])
        now = sim.now_dt
        kinds = {
            self._fitting_kind(job)
            for job in sim.queued[pool].values()
            if state["free"] > 0
            and job.demand.get(pool, 0) <= state["free"]
            and (job.not_before is None or job.not_before <= now)
        }
        record.fitting = next((kind for kind in FITTING if kind in kinds), None)
        record.blocked = None
        if record.backlog and record.fitting is None and state["free"] > 0:
            record.blocked = self._blocked_kind(sim, pool, now, state)
        if self.keep_timeline:
            row = (at, state["training"], state["starting"], state["stopping"], state["warm"], state["free"])
            if record.timeline and record.timeline[-1][0] == at:
                record.timeline[-1] = row
            elif not record.timeline or record.timeline[-1][1:] != row[1:]:
                record.timeline.append(row)

    def _blocked_kind(
        self, sim: Simulation, pool: str, now: datetime, state: Mapping[str, int]
    ) -> str | None:
        ready = [
            job
            for job in sim.queued[pool].values()
            if (job.not_before is None or job.not_before <= now)
            and never_fits(job.demand, sim.settings.capacity) is None
        ]
        if not ready:
            return None  # only jobs backing off, or that can never fit, wait: not a scheduling choice
        if any(job.demand.get(pool, 0) <= state["free"] + state["warm"] for job in ready):
            return NOT_FITTING[1]  # releasing warm pools would make room for one
        if sim.settings.team_quotas:
            return NOT_FITTING[1]  # a team under its quota reclaims other teams' work whatever its priority
        waiting = [job.priority for job in ready]
        holders = [
            sim.runs[attempt.job_name].spec.priority
            for attempt in sim.sagemaker.live.values()
            if attempt.pool == pool
        ]
        if all(priority >= max(waiting) for priority in holders):
            return NOT_FITTING[0]
        return NOT_FITTING[1]

    def _fitting_kind(self, job: SimJob) -> str:
        if not job.checkpointed:
            return "no checkpoint"
        if self.preemption_budget and job.loans_taken_back >= self.preemption_budget:
            return "loans spent"
        return "resumable"

    def _teams(self, sim: Simulation, at: float) -> None:
        if not self.has_teams:
            return
        dt = at - self.team_since
        if dt > 0:
            for team, held in self.team_state.items():
                self.team_totals[team] = self.team_totals.get(team, 0.0) + held * dt
        self.team_since = at
        state: dict[str, int] = {}
        for attempt in sim.sagemaker.live.values():
            team = team_label(sim.runs[attempt.job_name].spec.team)
            state[team] = state.get(team, 0) + attempt.instances
        if state != self.team_state:
            self.team_state = state
            if self.keep_timeline:
                self.team_timeline.append((at, dict(state)))

    def _accumulate(self, record: PoolRecord, at: float) -> None:
        dt = at - record.since
        if dt > 0:
            for name, value in record.state.items():
                record.totals[name] += value * dt
            if record.backlog:
                record.backlog_seconds += dt
                record.backlog_free += record.state["free"] * dt
                record.backlog_training += record.state["training"] * dt
                if record.fitting is not None:
                    record.backlog_fitting_free += record.state["free"] * dt
                    by = record.backlog_fitting_by
                    by[record.fitting] = by.get(record.fitting, 0.0) + record.state["free"] * dt
                if record.blocked is not None:
                    by = record.backlog_blocked_by
                    by[record.blocked] = by.get(record.blocked, 0.0) + record.state["free"] * dt
        record.since = at

    def close(self, at: float, sim: Simulation) -> None:
        self.end = at
        for pool in self.pools:
            self.occupancy(sim, pool, at)
        self.passes = sim.passes
        self.refused_creates = sim.refused_creates


# --- the summary ---------------------------------------------------------------------------------------------


def team_usage_by_interval(recorder: Recorder, seconds: float = 3600.0) -> list[dict[str, float]]:
    """Instance-seconds each team held on SageMaker in each interval of `seconds` from the start, from the
    recorded timeline (empty without teams, or with the timeline off)."""
    out: list[dict[str, float]] = []
    changes = recorder.team_timeline
    for (at, state), following in zip(changes, [*changes[1:], (recorder.end, {})], strict=True):
        end = following[0]
        t = at
        while t < end:
            index = int(t // seconds)
            step = min(end, (index + 1) * seconds) - t
            while len(out) <= index:
                out.append({})
            for team, held in state.items():
                out[index][team] = out[index].get(team, 0.0) + held * step
            t += step
    return out


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def summarize(
    recorder: Recorder, *, stop_grace_seconds: float, provisioning_seconds: float
) -> dict[str, Any]:
    """The report's figures for one run, as plain JSON values (seconds, shares in 0-1, counts)."""
    jobs = list(recorder.jobs.values())
    end = recorder.end
    start = recorder.first_submit or 0.0
    waits = {
        job.name: (job.first_start if job.first_start is not None else end) - job.submitted for job in jobs
    }
    unfinished = [job for job in jobs if job.ended is None]
    completed = [job for job in jobs if job.outcome == "completed"]
    priorities = sorted({job.priority for job in jobs}, reverse=True)
    by_priority = {str(p): _wait_stats([waits[j.name] for j in jobs if j.priority == p]) for p in priorities}
    gang = [waits[j.name] for j in jobs if j.gang]
    small = [waits[j.name] for j in jobs if not j.gang]
    worst_gang_ratio = None
    worst_gang_class = None  # the priority where gang / small is largest, and its small jobs' mean wait
    for p in priorities:
        wide = [waits[j.name] for j in jobs if j.priority == p and j.gang]
        narrow = [waits[j.name] for j in jobs if j.priority == p and not j.gang]
        ratio = _ratio(_mean(wide), _mean(narrow))
        if ratio is not None and (worst_gang_ratio is None or ratio > worst_gang_ratio):
            worst_gang_ratio = ratio
            worst_gang_class = {"priority": p, "small_mean_wait": _mean(narrow)}
    top = [waits[j.name] for j in jobs if priorities and j.priority == priorities[0]]
    span = max(end - start, 0.0)
    capacity_seconds = sum(r.capacity for r in recorder.pools.values()) * span
    totals = {name: sum(r.totals[name] for r in recorder.pools.values()) for name in STATES}
    backlog_capacity = sum(r.capacity * r.backlog_seconds for r in recorder.pools.values())
    backlog_free = sum(r.backlog_free for r in recorder.pools.values())
    backlog_training = sum(r.backlog_training for r in recorder.pools.values())
    backlog_fitting_free = sum(r.backlog_fitting_free for r in recorder.pools.values())
    attempts = sum(j.attempts for j in jobs)
    last_end = max((j.ended for j in jobs if j.ended is not None), default=None)
    makespan = (end if unfinished or last_end is None else last_end) - start
    bound = lower_bound(recorder, provisioning_seconds)
    preemptions = [j.preemptions for j in jobs]
    teams = sorted({j.team for j in jobs if j.team})
    by_team: dict[str, Any] = {}
    held_total = sum(recorder.team_totals.values())
    for team in teams:
        mine = [j for j in jobs if j.team == team]
        held = recorder.team_totals.get(team, 0.0)
        by_team[team] = {
            "jobs": len(mine),
            "wait": _wait_stats([waits[j.name] for j in mine]),
            "instance_hours": held / 3600,
            "usage_share": held / held_total if held_total else None,
            "preemptions": sum(j.preemptions for j in mine),
        }
    report: dict[str, Any] = {
        "jobs": len(jobs),
        "completed": len(completed),
        "unfinished": len(unfinished),
        "failed": sum(1 for j in jobs if j.outcome == "failed"),
        "held_in_use_while_backlog": 1 - backlog_free / backlog_capacity if backlog_capacity else None,
        "idle_while_a_waiting_job_fits_by_kind": {
            kind: sum(r.backlog_fitting_by.get(kind, 0.0) for r in recorder.pools.values()) / backlog_capacity
            if backlog_capacity
            else None
            for kind in FITTING
        },
        "idle_while_no_waiting_job_fits_by_kind": {
            kind: sum(r.backlog_blocked_by.get(kind, 0.0) for r in recorder.pools.values()) / backlog_capacity
            if backlog_capacity
            else None
            for kind in NOT_FITTING
        },
        "training_while_backlog": backlog_training / backlog_capacity if backlog_capacity else None,
        "idle_while_a_waiting_job_fits": backlog_fitting_free / backlog_capacity
        if backlog_capacity
        else None,
        "training_share": totals["training"] / capacity_seconds if capacity_seconds else None,
        "warm_idle_share": totals["warm"] / capacity_seconds if capacity_seconds else None,
        "warm_reuse": sum(j.warm_starts for j in jobs) / attempts if attempts else None,
        "attempts": attempts,
        "preemptions_total": sum(preemptions),
        "preemptions_max_per_job": max(preemptions, default=0),
        "loans_taken_back_total": sum(j.loans_taken_back for j in jobs),
        "loans_taken_back_max_per_job": max((j.loans_taken_back for j in jobs), default=0),
        "work_lost_instance_hours": sum(j.work_lost * j.instances for j in jobs) / 3600,
        "work_lost_share": _ratio(
            sum(j.work_lost * j.instances for j in jobs), sum(j.duration * j.instances for j in jobs)
        ),
        # what lost it: preemptions of jobs without checkpoints (all they trained in the attempt), loans
        # taken back, preemptions of jobs that resume from checkpoints
        "work_lost_by_kind_instance_hours": {
            "no checkpoint": sum(j.work_lost * j.instances for j in jobs if not j.checkpointed) / 3600,
            "loans taken back": sum(j.lost_on_loans * j.instances for j in jobs if j.checkpointed) / 3600,
            "checkpointed, preempted": sum(
                (j.work_lost - j.lost_on_loans) * j.instances for j in jobs if j.checkpointed
            )
            / 3600,
        },
        "work_lost_per_stop_instance_hours": _stats(
            [lost * j.instances / 3600 for j in jobs for lost in j.lost_per_stop]
        ),
        "wait_by_priority": by_priority,
        "wait_gang": _wait_stats(gang),
        "wait_small": _wait_stats(small),
        "gang_over_small_wait_same_priority": worst_gang_ratio,
        "gang_over_small_worst_class": worst_gang_class,
        "top_priority": priorities[0] if priorities else None,
        "top_p95_wait_over_grace_and_provisioning": _ratio(
            percentile(top, 95), stop_grace_seconds + provisioning_seconds
        ),
        "makespan_seconds": makespan,
        "lower_bound_seconds": bound,
        "makespan_over_lower_bound": _ratio(makespan, bound),
        "passes": recorder.passes,
        "refused_creates": recorder.refused_creates,
        "simulated_seconds": span,
    }
    if by_team:
        report["by_team"] = by_team  # only when jobs have teams: reports without teams are unchanged
    return report


def _wait_stats(values: Sequence[float]) -> dict[str, float | int | None]:
    return {"n": len(values), "mean": _mean(values), "p95": percentile(values, 95)}


def _stats(values: Sequence[float]) -> dict[str, float | int | None]:
    return {
        "n": len(values),
        "mean": _mean(values),
        "p95": percentile(values, 95),
        "max": max(values, default=None),
    }


def lower_bound(recorder: Recorder, provisioning_seconds: float) -> float | None:
    """The shortest makespan any scheduler could reach: per pool, all its training packed onto its capacity
    from the first submission, and no job ending before its submission plus a cold start and its training."""
    start = recorder.first_submit
    if start is None:
        return None
    best = 0.0
    for pool, record in recorder.pools.items():
        jobs = [j for j in recorder.jobs.values() if j.pool == pool]
        if not jobs or record.capacity <= 0:
            continue
        packed = sum(j.duration * j.instances for j in jobs) / record.capacity
        earliest = min(j.submitted for j in jobs) - start + provisioning_seconds + packed
        single = max(j.submitted - start + provisioning_seconds + j.duration for j in jobs)
        best = max(best, earliest, single)
    return best or None


__all__ = ["STATES", "JobRecord", "PoolRecord", "Recorder", "lower_bound", "percentile", "summarize"]
