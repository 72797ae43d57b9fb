"""Timeline change detection: each change in the observed facts becomes one event, once."""

from __future__ import annotations

from services.dashboard.timeline import Observation, OnlinePoint, Timeline


def _obs(**kw: object) -> Observation:
    base: dict[str, object] = {"policy": "baseline", "services_up": {"allocator": True}}
    base.update(kw)
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
