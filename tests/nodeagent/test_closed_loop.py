"""The closed loop over real gRPC: allocator tick -> NodePlan -> the real agent's pools -> telemetry
-> predictor -> next plan. An intent submitted over gRPC changes the running pools within two
ticks; killing the agent leaves the allocator serving with the node stale; the loop resumes by
itself when the agent comes back on the same address."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from prometheus_client import REGISTRY

from parfusion.v1 import allocator_pb2, allocator_pb2_grpc, intent_pb2
from services.allocator.server import RunningAllocator, start_allocator
from services.bridge.allocator_client import UrgentIntentTemplate, build_urgent_intent
from services.common.clients import channel
from services.common.config import build_settings
from services.nodeagent.server import RunningNodeAgent, start_nodeagent
from tests.conftest import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TICK_S = 0.25


def _agent(port: int) -> RunningNodeAgent:
    settings = build_settings(
        "nodeagent",
        overrides={"port": port, "backend": "real", "max_workers": 4, "max_load_fraction": 0.5},
        env=dict(os.environ),
    )
    return start_nodeagent(settings, port=port)


def _wait(predicate: Callable[[], bool], timeout: float) -> float | None:
    """Seconds until predicate held, or None if it never did within timeout."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.01)
    return None


@pytest.fixture
def cpu_units() -> int:
    return 0  # the agent's arena (a test overrides this fixture for a node of a given size)


@pytest.fixture
def loop(
    home: Path, cpu_units: int
) -> Iterator[tuple[RunningAllocator, list[RunningNodeAgent], int]]:
    agent_port = free_port()
    agents = [_agent(agent_port)]
    settings = build_settings(
        "allocator",
        overrides={
            "port": 0,
            "metrics_port": None,
            "seed_intents": False,
            "nodeagent_address": f"127.0.0.1:{agent_port}",
            "gpulane_address": "",
            "tick_ms": int(TICK_S * 1000),
            "stale_after_ms": 1000,
            "cpu_units": cpu_units,
        },
        env=dict(os.environ),
    )
    allocator = start_allocator(settings, port=0, start_loop=True)
    try:
        yield allocator, agents, agent_port
    finally:
        allocator.stop(0.5)
        pids: set[int] = set()
        for a in agents:
            pids |= a.backend.owned_pids()
            a.stop(0.5)
        alive = [
            p
            for p in pids
            if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        assert not alive, f"orphans: {alive}"


def _online_intent() -> intent_pb2.ResourceIntent:
    return intent_pb2.ResourceIntent(
        id="web",
        name="web",
        workload_class=intent_pb2.WORKLOAD_CLASS_ONLINE,
        priority=800,
        slo=intent_pb2.Slo(deadline_ms=80.0),
        parallelism=intent_pb2.Parallelism(min=1, max=2),
        speedup=intent_pb2.Speedup(parallel_fraction=1.0, base_service_ms=3.0),
        demand=intent_pb2.Demand(arrival_rate_per_s=30.0),
    )


def _workers(agent: RunningNodeAgent, intent_id: str) -> int:
    return agent.backend.pool_sizes().get(intent_id, 0)  # type: ignore[attr-defined]


def test_intent_reaches_the_pools_and_telemetry_reaches_the_predictor(loop) -> None:  # type: ignore[no-untyped-def]
    allocator, agents, _ = loop
    stub = allocator_pb2_grpc.AllocatorServiceStub(channel(allocator.address))
    assert (
        _wait(lambda: not stub.GetPlan(allocator_pb2.GetPlanRequest(), timeout=2).node_stale, 5.0)
        is not None
    )
    stub.SubmitIntent(allocator_pb2.SubmitIntentRequest(intent=_online_intent()), timeout=5)
    snapshot = allocator.handle.loop.current()
    submitted_at = snapshot.generation if snapshot is not None else 0
    took = _wait(lambda: _workers(agents[0], "web") > 0, 5.0)
    assert took is not None, "the intent never reached the agent's pools"
    # Counted in ticks (plan generations), not wall time: a busy host stretches ticks, not this.
    applied_in = agents[0].backend.plan_generation - submitted_at  # type: ignore[attr-defined]
    assert applied_in <= 2, f"pools changed {applied_in} ticks after the submission ({took:.3f}s)"

    # Real service times flow back: the allocator's predictor learns them from the agent.
    predictor = allocator.handle.loop.predictor
    assert (
        _wait(lambda: (s := predictor.snapshot().get("web")) is not None and s.count >= 10, 8.0)
        is not None
    )
    learned = predictor.snapshot()["web"]
    assert 0.5 < learned.mean_ms < 200.0
    plan = stub.GetPlan(allocator_pb2.GetPlanRequest(), timeout=2)
    web = next(a for a in plan.node_plan.allocations if a.intent_id == "web")
    assert web.workers >= 1 and web.arrival_rate_per_s == 30.0

    # Deleting the intent removes its pool within two ticks as well.
    stub.DeleteIntent(allocator_pb2.DeleteIntentRequest(id="web"), timeout=5)
    assert _wait(lambda: _workers(agents[0], "web") == 0, 2 * TICK_S + 0.5) is not None


def test_agent_loss_marks_the_node_stale_and_the_loop_resumes(loop) -> None:  # type: ignore[no-untyped-def]
    allocator, agents, agent_port = loop
    stub = allocator_pb2_grpc.AllocatorServiceStub(channel(allocator.address))
    stub.SubmitIntent(allocator_pb2.SubmitIntentRequest(intent=_online_intent()), timeout=5)
    assert _wait(lambda: _workers(agents[0], "web") > 0, 5.0) is not None

    agents[0].stop(0.2)  # the agent goes away (its pools with it)
    stale = lambda: stub.GetPlan(allocator_pb2.GetPlanRequest(), timeout=2).node_stale  # noqa: E731
    assert _wait(stale, 5.0) is not None, "the allocator never marked the node stale"
    gauge = lambda: REGISTRY.get_sample_value("parfusion_allocator_node_stale")  # noqa: E731
    assert _wait(lambda: gauge() == 1.0, 2.0) is not None, "stale node not visible in metrics"
    reply = stub.GetPlan(allocator_pb2.GetPlanRequest(), timeout=2)  # still serving
    assert any(a.intent_id == "web" for a in reply.node_plan.allocations)

    agents.append(_agent(agent_port))  # back on the same address
    assert _wait(lambda: not stale(), 8.0) is not None, "the loop did not resume"
    assert _wait(lambda: _workers(agents[-1], "web") > 0, 3.0) is not None
    assert _wait(lambda: gauge() == 0.0, 2.0) is not None


@pytest.mark.parametrize("cpu_units", [2])
def test_urgent_work_takes_a_unit_on_a_full_node_where_batch_runs_in_idle_time(loop) -> None:  # type: ignore[no-untyped-def]
    """A 2-unit node: elastic online work holds both units (it needs them for its deadline),
    batch runs in idle time holding none. An URGENT intent gets its minimum within two ticks,
    from the online work above its minimum, and the plan says so."""
    allocator, agents, _ = loop
    stub = allocator_pb2_grpc.AllocatorServiceStub(channel(allocator.address))
    web = intent_pb2.ResourceIntent(
        id="web",
        name="web",
        workload_class=intent_pb2.WORKLOAD_CLASS_ONLINE,
        priority=800,
        slo=intent_pb2.Slo(deadline_ms=30.0),
        parallelism=intent_pb2.Parallelism(min=1, max=2),
        speedup=intent_pb2.Speedup(parallel_fraction=0.9, base_service_ms=40.0),  # 2 units: 22 ms
        demand=intent_pb2.Demand(arrival_rate_per_s=2.0),
        elastic=True,
    )
    batch = intent_pb2.ResourceIntent(
        id="train",
        name="train",
        workload_class=intent_pb2.WORKLOAD_CLASS_BATCH,
        priority=300,
        parallelism=intent_pb2.Parallelism(min=1, max=2),
        speedup=intent_pb2.Speedup(parallel_fraction=0.95, base_service_ms=5.0),
        demand=intent_pb2.Demand(work_units=1_000_000),
        preemptible=True,
        elastic=True,
    )
    for intent in (web, batch):
        stub.SubmitIntent(allocator_pb2.SubmitIntentRequest(intent=intent), timeout=5)

    def allocation(intent_id: str) -> intent_pb2.Allocation:
        reply = stub.GetIntent(allocator_pb2.GetIntentRequest(id=intent_id), timeout=2)
        return reply.allocation

    assert _wait(lambda: allocation("web").units == 2, 5.0) is not None
    assert allocation("train").units == 0 and allocation("train").sched_policy == "idle"
    urgent = build_urgent_intent("e1", "fall-detected", 3_000.0, UrgentIntentTemplate())
    stub.SubmitIntent(allocator_pb2.SubmitIntentRequest(intent=urgent), timeout=5)
    snapshot = allocator.handle.loop.current()
    submitted_at = snapshot.generation if snapshot is not None else 0
    assert _wait(lambda: allocation(urgent.id).units >= 1, 5.0) is not None
    planned_at = allocator.handle.loop.current().generation
    assert planned_at - submitted_at <= 2, f"urgent planned {planned_at - submitted_at} ticks late"
    got = allocation(urgent.id)
    assert got.state == intent_pb2.ALLOCATION_STATE_ADMITTED, got.reason
    assert allocation("web").units == 1  # kept its minimum
    assert _wait(lambda: _workers(agents[0], urgent.id) >= 1, 3.0) is not None
