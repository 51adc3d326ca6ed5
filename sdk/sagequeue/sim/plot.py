"""Charts of a set of runs: pool occupancy over time (training / starting / stopping / warm idle / free) and
wait CDFs per priority. `.html` is a self-contained page of inline SVG (no dependency); `.png` needs
matplotlib (`pip install matplotlib`)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

from sagequeue.sim.metrics import STATES, Recorder
from sagequeue.sim.run import Result

COLOURS = {
    "training": "#2b8a3e",
    "starting": "#f59f00",
    "stopping": "#e03131",
    "warm": "#1c7ed6",
    "free": "#dee2e6",
}
LINE_COLOURS = ("#212529", "#e8590c", "#5f3dc4", "#0b7285", "#c2255c", "#5c940d", "#1864ab", "#862e9c")
_W, _H, _PAD = 760, 180, 40


class PlotError(Exception):
    """The chart cannot be written (unknown format, matplotlib missing)."""


def write(results: Sequence[Result], path: str | Path) -> None:
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".html", ".htm"):
        path.write_text(html_page(results), encoding="utf-8")
    elif suffix == ".png":
        _png(results, path)
    else:
        raise PlotError(f"--plot {path}: the file must end in .html or .png")


def occupancy_series(
    recorder: Recorder, pool: str, buckets: int = 300
) -> list[tuple[float, dict[str, float]]]:
    """The pool's mean instances per state over `buckets` equal slices of the run."""
    record = recorder.pools[pool]
    start = recorder.first_submit or 0.0
    end = max(recorder.end, start + 1)
    width = (end - start) / buckets
    sums = [dict.fromkeys(STATES, 0.0) for _ in range(buckets)]
    timeline = record.timeline
    for index, row in enumerate(timeline):
        t0 = max(row[0], start)
        t1 = timeline[index + 1][0] if index + 1 < len(timeline) else end
        t1 = min(t1, end)
        if t1 <= t0:
            continue
        values = dict(zip(STATES, row[1:], strict=True))
        b = int((t0 - start) // width)
        while t0 < t1 and b < buckets:
            edge = min(start + (b + 1) * width, t1)
            for name, value in values.items():
                sums[b][name] += value * (edge - t0)
            t0 = edge
            b += 1
    return [(start + (i + 0.5) * width, {k: v / width for k, v in s.items()}) for i, s in enumerate(sums)]


def _waits(recorder: Recorder) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for job in recorder.jobs.values():
        start = job.first_start if job.first_start is not None else recorder.end
        out.setdefault(job.priority, []).append((start - job.submitted) / 3600)
    return {p: sorted(v) for p, v in sorted(out.items(), reverse=True)}


def _occupancy_svg(recorder: Recorder, pool: str) -> str:
    capacity = recorder.pools[pool].capacity or 1
    series = occupancy_series(recorder, pool)
    start = recorder.first_submit or 0.0
    span = max(recorder.end - start, 1)
    x = lambda t: _PAD + (t - start) / span * (_W - 2 * _PAD)  # noqa: E731
    y = lambda v: _H - _PAD / 2 - v / capacity * (_H - _PAD)  # noqa: E731
    parts = []
    base = [0.0] * len(series)
    for state in STATES:
        top = [b + s[state] for b, (_, s) in zip(base, series, strict=True)]
        points = [f"{x(t):.1f},{y(v):.1f}" for (t, _), v in zip(series, top, strict=True)]
        points += [f"{x(t):.1f},{y(v):.1f}" for (t, _), v in reversed(list(zip(series, base, strict=True)))]
        parts.append(
            f'<polygon fill="{COLOURS[state]}" points="{" ".join(points)}"><title>{state}</title></polygon>'
        )
        base = top
    days = int(span // 86400)
    for d in range(days + 1):
        px = x(start + d * 86400)
        parts.append(
            f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{_PAD / 2}" y2="{_H - _PAD / 2}" stroke="#fff" stroke-width="0.5"/>'
        )
    parts.append(
        f'<text x="{_PAD}" y="14" font-size="12">{html.escape(pool)} (capacity {capacity}; one line a day)</text>'
    )
    return f'<svg width="{_W}" height="{_H}" xmlns="http://www.w3.org/2000/svg">{"".join(parts)}</svg>'


def _cdf_svg(recorder: Recorder) -> str:
    waits = _waits(recorder)
    top = max((v[-1] for v in waits.values() if v), default=1.0) or 1.0
    x = lambda h: _PAD + h / top * (_W - 2 * _PAD)  # noqa: E731
    y = lambda q: _H - _PAD / 2 - q * (_H - _PAD)  # noqa: E731
    parts = []
    for index, (priority, values) in enumerate(waits.items()):
        colour = LINE_COLOURS[index % len(LINE_COLOURS)]
        points = []
        for i, value in enumerate(values):
            points.append(f"{x(value):.1f},{y(i / len(values)):.1f}")
            points.append(f"{x(value):.1f},{y((i + 1) / len(values)):.1f}")
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{" ".join(points)}"/>'
        )
        parts.append(
            f'<text x="{_W - _PAD - 90}" y="{20 + 14 * index}" font-size="12" fill="{colour}">priority {priority}</text>'
        )
    parts.append(f'<text x="{_PAD}" y="14" font-size="12">wait CDF (x: 0 to {top:.1f} h)</text>')
    return f'<svg width="{_W}" height="{_H}" xmlns="http://www.w3.org/2000/svg">{"".join(parts)}</svg>'


def html_page(results: Sequence[Result]) -> str:
    legend = " ".join(
        f'<span style="background:{c};padding:0 8px;margin-right:4px"></span>{s}' for s, c in COLOURS.items()
    )
    sections = []
    for result in results:
        recorder = result.recorder
        charts = "".join(f"<div>{_occupancy_svg(recorder, pool)}</div>" for pool in recorder.pools)
        sections.append(
            f"<section><h2>{html.escape(result.variant.label)}</h2>{charts}<div>{_cdf_svg(recorder)}</div></section>"
        )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>sagequeue simulate</title></head>"
        f"<body style='font-family:sans-serif'><h1>sagequeue simulate</h1><p>{legend}</p>{''.join(sections)}"
        "</body></html>\n"
    )


def _png(results: Sequence[Result], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotError("--plot .png needs matplotlib (pip install matplotlib); .html needs nothing") from exc
    pools = list(results[0].recorder.pools) if results else []
    fig, axes = plt.subplots(
        len(results), len(pools) + 1, figsize=(5 * (len(pools) + 1), 2.6 * len(results)), squeeze=False
    )
    for row, result in enumerate(results):
        recorder = result.recorder
        for col, pool in enumerate(pools):
            series = occupancy_series(recorder, pool)
            days = [(t - (recorder.first_submit or 0)) / 86400 for t, _ in series]
            axes[row][col].stackplot(
                days,
                *[[s[state] for _, s in series] for state in STATES],
                colors=[COLOURS[s] for s in STATES],
                labels=STATES,
            )
            axes[row][col].set_title(f"{result.variant.label}: {pool}", fontsize=9)
        for priority, values in _waits(recorder).items():
            axes[row][-1].step(
                values, [(i + 1) / len(values) for i in range(len(values))], label=f"p{priority}"
            )
        axes[row][-1].set_title(f"{result.variant.label}: wait CDF (h)", fontsize=9)
        axes[row][-1].legend(fontsize=7)
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


__all__ = ["PlotError", "html_page", "occupancy_series", "write"]
