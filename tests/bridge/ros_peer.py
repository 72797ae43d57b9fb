"""A robot-side ROS 2 node for tests and the latency bench: real rclpy, real DDS, its own context.

It is what a robot developer would write against the bridge's interface (README, "Robot bridge
on ROS 2"): subscribe to the latched state and diagnostics, publish urgent events, call the
Trigger services, set the mission parameters. Everything it receives is kept in arrival order
with the receive time (time.time(), comparable with the bridge's clock on the same machine).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import rclpy
from diagnostic_msgs.msg import DiagnosticStatus
from rclpy.executors import SingleThreadedExecutor
from rclpy.parameter import Parameter
from rclpy.parameter_client import AsyncParameterClient
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import String
from std_srvs.srv import Trigger

from services.bridge import ros2

CALL_TIMEOUT_S = 10.0


@dataclass
class Received:
    states: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    diagnostics: list[tuple[float, DiagnosticStatus]] = field(default_factory=list)


def latched(depth: int = 1000) -> QoSProfile:
    """A subscriber that also gets what the bridge last published before it joined."""
    return QoSProfile(
        depth=depth,
        reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.TRANSIENT_LOCAL,
    )


class RobotPeer:
    """One node in its own rclpy context, spun on a background thread; close() when done."""

    def __init__(self, name: str = "robot_peer", domain_id: int | None = None) -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain_id)
        self.node = rclpy.create_node(name, context=self.context)
        self.received = Received()
        self._cond = threading.Condition()
        self.node.create_subscription(String, ros2.STATE_TOPIC, self._on_state, latched())
        self.node.create_subscription(
            DiagnosticStatus, ros2.DIAGNOSTICS_TOPIC, self._on_diagnostic, latched()
        )
        self.urgent = self.node.create_publisher(String, ros2.URGENT_TOPIC, 10)
        self.clients: dict[str, Any] = {
            name: self.node.create_client(Trigger, name) for name in ros2.SERVICES
        }  # start_mission, cancel_mission, tick
        self.parameters = AsyncParameterClient(self.node, ros2.NODE_NAME)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self._thread = threading.Thread(target=self._spin, name=f"{name}-spin", daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except Exception:
            if self.context.ok():
                raise

    def _on_state(self, message: String) -> None:
        with self._cond:
            self.received.states.append((time.time(), json.loads(message.data)))
            self._cond.notify_all()

    def _on_diagnostic(self, message: DiagnosticStatus) -> None:
        with self._cond:
            self.received.diagnostics.append((time.time(), message))
            self._cond.notify_all()

    def wait_until(self, ready: Callable[[Received], bool], timeout_s: float = 10.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: ready(self.received), timeout_s)

    def wait_for_bridge(self, timeout_s: float = 20.0) -> None:
        """Services discovered and the urgent topic matched: nothing sent from here is lost."""
        deadline = time.monotonic() + timeout_s
        for client in self.clients.values():
            if not client.wait_for_service(timeout_sec=max(0.1, deadline - time.monotonic())):
                raise TimeoutError(f"{client.srv_name} not offered within {timeout_s} s")
        while self.urgent.get_subscription_count() == 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nobody subscribes to {ros2.URGENT_TOPIC}")
            time.sleep(0.02)

    def call(self, service: str) -> tuple[bool, dict[str, Any]]:
        """A Trigger call: (success, the JSON document the bridge put in the message)."""
        response = self._wait(self.clients[service].call_async(Trigger.Request()))
        return response.success, json.loads(response.message)

    def set_parameters(self, **values: Any) -> list[Any]:
        """mission.<key> = value on the bridge node; the SetParametersResult of each."""
        params = [Parameter(f"mission.{k}", value=v) for k, v in values.items()]
        return list(self._wait(self.parameters.set_parameters(params)).results)

    def publish_urgent(self, payload: dict[str, Any] | str) -> float:
        """Publish one urgent event; the time.time() just before it left."""
        data = payload if isinstance(payload, str) else json.dumps(payload)
        sent = time.time()
        self.urgent.publish(String(data=data))
        return sent

    def _wait(self, future: Any) -> Any:
        done = threading.Event()
        future.add_done_callback(lambda _f: done.set())
        if not done.wait(CALL_TIMEOUT_S):
            raise TimeoutError("no answer from the bridge")
        return future.result()

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()
        if self.context.ok():
            rclpy.shutdown(context=self.context)
        self._thread.join(timeout=2.0)


def diagnostic_values(status: DiagnosticStatus) -> dict[str, str]:
    return {kv.key: kv.value for kv in status.values}
