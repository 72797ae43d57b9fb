"""Urgent events against the real AllocatorService (in process, real gRPC, its SQLite store)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from parfusion.v1 import allocator_pb2, allocator_pb2_grpc, intent_pb2
from services.allocator import server
from services.bridge.app import create_app
from services.common.clients import channel
from services.common.config import build_settings
from services.core.convert import intents_in_file
from tests.bridge.conftest import Clock
from tests.conftest import ROOT, free_port

pytestmark = pytest.mark.integration


def allocator_settings(port: int = 0) -> Any:
    """No peers (never the default node-agent / GPU-lane ports), a fixed 4-unit node, no seeding."""
    overrides = {
        "port": port,
        "seed_intents": False,
        "cpu_units": 4,
        "nodeagent_address": "",
        "gpulane_address": "",
    }
    return build_settings("allocator", overrides=overrides, env={})


@pytest.fixture
def allocator(home: Path) -> Iterator[Any]:
    settings = allocator_settings()
    running = server.start_allocator(settings, port=0, start_loop=False)
    yield running
    running.stop(grace=0.2)


def urgent_intents(address: str) -> list[Any]:
    ch = channel(address)
    try:
        stub = allocator_pb2_grpc.AllocatorServiceStub(ch)
        request = allocator_pb2.ListIntentsRequest(workload_class=intent_pb2.WORKLOAD_CLASS_URGENT)
        # wait_for_ready: after an outage gRPC's shared subchannel may still be in reconnect backoff
        return list(stub.ListIntents(request, timeout=5.0, wait_for_ready=True).intents)
    finally:
        ch.close()


def test_the_urgent_intent_lives_in_the_allocator_exactly_while_the_task_runs(
    allocator: Any,
) -> None:
    settings = build_settings(
        "bridge",
        overrides={
            "background_ticker": False,
            "allocator_address": allocator.address,
            "ros2": "off",
        },
        env={},
    )
    with TestClient(create_app(settings)) as client:
        client.post("/api/mission", json={"steps": 10, "safe_point_interval": 5})
        client.post("/api/urgent", json={"name": "fall-detected", "deadline_ms": 3_000, "work": 2})
        assert urgent_intents(allocator.address) == []
        state = client.post("/api/tick", json={"ticks": 3}).json()
        assert state["state"] == "URGENT_TASK_RUNNING"
        # submitted, not granted: no plan has been made for it yet
        assert state["urgent"]["active"]["allocator"] == "submitted", state["allocator"]
        assert state["urgent"]["active"]["allocation"] is None
        stored = urgent_intents(allocator.address)
        assert len(stored) == 1
        assert stored[0].name == "fall-detected" and stored[0].slo.deadline_ms == 3_000
        assert not stored[0].preemptible
        allocator.handle.loop.tick()  # the allocator plans it
        state = client.post("/api/tick").json()
        active = state["urgent"]["active"]
        assert active["allocator"] == "granted", active
        assert active["allocation"]["state"] == "ADMITTED" and active["allocation"]["units"] >= 1
        state = client.post("/api/tick").json()
        assert state["state"] == "PREEMPTED"
        assert state["urgent"]["recent"][0]["intent_deleted"] is True
        assert urgent_intents(allocator.address) == []
        assert client.post("/api/tick", json={"ticks": 13}).json()["state"] == "COMPLETED"


@pytest.mark.slow  # waits for the bridge to notice the allocator is back (about a second)
def test_an_allocator_that_stops_mid_task_leaves_no_intent_behind_once_it_is_back(
    home: Path,
) -> None:
    """Issue item 15: the leftover URGENT intent goes when the allocator comes back, with no
    tick (the manual ticker may never tick again), and last_error clears once it answers."""
    port = free_port()
    settings = allocator_settings(port)
    first = server.start_allocator(settings, port=port, start_loop=False)
    bridge_settings = build_settings(
        "bridge",
        overrides={
            "background_ticker": False,
            "allocator_address": f"127.0.0.1:{port}",
            "allocator_retry_ms": 200,
            "allocator_cleanup_ms": 200,
            "ros2": "off",
        },
        env={},
    )
    clock = Clock()
    with TestClient(create_app(bridge_settings, clock=clock)) as client:
        client.post("/api/urgent", json={"name": "fall-detected", "deadline_ms": 3_000, "work": 1})
        assert client.post("/api/tick").json()["urgent"]["active"]["allocator"] == "submitted"
        first.stop(grace=0.2)
        state = client.post("/api/tick").json()
        assert state["urgent"]["recent"][0]["intent_deleted"] is False
        assert state["allocator"]["undeleted_intents"] == 1
        assert "UNAVAILABLE" in state["allocator"]["last_error"]
        second = server.start_allocator(settings, port=port, start_loop=False)  # same SQLite store
        try:
            assert len(urgent_intents(second.address)) == 1
            deadline = time.monotonic() + 20
            while client.get("/api/state").json()["allocator"]["undeleted_intents"]:
                assert time.monotonic() < deadline, "the leftover intent was never cleaned up"
                time.sleep(0.1)
            assert urgent_intents(second.address) == []
            status = client.get("/api/state").json()["allocator"]
            assert status["reachable"] is True and status["last_error"] == ""
        finally:
            second.stop(grace=0.2)


def allocations_by_name(allocator: Any) -> dict[str, Any]:
    allocator.handle.loop.tick()  # one node-loop tick, driven here so the test sees each plan
    current = allocator.handle.loop.current()
    return {a.intent_name: a for a in current.node_plan.allocations}


def workers_by_name(allocator: Any) -> dict[str, int]:
    return {name: a.workers for name, a in allocations_by_name(allocator).items()}


def test_the_urgent_intent_takes_units_from_preemptible_batch_work_until_it_is_deleted(
    allocator: Any,
) -> None:
    ch = channel(allocator.address)
    stub = allocator_pb2_grpc.AllocatorServiceStub(ch)
    for intent in intents_in_file(ROOT / "configs" / "intents" / "batch-training.yaml"):
        stub.SubmitIntent(allocator_pb2.SubmitIntentRequest(intent=intent), timeout=2.0)
    ch.close()
    assert workers_by_name(allocator) == {"batch-training": 4}
    settings = build_settings(
        "bridge",
        overrides={
            "background_ticker": False,
            "allocator_address": allocator.address,
            "ros2": "off",
        },
        env={},
    )
    with TestClient(create_app(settings)) as client:
        client.post("/api/mission", json={"steps": 10, "safe_point_interval": 5})
        client.post("/api/urgent", json={"name": "fall-detected", "deadline_ms": 3_000, "work": 2})
        client.post("/api/tick", json={"ticks": 3})  # the urgent task has the robot
        during = allocations_by_name(allocator)
        urgent, batch = during["fall-detected"], during["batch-training"]
        assert urgent.units >= 1 and urgent.workers == urgent.units
        assert batch.units <= 4 - urgent.units  # the urgent work took its units
        # what batch runs beyond its units is idle-time work only: SCHED_IDLE, nice 19
        assert batch.workers > batch.units and batch.sched_policy == "idle" and batch.nice == 19
        client.post("/api/tick", json={"ticks": 2})  # done: intent deleted
        assert workers_by_name(allocator) == {"batch-training": 4}
