"""The ROS 2 adapter: local-compatible without rclpy; with it, the bridge on real DDS.

The DDS tests run when the ``ros`` extra is installed (it is part of ``dev``): the bridge and a
real allocator run as their own processes through ``parfusion up`` (tests/stack.py), and the
test is a separate rclpy node in this process, on this run's own loopback-only domain
(tests/ros_domain.py). Without rclpy they skip with the reason.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from parfusion.v1 import allocator_pb2, allocator_pb2_grpc, intent_pb2
from services.bridge.app import create_app
from services.bridge.ros2 import (
    CANCEL_SERVICE,
    LOCAL_MODE,
    ROS2_MODE,
    START_SERVICE,
    TICK_SERVICE,
    BridgeCommands,
    Ros2Adapter,
    diagnostic_summary,
)
from services.bridge.validation import parse_urgent
from services.common.clients import channel
from services.common.config import build_settings
from services.common.errors import DomainError
from tests.bridge.conftest import Clock, make_bridge
from tests.conftest import ROOT
from tests.stack import Stack, start_stack

HAVE_RCLPY = importlib.util.find_spec("rclpy") is not None
needs_ros = pytest.mark.skipif(
    not HAVE_RCLPY, reason="rclpy not installed: pip install -e '.[ros]' (x86-64 Linux wheels)"
)


def local_settings(ros2: str = "auto") -> Any:
    return build_settings(
        "bridge",
        overrides={"background_ticker": False, "allocator_address": "", "ros2": ros2},
        env={},
    )


def test_ros2_off_stays_local(home: Path) -> None:
    with TestClient(create_app(local_settings("off"))) as client:
        ros = client.get("/api/state").json()["ros2"]
    assert ros["mode"] == LOCAL_MODE and "off" in ros["detail"]
    assert ros["domain_id"] is None and ros["rmw_implementation"] is None


def test_without_rclpy_the_bridge_is_local_compatible_and_says_why(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "rclpy", None)  # what a machine without the extra sees
    with TestClient(create_app(local_settings())) as client:
        state = client.get("/api/state").json()
        assert state["mode"] == LOCAL_MODE
        assert "rclpy not importable" in state["ros2"]["detail"]
        response = client.post("/api/mission", json={"steps": 4})
        assert response.status_code == 201  # the HTTP API is the whole interface, as before


def test_a_discovery_range_that_is_not_ros_2s_is_refused_at_start(home: Path) -> None:
    settings = build_settings(
        "bridge",
        overrides={"allocator_address": "", "ros2_discovery_range": "everywhere"},
        env={},
    )
    with pytest.raises(ValueError, match="ros2_discovery_range"), TestClient(create_app(settings)):
        pass


def state_document(state: str, **extra: Any) -> dict[str, Any]:
    base = {
        "state": state,
        "event": "step",
        "mission": {"id": "m1", "active": True, "spec": {"name": "patrol"}, "plan": {}},
        "mission_step": 3,
        "mission_steps": 10,
        "checkpoint_step": 0,
        "urgent_queued": 0,
        "urgent_active": None,
        "allocator_reachable": True,
    }
    return {**base, **extra}


@pytest.mark.parametrize(
    ("document", "level"),
    [
        (state_document("RUNNING"), "OK"),
        (state_document("IDLE", mission=None, mission_step=None, mission_steps=None), "OK"),
        (state_document("PREEMPTED", urgent_queued=1), "WARN"),
        (state_document("URGENT_TASK_RUNNING", urgent_active="door-open"), "WARN"),
        (state_document("RUNNING", allocator_reachable=False), "ERROR"),
        (
            state_document(
                "RUNNING",
                mission={"id": "m1", "active": True, "plan": {"deadline_at_risk": True}},
            ),
            "WARN",
        ),
    ],
)
def test_diagnostic_level_follows_the_robot(document: dict[str, Any], level: str) -> None:
    got, message, values = diagnostic_summary(document)
    assert got == level
    assert message.startswith(document["state"])
    keys = dict(values)
    assert keys["state"] == document["state"]
    assert keys["step"] == ("" if document["mission_step"] is None else "3")
    assert keys["urgent_queue"] == str(document["urgent_queued"])
    assert all(isinstance(v, str) for v in keys.values())


JSON_VALUES = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=80)
URGENT_BODIES = st.dictionaries(
    st.sampled_from(["name", "deadline_ms", "work", "extra"]) | st.text(max_size=8),
    JSON_VALUES,
    max_size=5,
)


@needs_ros
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=st.text(max_size=200) | URGENT_BODIES.map(json.dumps))
def test_any_message_on_the_urgent_topic_queues_a_valid_event_or_nothing(
    payload: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from std_msgs.msg import String

    bridge = make_bridge(tmp_path_factory.mktemp("fuzz") / "checkpoint.json", Clock())
    adapter = Ros2Adapter(
        "auto",
        BridgeCommands(
            submit_urgent=lambda body: bridge.submit_urgent(parse_urgent(body), source="ros2"),
            start_mission=lambda _body: (False, {}),
            cancel_mission=lambda: (False, {}),
            tick=lambda: (False, {}),
            state_view=lambda: {},
        ),
    )
    adapter._received(String(data=payload))  # the subscription's callback, as rclpy calls it
    try:
        document = json.loads(payload)
        expected = parse_urgent(document) if isinstance(document, dict) else None
    except (ValueError, DomainError):  # not JSON, or refused by the HTTP route's validation
        expected = None
    assert [event.spec for _, _, event in bridge.queue] == ([expected] if expected else [])


# --- real DDS -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ros_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A real allocator and bridge (own processes); the bridge ticks only when asked."""
    if not HAVE_RCLPY:
        pytest.skip("rclpy not installed: pip install -e '.[ros]' (x86-64 Linux wheels)")
    home = tmp_path_factory.mktemp("ros-home")
    (home / "configs").symlink_to(ROOT / "configs")
    stack = start_stack(
        home,
        ["allocator", "bridge"],
        {
            "PARFUSION_BRIDGE_BACKGROUND_TICKER": "false",
            "PARFUSION_ALLOCATOR_SEED_INTENTS": "false",
            "PARFUSION_ALLOCATOR_CPU_UNITS": "4",
        },
    )
    yield stack
    stack.close()


@pytest.fixture
def peer(ros_stack: Stack, ros_domain: int) -> Iterator[Any]:
    from tests.bridge.ros_peer import RobotPeer

    robot = RobotPeer("robot_test", domain_id=ros_domain)
    robot.wait_for_bridge()
    yield robot
    robot.close()


def http_state(stack: Stack) -> dict[str, Any]:
    return httpx.get(f"{stack.address('bridge')}/api/state", timeout=5.0).json()


def urgent_allocation(address: str, name: str, timeout_s: float = 10.0) -> Any:
    """The allocation the allocator's own loop made for the URGENT intent ``name``."""
    ch = channel(address)
    try:
        stub = allocator_pb2_grpc.AllocatorServiceStub(ch)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            plan = stub.GetPlan(allocator_pb2.GetPlanRequest(), timeout=5.0).node_plan
            for allocation in plan.allocations:
                if allocation.intent_name == name:
                    return allocation
            time.sleep(0.05)
        return None
    finally:
        ch.close()


def urgent_intent_names(address: str) -> list[str]:
    ch = channel(address)
    try:
        stub = allocator_pb2_grpc.AllocatorServiceStub(ch)
        request = allocator_pb2.ListIntentsRequest(workload_class=intent_pb2.WORKLOAD_CLASS_URGENT)
        return [i.name for i in stub.ListIntents(request, timeout=5.0).intents]
    finally:
        ch.close()


def states_after(received: list[tuple[float, dict[str, Any]]], mission_id: str) -> list[str]:
    """The states published from this mission's start on, each with the event that led there."""
    docs = [doc for _, doc in received]
    first = next(i for i, d in enumerate(docs) if (d.get("mission") or {}).get("id") == mission_id)
    return [f"{d['event']}>{d['state']}" for d in docs[first:]]


@needs_ros
@pytest.mark.integration
@pytest.mark.slow
def test_an_urgent_event_over_dds_preempts_the_mission_and_reaches_the_allocator(
    ros_stack: Stack, peer: Any
) -> None:
    from tests.bridge.ros_peer import diagnostic_values

    state = http_state(ros_stack)
    assert state["ros2"]["mode"] == ROS2_MODE
    assert state["ros2"]["rmw_implementation"] == "rmw_fastrtps_cpp"
    assert state["ros2"]["domain_id"] == int(ros_stack.env["ROS_DOMAIN_ID"])
    assert state["ros2"]["discovery_range"] == "LOCALHOST"

    results = peer.set_parameters(name="patrol", steps=10, safe_point_interval=5)
    assert all(r.successful for r in results), results
    ok, started = peer.call(START_SERVICE)
    assert ok and started["state"] == "RUNNING", started
    assert started["mission"]["spec"] == {
        "name": "patrol",
        "steps": 10,
        "safe_point_interval": 5,
        "deadline_ms": 0.0,
    }
    mission_id = started["mission_id"]
    assert peer.call(TICK_SERVICE)[1]["mission_step"] == 1
    assert peer.call(TICK_SERVICE)[1]["mission_step"] == 2

    # refused on the topic (logged by the bridge), nothing queued, the subscription lives on
    peer.publish_urgent("not json")
    peer.publish_urgent({"name": "BAD", "deadline_ms": 100})
    peer.publish_urgent({"name": "door-open", "deadline_ms": 5_000, "work": 2})
    deadline = time.monotonic() + 10.0
    while http_state(ros_stack)["urgent_queued"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    state = http_state(ros_stack)
    assert [e["spec"]["name"] for e in state["urgent"]["queue"]] == ["door-open"]
    assert state["urgent"]["queue"][0]["source"] == "ros2"

    # steps 3, 4, 5 (safe point: the mission stops there), checkpoint, hand-over
    for _ in range(3):
        peer.call(TICK_SERVICE)
    assert http_state(ros_stack)["state"] == "CHECKPOINTING"
    ok, after = peer.call(TICK_SERVICE)
    assert ok and after["state"] == "PREEMPTED"
    checkpoint = json.loads(Path(after["checkpoint"]["path"]).read_text())
    assert checkpoint["reason"] == "preemption" and checkpoint["state"] == "CHECKPOINTING"
    assert checkpoint["mission"]["id"] == mission_id
    assert checkpoint["mission"]["checkpoint_step"] == 5
    assert [e["spec"]["name"] for e in checkpoint["queue"]] == ["door-open"]

    ok, after = peer.call(TICK_SERVICE)
    assert after["state"] == "URGENT_TASK_RUNNING"
    assert after["urgent"]["active"]["allocator"] in ("submitted", "granted"), after["allocator"]
    allocator = ros_stack.address("allocator")
    assert urgent_intent_names(allocator) == ["door-open"]
    allocation = urgent_allocation(allocator, "door-open")
    assert allocation is not None and allocation.units >= 1

    # two units of urgent work (the first sees the allocator's plan), then back to the mission
    ok, after = peer.call(TICK_SERVICE)
    assert after["urgent"]["active"]["allocator"] == "granted", after["urgent"]["active"]
    assert after["urgent"]["active"]["allocation"]["units"] >= 1
    for _ in range(4):
        peer.call(TICK_SERVICE)
    assert http_state(ros_stack)["state"] == "RUNNING"
    assert urgent_intent_names(allocator) == []

    expected = [
        "start_mission>RUNNING",
        "step>RUNNING",
        "step>RUNNING",
        "step>RUNNING",
        "step>RUNNING",
        "step>RUNNING",
        "preempt>CHECKPOINTING",
        "checkpoint_saved>PREEMPTED",
        "start_urgent>URGENT_TASK_RUNNING",
        "urgent_step>URGENT_TASK_RUNNING",
        "urgent_step>URGENT_TASK_RUNNING",
        "urgent_done>PREEMPTED",
        "resume>RESUMING",
        "restored>COMPENSATING",
        "compensated>RUNNING",
    ]
    assert peer.wait_until(lambda r: len(states_after(r.states, mission_id)) >= len(expected))
    assert states_after(peer.received.states, mission_id) == expected
    diagnostics = [diagnostic_values(d) for _, d in peer.received.diagnostics]
    first = next(i for i, v in enumerate(diagnostics) if v["mission"] == mission_id)
    assert [f"{v['event']}>{v['state']}" for v in diagnostics[first:]] == expected
    levels = {diagnostic_values(d)["state"]: d.level for _, d in peer.received.diagnostics[first:]}
    assert levels["RUNNING"] == b"\x00" and levels["URGENT_TASK_RUNNING"] == b"\x01"
    preempted = next(v for v in diagnostics[first:] if v["state"] == "PREEMPTED")
    assert preempted["checkpoint"] == "5" and preempted["urgent_queue"] == "1"

    ok, cancelled = peer.call(CANCEL_SERVICE)
    assert ok and cancelled["cancelled"] == mission_id and cancelled["state"] == "IDLE"
    ok, refused = peer.call(CANCEL_SERVICE)
    assert not ok and refused["state"] == "IDLE" and "no mission to cancel" in refused["error"]


@needs_ros
@pytest.mark.integration
def test_a_late_subscriber_gets_the_current_state_and_bad_parameters_are_refused(
    ros_stack: Stack, peer: Any, ros_domain: int
) -> None:
    from tests.bridge.ros_peer import RobotPeer, diagnostic_values

    refused = peer.set_parameters(steps=0)
    assert not refused[0].successful and "range" in refused[0].reason
    assert peer.set_parameters(name="BAD")[0].successful  # a string; checked when it starts
    ok, error = peer.call(START_SERVICE)
    assert not ok and error["field"] == "name" and "DNS-1123" in error["error"]
    peer.set_parameters(name="", steps=8, safe_point_interval=9)
    ok, error = peer.call(START_SERVICE)
    assert not ok and error["field"] == "safe_point_interval"

    peer.call(CANCEL_SERVICE)  # whatever an earlier test left running
    peer.set_parameters(safe_point_interval=4)
    ok, started = peer.call(START_SERVICE)
    assert ok and started["mission"]["spec"]["name"].startswith("mission-"), started
    ok, after = peer.call(TICK_SERVICE)
    assert ok
    late = RobotPeer("late_subscriber", domain_id=ros_domain)
    try:
        assert late.wait_until(lambda r: bool(r.states) and bool(r.diagnostics))
        time.sleep(0.5)  # anything else would arrive now: it must not
        assert len(late.received.states) == 1 and len(late.received.diagnostics) == 1
        latest = late.received.states[0][1]
        assert latest["state"] == after["state"]
        assert latest["mission_step"] == after["mission_step"]
        assert latest["mission"]["id"] == after["mission"]["id"]
        values = diagnostic_values(late.received.diagnostics[0][1])
        assert values["step"] == str(after["mission_step"])
    finally:
        late.close()
    ok, _ = peer.call(CANCEL_SERVICE)
    assert ok
