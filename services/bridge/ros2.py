"""The one ROS 2 boundary: rclpy when it can be imported, local-compatible mode otherwise.

With rclpy, the bridge publishes every state change as JSON (std_msgs/String) on
``/parfusion/robot_state`` and accepts urgent events as JSON (the body of POST /api/urgent) on
``/parfusion/urgent``. Without it the HTTP API is the whole interface and /api/state says so.
The bridge never installs ROS 2; a sourced ROS 2 environment is picked up as it is.
"""

from __future__ import annotations

import importlib
import json
import logging
import threading
from collections.abc import Callable
from typing import Any

from services.bridge.statemachine import Transition

log = logging.getLogger(__name__)

STATE_TOPIC = "/parfusion/robot_state"
URGENT_TOPIC = "/parfusion/urgent"
LOCAL_MODE = "local-compatible"
ROS2_MODE = "rclpy"


class Ros2Adapter:
    """Start with :meth:`start`; ``on_urgent`` gets each decoded urgent-event document."""

    def __init__(self, setting: str, on_urgent: Callable[[dict[str, Any]], None]) -> None:
        self.setting = setting  # "auto" (rclpy if importable) or "off"
        self.on_urgent = on_urgent
        self.mode = LOCAL_MODE
        self.detail = "not started"
        self._rclpy: Any = None
        self._node: Any = None
        self._publisher: Any = None
        self._string: Any = None
        self._executor: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self.setting == "off":
            self.detail = "ROS 2 disabled by bridge.ros2: off"
            return
        try:
            rclpy = importlib.import_module("rclpy")
            executors = importlib.import_module("rclpy.executors")
            self._string = importlib.import_module("std_msgs.msg").String
        except ImportError as exc:
            self.detail = f"rclpy not importable ({exc.name or exc}); HTTP API only"
            log.info("ROS 2 not available; local-compatible mode", extra={"reason": self.detail})
            return
        try:
            rclpy.init()
            node = rclpy.create_node("parfusion_bridge")
            self._publisher = node.create_publisher(self._string, STATE_TOPIC, 10)
            node.create_subscription(self._string, URGENT_TOPIC, self._received, 10)
            executor = executors.SingleThreadedExecutor()
            executor.add_node(node)
        except Exception as exc:  # a broken ROS 2 install must not take the bridge down
            self.detail = f"rclpy failed to start: {exc}"
            log.warning("ROS 2 start failed; local-compatible mode", extra={"error": str(exc)})
            return
        self._rclpy, self._node, self._executor = rclpy, node, executor
        self._thread = threading.Thread(target=executor.spin, name="ros2-spin", daemon=True)
        self._thread.start()
        self.mode = ROS2_MODE
        self.detail = f"publishing {STATE_TOPIC}, subscribed to {URGENT_TOPIC}"
        log.info(
            "ROS 2 adapter started",
            extra={"state_topic": STATE_TOPIC, "urgent_topic": URGENT_TOPIC},
        )

    def _received(self, message: Any) -> None:
        try:
            document = json.loads(message.data)
            if not isinstance(document, dict):
                raise ValueError("expected a JSON object")
            self.on_urgent(document)
        except Exception as exc:  # one bad message must not stop the subscription
            log.warning("urgent event from ROS 2 refused", extra={"error": str(exc)})

    def publish(self, transition: Transition, snapshot: dict[str, Any]) -> None:
        if self._publisher is None:
            return
        message = self._string()
        message.data = json.dumps(
            {
                "state": transition.target.value,
                "event": transition.event.value,
                "from": transition.source.value,
                "at": transition.at,
                "mission_step": snapshot.get("step"),
                "mission_steps": snapshot.get("steps"),
            }
        )
        self._publisher.publish(message)

    def status(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "detail": self.detail,
            "state_topic": STATE_TOPIC,
            "urgent_topic": URGENT_TOPIC,
        }

    def stop(self) -> None:
        if self._executor is None:
            return
        try:
            self._executor.shutdown()
            self._node.destroy_node()
            self._rclpy.shutdown()
        except Exception:
            log.exception("ROS 2 shutdown failed")
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self._executor = None
        self._publisher = None
