"""Team quotas as the API serves them: read a team's quotas and usage per pool, set one (admins).

The arithmetic is `sagequeue_core.quotas`; this module reads the table, checks the caller and the input,
and shapes the answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sagequeue_core.domain import is_pool_name
from sagequeue_core.errors import RequestInvalid
from sagequeue_core.events import EventType, announce
from sagequeue_core.observability import logger
from sagequeue_core.quotas import (
    PoolShare,
    QuotaError,
    TeamLedger,
    TeamQuota,
    check_stored_team_name,
    check_team_name,
    oversubscription,
    team_label,
)
from sagequeue_core.runtime import Dependencies
from sagequeue_core.service.access import require_admin, require_caller


def _ledger(deps: Dependencies) -> TeamLedger:
    """Every team's usage of every pool with quotas, as the table has it now."""
    deps.ensure_pools()
    pools, quotas, _ = deps.store.pools_and_teams()
    capacity = {status.pool.instance_type: status.pool.capacity for status in pools}
    held = [
        _Held(
            job.training_job_name or job.name, job.demand, job.team, job.started_at or deps.now(), False, True
        )
        for job in deps.store.live_jobs()
    ]
    return TeamLedger(quotas, capacity, held)


@dataclass(frozen=True)
class _Held:
    training_job_name: str
    demand: Mapping[str, int]
    team: str | None
    started_at: datetime
    stopping: bool
    preemptible: bool


def all_teams(deps: Dependencies) -> list[dict[str, Any]]:
    """Every team's position in every pool with quotas, with how many of its jobs wait there: each team with
    a quota there, or holding or waiting for instances of it; jobs without a team are the team "none"."""
    ledger = _ledger(deps)
    waiting = {pool: deps.store.queued_by_team(pool) for pool in sorted(ledger.quotas)}
    shares = {(share.pool, share.team): share for share in ledger.shares()}
    for pool, teams in waiting.items():
        for team in teams:
            if (pool, team) not in shares:
                shares[(pool, team)] = ledger.share(team, pool)
    return [
        {**_share_api(share, ledger), "waiting": waiting[pool].get(team, 0)}
        for (pool, team), share in sorted(shares.items())
    ]


def team_quotas(deps: Dependencies, team: str) -> list[dict[str, Any]]:
    """A team's quota and usage in every pool with quotas where it has a quota, or holds or waits for
    instances: its rows of all_teams."""
    _team(team)
    ledger = _ledger(deps)
    rows = []
    for pool in sorted(ledger.quotas):
        share = ledger.share(team, pool)
        waiting = deps.store.queued_count(pool, team)
        if team in ledger.quotas[pool] or share.used or waiting:
            rows.append({**_share_api(share, ledger), "waiting": waiting})
    return rows


def set_quota(deps: Dependencies, team: str, body: Any, caller: str | None) -> dict[str, Any]:
    """Set `team`'s quota in one pool: {pool, nominal, borrowing_limit?, lending_limit?} (null: unlimited);
    a nominal of null removes the quota.

    A quota is set only under a name the rule accepts (check_team_name). One is removed under any name a
    quota may be stored under (check_stored_team_name), so a quota stored before the rule ("-ops", "none")
    can be removed; removing one the rule refuses when none is stored answers the rule, and that nothing
    is stored under it."""
    me = require_caller(caller)
    require_admin(me, deps.settings.admin_role_arns, "set a team's quota")
    _team(team, check_stored_team_name)
    if not isinstance(body, dict):
        raise RequestInvalid("the body must be an object {pool, nominal, borrowing_limit, lending_limit}")
    unknown = sorted(set(body) - {"pool", "nominal", "borrowing_limit", "lending_limit"})
    if unknown:
        raise RequestInvalid(
            f"unknown field(s) {', '.join(unknown)}; a quota has pool, nominal, "
            "borrowing_limit and lending_limit"
        )
    pool = body.get("pool")
    deps.ensure_pools()
    if not is_pool_name(pool):
        raise RequestInvalid(
            f"pool must be an instance type like ml.trn1.32xlarge or plan:<name>, got {pool!r}"
        )
    known = {status.pool.instance_type for status in deps.store.pools()}
    if pool not in known:
        raise RequestInvalid(
            f"{pool} is not a pool sagequeue manages (pools: {', '.join(sorted(known)) or 'none'})"
        )
    if "nominal" not in body:
        raise RequestInvalid("nominal is required: instances guaranteed to the team (null removes the quota)")
    if body["nominal"] is None:
        limits = [name for name in ("borrowing_limit", "lending_limit") if body.get(name) is not None]
        if limits:
            raise RequestInvalid(
                f"nominal null removes the quota; {' and '.join(limits)} may only be given with a nominal"
            )
        return _remove(deps, team, pool, me)
    _team(team)
    try:
        quota = TeamQuota(
            team=team,
            pool=pool,
            nominal=body["nominal"],
            borrowing_limit=body.get("borrowing_limit"),
            lending_limit=body.get("lending_limit"),
        )
    except QuotaError as exc:
        raise RequestInvalid(str(exc)) from None
    deps.store.set_team_quota(quota)
    _announce(deps, team, pool, quota, me)
    ledger = _ledger(deps)
    if not ledger.governs(pool):  # removed again by a racing admin: answer what was stored
        return {**quota.to_dict(), "warning": None}
    answer = _share_api(ledger.share(team, pool), ledger)
    if answer["warning"] is not None:
        # stored all the same: capacity may grow back, and quotas are often set one team at a time
        logger.warning("team quotas above the pool's capacity", extra={"team": team, "pool": pool})
    return answer


def _remove(deps: Dependencies, team: str, pool: str, by: str) -> dict[str, Any]:
    removed = deps.store.remove_team_quota(team, pool)
    if not removed:
        try:
            check_team_name(team)
        except QuotaError as exc:
            # nothing stored under a name no quota can be set under: the caller mistyped it
            raise RequestInvalid(
                f"team: {exc}; no quota of team {team!r} in {pool} is stored to remove"
            ) from None
        # idempotent: nothing stored to remove, nothing changed, nothing to announce
        return {"team": team, "pool": pool, "removed": False, "warning": _warning(_ledger(deps), pool)}
    _announce(deps, team, pool, None, by)
    return {"team": team, "pool": pool, "removed": True, "warning": _warning(_ledger(deps), pool)}


def _announce(deps: Dependencies, team: str, pool: str, quota: TeamQuota | None, by: str) -> None:
    # a JobChanged makes the scheduler run a pass: a new quota may start or reclaim work now
    announce(
        deps.publisher,
        EventType.JOB_CHANGED,
        {"team": team, "pool": pool, "change": "quota", "quota": quota.to_dict() if quota else None},
    )
    logger.info("team quota " + ("set" if quota else "removed"), extra={"team": team, "pool": pool, "by": by})


def _team(team: str, rule: Callable[[object], str] = check_team_name) -> str:
    """`team` if `rule` accepts it; else RequestInvalid naming the path's member and the rule, as the API's
    path check does."""
    try:
        return rule(team)
    except QuotaError as exc:
        raise RequestInvalid(f"team: {exc}") from None


def _warning(ledger: TeamLedger, pool: str) -> str | None:
    quotas = ledger.quotas.get(pool, {}).values()
    return oversubscription(quotas, pool, ledger.capacity.get(pool, 0))


def _share_api(share: PoolShare, ledger: TeamLedger) -> dict[str, Any]:
    return {
        "team": team_label(share.team),
        "pool": share.pool,
        "nominal": share.nominal,
        "borrowing_limit": share.borrowing_limit,
        "lending_limit": share.lending_limit,
        "used": share.used,
        "borrowed": share.borrowed,
        "lent": share.lent,
        "borrowable": share.borrowable,
        "warning": _warning(ledger, share.pool),
    }
