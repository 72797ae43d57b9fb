"""Timeline change detection: each change in the observed facts becomes one event, once; on a
node with thousands of intents the chart and the events stay readable."""

from __future__ import annotations

from typing import cast

from hypothesis import given, settings
from hypothesis import strategies as st

from services.dashboard.observer import chart_points
from services.dashboard.timeline import NAMED_EVENTS, Observation, OnlinePoint, Timeline


def _obs(**kw: object) -> Observation:
    base: dict[str, object] = {"policy": "baseline", "services_up": {"allocator": True}}
    base.update(kw)
    # every online intent charted: their levels and counters as observe() gives them
    online = cast(tuple[OnlinePoint, ...], base.get("online", ()))
    base.setdefault("levels", {p.name: p.degradation for p in online})
    base.setdefault("counts", {p.name: (p.completed, p.misses) for p in online if p.observed})
    return Observation(**base)  # type: ignore[arg-type]


def test_policy_degradation_disturbance_service_changes_become_events() -> None:
    tl = Timeline()
    web = OnlinePoint("web", 30.0, 30.0, 50.0, degradation="NORMAL")
    tl.update(1.0, _obs(online=(web,)))
    tl.update(2.0, _obs(online=(web,)))  # nothing changed: no new event
    assert [e.label for e in tl.events] == ["policy baseline"]
    fp16 = OnlinePoint("web", 60.0, 60.0, 50.0, degradation="FP16")
    found = tl.update(
        3.0,
        _obs(policy="parfusion", online=(fp16,), disturbance=(0.6, 0.5, 0.4),
             services_up={"allocator": False}, allocation_states={"batch": "PREEMPTED"}),
    )  # fmt: skip
    assert {e.kind for e in found} == {"policy", "degradation", "disturbance", "service"}
    tl.update(
        4.0, _obs(policy="parfusion", online=(fp16,), allocation_states={"batch": "ADMITTED"})
    )
    labels = [e.label for e in tl.events]
    assert "policy baseline -> parfusion" in labels
    assert "web NORMAL -> FP16" in labels
    assert "disturbance over" in labels and "allocator back" in labels
    assert len(tl.samples) == 4


def test_robot_transitions_from_the_bridge_are_recorded_once_in_order() -> None:
    tl = Timeline()
    trs = ((10.0, "IDLE", "RUNNING"), (10.5, "RUNNING", "CHECKPOINTING"))
    tl.update(11.0, _obs(robot_state="CHECKPOINTING", robot_transitions=trs))
    trs2 = (*trs, (11.2, "CHECKPOINTING", "PREEMPTED"))
    tl.update(12.0, _obs(robot_state="PREEMPTED", robot_transitions=trs2))
    robot = [e.label for e in tl.events if e.kind == "robot"]
    assert robot == ["robot IDLE -> RUNNING", "robot RUNNING -> CHECKPOINTING",
                     "robot CHECKPOINTING -> PREEMPTED"]  # fmt: skip
    _, _, spans = tl.window(12.0, 100.0)
    assert [s.state for s in spans] == ["IDLE", "RUNNING", "CHECKPOINTING", "PREEMPTED"]


def test_miss_ratio_is_over_the_window_not_since_start() -> None:
    tl = Timeline()
    for t, done, missed in ((0.0, 1000, 500), (10.0, 1100, 500), (20.0, 1200, 510)):
        point = OnlinePoint("web", 1, 1, 50, completed=done, misses=missed, observed=True)
        tl.update(t, _obs(online=(point,)))
    assert tl.miss_ratio(20.0, 15.0) == 10 / 100
    assert tl.miss_ratio(20.0, 25.0) == 10 / 200
    assert tl.miss_ratio(20.0, 1.0) is None


def _point(name: str, p99: float, level: str = "NORMAL", deadline: float = 50.0) -> OnlinePoint:
    return OnlinePoint(name, p99, p99, deadline, degradation=level, observed=True)


def test_the_chart_keeps_its_intents_until_one_needs_it_more() -> None:
    calm = [_point(f"web-{k}", 10.0 + k) for k in range(8)]
    first = chart_points(calm, (), limit=3)
    assert [p.name for p in first] == ["web-5", "web-6", "web-7"]  # nearest their deadline
    # calm intents drifting closer to their deadline do not move the chart
    drift = [_point(f"web-{k}", 40.0 - k) for k in range(8)]
    kept = chart_points(drift, {p.name for p in first}, limit=3)
    assert [p.name for p in kept] == ["web-5", "web-6", "web-7"]
    # one over its deadline takes the place of the calmest charted one
    over = [*drift[:2], _point("web-2", 80.0), *drift[3:]]
    moved = chart_points(over, {p.name for p in kept}, limit=3)
    assert [p.name for p in moved] == ["web-2", "web-5", "web-6"]
    assert chart_points(calm[:3], (), limit=3) == calm[:3]


def test_miss_ratio_counts_every_online_intent_not_only_the_charted() -> None:
    tl = Timeline()
    charted = (OnlinePoint("web-0", 1, 1, 50, observed=True),)
    for t, done, missed in ((0.0, 0, 0), (10.0, 100, 5)):
        counts = {f"web-{k}": (done, missed) for k in range(20)}
        tl.update(t, _obs(online=charted, counts=counts, online_total=20))
    assert tl.miss_ratio(10.0, 20.0) == 100 / 2000


def test_one_poll_with_thousands_of_changes_names_a_few_and_counts_the_rest() -> None:
    tl = Timeline()
    names = [f"web-{k}" for k in range(1000)]
    tl.update(1.0, _obs(levels=dict.fromkeys(names, "NORMAL"),
                        allocation_states=dict.fromkeys(names, "ADMITTED")))  # fmt: skip
    found = tl.update(2.0, _obs(levels=dict.fromkeys(names, "FP16"),
                                allocation_states=dict.fromkeys(names, "PREEMPTED")))  # fmt: skip
    degradation = [e.label for e in found if e.kind == "degradation"]
    preemption = [e.label for e in found if e.kind == "preemption"]
    assert degradation[:NAMED_EVENTS] == [f"web-{k} NORMAL -> FP16" for k in range(NAMED_EVENTS)]
    assert degradation[NAMED_EVENTS:] == [f"{1000 - NAMED_EVENTS:,} more intents changed level"]
    assert len(preemption) == NAMED_EVENTS + 1 and preemption[-1].endswith("more intents preempted")


LEVELS = st.sampled_from(["NORMAL", "NORMAL", "FP16"])


@settings(max_examples=200, deadline=None)
@given(
    p99s=st.lists(st.floats(0.0, 200.0), min_size=0, max_size=12),
    levels=st.lists(LEVELS, min_size=12, max_size=12),
    charted=st.sets(st.integers(0, 11)),
    limit=st.integers(1, 6),
)
def test_chart_points_properties(
    p99s: list[float], levels: list[str], charted: set[int], limit: int
) -> None:
    """At most `limit` points, in their own order; all of them when they fit; an intent over
    its deadline is charted whenever one charted is not; a charted intent leaves only for one
    at a higher level of need."""
    points = [_point(f"w{k}", p99, levels[k]) for k, p99 in enumerate(p99s)]
    names = {f"w{k}" for k in charted}
    chosen = chart_points(points, names, limit)
    assert len(chosen) == min(limit, len(points))
    assert [p.name for p in chosen] == [p.name for p in points if p in chosen]
    over = [p for p in points if p.p99_ms > p.deadline_ms]
    if len(over) <= limit:
        assert all(p in chosen for p in over)
    picked = {p.name for p in chosen}
    dropped = [p for p in points if p.name in names and p.name not in picked]
    kept_fewer = len([p for p in points if p.name in names]) <= limit
    for p in dropped if kept_fewer else ():
        assert any(_need(q) > _need(p) for q in chosen), (p, chosen)


def _need(p: OnlinePoint) -> int:
    """2: over its deadline; 1: degraded; 0: neither (the points here predict what they see)."""
    return 2 if p.p99_ms > p.deadline_ms else 1 if p.degradation != "NORMAL" else 0
