"""Forecast calibration: forecasts of every waiting job made every 15 simulated minutes, scored against the
starts that happened, beside the earlier `ls --start` estimate on the same jobs at the same moments, and
beside the forecast as it was before its calibration (`BEFORE`), and beside "now"'s forecasts calibrated
by what its earlier forecasts in the same run got wrong (`calibrated`, ADR 0026); then how long a
forecast of 1,000 queued jobs takes, before and now, in the same run.

    python bench/bench_forecast.py [--seeds 1,2,3] [--samples 10] [--every 900] [--skip-overload]
                                   [--overload-only] [--upto-days D] [--skip-timing] [--skip-traces]
                                   [--oracle] [--no-before] [--no-calibrated]
                                   [--half-life H] [--prior W] [--coverage C] [--shift-p50]
                                   [--distribution-oracle] [--full-oracle]
                                   [--half-oracle "run times"|arrivals] [--oracle-samples N]
                                   [--variant NAME:KEY=VALUE,...] [--breakdown]

The traces are bench_schedule_quality.py's: the documented 21-day trace (`WorkloadSpec()`, seeds 1-3) and
the overload trace (350 jobs in 3 days), on 4 x ml.trn1.32xlarge and 2 x ml.trn2.48xlarge with the stack's
defaults. For each: how many forecasts were made, the median absolute error of the earlier estimate on the
jobs it gives one for, and for each forecast (before, now, and with `--oracle` the reference that knows
every submitted job's training time): the share of actual starts inside the P10-P90 range (target
75-95 %), the median absolute error of the P50 and its ratio to the earlier estimate's on the same jobs
(target at most 0.5). All forecasts of a trace are made in one simulation, at the same moments, from the
same observations. `--upto-days D` keeps only the jobs submitted in the first D days (a shorter run).

References beside them: `--distribution-oracle` draws run times and later submissions as the trace's
generator draws them (`WorkloadSpec`: the log-normal and its clip, conditioned on what a running job has
trained; the jobs still to come, in singles, bursts and sweeps at the office-hours rate up to the trace's
end): the best a forecast that knows no realization can do, so its P50 error bounds what any model of run
times and arrivals can reach. `--full-oracle` knows every training time and every later submission: what
error is left is where the forward run differs from the simulator (its line gives the share of P50s within
1 minute, 15 minutes and an hour of the start). `--half-oracle` knows one half of the generator.
`--variant NAME:KEY=VALUE,...` adds a forecast with ForecastSettings changes; `--breakdown` prints coverage,
the share after P90 and the P50's signed error per pool, priority and instance count.
docs/forecast.md has the figures.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta

from sagequeue.forecast import ForecastSettings, History, QueueState, Traits, forecast
from sagequeue.forecast.calibrate import CalibrationSettings
from sagequeue.sim import SimSettings, WorkloadSpec, generate
from sagequeue.sim.forecast import Made, Score, scored_runs
from sagequeue_core.policy import QueuedJob, RunningAttempt

CAPACITY = {"ml.trn1.32xlarge": 4, "ml.trn2.48xlarge": 2}


def offered_load(trace) -> float:  # type: ignore[no-untyped-def]
    work = sum(j.duration_seconds * j.instance_count for j in trace.jobs)
    return work / (sum(CAPACITY.values()) * max(trace.last_submit_seconds, 1.0))


def _hours(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds / 3600:.2f} h"


#: the forecast before its calibration: every run at last week's arrival rate, run times from the whole
#: history, every pass reading the whole window (the same plans, slower)
BEFORE: dict[str, object] = {"arrival_rate_spread": 0.0, "resample_history": False, "narrow_lookahead": 0}


def _ratio(score: Score) -> float:
    if not score.baseline_errors:
        return math.nan
    return score.median_error_where_baseline / score.baseline_median_error


def row(title: str, trace, scores: dict[str, Score], wall: float) -> list[str]:  # type: ignore[no-untyped-def]
    first = next(iter(scores.values()))
    cells = [
        title,
        f"{offered_load(trace):.2f}",
        str(len(first.seconds)),
        str(first.pairs),
        _hours(first.baseline_median_error),
    ]
    for score in scores.values():
        cells += [
            f"{100 * score.coverage:.1f} %",
            _hours(score.median_error_where_baseline),
            f"{_ratio(score):.2f}",
        ]
    last = scores.get("now", list(scores.values())[-1])
    cells += [
        f"{statistics.mean(last.seconds) if last.seconds else 0:.2f} / {max(last.seconds, default=0):.2f} s",
        f"{wall:.0f} s",
    ]
    return cells


def headers(variants: list[str]) -> list[str]:
    out = ["trace", "load", "forecasts", "jobs scored", "--start error"]
    for name in variants:
        out += [f"{name}: P10-P90 coverage", f"{name}: P50 error", f"{name}: ratio"]
    return [*out, "forecast mean / max (now)", "run wall"]


def _changes(text: str) -> dict[str, object]:
    """`key=value,...` as ForecastSettings changes (numbers and true/false parsed)."""
    out: dict[str, object] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if value in ("true", "false"):
            out[key] = value == "true"
        else:
            try:
                out[key] = int(value)
            except ValueError:
                out[key] = float(value)
    return out


def variants_of(args: argparse.Namespace) -> dict[str, dict[str, object]]:
    variants: dict[str, dict[str, object]] = {}
    if not args.no_before:
        variants["before"] = {"samples": args.samples, **BEFORE}
    if args.oracle:
        variants["oracle"] = {"samples": args.samples, "oracle": True}
    oracle_samples = args.oracle_samples or args.samples
    if args.distribution_oracle:
        variants["distribution oracle"] = {"samples": oracle_samples, "truth": "distribution"}
    if args.full_oracle:
        variants["full oracle"] = {"samples": oracle_samples, "truth": "full"}
    for text in args.variant:
        name, _, changes = text.partition(":")
        variants[name] = {"samples": args.samples, **_changes(changes)}
    for truth in args.half_oracle:
        variants[f"true {truth}"] = {"samples": oracle_samples, "truth": truth}
    variants["now"] = {"samples": args.samples}
    if not args.no_calibrated:
        variants["calibrated"] = {"calibrate": "now", "calibration": calibration_of(args)}
    return variants


def calibration_of(args: argparse.Namespace) -> CalibrationSettings:
    """The calibration of "now"'s forecasts by what its earlier forecasts in the run got wrong (ADR 0026)."""
    defaults = CalibrationSettings()
    return CalibrationSettings(
        half_life_seconds=defaults.half_life_seconds if args.half_life is None else args.half_life * 3600,
        prior=defaults.prior if args.prior is None else args.prior,
        coverage=defaults.coverage if args.coverage is None else args.coverage,
        shift_p50=args.shift_p50,
    )


def one(title: str, spec: WorkloadSpec, seed: int, args: argparse.Namespace, drain_days: float) -> list[str]:
    trace = generate(spec, seed=seed)
    if args.upto_days is not None:
        trace = dataclasses.replace(
            trace, jobs=tuple(j for j in trace.jobs if j.submit_seconds < args.upto_days * 86400)
        )
    began = time.perf_counter()
    scored = scored_runs(
        trace,
        SimSettings(capacity=CAPACITY),
        every_seconds=args.every,
        horizon_seconds=trace.last_submit_seconds + drain_days * 86400,
        variants=variants_of(args),
        spec=spec,
    )
    scores = {name: score for name, (score, _) in scored.items()}
    result = row(f"{title}, seed {seed}", trace, scores, time.perf_counter() - began)
    print("| " + " | ".join(result) + " |", flush=True)
    if "full oracle" in scored:
        print(f"|   {fidelity(scored['full oracle'][1])} |", flush=True)
    if args.breakdown:
        for line in breakdown(trace, scored):
            print(f"|   {line} |", flush=True)
    if len(scores) > 1:
        walls = ", ".join(
            f"{name} {statistics.mean(score.seconds) if score.seconds else 0:.2f} s"
            for name, score in scores.items()
        )
        print(f"|   forecast wall time, mean: {walls} |", flush=True)
    return result


def breakdown(trace, scored: dict[str, tuple[Score, list[Made]]]) -> list[str]:  # type: ignore[no-untyped-def]
    """Per pool, priority and instance count: forecasts scored, coverage, the median signed error of the P50
    (positive: forecast too late) and the share that started after the P90, for each forecast."""
    jobs = {j.name: j for j in trace.jobs}
    groups: dict[str, object] = {
        "pool": lambda j: j.instance_type,
        "priority": lambda j: j.priority,
        "instances": lambda j: j.instance_count,
    }
    lines = []
    for label, key in groups.items():
        for name, (_, made) in scored.items():
            cells = []
            by: dict[object, list[Made]] = {}
            for m in made:
                if m.actual is not None:
                    by.setdefault(key(jobs[m.job]), []).append(m)  # type: ignore[operator]
            for value in sorted(by, key=str):
                ms = by[value]
                covered = sum(m.p10 <= m.actual <= m.p90 for m in ms) / len(ms)  # type: ignore[operator]
                late = sum(m.actual > m.p90 for m in ms) / len(ms)  # type: ignore[operator]
                signed = statistics.median(m.p50 - m.actual for m in ms)  # type: ignore[operator]
                cells.append(
                    f"{value}: {len(ms)}, {100 * covered:.0f} % in, {100 * late:.0f} % after P90,"
                    f" P50 {signed / 3600:+.2f} h"
                )
            lines.append(f"{name} by {label}: " + "; ".join(cells))
    return lines


def fidelity(made: list[Made]) -> str:
    """How close the full oracle's P50 came to the starts: what is left is where the forward run differs from
    the simulator (its P10-P90 range is near a point, so its coverage says little)."""
    errors = sorted(abs(m.p50 - m.actual) for m in made if m.actual is not None)
    if not errors:
        return "full oracle: nothing scored"
    share = {limit: sum(e <= limit for e in errors) / len(errors) for limit in (60, 900, 3600)}
    p90 = errors[min(int(0.9 * len(errors)), len(errors) - 1)]
    return (
        f"full oracle: P50 within 1 min of the start {100 * share[60]:.1f} %, within 15 min"
        f" {100 * share[900]:.1f} %, within 1 h {100 * share[3600]:.1f} %; mean error {_hours(statistics.mean(errors))},"
        f" 90th percentile {_hours(p90)}"
    )


def thousand_jobs(samples: int, **changes: object) -> tuple[float, float]:
    """A forecast of 1,000 queued jobs on the documented pools, 6 running: wall seconds, and per sample."""
    rng = random.Random(7)
    now = datetime(2026, 3, 4, 12, tzinfo=UTC)
    pools = list(CAPACITY)
    queued = [
        QueuedJob(
            name=f"q{i:04d}",
            priority=rng.choice((1, 3, 5, 6, 9)),
            submitted_at=now - timedelta(minutes=rng.uniform(0, 3000)),
            demand={(pool := rng.choice(pools)): min(rng.choice((1, 1, 1, 2, 4)), CAPACITY[pool])},
        )
        for i in range(1000)
    ]
    running = []
    for pool, capacity in CAPACITY.items():
        for k in range(capacity):
            started = now - timedelta(minutes=rng.uniform(10, 300))
            running.append(
                RunningAttempt(
                    training_job_name=f"r-{pool}-{k}",
                    demand={pool: 1},
                    priority=5,
                    started_at=started,
                    job_name=f"r-{pool}-{k}",
                    training_started_at=started + timedelta(minutes=6),
                )
            )
    history = History(
        completed=[(Traits(instances=1), rng.lognormvariate(math.log(5400), 1.0)) for _ in range(200)]
    )
    state = QueueState(now=now, capacity=CAPACITY, queued=queued, running=running)
    began = time.perf_counter()
    forecast(state, history, ForecastSettings(samples=samples, arrivals=False, **changes))  # type: ignore[arg-type]
    wall = time.perf_counter() - began
    return wall, wall / samples


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--every", type=float, default=900.0)
    parser.add_argument("--upto-days", type=float, default=None)
    parser.add_argument("--skip-overload", action="store_true")
    parser.add_argument("--skip-traces", action="store_true", help="the 1,000-job timing alone")
    parser.add_argument(
        "--overload-only", action="store_true", help="of the traces, the overload trace alone"
    )
    parser.add_argument(
        "--oracle",
        action="store_true",
        help="a reference beside them: forecasts that know every submitted job's training time",
    )
    parser.add_argument(
        "--distribution-oracle",
        action="store_true",
        help="a reference beside them: run times and later submissions drawn as the trace's generator draws"
        " them (the best a forecast that knows no realization can do)",
    )
    parser.add_argument(
        "--full-oracle",
        action="store_true",
        help="a reference beside them: every job's training time and the trace's later submissions known"
        " (what is left is where the forward run differs from the simulator)",
    )
    parser.add_argument(
        "--oracle-samples",
        type=int,
        default=None,
        help="runs forward per forecast of the oracles (--samples)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE,...",
        help="another forecast beside them, with these ForecastSettings changes (repeatable)",
    )
    parser.add_argument(
        "--half-oracle",
        action="append",
        default=[],
        choices=["run times", "arrivals"],
        help="a reference that knows one half of the generator (its run times or its arrivals), the other"
        " half drawn as the forecast draws it (repeatable)",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="per pool, priority and instance count: coverage, share after P90 and the P50's signed error",
    )
    parser.add_argument("--no-before", action="store_true", help="leave out the forecast before calibration")
    parser.add_argument(
        "--no-calibrated", action="store_true", help="leave out the calibrated forecast (ADR 0026)"
    )
    parser.add_argument(
        "--half-life", type=float, help="calibration: hours for a past forecast's weight to halve"
    )
    parser.add_argument("--prior", type=float, help="calibration: shrinkage weight toward no shift")
    parser.add_argument("--coverage", type=float, help="calibration: share of past starts the ranges hold")
    parser.add_argument(
        "--shift-p50", action="store_true", help="calibration: also move the P50 by its past bias"
    )
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--timing-samples", type=int, default=3)
    parser.add_argument("--timing-repeats", type=int, default=3)
    args = parser.parse_args()
    if not args.skip_traces:
        print(f"forecasts every {args.every:g} s of simulated time, {args.samples} runs forward each\n")
        names = list(variants_of(args))
        print("| " + " | ".join(headers(names)) + " |")
        print("|" + "---|" * len(headers(names)), flush=True)
        for seed in [int(s) for s in args.seeds.split(",") if s] if not args.overload_only else []:
            one("21-day trace", WorkloadSpec(capacity=CAPACITY), seed, args, drain_days=7)
        if not args.skip_overload:
            seed = int(args.seeds.split(",")[0])
            one("overload trace", WorkloadSpec(days=3, capacity=CAPACITY), seed, args, drain_days=30)
    if not args.skip_timing:
        # interleaved and the best of `--timing-repeats`: on a shared machine the others' load comes and goes
        befores, nows = [], []
        for _ in range(args.timing_repeats):
            befores.append(thousand_jobs(1, narrow_lookahead=0)[0])
            nows.append(thousand_jobs(args.timing_samples)[1])
        before, now = min(befores), min(nows)
        print(
            f"\n1,000 queued jobs, one run forward (best of {args.timing_repeats}): {before:.2f} s before (every"
            f" pass reading the whole window of every pool), {now:.2f} s now (the mean of {args.timing_samples}"
            f" runs): {before / now:.1f} x faster",
            flush=True,
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
