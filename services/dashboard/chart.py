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


def _fmt(v: float) -> str:
    return f"{v:.1f}"


def latency_chart(
    samples: Sequence[Sample],
    events: Sequence[Event],
    *,
    now: float,
    window_s: float,
    width: int = 900,
    height: int = 280,
) -> Markup:
    left, right, top, bottom = 52, 12, 64, 28
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
    for i in range(5):
        v = y_max * i / 4
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{_fmt(y(v))}" y2="{_fmt(y(v))}" '
            'stroke="#e2e8f0"/>'
            f'<text x="{left - 6}" y="{_fmt(y(v) + 4)}" text-anchor="end" class="axis">{v:.0f}</text>'
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
        if points:
            parts.append(
                f'<polyline class="series" data-intent="{escape(name)}" fill="none" '
                f'stroke="{colour}" stroke-width="2" points="{" ".join(points)}"/>'
            )
        parts.append(
            f'<rect x="{left + 8 + i * 170}" y="{top + 8}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{left + 22 + i * 170}" y="{top + 17}" class="legend">{escape(name)} p99</text>'
        )

    rows = 4
    for i, event in enumerate(e for e in events if e.t >= start):
        colour = EVENT_COLOURS.get(event.kind, "#334155")
        ex = x(event.t)
        row = i % rows
        ly = 12 + row * 13
        anchor = "end" if ex > left + plot_w * 0.75 else "start"
        dx = -3 if anchor == "end" else 3
        parts.append(
            f'<g class="event" data-kind="{escape(event.kind)}">'
            f'<line x1="{_fmt(ex)}" x2="{_fmt(ex)}" y1="{ly + 2}" y2="{top + plot_h}" '
            f'stroke="{colour}" stroke-width="1.2" stroke-dasharray="2 2"/>'
            f'<text x="{_fmt(ex + dx)}" y="{ly}" text-anchor="{anchor}" fill="{colour}" '
            f'class="event-label">{escape(event.label)}</text></g>'
        )
    if not names:
        parts.append(
            f'<text x="{left + plot_w / 2:.0f}" y="{top + plot_h / 2:.0f}" text-anchor="middle" '
            'class="empty">no online latency yet</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))


def robot_timeline(
    spans: Sequence[RobotSpan], *, now: float, window_s: float, width: int = 900, height: int = 46
) -> Markup:
    left, right = 52, 12
    plot_w = width - left - right
    start = now - window_s

    def x(t: float) -> float:
        return left + plot_w * min(max((t - start) / window_s, 0.0), 1.0)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        'class="robot-timeline" role="img" aria-label="robot state timeline">',
        f'<text x="{left - 6}" y="22" text-anchor="end" class="axis">robot</text>',
    ]
    for i, span in enumerate(spans):
        end = spans[i + 1].start if i + 1 < len(spans) else now
        x0, x1 = x(span.start), x(end)
        colour = ROBOT_COLOURS.get(span.state, "#e5e7eb")
        parts.append(
            f'<rect class="robot-span" data-state="{escape(span.state)}" x="{_fmt(x0)}" y="6" '
            f'width="{_fmt(max(x1 - x0, 1.0))}" height="22" fill="{colour}" stroke="#fff"/>'
        )
        if x1 - x0 > 60:
            parts.append(
                f'<text x="{_fmt(x0 + 4)}" y="21" class="robot-label">{escape(span.state)}</text>'
            )
    if not spans:
        parts.append(f'<text x="{left + 6}" y="22" class="empty">no robot state yet</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
