"""Why a job waits, and what would start it sooner.

The counterfactuals are forecasts of the same state with one thing about the job changed, run with the same
seeds (so they differ by the change, not by luck): one priority higher, fewer instances, another pool with
the capacity for it, its team's quota raised by what it asks. The jobs ahead are those the scheduler's pass
order (`sagequeue_core.policy.pass_order`) puts before it in its pool, each with the rule that does
(like Slurm's `sprio`): higher priority, a reservation within the same priority, or an earlier submission.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sagequeue.forecast.engine import forecast, replace_job
from sagequeue.forecast.model import ForecastSettings, History, QueueState
from sagequeue_core.policy import QueuedJob, pass_order
from sagequeue_core.quotas import TeamQuota


@dataclass(frozen=True)
class Option:
    """A change to the job and the P50 start it would give (seconds from now; inf: not by the horizon)."""

    change: str
    p50: float


@dataclass(frozen=True)
class Ahead:
    name: str
    priority: int
    instances: int
    rule: str


@dataclass
class Explanation:
    name: str
    p10: float
    p50: float
    p90: float
    options: list[Option] = field(default_factory=list)
    ahead: list[Ahead] = field(default_factory=list)
    running: list[tuple[str, int, int]] = field(default_factory=list)  # name, priority, instances


def _with_demand(demand: dict[str, int]) -> Callable[[QueuedJob], QueuedJob]:
    def change(job: QueuedJob) -> QueuedJob:
        # another shape or pool is another warm-pool key: no warm pool of the old one fits it
        return dataclasses.replace(job, demand=demand, resource_key=None)

    return change


def _rule(other: QueuedJob, job: QueuedJob) -> str:
    if other.priority > job.priority:
        return f"higher priority ({other.priority} > {job.priority})"
    if other.reservation is not None and job.reservation is None:
        return "same priority, holds a reservation"
    return "same priority, submitted earlier"


def explain(
    state: QueueState, history: History, name: str, settings: ForecastSettings | None = None
) -> Explanation:
    settings = settings or ForecastSettings()
    job = next((j for j in state.queued if j.name == name), None)
    if job is None:
        raise KeyError(name)
    pool = next(iter(job.demand))

    def p50_of(changed: QueueState) -> float:
        return forecast(changed, history, settings, only=[name]).jobs[name].p50

    base = forecast(state, history, settings, only=[name]).jobs[name]
    result = Explanation(name, base.p10, base.p50, base.p90)
    result.options.append(
        Option(
            f"priority {job.priority + 1}",
            p50_of(replace_job(state, name, lambda j: dataclasses.replace(j, priority=j.priority + 1))),
        )
    )
    need = job.demand[pool]
    for fewer in sorted({need // 2, need - 1} - {0, need}, reverse=True):
        result.options.append(
            Option(
                f"{fewer} instance{'s' if fewer > 1 else ''}",
                p50_of(replace_job(state, name, _with_demand({pool: fewer}))),
            )
        )
    for other, capacity in sorted(state.capacity.items()):
        if other != pool and capacity >= need:
            result.options.append(
                Option(
                    f"pool {other}",
                    p50_of(replace_job(state, name, _with_demand({other: need}))),
                )
            )
    quotas = [q for q in state.team_quotas if q.team == job.team and q.pool == pool]
    if job.team and quotas:
        raised: Sequence[TeamQuota] = [
            dataclasses.replace(q, nominal=q.nominal + need) if q in quotas else q for q in state.team_quotas
        ]
        result.options.append(
            Option(
                f"team {job.team}'s quota in {pool} raised by {need}",
                p50_of(dataclasses.replace(state, team_quotas=tuple(raised))),
            )
        )
    mine = pass_order(job)
    ahead = sorted((j for j in state.queued if pool in j.demand and pass_order(j) < mine), key=pass_order)
    result.ahead = [Ahead(j.name, j.priority, sum(j.demand.values()), _rule(j, job)) for j in ahead]
    result.running = [
        (a.job_name or a.training_job_name, a.priority, a.demand[pool])
        for a in state.running
        if pool in a.demand
    ]
    return result


__all__ = ["Ahead", "Explanation", "Option", "explain"]
