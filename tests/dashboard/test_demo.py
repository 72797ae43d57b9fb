"""The guided demo against real services: it ends where it says, and puts back what it changed.

A real allocator, modeled node agent and robot bridge run as processes (tests.stack); the
dashboard runs in-process against them with the demo compressed to one second per stage.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from parfusion.v1 import allocator_pb2, allocator_pb2_grpc, nodeagent_pb2, nodeagent_pb2_grpc
from services.common.clients import channel
from services.common.config import ServiceSettings
from services.dashboard.app import create_app
from services.dashboard.demo import STAGES
from services.dashboard.demo_restore import MISSION_HELD
from tests.conftest import ROOT
from tests.dashboard.conftest import HTMX
from tests.stack import Stack, start_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    home = tmp_path_factory.mktemp("demo-stack")
    (home / "configs").symlink_to(ROOT / "configs")
    running = start_stack(home, ["allocator", "nodeagent", "bridge"])
    yield running
    running.close()


@pytest.fixture
def settings(
    stack: Stack, dashboard_settings: Callable[..., ServiceSettings]
) -> Callable[..., ServiceSettings]:
    def make(**overrides: Any) -> ServiceSettings:
        values: dict[str, Any] = {
            "allocator_address": stack.address("allocator"),
            "nodeagent_address": stack.address("nodeagent"),
            "bridge_url": stack.address("bridge"),
            "demo_stage_seconds": 1.0,
            "demo_tick_ms": 100.0,
            "call_timeout_ms": 2000.0,
        }
        return dashboard_settings(**{**values, **overrides})

    return make


def _policy(stack: Stack, name: str | None = None) -> str:
    with channel(stack.address("allocator")) as ch:
        stub = allocator_pb2_grpc.AllocatorServiceStub(ch)
        if name:
            stub.SetPolicy(allocator_pb2.SetPolicyRequest(name=name), timeout=5)
        return str(stub.ListPolicies(allocator_pb2.ListPoliciesRequest(), timeout=5).active)


def _disturbance_left(stack: Stack) -> float:
    with channel(stack.address("nodeagent")) as ch:
        reply = nodeagent_pb2_grpc.NodeAgentServiceStub(ch).GetNodeTelemetry(
            nodeagent_pb2.GetNodeTelemetryRequest(), timeout=5
        )
    return float(reply.telemetry.disturbance_remaining_s)


def _robot(stack: Stack) -> dict[str, Any]:
    return dict(httpx.get(f"{stack.address('bridge')}/api/state", timeout=5).json())


def _stage(client: TestClient) -> str:
    page = client.get("/partials/demo").text
    found = re.search(r'id="demo-caption" class="caption" data-stage="(\w+)"', page)
    return found.group(1) if found else ""


def _wait(predicate: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout_s:.0f} s")
        time.sleep(0.05)


def _outcomes(client: TestClient) -> list[str]:
    return re.findall(r'class="outcome">([^<]*)<', client.get("/partials/demo").text)


def _assert_robot_released(stack: Stack) -> None:
    robot = _robot(stack)
    assert robot["state"] not in MISSION_HELD | {"URGENT_TASK_RUNNING"}, robot["state"]
    assert not (robot.get("mission") or {}).get("active")


def test_captions_make_no_claim_about_how_a_stage_turns_out() -> None:
    recovery = next(s for s in STAGES if s.key == "recovery")
    assert "NORMAL" not in recovery.caption and "what the node, the robot" in recovery.caption


def test_a_finished_demo_puts_back_policy_and_mission(
    stack: Stack, settings: Callable[..., ServiceSettings]
) -> None:
    assert _policy(stack, "no-degrade") == "no-degrade"
    with TestClient(create_app(settings())) as client:
        client.post("/actions/demo/start", headers=HTMX)
        _wait(lambda: 'id="demo-status">done<' in client.get("/partials/demo").text, "done")
        outcomes = _outcomes(client)
    assert "SetPolicy baseline (was no-degrade)" in outcomes
    assert _policy(stack) == "no-degrade"
    assert "restored: policy no-degrade (was parfusion)" in outcomes
    assert any(o.startswith("restored: mission cancelled at step ") for o in outcomes), outcomes
    _assert_robot_released(stack)
    assert _disturbance_left(stack) == 0.0
    assert "restored: disturbance over (the node reports none active)" in outcomes
    # the recovery stage reports what the node and the robot say, not what was expected
    assert "node reports no disturbance active" in outcomes or any(
        o.startswith("node reports the disturbance active for ") for o in outcomes
    ), outcomes
    assert any(re.match(r"robot [A-Z_]+, mission step \d+ of 400", o) for o in outcomes), outcomes
    _policy(stack, "parfusion")


def test_stop_during_the_disturbance_clears_it_at_once(
    stack: Stack, settings: Callable[..., ServiceSettings]
) -> None:
    assert _policy(stack) == "parfusion"
    # a storm long enough to be seen on a loaded machine before the stop
    with TestClient(create_app(settings(demo_stage_seconds=3.0))) as client:
        client.post("/actions/demo/start", headers=HTMX)
        _wait(lambda: _stage(client) == "disturbance" and _disturbance_left(stack) > 0, "storm")
        client.post("/actions/demo/stop", headers=HTMX)
        assert _disturbance_left(stack) == 0.0
        outcomes = _outcomes(client)
        assert 'id="demo-status">stopped<' in client.get("/partials/demo").text
    assert "restored: disturbance cleared (the node reports none active)" in outcomes
    assert "restored: policy parfusion, as before the demo" in outcomes
    _assert_robot_released(stack)


def test_stop_right_after_the_urgent_event_lets_it_finish_then_ends_the_mission(
    stack: Stack, settings: Callable[..., ServiceSettings]
) -> None:
    # 40 units of urgent work at 100 ms a tick: still running when the stop comes
    with TestClient(create_app(settings(demo_urgent_work=40))) as client:
        client.post("/actions/demo/start", headers=HTMX)
        _wait(lambda: _stage(client) == "urgent", "urgent stage")
        _wait(
            lambda: bool(_robot(stack)["urgent"]["queue"] or _robot(stack)["urgent"]["active"]),
            "urgent event",
        )
        client.post("/actions/demo/stop", headers=HTMX)
        outcomes = _outcomes(client)
    assert _policy(stack) == "parfusion"  # baseline during the demo, back now
    assert any(o.startswith("restored: mission cancelled at step ") for o in outcomes), outcomes
    robot = _robot(stack)
    _assert_robot_released(stack)
    finished = [u["spec"]["name"] for u in robot["urgent"]["recent"]]
    assert "obstacle-stop" in finished  # the urgent task ran to its end, it was not cut short


def test_policy_note_goes_once_the_allocator_reports_another_policy(
    stack: Stack, settings: Callable[..., ServiceSettings]
) -> None:
    with TestClient(create_app(settings())) as client:
        note = client.post("/actions/policy?name=baseline", headers=HTMX).text
        assert "policy baseline active (was parfusion)" in note
        _policy(stack, "parfusion")  # switched back elsewhere (another tab, grpcurl, the demo)
        _wait(
            lambda: "policy baseline active" not in client.get("/partials/policies").text,
            "stale note to go",
            timeout_s=10,
        )
        assert 'data-policy="parfusion"' in client.get("/partials/policies").text
