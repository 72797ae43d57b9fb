"""Server-rendered SVG: online p99 over time against the deadline, with every event marked.

Pure functions from the timeline's samples and events to an SVG string, so the latency chart
needs no JavaScript library and a test can read exactly what the page will show. One polyline per
online intent, its deadline as a dashed line of the same colour, a vertical marker plus a label
for every mode change and event (labels staggered in rows so neighbours stay readable), and a
band chart of the robot's state machine for the preemption timeline.
"""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

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


LEFT, RIGHT = 56, 14
CHAR_W = 6.4  # average glyph width of the 11px label font, for laying labels out without overlap
LABEL_ROWS = 4


def _fmt(v: float) -> str:
    return f"{v:.1f}"


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

    parts: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'class="latency-chart" role="img" aria-label="online p99 latency over time">',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#f8fafc" '
        'stroke="#cbd5e1"/>',
    ]
    digits = 0 if y_max >= 20 else 1
    for i in range(5):
        v = y_max * i / 4
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{_fmt(y(v))}" y2="{_fmt(y(v))}" '
            'stroke="#e2e8f0"/>'
            f'<text x="{left - 6}" y="{_fmt(y(v) + 4)}" text-anchor="end" class="axis">'
            f"{v:.{digits}f}</text>"
        )
    for i in range(7):
        t = start + window_s * i / 6
        ago = now - t
        label = "now" if ago < 0.5 else f"-{ago:.0f}s"
        parts.append(
            f'<text x="{_fmt(x(t))}" y="{height - 8}" text-anchor="middle" class="axis">{label}</text>'
        )
    parts.append(
        f'<text x="14" y="{top + plot_h / 2:.0f}" class="axis" '
        f'transform="rotate(-90 14 {top + plot_h / 2:.0f})" text-anchor="middle">p99 ms</text>'
    )

    for i, name in enumerate(names):
        colour = SERIES_COLOURS[i % len(SERIES_COLOURS)]
        deadline = deadlines.get(name)
        if deadline:
            parts.append(
                f'<line class="deadline" x1="{left}" x2="{left + plot_w}" y1="{_fmt(y(deadline))}" '
                f'y2="{_fmt(y(deadline))}" stroke="#dc2626" stroke-dasharray="6 4" stroke-width="1.5"/>'
                f'<text x="{left + plot_w - 4}" y="{_fmt(y(deadline) - 4)}" text-anchor="end" '
                f'class="deadline-label" fill="#dc2626">{escape(name)} deadline {deadline:.0f} ms</text>'
            )
        points = [
            f"{_fmt(x(s.t))},{_fmt(y(p.p99_ms))}"
            for s in samples
            for p in s.online
            if p.name == name and s.t >= start
        ]
        predicted = [
            f"{_fmt(x(s.t))},{_fmt(y(p.predicted_p99_ms))}"
            for s in samples
            for p in s.online
            if p.name == name and s.t >= start and p.observed and p.predicted_p99_ms > 0
        ]
        if predicted:
            parts.append(
                f'<polyline class="predicted" data-intent="{escape(name)}" fill="none" '
                f'stroke="{colour}" stroke-width="1" stroke-dasharray="1 3" opacity="0.8" '
                f'points="{" ".join(predicted)}"/>'
            )
        if points:
            parts.append(
                f'<polyline class="series" data-intent="{escape(name)}" fill="none" '
                f'stroke="{colour}" stroke-width="2" points="{" ".join(points)}"/>'
            )
        parts.append(
            f'<rect x="{left + 8 + i * 260}" y="{top + 8}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{left + 22 + i * 260}" y="{top + 17}" class="legend">{escape(name)} p99 (dotted: predicted)</text>'
        )

    row_ends = [float("-inf")] * LABEL_ROWS
    for number, event in enumerate((e for e in events if e.t >= start), 1):
        colour = EVENT_COLOURS.get(event.kind, "#334155")
        ex = x(event.t)
        badge = f"{number}"
        text = f"{number} {event.label}"
        span = CHAR_W * len(text) + 8
        # first row whose last label ends before this one starts; right-anchored near the edge
        anchor_end = ex + span > left + plot_w
        x0 = ex - span if anchor_end else ex
        row = next((r for r in range(LABEL_ROWS) if row_ends[r] < x0), None)
        ly = 12 + (row if row is not None else LABEL_ROWS - 1) * 13
        parts.append(
            f'<g class="event" data-kind="{escape(event.kind)}" data-label="{escape(event.label)}">'
            f'<line x1="{_fmt(ex)}" x2="{_fmt(ex)}" y1="{ly + 2}" y2="{top + plot_h}" '
            f'stroke="{colour}" stroke-width="1.2" stroke-dasharray="2 2"/>'
        )
        if row is not None:
            row_ends[row] = x0 + span
            anchor = "end" if anchor_end else "start"
            dx = -3 if anchor_end else 3
            parts.append(
                f'<text x="{_fmt(ex + dx)}" y="{ly}" text-anchor="{anchor}" fill="{colour}" '
                f'class="event-label">{escape(text)}</text>'
            )
        else:  # no room for the words here: the number ties the marker to the legend below
            parts.append(
                f'<text x="{_fmt(ex)}" y="{top + plot_h - 4}" text-anchor="middle" fill="{colour}" '
                f'class="event-badge">{badge}</text>'
            )
        parts.append("</g>")
    if not names:
        parts.append(
            f'<text x="{left + plot_w / 2:.0f}" y="{top + plot_h / 2:.0f}" text-anchor="middle" '
            'class="empty">no online latency yet</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def robot_timeline(
    spans: Sequence[RobotSpan], *, now: float, window_s: float, width: int = 1400, height: int = 34
) -> Markup:
    left, right = LEFT, RIGHT
    plot_w = width - left - right
    start = now - window_s

    def x(t: float) -> float:
        return left + plot_w * min(max((t - start) / window_s, 0.0), 1.0)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        'class="robot-timeline" role="img" aria-label="robot state timeline">',
        f'<text x="{left - 6}" y="21" text-anchor="end" class="axis">robot</text>',
    ]
    for i, span in enumerate(spans):
        end = spans[i + 1].start if i + 1 < len(spans) else now
        x0, x1 = x(span.start), x(end)
        colour = ROBOT_COLOURS.get(span.state, "#e5e7eb")
        parts.append(
            f'<rect class="robot-span" data-state="{escape(span.state)}" x="{_fmt(x0)}" y="6" '
            f'width="{_fmt(max(x1 - x0, 1.0))}" height="22" fill="{colour}" stroke="#fff"/>'
        )
        if x1 - x0 > CHAR_W * 0.85 * len(span.state) + 8:
            parts.append(
                f'<text x="{_fmt(x0 + 4)}" y="21" class="robot-label">{escape(span.state)}</text>'
            )
    if not spans:
        parts.append(f'<text x="{left + 6}" y="21" class="empty">no robot state yet</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
