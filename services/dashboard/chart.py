"""Server-rendered SVG: online p99 over time against the deadline, with every event marked.

Pure functions from the timeline's samples and events to SVG, so the latency chart needs no
JavaScript library and a test can read exactly what the page will show. The functions here only
lay the chart out (coordinates, rows, colours); the markup is templates/chart.svg.html, rendered
with autoescape, so no name or label can inject markup. One polyline per
online intent, its deadline as a dashed line of the same colour, a vertical marker plus a label
for every mode change and event (labels staggered in rows so neighbours stay readable), and a
band chart of the robot's state machine for the preemption timeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader
from markupsafe import Markup

from services.common.latency import is_unbounded
from services.dashboard.timeline import Event, RobotSpan, Sample

SERIES_COLOURS = ("#2563eb", "#059669", "#7c3aed", "#db2777")
EVENT_COLOURS = {
    "policy": "#0f766e",
    "stage": "#1d4ed8",
    "urgent": "#dc2626",
    "disturbance": "#ea580c",
    "degradation": "#a16207",
    "robot": "#6d28d9",
    "preemption": "#be123c",
    "service": "#475569",
    "action": "#0369a1",
}
ROBOT_COLOURS = {
    "IDLE": "#e2e8f0",
    "RUNNING": "#86efac",
    "CHECKPOINTING": "#fde68a",
    "PREEMPTED": "#fca5a5",
    "URGENT_TASK_RUNNING": "#f87171",
    "RESUMING": "#93c5fd",
    "COMPENSATING": "#c4b5fd",
    "COMPLETED": "#cbd5e1",
}


_TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).resolve().parent / "templates"), autoescape=True
)

LEFT, RIGHT = 56, 14
CHAR_W = 6.4  # average glyph width of the 11px label font, for laying labels out without overlap
LABEL_ROWS = 4


def _fmt(v: float) -> str:
    return f"{v:.1f}"


def _render(macro: str, **layout: Any) -> Markup:
    template = _TEMPLATES.get_template("chart.svg.html")
    return Markup(getattr(template.module, macro)(**layout))


def latency_chart(
    samples: Sequence[Sample],
    events: Sequence[Event],
    *,
    now: float,
    window_s: float,
    width: int = 1400,
    height: int = 300,
) -> Markup:
    left, right, top, bottom = LEFT, RIGHT, 64, 26
    plot_w, plot_h = width - left - right, height - top - bottom
    start = now - window_s

    names: list[str] = []
    deadlines: dict[str, float] = {}
    peak = 0.0
    for sample in samples:
        for p in sample.online:
            if p.name not in names:
                names.append(p.name)
            if p.deadline_ms > 0:
                deadlines[p.name] = p.deadline_ms
            if not is_unbounded(p.p99_ms):  # the allocator's 'cannot meet it' sentinel
                peak = max(peak, p.p99_ms)
    y_max = max([peak * 1.1, *(d * 1.4 for d in deadlines.values()), 1.0])

    def x(t: float) -> float:
        return left + plot_w * min(max((t - start) / window_s, 0.0), 1.0)

    def y(v: float) -> float:
        return top + plot_h * (1.0 - min(v, y_max) / y_max)

    digits = 0 if y_max >= 20 else 1
    grid = [
        {"y": _fmt(y(v)), "label_y": _fmt(y(v) + 4), "label": f"{v:.{digits}f}"}
        for v in (y_max * i / 4 for i in range(5))
    ]
    ticks = []
    for i in range(7):
        t = start + window_s * i / 6
        ago = now - t
        ticks.append({"x": _fmt(x(t)), "label": "now" if ago < 0.5 else f"-{ago:.0f}s"})

    series = []
    for i, name in enumerate(names):
        deadline = deadlines.get(name)
        series.append(
            {
                "name": name,
                "colour": SERIES_COLOURS[i % len(SERIES_COLOURS)],
                "deadline": f"{deadline:.0f}" if deadline else "",
                "deadline_y": _fmt(y(deadline)) if deadline else "",
                "deadline_label_y": _fmt(y(deadline) - 4) if deadline else "",
                "points": " ".join(
                    f"{_fmt(x(s.t))},{_fmt(y(p.p99_ms))}"
                    for s in samples
                    for p in s.online
                    if p.name == name and s.t >= start
                ),
                "predicted": " ".join(
                    f"{_fmt(x(s.t))},{_fmt(y(p.predicted_p99_ms))}"
                    for s in samples
                    for p in s.online
                    if p.name == name and s.t >= start and p.observed and p.predicted_p99_ms > 0
                ),
                "legend_x": left + 8 + i * 260,
            }
        )

    markers = []
    row_ends = [float("-inf")] * LABEL_ROWS
    for number, event in enumerate((e for e in events if e.t >= start), 1):
        ex = x(event.t)
        text = f"{number} {event.label}"
        span = CHAR_W * len(text) + 8
        # first row whose last label ends before this one starts; right-anchored near the edge
        anchor_end = ex + span > left + plot_w
        x0 = ex - span if anchor_end else ex
        row = next((r for r in range(LABEL_ROWS) if row_ends[r] < x0), None)
        if row is not None:
            row_ends[row] = x0 + span
        markers.append(
            {
                "kind": event.kind,
                "label": event.label,
                "colour": EVENT_COLOURS.get(event.kind, "#334155"),
                "x": _fmt(ex),
                "line_y": 12 + (row if row is not None else LABEL_ROWS - 1) * 13 + 2,
                "text_y": 12 + (row if row is not None else LABEL_ROWS - 1) * 13,
                # no room for the words: the number ties the marker to the legend below
                "text": text if row is not None else "",
                "badge": f"{number}",
                "anchor": "end" if anchor_end else "start",
                "text_x": _fmt(ex + (-3 if anchor_end else 3)),
            }
        )
    return _render(
        "latency_chart",
        width=width,
        height=height,
        left=left,
        top=top,
        plot_w=plot_w,
        plot_h=plot_h,
        mid_y=f"{top + plot_h / 2:.0f}",
        mid_x=f"{left + plot_w / 2:.0f}",
        grid=grid,
        ticks=ticks,
        series=series,
        markers=markers,
    )


def robot_timeline(
    spans: Sequence[RobotSpan], *, now: float, window_s: float, width: int = 1400, height: int = 34
) -> Markup:
    left, right = LEFT, RIGHT
    plot_w = width - left - right
    start = now - window_s

    def x(t: float) -> float:
        return left + plot_w * min(max((t - start) / window_s, 0.0), 1.0)

    bands = []
    for i, span in enumerate(spans):
        end = spans[i + 1].start if i + 1 < len(spans) else now
        x0, x1 = x(span.start), x(end)
        bands.append(
            {
                "state": span.state,
                "x": _fmt(x0),
                "width": _fmt(max(x1 - x0, 1.0)),
                "colour": ROBOT_COLOURS.get(span.state, "#e5e7eb"),
                "label_x": _fmt(x0 + 4),
                "labelled": x1 - x0 > CHAR_W * 0.85 * len(span.state) + 8,
            }
        )
    return _render("robot_timeline", width=width, height=height, left=left, bands=bands)
