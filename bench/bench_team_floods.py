"""Two teams' equal-priority floods on one pool of 4 x ml.trn1.32xlarge, in the simulator with the real
policy: per-hour instance usage of each team, printed, and drawn as an SVG figure.

    python bench/bench_team_floods.py [--svg docs/figures/team-floods.svg]

Team a submits 80 one-hour jobs (checkpointing every 10 min) at t = 0, team b the same at t = 2 h, all at
priority 5; min runtime 600 s, stop grace 120 s, provisioning 300 s + 60 s download (the simulator's
defaults). Two settings of the quotas:
- quotas 2 + 2: each team's nominal quota is half the pool; a borrows all four while alone, b reclaims two.
- quotas 0 + 0: nothing is guaranteed, everything is borrowed; only fair share (decaying instance-hours,
  half-life 24 h) orders the teams.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sagequeue.sim.engine import SimSettings, Simulation
from sagequeue.sim.metrics import summarize, team_usage_by_interval
from sagequeue.sim.schedulers import SagequeuePolicy
from sagequeue.sim.trace import Trace, TraceJob
from sagequeue_core.quotas import TeamQuota

POOL = "ml.trn1.32xlarge"
HOUR = 3600.0
HOURS = 16
COLOURS = {"a": "#1c7ed6", "b": "#e8590c"}


def flood(team: str, start: float, jobs: int) -> list[TraceJob]:
    return [
        TraceJob(f"{team}-{i}", start + i, 5, POOL, 1, HOUR, checkpoint_minutes=10.0, team=team)
        for i in range(jobs)
    ]


def run(nominal: int) -> tuple[list[dict[str, float]], dict[str, object]]:
    quotas = (TeamQuota("a", POOL, nominal), TeamQuota("b", POOL, nominal))
    sim = Simulation(
        Trace(tuple(flood("a", 0, 80) + flood("b", 2 * HOUR, 80))),
        SagequeuePolicy(),
        SimSettings(capacity={POOL: 4}, team_quotas=quotas),
        horizon_seconds=HOURS * HOUR,
    )
    recorder = sim.run()
    return team_usage_by_interval(recorder, HOUR)[:HOURS], summarize(
        recorder, stop_grace_seconds=120, provisioning_seconds=360
    )


def svg(panels: list[tuple[str, list[dict[str, float]]]]) -> str:
    width, height, pad, gap = 640, 150, 36, 40
    total = len(panels) * (height + gap) + pad
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width + 2 * pad}" height="{total}" '
        'font-family="sans-serif" font-size="11">'
    ]
    bar = width / HOURS
    for n, (title, hours) in enumerate(panels):
        top = pad + n * (height + gap)
        out.append(f'<text x="{pad}" y="{top - 8}" font-size="12">{title}</text>')
        for h, used in enumerate(hours):
            y = top + height
            for team in ("a", "b"):
                share = used.get(team, 0.0) / (4 * HOUR)
                h_px = share * height
                y -= h_px
                out.append(
                    f'<rect x="{pad + h * bar:.1f}" y="{y:.1f}" width="{bar - 2:.1f}" height="{h_px:.1f}" '
                    f'fill="{COLOURS[team]}"/>'
                )
        mid = top + height / 2
        out.append(
            f'<line x1="{pad}" y1="{mid}" x2="{pad + width}" y2="{mid}" stroke="#212529" stroke-dasharray="4 3"/>'
        )
        out.append(f'<text x="{pad + width + 4}" y="{mid + 4}">50 %</text>')
        for h in range(0, HOURS + 1, 2):
            out.append(f'<text x="{pad + h * bar:.1f}" y="{top + height + 14}">{h} h</text>')
    legend = total - 8
    out.append(f'<rect x="{pad}" y="{legend - 9}" width="10" height="10" fill="{COLOURS["a"]}"/>')
    out.append(f'<text x="{pad + 14}" y="{legend}">team a (floods at 0 h)</text>')
    out.append(f'<rect x="{pad + 170}" y="{legend - 9}" width="10" height="10" fill="{COLOURS["b"]}"/>')
    out.append(f'<text x="{pad + 184}" y="{legend}">team b (floods at 2 h)</text>')
    out.append("</svg>")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--svg", type=Path, help="write the figure here")
    args = parser.parse_args()
    panels = []
    for nominal, title in (
        (2, "quotas 2 + 2 of 4: borrow, then reclaim"),
        (0, "quotas 0 + 0: fair share only"),
    ):
        hours, summary = run(nominal)
        panels.append((title, hours))
        print(f"{title}\n  hour   a    b   (instances held, hourly mean)")
        for h, used in enumerate(hours):
            print(f"  {h:>4} {used.get('a', 0) / HOUR:4.2f} {used.get('b', 0) / HOUR:4.2f}")
        later = [sum(h.get(t, 0.0) for h in hours[4:]) for t in ("a", "b")]
        print(f"  hours 4-{HOURS}: a {later[0] / sum(later):.1%}, b {later[1] / sum(later):.1%}")
        by_team = summary["by_team"]
        assert isinstance(by_team, dict)
        for team in ("a", "b"):
            wait = by_team[team]["wait"]
            print(
                f"  team {team}: mean wait {wait['mean'] / HOUR:.2f} h, usage share {by_team[team]['usage_share']:.1%}"
            )
    if args.svg:
        args.svg.write_text(svg(panels), encoding="utf-8")
        print(f"wrote {args.svg}")


if __name__ == "__main__":
    main()
