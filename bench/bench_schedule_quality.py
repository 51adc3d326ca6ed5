"""Schedule quality: sagequeue's policy beside FIFO, priority without preemption, the article's naive
preemptive scheduler, and sagequeue's own policy without backfill on loan and without drains, on the
documented 21-day trace and on an overload trace.

    python bench/bench_schedule_quality.py [--seeds 1,2,3] [--markdown]

The documented trace: `WorkloadSpec()` (350 jobs over 21 days: office-hours arrivals with bursts, priorities
1/3/5/6/9 weighted 30/25/30/10/5 %, 62 % one-instance jobs and 4- and 8-instance gangs, log-normal
training times with a 1.5 h median, 15 % sweeps sharing a resource key with a 10-30 min keep-alive, 70 %
checkpointing every 10-60 min) on 4 x ml.trn1.32xlarge and 2 x ml.trn2.48xlarge, the stack's defaults
(min runtime 600 s, keep-alive 600 s, lookahead 50), cold start 300 s + 60 s download, stop grace 120 s.
After each table, reference runs of sagequeue's policy that say what holds a figure where a target is
missed (other schedules, not bounds): the top priority's jobs alone on the pools, the whole trace with no
minimum runtime before preemption, and the worst equal-priority gang class's gangs alone on the pools.
The overload trace: the same generator, 350 jobs in 3 days (offered load printed, above 2), simulated 30
days past its last submission so that every scheduler can drain it. Each table is one run of every scheduler
on one trace; the wall time of each and the peak memory of the whole run are printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import sys
import time

from sagequeue.sim import SimSettings, WorkloadSpec, baselines, generate, simulate
from sagequeue.sim.report import table
from sagequeue.sim.run import Variant

CAPACITY = {"ml.trn1.32xlarge": 4, "ml.trn2.48xlarge": 2}


def offered_load(trace, capacity) -> float:  # type: ignore[no-untyped-def]
    work = sum(j.duration_seconds * j.instance_count for j in trace.jobs)
    span = max(trace.last_submit_seconds, 1.0)
    return work / (sum(capacity.values()) * span)


def run(title: str, spec: WorkloadSpec, seed: int, markdown: bool, drain_days: float = 7) -> None:
    trace = generate(spec, seed=seed)
    settings = SimSettings(capacity=CAPACITY)
    began = time.perf_counter()
    horizon = trace.last_submit_seconds + drain_days * 86400
    variants = baselines(settings)
    # the same policy without backfill on loan, to show what lending a waiting reservation's idle part adds
    variants.insert(-1, Variant("no loans", "sagequeue", settings.with_changes(lend_reserved_capacity=False)))
    # and without drains (no reservation for waiting alone): what holding capacity for wide jobs costs
    variants.insert(-1, Variant("no drains", "sagequeue", settings.with_changes(reserve_after_seconds=0)))
    results = simulate(trace, variants, horizon_seconds=horizon, timeline=False)
    print(
        f"\n### {title}, seed {seed}: {len(trace.jobs)} jobs, offered load {offered_load(trace, CAPACITY):.2f}"
    )
    print(table(results, markdown=markdown))
    # The top priority's p95 wait with no other work at all: its own jobs queue behind each other when they
    # arrive together (a reference run of the same policy, not a bound: with other work present, a
    # different order among them can come out lower).
    top = max(job.priority for job in trace.jobs)
    alone = dataclasses.replace(trace, jobs=tuple(job for job in trace.jobs if job.priority == top))
    (by_itself,) = simulate(
        alone, [Variant("alone", "sagequeue", settings)], horizon_seconds=horizon, timeline=False
    )
    ratio = by_itself.summary["top_p95_wait_over_grace_and_provisioning"]
    print(
        f"\ntop priority ({top}, {len(alone.jobs)} jobs) alone on the pools: p95 wait / (grace + provisioning)"
        f" {ratio:.2f}"
    )
    # What it would be if running work had no minimum runtime before preemption: a top-priority job that
    # arrives just after its victims started waits out their minimum runtime, which the target leaves out.
    (no_minimum,) = simulate(
        trace,
        [
            Variant(
                "no minimum runtime",
                "sagequeue",
                settings.with_changes(min_runtime_before_preemption_seconds=0),
            )
        ],
        horizon_seconds=horizon,
        timeline=False,
    )
    print(
        "top priority with no minimum runtime before preemption: p95 wait / (grace + provisioning)"
        f" {no_minimum.summary['top_p95_wait_over_grace_and_provisioning']:.2f}"
    )
    # The worst equal-priority class of gang / small wait, with its gangs alone on empty pools: whole-pool
    # jobs submitted together run one after another whatever else runs, so their wait alone, over the small
    # jobs' wait in the full run, says how much of the ratio is their own queue (a reference run of the
    # same policy, not a bound).
    summary = results[-1].summary
    worst = summary["gang_over_small_worst_class"]
    if worst is not None:
        priority = worst["priority"]
        gangs = tuple(job for job in trace.jobs if job.priority == priority and job.gang)
        (gangs_alone,) = simulate(
            dataclasses.replace(trace, jobs=gangs),
            [Variant("gangs alone", "sagequeue", settings)],
            horizon_seconds=horizon,
            timeline=False,
        )
        alone_wait = gangs_alone.summary["wait_gang"]["mean"]
        print(
            f"worst gang / small class (priority {priority}, {len(gangs)} gangs):"
            f" {summary['gang_over_small_wait_same_priority']:.2f}; its gangs alone on the pools wait"
            f" {alone_wait / worst['small_mean_wait']:.2f} x its small jobs' mean wait"
        )
    walls = ", ".join(f"{r.variant.label} {r.wall_seconds:.1f} s" for r in results)
    print(f"\nwall time: {time.perf_counter() - began:.1f} s ({walls})")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", default="2,1,3")
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--skip-overload", action="store_true")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    for seed in seeds:
        run("21-day trace", WorkloadSpec(capacity=CAPACITY), seed, args.markdown)
    if not args.skip_overload:
        run("overload trace", WorkloadSpec(days=3, capacity=CAPACITY), seeds[0], args.markdown, drain_days=30)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak memory: {peak:.0f} MB")


if __name__ == "__main__":
    main()
