"""Plans and the loop's telemetry as deltas over real gRPC, on the modeled node agent: a delta
against the plan held changes only what it names, any other is refused whole with
resync_required; telemetry against the reply the caller holds carries only what changed."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from parfusion.v1 import intent_pb2, nodeagent_pb2, nodeagent_pb2_grpc
from services.common.clients import channel
from services.common.config import build_settings
from services.nodeagent.server import RunningNodeAgent, start_nodeagent


@pytest.fixture
def agent(home: Path) -> Iterator[RunningNodeAgent]:
    settings = build_settings(
        "nodeagent", overrides={"port": 0, "backend": "modeled"}, env=dict(os.environ)
    )
    running = start_nodeagent(settings)
    try:
        yield running
    finally:
        running.stop()


def _allocation(intent_id: str, workers: int) -> intent_pb2.Allocation:
    return intent_pb2.Allocation(
        intent_id=intent_id,
        workload_class=intent_pb2.WORKLOAD_CLASS_ONLINE,
        workers=workers,
        units=workers,
        base_service_ms=10.0,
        arrival_rate_per_s=20.0,
        deadline_ms=100.0,
    )


def _apply(stub, generation, allocations, base=0, removed=()):
    return stub.ApplyNodePlan(
        nodeagent_pb2.ApplyNodePlanRequest(
            plan=intent_pb2.NodePlan(generation=generation, allocations=allocations),
            base_generation=base,
            removed_intent_ids=list(removed),
        ),
        timeout=10,
    )


def _workers(agent: RunningNodeAgent) -> dict[str, int]:
    return {i: run.assignment.units for i, run in agent.backend.node.runs.items()}


def test_a_plan_delta_changes_only_what_it_names(agent: RunningNodeAgent) -> None:
    stub = nodeagent_pb2_grpc.NodeAgentServiceStub(channel(agent.address))
    whole = _apply(stub, 1, [_allocation("a", 1), _allocation("b", 2), _allocation("c", 1)])
    assert not whole.resync_required and len(whole.applied) == 3
    delta = _apply(stub, 2, [_allocation("b", 3), _allocation("d", 1)], base=1, removed=["c"])
    assert not delta.resync_required
    assert sorted(a.intent_id for a in delta.applied) == ["b", "d"]
    assert _workers(agent) == {"a": 1, "b": 3, "d": 1}

    # against a plan it does not hold (1 is gone; 7 never was): refused, nothing changed
    for base in (1, 7):
        stale = _apply(stub, 3, [_allocation("a", 0)], base=base)
        assert stale.resync_required and stale.generation == 2 and not stale.applied
    # removing an intent it does not hold is a disagreement too
    assert _apply(stub, 3, [], base=2, removed=["zz"]).resync_required
    assert _workers(agent) == {"a": 1, "b": 3, "d": 1}

    # a whole plan is always taken, and the next delta is against it
    assert not _apply(stub, 4, [_allocation("e", 1)]).resync_required
    assert not _apply(stub, 5, [_allocation("e", 2)], base=4).resync_required
    assert _workers(agent) == {"e": 2}


def test_telemetry_against_the_reply_held_carries_only_changes(agent: RunningNodeAgent) -> None:
    stub = nodeagent_pb2_grpc.NodeAgentServiceStub(channel(agent.address))
    _apply(stub, 1, [_allocation("a", 1), _allocation("b", 1)])

    def pull(known: int) -> nodeagent_pb2.GetNodeTelemetryResponse:
        request = nodeagent_pb2.GetNodeTelemetryRequest(
            drain_samples=True, delta=True, known_generation=known
        )
        return stub.GetNodeTelemetry(request, timeout=10)

    first = pull(0)
    assert first.base_generation == 0
    assert sorted(p.intent_id for p in first.telemetry.pools) == ["a", "b"]
    steady = pull(first.generation)
    assert steady.base_generation == first.generation and steady.generation > first.generation
    assert not steady.telemetry.pools and not steady.removed_intent_ids  # nothing changed
    assert all(s.recent_service_ms for s in steady.telemetry.latencies)  # only fresh samples

    _apply(stub, 2, [_allocation("a", 2)], base=1, removed=["b"])
    changed = pull(steady.generation)
    assert [p.intent_id for p in changed.telemetry.pools] == ["a"]
    assert changed.telemetry.pools[0].workers == 2
    assert list(changed.removed_intent_ids) == ["b"]

    # a caller holding something else (a lost reply) gets everything again
    again = pull(steady.generation)
    assert again.base_generation == 0 and [p.intent_id for p in again.telemetry.pools] == ["a"]

    # dashboards' plain reads are whole and leave the loop's stream alone
    plain = stub.GetNodeTelemetry(nodeagent_pb2.GetNodeTelemetryRequest(), timeout=10)
    assert plain.base_generation == 0 and len(plain.telemetry.pools) == 1
    assert pull(again.generation).base_generation == again.generation
