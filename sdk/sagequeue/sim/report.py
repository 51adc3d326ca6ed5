"""The side-by-side table and the JSON document of a set of runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sagequeue.sim.metrics import FITTING, NOT_FITTING
from sagequeue.sim.run import Result


def _hours(seconds: Any) -> str:
    if seconds is None:
        return "-"
    value = float(seconds)
    if value < 3600:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def _share(value: Any) -> str:
    return "-" if value is None else f"{100 * float(value):.1f}%"


def _ratio(value: Any) -> str:
    return "-" if value is None else f"{float(value):.2f}"


def _count(value: Any) -> str:
    return "-" if value is None else f"{value:,}" if isinstance(value, int) else f"{float(value):,.1f}"


def _wait(stat: Any) -> str:
    if not stat or not stat.get("n"):
        return "-"
    return f"{_hours(stat['mean'])} / {_hours(stat['p95'])}"


def _per_stop(stat: Any) -> str:
    if not stat or not stat.get("n"):
        return "-"
    return f"{float(stat['mean']):.2f} / {float(stat['p95']):.2f}"


Row = tuple[str, Callable[[dict[str, Any]], str]]

ROWS: list[Row] = [
    ("jobs unfinished", lambda s: _count(s["unfinished"])),
    ("jobs completed", lambda s: _count(s["completed"])),
    ("held in use while backlog", lambda s: _share(s["held_in_use_while_backlog"])),
    ("idle while a waiting job fits", lambda s: _share(s["idle_while_a_waiting_job_fits"])),
    (
        "  of it: resumable / loans spent / no checkpoint",
        lambda s: " / ".join(_share(s["idle_while_a_waiting_job_fits_by_kind"][k]) for k in FITTING),
    ),
    (
        "idle while no waiting job fits: behind >= / lower priority or warm",
        lambda s: " / ".join(_share(s["idle_while_no_waiting_job_fits_by_kind"][k]) for k in NOT_FITTING),
    ),
    ("training while backlog", lambda s: _share(s["training_while_backlog"])),
    ("training share", lambda s: _share(s["training_share"])),
    ("warm idle share", lambda s: _share(s["warm_idle_share"])),
    ("warm reuse", lambda s: _share(s["warm_reuse"])),
    ("attempts", lambda s: _count(s["attempts"])),
    ("preemptions total", lambda s: _count(s["preemptions_total"])),
    ("preemptions max per job", lambda s: _count(s["preemptions_max_per_job"])),
    (
        "loans taken back: total / max per job",
        lambda s: f"{_count(s['loans_taken_back_total'])} / {_count(s['loans_taken_back_max_per_job'])}",
    ),
    ("work lost (instance-hours)", lambda s: _count(s["work_lost_instance_hours"])),
    ("work lost, share of all work", lambda s: _share(s["work_lost_share"])),
    (
        "work lost per stop mean / p95 (instance-h)",
        lambda s: _per_stop(s["work_lost_per_stop_instance_hours"]),
    ),
    ("wait gang (>=4) mean / p95", lambda s: _wait(s["wait_gang"])),
    ("wait small mean / p95", lambda s: _wait(s["wait_small"])),
    ("gang / small wait, same priority (worst)", lambda s: _ratio(s["gang_over_small_wait_same_priority"])),
    (
        "top-priority p95 wait / (grace + provisioning)",
        lambda s: _ratio(s["top_p95_wait_over_grace_and_provisioning"]),
    ),
    ("makespan", lambda s: _hours(s["makespan_seconds"])),
    ("makespan / per-pool lower bound", lambda s: _ratio(s["makespan_over_lower_bound"])),
    ("passes run", lambda s: _count(s["passes"])),
    ("creates refused (ResourceLimitExceeded)", lambda s: _count(s["refused_creates"])),
]


def table(results: Sequence[Result], *, markdown: bool = False) -> str:
    """One column per run, one row per metric; waits by priority follow the fixed rows."""
    headers = ["metric", *(r.variant.label for r in results)]
    rows = [[label, *(render(r.summary) for r in results)] for label, render in ROWS]
    priorities: list[str] = []
    for result in results:
        for p in result.summary["wait_by_priority"]:
            if p not in priorities:
                priorities.append(p)
    for p in sorted(priorities, key=int, reverse=True):
        rows.append(
            [f"wait priority {p} mean / p95", *(_wait(r.summary["wait_by_priority"].get(p)) for r in results)]
        )
    teams = sorted({t for r in results for t in r.summary.get("by_team", {})})
    for team in teams:
        rows.append([f"team {team} wait mean / p95", *(_wait(_team(r, team).get("wait")) for r in results)])
        rows.append(
            [f"team {team} usage share", *(_ratio(_team(r, team).get("usage_share")) for r in results)]
        )
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(str(row[i])) for row in [headers, *rows]) for i in range(len(headers))]
    out = [
        "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths, strict=True))
        )
    ]
    out.append("  ".join("-" * w for w in widths))
    for row in rows:
        out.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    return "\n".join(out)


def _team(result: Result, team: str) -> dict[str, Any]:
    return dict(result.summary.get("by_team", {}).get(team) or {})


def document(results: Sequence[Result], *, trace: str, notes: Sequence[str] = ()) -> dict[str, Any]:
    """The runs as JSON: each variant's scheduler, settings and summary."""
    return {
        "trace": trace,
        "notes": list(notes),
        "runs": [
            {
                "label": r.variant.label,
                "scheduler": r.variant.scheduler,
                "settings": _settings(r),
                "wall_seconds": round(r.wall_seconds, 3),
                "summary": r.summary,
            }
            for r in results
        ],
    }


def _settings(result: Result) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in vars(result.variant.settings).items():
        if hasattr(value, "items"):
            out[name] = dict(value)
        elif isinstance(value, tuple) and value and hasattr(value[0], "to_dict"):
            out[name] = [item.to_dict() for item in value]  # team quotas
        else:
            out[name] = value
    return out


__all__ = ["ROWS", "document", "table"]
