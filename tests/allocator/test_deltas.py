"""The loop and a real (modeled) node agent agree on the plan through deltas: after steady
ticks, store changes, an agent restart (which holds nothing) and a lost push, the agent holds
exactly the allocations of the loop's last plan; the tick histogram and plan size are exported."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from prometheus_client import REGISTRY

from parfusion.v1 import intent_pb2, nodeagent_pb2_grpc
from services.allocator.loop import ControlLoop, LoopConfig
from services.allocator.peers import NodeAgentClient
from services.allocator.store import IntentStore
from services.common.config import build_settings
from services.common.grpc_server import start_grpc_server
from services.core.validation import normalize_intent
from services.nodeagent.backend import BackendOptions, create_backend
from services.nodeagent.server import (
    SERVICE_NAME,
    NodeAgentServicer,
    RunningNodeAgent,
    start_nodeagent,
)
from tests.allocator.conftest import batch_intent, online_intent


@pytest.fixture
def store(tmp_path: Path) -> Iterator[IntentStore]:
    s = IntentStore(tmp_path / "intents.db")
    yield s
    s.close()


def _agent(port: int = 0) -> RunningNodeAgent:
    settings = build_settings(
        "nodeagent", overrides={"port": port, "backend": "modeled"}, env=dict(os.environ)
    )
    return start_nodeagent(settings, port=port)


def _loop_entries(loop: ControlLoop) -> dict[str, bytes]:
    snapshot = loop.current()
    assert snapshot is not None
    return {
        a.intent_id: intent_pb2.NodePlan(allocations=[a]).SerializeToString()
        for a in snapshot.node_plan.allocations
    }


def _agrees(loop: ControlLoop, agent: RunningNodeAgent, ticks: int = 6) -> bool:
    """A few ticks (deadlines are generous here: a busy test host must not fail it)."""
    for _ in range(ticks):
        loop.tick()
        if agent.servicer.plan.entries == _loop_entries(loop):
            return True
    return False


def _loop(store: IntentStore, agent: RunningNodeAgent) -> ControlLoop:
    return ControlLoop(store, LoopConfig(nodeagent_address=agent.address, tick_s=4.0))


def test_the_agent_holds_the_loops_plan_after_changes_and_a_restart(store: IntentStore) -> None:
    for k in range(12):
        intent = online_intent(name=f"on-{k}") if k % 2 else batch_intent(name=f"job-{k}")
        store.submit(normalize_intent(intent))
    agent = _agent()
    loop = _loop(store, agent)
    try:
        assert _agrees(loop, agent)
        store.submit(normalize_intent(online_intent(name="late")))
        victim = store.list_intents()[0].intent.id
        store.delete(victim)
        assert _agrees(loop, agent)
        assert victim not in agent.servicer.plan.entries

        # a restarted agent holds nothing: the next delta is refused and the whole plan follows
        port = int(agent.address.rsplit(":", 1)[1])
        agent.stop()
        agent = _agent(port)
        resyncs = REGISTRY.get_sample_value(
            "parfusion_allocator_resyncs_total", {"peer": "nodeagent", "stream": "plan"}
        )
        assert _agrees(loop, agent, ticks=12)
        after = REGISTRY.get_sample_value(
            "parfusion_allocator_resyncs_total", {"peer": "nodeagent", "stream": "plan"}
        )
        assert (after or 0) > (resyncs or 0)
    finally:
        loop.stop()
        agent.stop()


def test_tick_duration_and_plan_size_are_exported(store: IntentStore) -> None:
    store.submit(normalize_intent(online_intent()))
    before = REGISTRY.get_sample_value("parfusion_allocator_tick_duration_seconds_count") or 0
    loop = ControlLoop(store, LoopConfig())
    try:
        snapshot = loop.tick()
    finally:
        loop.stop()
    assert snapshot is not None
    assert REGISTRY.get_sample_value("parfusion_allocator_tick_duration_seconds_count") == (
        before + 1
    )
    size = REGISTRY.get_sample_value("parfusion_allocator_plan_size_bytes", {"plan": "node"})
    assert size == snapshot.node_plan.ByteSize()
    gpu = REGISTRY.get_sample_value("parfusion_allocator_plan_size_bytes", {"plan": "gpu"})
    assert gpu == snapshot.gpu_plan.ByteSize()


class _SlowOnce(NodeAgentServicer):
    """A real agent servicer whose second telemetry reply is made but held past the caller's
    deadline; it records each request's generation and the deadline left when it arrived."""

    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self.seen: list[tuple[int, float]] = []
        self.late_reply_made = threading.Event()

    async def GetNodeTelemetry(self, request: Any, context: Any) -> Any:  # noqa: N802
        # a coroutine: it gets the call's own context, which knows the deadline
        self.seen.append((request.known_generation, context.time_remaining()))
        reply = super().GetNodeTelemetry(request, context)  # counted as held from here on
        if len(self.seen) == 2:
            self.late_reply_made.set()
            await asyncio.sleep(1.2)  # the caller's deadline ends the call here
        return reply


def test_a_missed_pull_gives_the_next_one_the_resync_deadline(tmp_path: Path) -> None:
    """The agent counts a reply as held once it sent it; when that reply missed the loop's
    deadline, the next reply is a whole one, which must get the resync deadline or, at 10,000
    intents, it misses again at every tick and the node stays stale."""
    backend = create_backend("modeled", BackendOptions(run_dir=tmp_path / "run"))
    servicer = _SlowOnce(backend)
    server = start_grpc_server(
        [(nodeagent_pb2_grpc.add_NodeAgentServiceServicer_to_server, servicer, SERVICE_NAME)]
    )
    client = NodeAgentClient(server.address)
    missed = {"peer": "nodeagent", "call": "GetNodeTelemetry", "code": "DEADLINE_EXCEEDED"}
    misses = REGISTRY.get_sample_value("parfusion_allocator_peer_call_failures_total", missed)
    try:
        replies = [client.finish_pull(client.start_pull(0.8)) for _ in range(2)]
        assert servicer.late_reply_made.wait(5)  # the agent now counts it as held
        replies += [client.finish_pull(client.start_pull(0.8)) for _ in range(2)]
        assert replies[0] is not None and replies[1] is None  # the second one came too late
        after = REGISTRY.get_sample_value("parfusion_allocator_peer_call_failures_total", missed)
        assert after == (misses or 0) + 1  # counted, by its status code
        assert replies[2] is not None and replies[3] is not None
        deadlines = [left for _, left in servicer.seen]
        assert deadlines[0] > 1.5  # nothing held yet: a whole reply, the resync deadline
        assert deadlines[1] < 1.0  # in step: the tick's deadline (0.8 s here)
        assert deadlines[2] > 1.5  # after the miss: a whole reply is coming
        assert deadlines[3] < 1.0  # in step again
        assert servicer.seen[2][0] == servicer.seen[1][0] != 0  # it names the reply it holds
    finally:
        client.close()
        server.stop(0)
        backend.stop()


class _HeldApply(NodeAgentServicer):
    """A real agent servicer that applies each plan only once the test lets it."""

    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self.arrived = threading.Event()
        self.release = threading.Event()

    def ApplyNodePlan(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.arrived.set()
        self.release.wait(10)
        return super().ApplyNodePlan(request, context)


def test_an_overlapped_tick_leaves_its_push_to_the_next_tick(
    store: IntentStore, tmp_path: Path
) -> None:
    """The loop's own ticks do not wait for the agent: a tick returns while its plan is still
    being applied, the next one takes the acknowledgement before its own delta, and the
    telemetry it plans on is dated when the reply came, not when it was read."""
    for k in range(6):
        intent = online_intent(name=f"on-{k}") if k % 2 else batch_intent(name=f"job-{k}")
        store.submit(normalize_intent(intent))
    backend = create_backend("modeled", BackendOptions(run_dir=tmp_path / "run"))
    servicer = _HeldApply(backend)
    server = start_grpc_server(
        [(nodeagent_pb2_grpc.add_NodeAgentServiceServicer_to_server, servicer, SERVICE_NAME)]
    )
    loop = ControlLoop(store, LoopConfig(nodeagent_address=server.address, tick_s=4.0))
    agent = loop.nodeagent
    assert agent is not None
    try:
        first = loop.tick(overlap=True)
        assert first is not None and servicer.arrived.wait(5)
        # returned with the push held by the agent: nothing acknowledged, nothing failed
        assert agent.plan_sent.held_generation == 0 and agent.push_health.ok is None
        assert servicer.plan.generation == 0
        servicer.release.set()

        flight = loop._in_flight  # the next tick's telemetry pull, started as this one ended
        assert flight is not None
        arrived = flight.pulls[2]
        for _ in range(500):
            if arrived:
                break
            threading.Event().wait(0.01)
        assert arrived, "the pull's reply never came"
        read_after = Timestamp()
        read_after.GetCurrentTime()
        second = loop.tick(overlap=True)
        assert second is not None
        # the first push was acknowledged before the second delta was taken against it
        assert agent.push_health.ok is True
        _, seen_wall = loop.node_status()
        assert seen_wall is not None and seen_wall.ToNanoseconds() < read_after.ToNanoseconds()

        third = loop.tick()  # not overlapped: returns with its plan acknowledged
        assert third is not None and loop._in_flight is None
        assert agent.plan_sent.held_generation == third.generation == servicer.plan.generation
        assert servicer.plan.entries == _loop_entries(loop)
    finally:
        servicer.release.set()
        loop.stop()
        server.stop(0)
        backend.stop()


class _SlowPullHeldApply(_HeldApply):
    """A real agent servicer whose telemetry replies after the first come 1.2 s late and whose
    plans are applied once the test lets it."""

    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self.pulls = 0

    async def GetNodeTelemetry(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.pulls += 1
        if self.pulls > 1:
            await asyncio.sleep(1.2)
        return super().GetNodeTelemetry(request, context)


def test_a_missed_deadline_leaves_the_other_calls_on_the_channel(tmp_path: Path) -> None:
    """A pull that missed its deadline reached a live agent: the push in flight beside it (an
    overlapped tick's pair) is still answered, not cancelled by a fresh channel."""
    backend = create_backend("modeled", BackendOptions(run_dir=tmp_path / "run"))
    servicer = _SlowPullHeldApply(backend)
    server = start_grpc_server(
        [(nodeagent_pb2_grpc.add_NodeAgentServiceServicer_to_server, servicer, SERVICE_NAME)]
    )
    client = NodeAgentClient(server.address)
    try:
        assert client.finish_pull(client.start_pull(0.3)) is not None  # in step after this
        header = intent_pb2.NodePlan(node="node-0", generation=1)
        push = client.start_push(header, {}, 10.0)
        assert servicer.arrived.wait(5)
        assert client.finish_pull(client.start_pull(0.3)) is None  # missed its deadline
        servicer.release.set()
        assert client.finish_push(push) is True
        assert servicer.plan.generation == 1
    finally:
        servicer.release.set()
        client.close()
        server.stop(0)
        backend.stop()
