"""`sagequeue simulate`: run a workload through sagequeue's policy and the baselines, print the table."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import click

from sagequeue.sim.engine import SimSettings
from sagequeue.sim.plot import PlotError
from sagequeue.sim.run import Variant, simulate
from sagequeue.sim.sagemaker import Timings
from sagequeue.sim.schedulers import SCHEDULERS
from sagequeue.sim.trace import Trace, TraceError, load_trace
from sagequeue.sim.workload import WorkloadSpec, generate
from sagequeue_core.quotas import QuotaError, TeamQuota, check_team_name, oversubscription

DEFAULT_CAPACITY = {"ml.trn1.32xlarge": 4, "ml.trn2.48xlarge": 2}
_INSTANCE_TYPE = re.compile(r"ml\.[a-z0-9]+\.[a-z0-9]+")

#: what-if names (as flags and in --compare) -> SimSettings field
SETTING_FLAGS = {
    "min-runtime": "min_runtime_before_preemption_seconds",
    "keep-alive": "default_keep_alive_seconds",
    "reservation-delay": "reserve_after_seconds",
    "preemption-budget": "max_preemptions_per_job",
    "lookahead": "queue_lookahead",
    "lend": "lend_reserved_capacity",  # 1 or 0
}
_BOOLEAN_SETTINGS = frozenset({"lend_reserved_capacity"})
_POOL_FLAGS = {"capacity": "capacity", "quota": "quota"}


class BadInput(Exception):
    """Input the simulation cannot run with; the message names the flag or the line."""


def _fail(message: str) -> NoReturn:
    click.echo(f"sagequeue simulate: error: {message}", err=True)
    raise click.exceptions.Exit(2)


def parse_pools(values: Sequence[str], flag: str) -> dict[str, int]:
    pools: dict[str, int] = {}
    for value in values:
        for part in value.split(","):
            name, sep, number = part.strip().partition("=")
            if not sep or not _INSTANCE_TYPE.fullmatch(name.strip()):
                raise BadInput(f"--{flag} {part!r}: expected TYPE=N with TYPE like ml.trn1.32xlarge")
            if not re.fullmatch(r"[+-]?\d+", number.strip()):
                raise BadInput(f"--{flag} {part!r}: {number!r} is not an integer")
            count = int(number)
            if count < 0:
                raise BadInput(f"--{flag} {part!r}: the number of instances must not be negative")
            pools[name.strip()] = count
    return pools


def _non_negative(value: int | None, flag: str) -> None:
    if value is not None and value < 0:
        raise BadInput(f"--{flag} {value}: must not be negative")


def parse_compare(spec: str, base: SimSettings) -> Variant:
    """`[scheduler:]name=value;name=value`, e.g. `min-runtime=0` or `naive:capacity=ml.trn1.32xlarge=6`."""
    scheduler = "sagequeue"
    body = spec
    head, sep, rest = spec.partition(":")
    if sep and "=" not in head:
        scheduler, body = head.strip(), rest
    if scheduler not in SCHEDULERS:
        raise BadInput(
            f"--compare {spec!r}: unknown scheduler {scheduler!r} (known: {', '.join(SCHEDULERS)})"
        )
    changes: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in body.split(";"))):
        name, eq, value = item.partition("=")
        name = name.strip()
        if not eq:
            raise BadInput(f"--compare {spec!r}: {item!r} is not name=value")
        if name in _POOL_FLAGS:
            pools = dict(getattr(base, _POOL_FLAGS[name]) or {})
            pools.update(parse_pools([value], f"compare {name}"))
            changes[_POOL_FLAGS[name]] = pools
        elif name in SETTING_FLAGS:
            if not re.fullmatch(r"\d+", value.strip()):
                raise BadInput(f"--compare {spec!r}: {name} must be a non-negative integer, got {value!r}")
            field_name = SETTING_FLAGS[name]
            if field_name in _BOOLEAN_SETTINGS:
                if value.strip() not in ("0", "1"):
                    raise BadInput(f"--compare {spec!r}: {name} must be 1 (on) or 0 (off), got {value!r}")
                changes[field_name] = value.strip() == "1"
            else:
                changes[field_name] = int(value)
        else:
            known = ", ".join([*SETTING_FLAGS, *_POOL_FLAGS])
            raise BadInput(f"--compare {spec!r}: unknown setting {name!r} (known: {known})")
    return Variant(f"{scheduler} {body.strip()}".strip(), scheduler, base.with_changes(**changes))


def parse_team_quota(spec: str) -> TeamQuota:
    """`vision/ml.trn1.32xlarge=2,borrow=1,lend=0` -> a team quota (limits unlimited when left out)."""
    head, *limits = (part.strip() for part in spec.split(","))
    team, slash, rest = head.partition("/")
    pool, equals, nominal = rest.partition("=")
    if not slash or not equals or not pool.strip():
        raise BadInput(f"--team-quota {spec!r}: must be TEAM/TYPE=N[,borrow=B][,lend=L]")
    values: dict[str, int] = {"N": _instances(spec, "N", nominal)}
    for limit in limits:
        name, eq, value = (part.strip() for part in limit.partition("="))
        if name not in ("borrow", "lend") or not eq or name in values:
            raise BadInput(f"--team-quota {spec!r}: {limit!r} must be borrow=B or lend=L, each at most once")
        values[name] = _instances(spec, name, value)
    try:
        return TeamQuota(
            team=check_team_name(team.strip()),
            pool=pool.strip(),
            nominal=values["N"],
            borrowing_limit=values.get("borrow"),
            lending_limit=values.get("lend"),
        )
    except QuotaError as exc:
        raise BadInput(f"--team-quota {spec!r}: {exc}") from None


def _instances(spec: str, name: str, text: str) -> int:
    if not re.fullmatch(r"[+-]?\d+", text.strip()):
        raise BadInput(
            f"--team-quota {spec!r}: {name} must be a whole number of instances, got {text.strip()!r}"
        )
    value = int(text)
    if value < 0:
        raise BadInput(f"--team-quota {spec!r}: {name} must not be negative, got {value}")
    return value


def check_team_quotas(team_quotas: Sequence[TeamQuota], capacity: dict[str, int]) -> list[str]:
    """Refuse quotas the run's pools make meaningless (an unknown pool, a team twice in a pool, a number
    above the pool's capacity: a typo, as no team could hold it); return a warning per pool whose nominal
    quotas sum above its capacity (allowed, as the API allows it, but no longer a guarantee for every team)."""
    seen: set[tuple[str, str]] = set()
    for quota in team_quotas:
        where = f"--team-quota {quota.team}/{quota.pool}"
        if quota.pool not in capacity:
            raise BadInput(
                f"{where}: {quota.pool} is not a pool of the run (--capacity: {_pools_text(capacity)})"
            )
        if (quota.team, quota.pool) in seen:
            raise BadInput(f"{where}: given twice; one quota per team and pool")
        seen.add((quota.team, quota.pool))
        for name, value in (
            ("N", quota.nominal),
            ("borrow", quota.borrowing_limit),
            ("lend", quota.lending_limit),
        ):
            if value is not None and value > capacity[quota.pool]:
                hint = "" if name == "N" else f"; leave {name}= out for no limit"
                raise BadInput(
                    f"{where}: {name}={value} is above the pool's capacity of {capacity[quota.pool]}{hint}"
                )
    warnings = (oversubscription(team_quotas, pool, capacity[pool]) for pool in capacity)
    return [warning for warning in warnings if warning is not None]


def ignored_settings(settings: SimSettings) -> list[str]:
    """What-if flags the policy in this version has no setting for: changing them changes nothing."""
    from sagequeue_core.snapshot import policy_settings

    default = SimSettings(capacity=settings.capacity)
    notes = []
    for flag, name in SETTING_FLAGS.items():
        if name == "queue_lookahead" or getattr(settings, name) == getattr(default, name):
            continue
        if policy_settings(settings) == policy_settings(
            settings.with_changes(**{name: getattr(default, name)})
        ):
            notes.append(f"--{flag}: today's policy has no such setting; it changes nothing")
    return notes


@click.command("simulate")
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(dir_okay=False),
    help="A JSON Lines or CSV trace (docs/simulator.md).",
)
@click.option("--jobs", type=int, default=350, show_default=True, help="Generated workload: jobs.")
@click.option(
    "--days", type=float, default=21.0, show_default=True, help="Generated workload: days of arrivals."
)
@click.option(
    "--seed",
    type=int,
    default=2,
    show_default=True,
    help="Seed of the generator and of capacity errors (2: the documented trace).",
)
@click.option(
    "--capacity", "capacity_flags", multiple=True, metavar="TYPE=N", help="Instances per pool (repeatable)."
)
@click.option(
    "--quota", "quota_flags", multiple=True, metavar="TYPE=N", help="SageMaker's account limit per type."
)
@click.option(
    "--team-quota",
    "team_quota_flags",
    multiple=True,
    metavar="TEAM/TYPE=N[,borrow=B][,lend=L]",
    help="A team's quota in a pool (repeatable); jobs' teams come from the trace's team field.",
)
@click.option("--min-runtime", type=int, help="Seconds before a running job may be preempted (600).")
@click.option("--keep-alive", type=int, help="Default keep-alive the scheduler sets (600).")
@click.option(
    "--reservation-delay", type=int, help="Seconds at the head of its pool before a job reserves (1800)."
)
@click.option("--preemption-budget", type=int, help="Preemptions of one job before it is spared (3).")
@click.option("--lookahead", type=int, help="Queued jobs read per pool per pass (50).")
@click.option(
    "--lend/--no-lend",
    default=None,
    help="Lend a waiting reservation's idle instances to checkpointing jobs (on).",
)
@click.option("--cold-start", type=float, help="Seconds a cold start spends in Starting (300).")
@click.option("--warm-start", type=float, help="Seconds a warm start spends in Starting (20).")
@click.option("--stop-grace", type=float, help="Seconds from StopTrainingJob to Stopped (120).")
@click.option(
    "--capacity-error-rate", type=float, help="Share of cold starts that fail with CapacityError (0)."
)
@click.option(
    "--policies", default=",".join(SCHEDULERS), show_default=True, help="Schedulers to run, comma-separated."
)
@click.option(
    "--compare",
    "compares",
    multiple=True,
    metavar="[SCHED:]NAME=V;...",
    help="Another run with changed settings.",
)
@click.option(
    "--drain-days",
    type=float,
    default=7.0,
    show_default=True,
    help="Simulated days after the last submission.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--markdown", is_flag=True, help="Print the table as Markdown.")
@click.option(
    "--plot", "plot_path", type=click.Path(dir_okay=False), help="Write charts to out.html or out.png."
)
@click.option("--save-trace", type=click.Path(dir_okay=False), help="Write the workload as JSON Lines.")
@click.option(
    "--progress/--no-progress", default=None, help="A progress bar on stderr (default: on a terminal)."
)
@click.option("--exact", is_flag=True, help="Run every timer pass, even when nothing could change.")
def simulate_command(**options: Any) -> None:
    """Simulate the queue on a workload: sagequeue's policy beside FIFO, priority and the naive scheduler."""
    try:
        _run(options)
    except (BadInput, TraceError, PlotError) as exc:
        _fail(str(exc))


def _run(options: dict[str, Any]) -> None:
    capacity = (
        parse_pools(options["capacity_flags"], "capacity")
        if options["capacity_flags"]
        else dict(DEFAULT_CAPACITY)
    )
    quota = parse_pools(options["quota_flags"], "quota") if options["quota_flags"] else None
    for flag in (
        "min_runtime",
        "keep_alive",
        "reservation_delay",
        "preemption_budget",
        "cold_start",
        "warm_start",
        "stop_grace",
    ):
        _non_negative(options[flag], flag.replace("_", "-"))
    if options["lookahead"] is not None and options["lookahead"] < 1:
        raise BadInput(f"--lookahead {options['lookahead']}: must be at least 1")
    rate = options["capacity_error_rate"]
    if rate is not None and not 0 <= rate <= 1:
        raise BadInput(f"--capacity-error-rate {rate}: must be between 0 and 1")
    if options["drain_days"] < 0:
        raise BadInput(f"--drain-days {options['drain_days']}: must not be negative")
    changes = {
        SETTING_FLAGS[flag.replace("_", "-")]: options[flag]
        for flag in ("min_runtime", "keep_alive", "reservation_delay", "preemption_budget", "lookahead")
        if options[flag] is not None
    }
    if options["lend"] is not None:
        changes["lend_reserved_capacity"] = options["lend"]
    team_quotas = tuple(parse_team_quota(spec) for spec in options["team_quota_flags"])
    quota_warnings = check_team_quotas(team_quotas, capacity)
    settings = SimSettings(capacity=capacity, quota=quota, team_quotas=team_quotas, **changes)
    timing_changes = {
        name: options[flag]
        for flag, name in (
            ("cold_start", "cold_start_seconds"),
            ("warm_start", "warm_start_seconds"),
            ("stop_grace", "stop_grace_seconds"),
            ("capacity_error_rate", "capacity_error_rate"),
        )
        if options[flag] is not None
    }
    timings = Timings(**timing_changes)
    trace = _trace(options, capacity)
    trace.check_pools(capacity)
    names = [p.strip() for p in options["policies"].split(",") if p.strip()]
    unknown = [n for n in names if n not in SCHEDULERS]
    if unknown:
        raise BadInput(
            f"--policies: unknown scheduler(s) {', '.join(unknown)} (known: {', '.join(SCHEDULERS)})"
        )
    variants = [Variant(name, name, settings) for name in names]
    variants += [parse_compare(spec, settings) for spec in options["compares"]]
    if not variants:
        raise BadInput("--policies: no scheduler to run")
    if options["save_trace"]:
        Path(options["save_trace"]).write_text(trace.to_jsonl(), encoding="utf-8")
    notes = [*quota_warnings, *ignored_settings(settings)]
    too_wide = [j.name for j in trace.jobs if j.instance_count > capacity.get(j.instance_type, 0)]
    if too_wide:
        notes.append(
            f"{len(too_wide)} job(s) wider than their pool's capacity can never start: {', '.join(too_wide[:5])}"
        )
    horizon = trace.last_submit_seconds + options["drain_days"] * 86400
    show_progress = options["progress"] if options["progress"] is not None else sys.stderr.isatty()
    results = _simulate(trace, variants, timings, horizon, options["seed"], options["exact"], show_progress)
    if options["plot_path"]:
        from sagequeue.sim import plot

        plot.write(results, options["plot_path"])
    from sagequeue.sim import report

    if options["as_json"]:
        click.echo(json.dumps(report.document(results, trace=trace.description, notes=notes), indent=2))
        return
    click.echo(f"trace: {trace.description} ({len(trace.jobs)} jobs); capacity {_pools_text(capacity)}")
    click.echo(report.table(results, markdown=options["markdown"]))
    for note in notes:
        click.echo(f"note: {note}")


def _trace(options: dict[str, Any], capacity: dict[str, int]) -> Trace:
    if options["trace_path"]:
        return load_trace(options["trace_path"])
    if options["jobs"] < 1:
        raise BadInput(f"--jobs {options['jobs']}: must be at least 1")
    if options["days"] <= 0:
        raise BadInput(f"--days {options['days']}: must be positive")
    types = {t: w for t, w in WorkloadSpec().instance_types.items() if t in capacity} or dict.fromkeys(
        capacity, 1.0
    )
    spec = WorkloadSpec(jobs=options["jobs"], days=options["days"], instance_types=types, capacity=capacity)
    return generate(spec, seed=options["seed"])


def _simulate(
    trace: Trace,
    variants: list[Variant],
    timings: Timings,
    horizon: float,
    seed: int,
    exact: bool,
    show_progress: bool,
) -> list[Any]:
    if not show_progress:
        return simulate(trace, variants, timings, horizon_seconds=horizon, seed=seed, exact=exact)
    total = int(horizon) * len(variants)
    with click.progressbar(length=total, label="simulating", file=sys.stderr) as bar:
        done = [0]

        def advance(index: int, now: float) -> None:
            position = index * int(horizon) + int(now)
            if position - done[0] >= 3600:
                bar.update(position - done[0])
                done[0] = position

        results = simulate(
            trace, variants, timings, horizon_seconds=horizon, seed=seed, exact=exact, progress=advance
        )
        bar.update(total - done[0])
    return results


def _pools_text(capacity: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in capacity.items())


__all__ = ["simulate_command"]
