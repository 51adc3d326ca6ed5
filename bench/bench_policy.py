"""How long one scheduling decision takes, and how it grows with the queue and the running work.

    python bench/bench_policy.py [--repeat N]

The scheduler reads at most `queue_lookahead` queued jobs per pool, so the lookahead, not the queue's
length, bounds the work; the last rows show the worst case the exact victim search can meet.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import tracemalloc
from datetime import UTC, datetime, timedelta

from sagequeue_core.domain import ResourceKey
from sagequeue_core.policy import PolicySettings, QueuedJob, RunningAttempt, Snapshot, WarmPool, plan

POOLS = ("ml.trn1.32xlarge", "ml.trn1n.32xlarge", "ml.trn2.48xlarge", "ml.p5.48xlarge")
NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


def make_snapshot(queued: int, running_per_pool: int, rng: random.Random) -> Snapshot:
    def key(pool: str, count: int) -> ResourceKey:
        return ResourceKey(f"arn:aws:iam::1:role/r{rng.randint(0, 3)}", pool, count, 512)

    running = []
    for pool in POOLS:
        for i in range(running_per_pool):
            started = NOW - timedelta(minutes=rng.randint(1, 600))
            running.append(
                RunningAttempt(
                    training_job_name=f"run-{pool}-{i}",
                    job_name=f"run-{pool}-{i}",
                    priority=rng.randint(0, 9),
                    started_at=started,
                    demand={pool: 1},
                    training_started_at=started + timedelta(seconds=480),  # after provisioning
                )
            )
    warm = [WarmPool(f"warm-{pool}", key(pool, 1)) for pool in POOLS]
    jobs = []
    for i in range(queued):
        pool = rng.choice(POOLS)
        count = rng.choice((1, 1, 1, 2, 4))
        jobs.append(
            QueuedJob(
                name=f"job-{i}",
                priority=rng.randint(0, 9),
                submitted_at=NOW - timedelta(seconds=i),
                demand={pool: count},
                resource_key=key(pool, count),
            )
        )
    capacity = dict.fromkeys(POOLS, running_per_pool + 1)
    return Snapshot(now=NOW, capacity=capacity, queued=jobs, running=running, warm_pools=warm)


def measure(queued: int, running_per_pool: int, repeat: int) -> tuple[float, float, float, int]:
    rng = random.Random(queued * 1000 + running_per_pool)
    snapshot = make_snapshot(queued, running_per_pool, rng)
    settings = PolicySettings(min_runtime_before_preemption_seconds=300, default_keep_alive_seconds=600)
    timings = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = plan(snapshot, settings)
        timings.append(time.perf_counter() - start)
    tracemalloc.start()
    plan(snapshot, settings)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return statistics.median(timings) * 1000, max(timings) * 1000, peak / 1024, len(result.actions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    print(f"{'queued':>8} {'running':>8} {'median ms':>10} {'max ms':>8} {'peak KiB':>9} {'actions':>8}")
    for queued, running_per_pool in ((10, 2), (100, 8), (400, 8), (400, 32), (2000, 64)):
        median_ms, max_ms, peak_kib, actions = measure(queued, running_per_pool, args.repeat)
        print(
            f"{queued:>8} {running_per_pool * len(POOLS):>8} {median_ms:>10.2f} {max_ms:>8.2f} "
            f"{peak_kib:>9.0f} {actions:>8}"
        )


if __name__ == "__main__":
    main()
