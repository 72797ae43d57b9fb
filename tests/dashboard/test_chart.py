"""The latency chart and robot timeline SVGs: what the page will draw, read back as XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from services.dashboard.chart import latency_chart, robot_timeline
from services.dashboard.timeline import Event, OnlinePoint, RobotSpan, Sample

NS = {"s": "http://www.w3.org/2000/svg"}


def _samples(now: float) -> list[Sample]:
    return [
        Sample(now - 60 + i, (OnlinePoint("web", 20.0 + i, 20.0 + i, 50.0),), 0.1)
        for i in range(0, 60, 5)
    ]


def test_series_deadline_and_every_event_are_drawn_and_labelled() -> None:
    now = 1000.0
    events = [
        Event(now - 50, "policy", "policy baseline -> parfusion"),
        Event(now - 30, "urgent", "urgent obstacle-stop"),
        Event(now - 10, "disturbance", "disturbance cpu 60% gpu 50% net 40%"),
    ]
    svg = ET.fromstring(str(latency_chart(_samples(now), events, now=now, window_s=120)))
    line = svg.find(".//s:polyline[@data-intent='web']", NS)
    assert line is not None and len(line.attrib["points"].split()) == 12
    assert svg.find(".//s:line[@class='deadline']", NS) is not None
    marked = [g.attrib["data-label"] for g in svg.iterfind(".//s:g[@class='event']", NS)]
    assert marked == [e.label for e in events]
    texts = [t.text for t in svg.iterfind(".//s:g[@class='event']/s:text", NS)]
    assert texts == [f"{i} {e.label}" for i, e in enumerate(events, 1)]
    assert any("deadline 50 ms" in (t.text or "") for t in svg.iterfind(".//s:text", NS))


def test_points_rise_with_latency_and_old_events_fall_out_of_the_window() -> None:
    now = 1000.0
    svg = ET.fromstring(
        str(
            latency_chart(_samples(now), [Event(now - 500, "policy", "old")], now=now, window_s=120)
        )
    )
    ys = [float(p.split(",")[1]) for p in svg.find(".//s:polyline", NS).attrib["points"].split()]  # type: ignore[union-attr]
    assert ys == sorted(ys, reverse=True)  # larger p99 is drawn higher (smaller y)
    assert svg.find(".//s:g[@class='event']", NS) is None


def test_crowded_events_stack_in_rows_then_fall_back_to_numbered_badges() -> None:
    now = 1000.0
    events = [Event(now - 60 + i * 0.1, "stage", f"stage number {i}") for i in range(8)]
    svg = ET.fromstring(str(latency_chart([], events, now=now, window_s=120)))
    groups = svg.findall(".//s:g[@class='event']", NS)
    assert len(groups) == 8  # every event keeps its marker
    labelled = [g for g in groups if g.find("s:text[@class='event-label']", NS) is not None]
    badges = [g.find("s:text[@class='event-badge']", NS) for g in groups]
    assert len(labelled) == 4  # one label per free row, no two overlapping
    assert [b.text for b in badges if b is not None] == ["5", "6", "7", "8"]


def test_labels_are_escaped_and_empty_chart_says_so() -> None:
    svg = str(latency_chart([], [Event(10.0, "action", "<b>&")], now=20.0, window_s=60))
    assert "&lt;b&gt;&amp;" in svg and "no online latency yet" in svg
    ET.fromstring(svg)


def test_robot_timeline_has_one_band_per_state() -> None:
    spans = [RobotSpan("RUNNING", 10.0), RobotSpan("PREEMPTED", 40.0), RobotSpan("RUNNING", 50.0)]
    svg = ET.fromstring(str(robot_timeline(spans, now=100.0, window_s=100)))
    rects = svg.findall(".//s:rect[@class='robot-span']", NS)
    assert [r.attrib["data-state"] for r in rects] == ["RUNNING", "PREEMPTED", "RUNNING"]
    widths = [float(r.attrib["width"]) for r in rects]
    assert widths[2] > widths[0] > widths[1]
