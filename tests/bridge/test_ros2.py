"""The ROS 2 adapter: local-compatible without rclpy; with it, state published and urgent events taken.

ROS 2 cannot be installed on this machine (and the bridge never installs it), so the rclpy case
runs against a stand-in for the rclpy / std_msgs modules: the true boundary, nothing else faked.
"""

from __future__ import annotations

import json
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest

from services.bridge.ros2 import LOCAL_MODE, ROS2_MODE, STATE_TOPIC, URGENT_TOPIC, Ros2Adapter
from services.bridge.validation import MissionSpec, parse_urgent
from tests.bridge.conftest import Clock, make_bridge, run_ticks


class FakeRos:
    """Just enough of rclpy's surface: init, create_node, publishers, subscriptions, an executor."""

    def __init__(self) -> None:
        self.published: dict[str, list[str]] = {}
        self.subscriptions: dict[str, Any] = {}
        self.shut_down = False
        self.stop = threading.Event()

    def modules(self) -> dict[str, types.ModuleType]:
        fake = self
        rclpy = types.ModuleType("rclpy")
        executors = types.ModuleType("rclpy.executors")
        std_msgs = types.ModuleType("std_msgs")
        msg = types.ModuleType("std_msgs.msg")

        class String:
            def __init__(self, data: str = "") -> None:
                self.data = data

        class Publisher:
            def __init__(self, topic: str) -> None:
                self.topic = topic

            def publish(self, message: String) -> None:
                fake.published.setdefault(self.topic, []).append(message.data)

        class Node:
            def create_publisher(self, _type: Any, topic: str, _qos: int) -> Publisher:
                return Publisher(topic)

            def create_subscription(self, _type: Any, topic: str, callback: Any, _qos: int) -> None:
                fake.subscriptions[topic] = callback

            def destroy_node(self) -> None:
                pass

        class SingleThreadedExecutor:
            def add_node(self, _node: Node) -> None:
                pass

            def spin(self) -> None:
                fake.stop.wait(5)

            def shutdown(self) -> None:
                fake.stop.set()

        def shutdown() -> None:
            fake.shut_down = True

        rclpy.init = lambda: None  # type: ignore[attr-defined]
        rclpy.create_node = lambda _name: Node()  # type: ignore[attr-defined]
        rclpy.shutdown = shutdown  # type: ignore[attr-defined]
        executors.SingleThreadedExecutor = SingleThreadedExecutor  # type: ignore[attr-defined]
        msg.String = String  # type: ignore[attr-defined]
        self.String = String
        return {
            "rclpy": rclpy,
            "rclpy.executors": executors,
            "std_msgs": std_msgs,
            "std_msgs.msg": msg,
        }


def test_without_rclpy_the_bridge_is_local_compatible() -> None:
    if "rclpy" in sys.modules or _importable("rclpy"):
        pytest.skip("a ROS 2 environment is sourced here")
    adapter = Ros2Adapter("auto", on_urgent=lambda _doc: None)
    adapter.start()
    assert adapter.status()["mode"] == LOCAL_MODE
    assert "rclpy" in adapter.status()["detail"]


def test_ros2_off_stays_local() -> None:
    adapter = Ros2Adapter("off", on_urgent=lambda _doc: None)
    adapter.start()
    assert adapter.mode == LOCAL_MODE and "off" in adapter.detail


def test_with_rclpy_state_is_published_and_urgent_events_are_queued(
    monkeypatch: pytest.MonkeyPatch, checkpoint_path: Path, clock: Clock
) -> None:
    ros = FakeRos()
    for name, module in ros.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    bridge = make_bridge(checkpoint_path, clock)
    adapter = Ros2Adapter(
        "auto", on_urgent=lambda doc: bridge.submit_urgent(parse_urgent(doc), source="ros2")
    )
    bridge.subscribe(
        lambda t: adapter.publish(t, {"step": bridge.mission.step if bridge.mission else None})
    )
    adapter.start()
    try:
        assert adapter.mode == ROS2_MODE
        bridge.start_mission(
            MissionSpec(name="patrol", steps=10, safe_point_interval=5, deadline_ms=0)
        )
        ros.subscriptions[URGENT_TOPIC](
            ros.String(json.dumps({"name": "door-open", "deadline_ms": 3000, "work": 1}))
        )
        ros.subscriptions[URGENT_TOPIC](
            ros.String("not json")
        )  # refused, logged, subscription lives on
        ros.subscriptions[URGENT_TOPIC](ros.String(json.dumps({"name": "BAD"})))
        assert [e.spec.name for _, _, e in bridge.queue] == ["door-open"]
        assert bridge.queue[0][2].source == "ros2"
        run_ticks(bridge, clock, 2)
        states = [json.loads(m)["state"] for m in ros.published[STATE_TOPIC]]
        assert states == ["RUNNING", "CHECKPOINTING", "PREEMPTED"]
    finally:
        adapter.stop()
    assert ros.shut_down


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
