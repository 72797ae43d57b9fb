"""The one ROS 2 boundary: rclpy when it can be imported, local-compatible mode otherwise.

With rclpy (``pip install -e '.[ros]'`` or a sourced ROS 2) the bridge is a ROS 2 node,
``parfusion_bridge``, with the interface in :data:`TOPICS` and :data:`SERVICES` (README, "Robot
bridge on ROS 2"): every state change as JSON on ``/parfusion/robot_state`` and as a
diagnostic_msgs/DiagnosticStatus on ``/parfusion/diagnostics`` (both latched: reliable,
transient-local, the current state only), urgent events taken as JSON on ``/parfusion/urgent``
(the body of POST /api/urgent), and std_srvs/Trigger services to start and cancel a mission and
to run one control tick. The next mission's shape is the node's parameters (``mission.steps``,
...): std_srvs has no request payload, and a parameter is typed, range-checked by rclpy and
readable. Without rclpy the HTTP API is the whole interface and /api/state says why.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from services.bridge.statemachine import State, Transition
from services.bridge.validation import MAX_DEADLINE_MS, MAX_STEPS

log = logging.getLogger(__name__)

NODE_NAME = "parfusion_bridge"
STATE_TOPIC = "/parfusion/robot_state"
DIAGNOSTICS_TOPIC = "/parfusion/diagnostics"
URGENT_TOPIC = "/parfusion/urgent"
START_SERVICE = "/parfusion/start_mission"
CANCEL_SERVICE = "/parfusion/cancel_mission"
TICK_SERVICE = "/parfusion/tick"
LOCAL_MODE = "local-compatible"
ROS2_MODE = "rclpy"
DIAGNOSTIC_NAME = "parfusion/bridge"
DISCOVERY_ENV = "ROS_AUTOMATIC_DISCOVERY_RANGE"
DISCOVERY_RANGES = ("LOCALHOST", "SUBNET", "OFF", "SYSTEM_DEFAULT")

# Latched: a late subscriber gets the current state at once, and only that; every message is the
# whole state, so a subscriber that falls behind never holds a stale view.
LATCHED_QOS = {"reliability": "reliable", "durability": "transient_local", "depth": 1}
# Urgent events are never replayed to a restarted bridge (volatile); the depth bounds what
# waits in the DDS reader, the bridge's own queue limit bounds the rest.
URGENT_QOS = {"reliability": "reliable", "durability": "volatile", "depth": 64}
TOPICS: dict[str, dict[str, Any]] = {
    STATE_TOPIC: {"type": "std_msgs/msg/String", "direction": "out", "qos": LATCHED_QOS},
    DIAGNOSTICS_TOPIC: {
        "type": "diagnostic_msgs/msg/DiagnosticStatus",
        "direction": "out",
        "qos": LATCHED_QOS,
    },
    URGENT_TOPIC: {"type": "std_msgs/msg/String", "direction": "in", "qos": URGENT_QOS},
}
SERVICES = {
    START_SERVICE: "std_srvs/srv/Trigger",
    CANCEL_SERVICE: "std_srvs/srv/Trigger",
    TICK_SERVICE: "std_srvs/srv/Trigger",
}
# States in which the mission has given the robot to urgent work (diagnostic level WARN).
HANDING_OVER = frozenset(
    {
        State.CHECKPOINTING,
        State.PREEMPTED,
        State.URGENT_TASK_RUNNING,
        State.RESUMING,
        State.COMPENSATING,
    }
)

Reply = tuple[bool, dict[str, Any]]  # (success, JSON document for the Trigger message)


@dataclass(frozen=True)
class BridgeCommands:
    """What the ROS 2 interface may ask of the bridge; app.py builds it over the HTTP handlers' code."""

    submit_urgent: Callable[[dict[str, Any]], object]  # raises DomainError on a refused document
    start_mission: Callable[[dict[str, Any]], Reply]
    cancel_mission: Callable[[], Reply]
    tick: Callable[[], Reply]
    state_view: Callable[[], dict[str, Any]]


def state_message(transition: Transition | None, view: dict[str, Any]) -> dict[str, Any]:
    """The /parfusion/robot_state document: /api/state plus the transition that led here."""
    return {
        **view,
        "event": transition.event.value if transition else None,
        "from": transition.source.value if transition else None,
        "at": transition.at if transition else None,
    }


def diagnostic_summary(document: dict[str, Any]) -> tuple[str, str, list[tuple[str, str]]]:
    """(level, message, key/values) of a robot_state document, as DiagnosticStatus carries them.

    ERROR: the allocator did not answer the last call (urgent work runs without reserved
    units). WARN: the robot is handing over to, running or coming back from urgent work, or the
    mission's deadline is at risk. OK otherwise.
    """
    state = document["state"]
    mission = document.get("mission") or {}
    at_risk = bool((mission.get("plan") or {}).get("deadline_at_risk")) and mission.get("active")
    if document.get("allocator_reachable") is False:
        level = "ERROR"
    elif state in HANDING_OVER or at_risk:
        level = "WARN"
    else:
        level = "OK"
    parts = [state]
    if document.get("mission_steps"):
        parts.append(
            f"mission {mission.get('spec', {}).get('name', '')} step "
            f"{document['mission_step']}/{document['mission_steps']}, "
            f"checkpoint {document['checkpoint_step']}"
        )
    if document.get("urgent_active"):
        parts.append(f"urgent {document['urgent_active']} has the robot")
    if document.get("urgent_queued"):
        parts.append(f"{document['urgent_queued']} urgent queued")
    if level == "ERROR":
        parts.append("allocator unreachable")
    values = {
        "state": state,
        "event": document.get("event"),
        "mission": mission.get("id"),
        "step": document.get("mission_step"),
        "steps": document.get("mission_steps"),
        "checkpoint": document.get("checkpoint_step"),
        "urgent_queue": document.get("urgent_queued"),
        "urgent_active": document.get("urgent_active"),
        "allocator_reachable": document.get("allocator_reachable"),
    }
    return level, "; ".join(parts), [(k, "" if v is None else str(v)) for k, v in values.items()]


class Ros2Adapter:
    """Start with :meth:`start` (after the bridge restored its checkpoint), stop with :meth:`stop`."""

    def __init__(
        self,
        setting: str,
        commands: BridgeCommands,
        *,
        discovery_range: str = "LOCALHOST",
        mission_defaults: dict[str, Any] | None = None,
    ) -> None:
        self.setting = setting  # "auto" (rclpy if importable) or "off"
        self.commands = commands
        self.discovery_range = discovery_range.upper()
        self.mission_defaults = {
            "steps": 20,
            "safe_point_interval": 5,
            "deadline_ms": 0.0,
            **(mission_defaults or {}),
        }
        self.mode = LOCAL_MODE
        self.detail = "not started"
        self.rmw_implementation = ""
        self.domain_id: int | None = None
        self._rclpy: Any = None
        self._context: Any = None
        self._node: Any = None
        self._msgs: dict[str, Any] = {}
        self._publishers: dict[str, Any] = {}
        self._executor: Any = None
        self._thread: threading.Thread | None = None
        self._publish_lock = threading.Lock()

    def start(self) -> None:
        if self.setting == "off":
            self.detail = "ROS 2 disabled by bridge.ros2: off"
            return
        if self.discovery_range not in DISCOVERY_RANGES:
            raise ValueError(
                f"bridge.ros2_discovery_range must be one of {', '.join(DISCOVERY_RANGES)}, "
                f"got {self.discovery_range!r}"
            )
        try:
            rclpy = importlib.import_module("rclpy")
            self._msgs = {
                "String": importlib.import_module("std_msgs.msg").String,
                "DiagnosticStatus": importlib.import_module("diagnostic_msgs.msg").DiagnosticStatus,
                "KeyValue": importlib.import_module("diagnostic_msgs.msg").KeyValue,
                "Trigger": importlib.import_module("std_srvs.srv").Trigger,
            }
        except ImportError as exc:
            self.detail = f"rclpy not importable ({exc.name or exc}); HTTP API only"
            log.info("ROS 2 not available; local-compatible mode", extra={"reason": self.detail})
            return
        # The ROS variable wins (a robot's launch environment sets it); otherwise the setting,
        # LOCALHOST by default like every other PARFusion listener.
        os.environ.setdefault(DISCOVERY_ENV, self.discovery_range)
        try:
            self._start_node(rclpy)
        except Exception as exc:  # a broken ROS 2 install must not take the bridge down
            self.detail = f"rclpy failed to start: {exc}"
            log.warning("ROS 2 start failed; local-compatible mode", extra={"error": str(exc)})
            self._shutdown()
            return
        self.mode = ROS2_MODE
        self.detail = (
            f"node /{NODE_NAME} on domain {self.domain_id} via {self.rmw_implementation}, "
            f"discovery {os.environ[DISCOVERY_ENV]}"
        )
        self.publish(None)  # the latched topics hold the current state from the start
        log.info(
            "ROS 2 adapter started",
            extra={"domain_id": self.domain_id, "rmw": self.rmw_implementation},
        )

    def _start_node(self, rclpy: Any) -> None:
        executors = importlib.import_module("rclpy.executors")
        qos = importlib.import_module("rclpy.qos")
        descriptors = importlib.import_module("rcl_interfaces.msg")
        self._rclpy = rclpy
        self._context = rclpy.Context()
        rclpy.init(context=self._context)  # ROS_DOMAIN_ID from the environment, 0 by default
        node = rclpy.create_node(NODE_NAME, context=self._context)
        self._node = node
        self.domain_id = self._context.get_domain_id()
        self.rmw_implementation = rclpy.get_rmw_implementation_identifier()
        for topic, spec in TOPICS.items():
            profile = _qos_profile(qos, spec["qos"])
            message = self._msgs[spec["type"].rsplit("/", 1)[1]]
            if spec["direction"] == "out":
                self._publishers[topic] = node.create_publisher(message, topic, profile)
            else:
                node.create_subscription(message, topic, self._received, profile)
        self._declare_mission_parameters(node, descriptors)
        trigger = self._msgs["Trigger"]
        node.create_service(trigger, START_SERVICE, self._answer(self._start_mission))
        node.create_service(trigger, CANCEL_SERVICE, self._answer(self.commands.cancel_mission))
        node.create_service(trigger, TICK_SERVICE, self._answer(self.commands.tick))
        self._executor = executors.SingleThreadedExecutor(context=self._context)
        self._executor.add_node(node)
        self._thread = threading.Thread(target=self._spin, name="ros2-spin", daemon=True)
        self._thread.start()

    def _declare_mission_parameters(self, node: Any, msg: Any) -> None:
        """mission.* parameters: the mission /parfusion/start_mission starts; rclpy checks ranges."""
        defaults = self.mission_defaults
        integer = msg.ParameterDescriptor(
            integer_range=[msg.IntegerRange(from_value=1, to_value=MAX_STEPS, step=1)]
        )
        node.declare_parameter("mission.name", "", msg.ParameterDescriptor(
            description="DNS-1123 label; empty = mission-<n>"
        ))  # fmt: skip
        node.declare_parameter("mission.steps", int(defaults["steps"]), integer)
        node.declare_parameter(
            "mission.safe_point_interval", int(defaults["safe_point_interval"]), integer
        )
        node.declare_parameter(
            "mission.deadline_ms",
            float(defaults["deadline_ms"]),
            msg.ParameterDescriptor(
                description="0 = no deadline",
                floating_point_range=[
                    msg.FloatingPointRange(from_value=0.0, to_value=MAX_DEADLINE_MS, step=0.0)
                ],
            ),
        )

    def _start_mission(self) -> Reply:
        node = self._node
        document: dict[str, Any] = {
            key: node.get_parameter(f"mission.{key}").value
            for key in ("steps", "safe_point_interval", "deadline_ms")
        }
        name = node.get_parameter("mission.name").value
        if name:
            document["name"] = name
        return self.commands.start_mission(document)

    def _answer(self, action: Callable[[], Reply]) -> Callable[[Any, Any], Any]:
        def callback(_request: Any, response: Any) -> Any:
            try:
                response.success, document = action()
            except Exception as exc:  # a failing call answers, it never kills the executor
                log.exception("ROS 2 service call failed")
                response.success, document = False, {"error": f"internal error: {exc}"}
            response.message = json.dumps(document)
            return response

        return callback

    def _spin(self) -> None:
        try:
            self._executor.spin()
        except Exception:  # rclpy raises on spin after its context shut down
            if self._context is not None and self._context.ok():
                log.exception("ROS 2 executor stopped")

    def _received(self, message: Any) -> None:
        try:
            document = json.loads(message.data)
            if not isinstance(document, dict):
                raise ValueError("expected a JSON object")
            self.commands.submit_urgent(document)
        except Exception as exc:  # one bad message must not stop the subscription
            log.warning("urgent event from ROS 2 refused", extra={"error": str(exc)})

    def publish(self, transition: Transition | None) -> None:
        """Publish the current state on both latched topics (called on every transition)."""
        if not self._publishers:
            return
        document = state_message(transition, self.commands.state_view())
        level, text, values = diagnostic_summary(document)
        status_type, key_value = self._msgs["DiagnosticStatus"], self._msgs["KeyValue"]
        status = status_type(
            level=getattr(status_type, level),
            name=DIAGNOSTIC_NAME,
            message=text,
            hardware_id=NODE_NAME,
            values=[key_value(key=k, value=v) for k, v in values],
        )
        with self._publish_lock:  # keeps the two topics in the same order
            publishers = self._publishers
            if not publishers:  # stopped meanwhile
                return
            try:
                publishers[STATE_TOPIC].publish(self._msgs["String"](data=json.dumps(document)))
                publishers[DIAGNOSTICS_TOPIC].publish(status)
            except Exception:  # DDS trouble (or a stop under way) never stops the robot's loop
                log.exception("ROS 2 publish failed")

    def status(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "detail": self.detail,
            "rmw_implementation": self.rmw_implementation or None,
            "domain_id": self.domain_id,
            "discovery_range": os.environ.get(DISCOVERY_ENV) if self.mode == ROS2_MODE else None,
            "node": f"/{NODE_NAME}",
            "state_topic": STATE_TOPIC,
            "urgent_topic": URGENT_TOPIC,
            "topics": TOPICS,
            "services": SERVICES,
        }

    def stop(self) -> None:
        self._shutdown()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None

    def _shutdown(self) -> None:
        with self._publish_lock:  # a publish under way finishes before the node goes
            self._publishers = {}
        try:
            if self._executor is not None:
                self._executor.shutdown()
            if self._node is not None:
                self._node.destroy_node()
            if self._context is not None and self._context.ok():
                self._rclpy.shutdown(context=self._context)
        except Exception:
            log.exception("ROS 2 shutdown failed")
        self._executor = self._node = None


def _qos_profile(qos: Any, spec: dict[str, Any]) -> Any:
    return qos.QoSProfile(
        history=qos.HistoryPolicy.KEEP_LAST,
        depth=spec["depth"],
        reliability=qos.ReliabilityPolicy.RELIABLE
        if spec["reliability"] == "reliable"
        else qos.ReliabilityPolicy.BEST_EFFORT,
        durability=qos.DurabilityPolicy.TRANSIENT_LOCAL
        if spec["durability"] == "transient_local"
        else qos.DurabilityPolicy.VOLATILE,
    )
