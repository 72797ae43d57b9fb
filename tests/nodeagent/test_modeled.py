"""The modeled node backend: the real backend's telemetry shape, on a clock the test controls."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from parfusion.v1 import (
    allocator_pb2,
    allocator_pb2_grpc,
    intent_pb2,
    nodeagent_pb2,
    nodeagent_pb2_grpc,
    telemetry_pb2,
)
from services.allocator.server import start_allocator
from services.common.clients import channel
from services.common.config import build_settings
from services.common.errors import FailedPrecondition, InvalidArgument
from services.nodeagent.backend import BACKENDS, BackendOptions
from services.nodeagent.modeled import ModeledBackend
from services.nodeagent.server import start_nodeagent
from services.sim.params import load_model_params
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def backend(clock: Clock) -> ModeledBackend:
    params = load_model_params(ROOT / "configs" / "model.yaml")
    return ModeledBackend(BackendOptions(node_name="node-m"), params=params, clock=clock, seed=5)


def plan(online_workers: int = 4, **online: object) -> intent_pb2.NodePlan:
    p = intent_pb2.NodePlan(generation=7)
    p.allocations.add(
        intent_id="on",
        intent_name="online",
        workload_class=intent_pb2.WORKLOAD_CLASS_ONLINE,
        workers=online_workers,
        base_service_ms=10.6,
        parallel_fraction=0.9,
        arrival_rate_per_s=150,
        deadline_ms=53,
        cpu_set=[0, 1, 2, 3],
        gpu_lane="online",
        gpu_indexes=[0, 1],
        stream_priority=1,
        **online,
    )
    p.allocations.add(
        intent_id="b",
        workload_class=intent_pb2.WORKLOAD_CLASS_BATCH,
        workers=8,
        base_service_ms=10,
        parallel_fraction=0.95,
        nice=19,
        sched_policy="idle",
    )
    return p


def test_registered_under_its_config_name() -> None:
    assert "modeled" in BACKENDS


def test_telemetry_reports_what_the_model_served(backend: ModeledBackend, clock: Clock) -> None:
    applied = backend.apply(plan())
    assert [a.workers for a in applied] == [4, 8]
    assert backend.owned_pids() == set()
    clock.now += 5.0
    tel = backend.telemetry()
    assert tel.backend == "modeled" and tel.node == "node-m" and tel.plan_generation == 7
    assert list(tel.arena_cpus) == list(range(16))
    assert len(tel.cpu_percent_per_core) == 16 and tel.cpu_pressure.available
    on = {s.intent_id: s for s in tel.latencies}["on"]
    assert 600 < on.count < 900  # ~150/s for 5 s
    assert 0 < on.p50_ms <= on.p95_ms <= on.p99_ms
    assert on.window_count == on.count
    assert len(on.recent_service_ms) == 256  # bounded: the newest samples
    pools = {p.intent_id: p for p in tel.pools}
    assert pools["on"].kind == "online" and list(pools["on"].cpu_set) == [0, 1, 2, 3]
    assert pools["b"].kind == "batch" and pools["b"].items_per_s > 0
    assert pools["b"].sched_policy == "idle" and pools["b"].nice == 19
    again = backend.telemetry()  # samples are drained: each reported once
    assert not {s.intent_id: s for s in again.latencies}["on"].recent_service_ms
    clock.now += 1.0
    peek = {s.intent_id: s for s in backend.telemetry(drain=False).latencies}["on"]
    assert peek.recent_service_ms and peek.window_count > 0  # a reader that does not consume
    drained = {s.intent_id: s for s in backend.telemetry().latencies}["on"]
    assert list(drained.recent_service_ms) == list(peek.recent_service_ms)
    assert drained.window_count == peek.window_count


def test_an_intent_missing_from_the_plan_stops(backend: ModeledBackend, clock: Clock) -> None:
    backend.apply(plan())
    clock.now += 1.0
    only_batch = plan()
    del only_batch.allocations[0]
    backend.apply(only_batch)
    clock.now += 1.0
    assert [s.intent_id for s in backend.telemetry().latencies] == ["b"]


def test_disturbance_is_accepted_reported_and_expires(
    backend: ModeledBackend, clock: Clock
) -> None:
    backend.apply(plan())
    accepted, expires = backend.inject_disturbance(
        telemetry_pb2.Disturbance(cpu_pressure=0.5, gpu_pressure=0.2, duration_s=3, source="t")
    )
    assert accepted and expires == 3
    clock.now += 1.0
    tel = backend.telemetry()
    assert tel.active_disturbance.cpu_pressure == 0.5
    assert tel.disturbance_remaining_s == pytest.approx(2.0)
    assert tel.cpu_pressure.full_avg10 == pytest.approx(50.0)
    clock.now += 3.0
    assert backend.telemetry().disturbance_remaining_s == 0
    with pytest.raises(InvalidArgument, match="disturbance.cpu_pressure"):
        backend.inject_disturbance(telemetry_pb2.Disturbance(cpu_pressure=2, duration_s=1))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"nice": 40}, "allocations[0].nice"),
        ({"sched_policy": "fifo"}, "allocations[0].sched_policy"),
        ({"parallel_fraction": 1.5}, "allocations[0].parallel_fraction"),
        ({"deadline_ms": -1}, "allocations[0].deadline_ms"),
    ],
)
def test_bad_plans_are_refused_whole(backend: ModeledBackend, change, field) -> None:
    backend.apply(plan())
    bad = plan()
    for key, value in change.items():
        setattr(bad.allocations[0], key, value)
    with pytest.raises(InvalidArgument, match=field.replace("[", r"\[").replace("]", r"\]")):
        backend.apply(bad)
    assert backend.node.runs["on"].assignment.units == 4  # the previous plan still runs


def test_cpus_outside_the_arena_and_oversized_plans_are_refused(backend: ModeledBackend) -> None:
    bad = plan()
    bad.allocations[0].cpu_set.append(99)
    with pytest.raises(InvalidArgument, match="cpu_set"):
        backend.apply(bad)
    with pytest.raises(FailedPrecondition, match="holds 20 units; the modeled arena has 16"):
        backend.apply(plan(online_workers=12, units=20))
    # workers beyond the units held share the cores (light work, idle-time batch): accepted
    applied = backend.apply(plan(online_workers=12, units=4))
    assert {a.intent_id: a.workers for a in applied}["on"] == 12


def test_long_silence_catches_up_without_simulating_hours(
    backend: ModeledBackend, clock: Clock
) -> None:
    backend.apply(plan())
    clock.now += 3600.0
    tel = backend.telemetry()
    assert backend.node.now_s <= 31.0
    assert {s.intent_id: s for s in tel.latencies}["on"].count > 0


# -- over real gRPC: the allocator's loop drives the node agent server running this backend ----


@pytest.mark.integration
def test_allocator_plans_on_the_modeled_node_over_grpc(home: Path) -> None:
    agent_port = free_port()
    agent = start_nodeagent(
        build_settings(
            "nodeagent", overrides={"port": agent_port, "backend": "modeled"}, env=dict(os.environ)
        ),
        port=agent_port,
    )
    allocator = start_allocator(
        build_settings(
            "allocator",
            overrides={
                "port": 0,
                "metrics_port": None,
                "seed_intents": False,
                "nodeagent_address": f"127.0.0.1:{agent_port}",
                "gpulane_address": "",
            },
            env=dict(os.environ),
        ),
        port=0,
        start_loop=False,  # the test ticks the loop itself
    )
    try:
        assert agent.backend.name == "modeled"
        with channel(allocator.address) as ch_alloc, channel(f"127.0.0.1:{agent_port}") as ch_agent:
            alloc = allocator_pb2_grpc.AllocatorServiceStub(ch_alloc)
            node = nodeagent_pb2_grpc.NodeAgentServiceStub(ch_agent)
            intent = intent_pb2.ResourceIntent(
                id="detect",
                name="detect",
                workload_class=intent_pb2.WORKLOAD_CLASS_ONLINE,
                slo=intent_pb2.Slo(deadline_ms=53),
                speedup=intent_pb2.Speedup(base_service_ms=10.6, parallel_fraction=0.9),
                demand=intent_pb2.Demand(arrival_rate_per_s=150),
                parallelism=intent_pb2.Parallelism(min=1, max=8),
            )
            alloc.SubmitIntent(allocator_pb2.SubmitIntentRequest(intent=intent), timeout=5)
            loop = allocator.handle.loop
            for _ in range(6):
                assert loop.tick() is not None
                time.sleep(0.25)
            tel = node.GetNodeTelemetry(
                nodeagent_pb2.GetNodeTelemetryRequest(), timeout=5
            ).telemetry
            assert tel.backend == "modeled"
            pools = {p.intent_id: p for p in tel.pools}
            plan = alloc.GetPlan(allocator_pb2.GetPlanRequest(), timeout=5)
            planned = {a.intent_id: a.workers for a in plan.node_plan.allocations}
            assert planned["detect"] >= 1 and pools["detect"].workers == planned["detect"]
            assert plan.node_plan.cpu_units == 16  # the modeled arena the agent reported
            assert not plan.node_stale
            stats = loop.service_stats()["detect"]
            assert stats.count > 50 and stats.observed_units == planned["detect"]
            # a dashboard's read (no drain) leaves the samples for the allocator's next pull
            time.sleep(0.3)
            seen = node.GetNodeTelemetry(nodeagent_pb2.GetNodeTelemetryRequest(), timeout=5)
            peeked = {s.intent_id: s for s in seen.telemetry.latencies}["detect"]
            assert len(peeked.recent_service_ms) > 0
            loop.tick()
            after = loop.service_stats()["detect"].count
            assert after >= stats.count + len(peeked.recent_service_ms)
            reply = node.InjectDisturbance(
                nodeagent_pb2.InjectDisturbanceRequest(
                    disturbance=telemetry_pb2.Disturbance(
                        cpu_pressure=0.6, gpu_pressure=0.3, network_pressure=0.2, duration_s=30
                    )
                ),
                timeout=5,
            )
            assert reply.accepted and reply.backend == "modeled"
            loop.tick()
            assert loop.node_state().disturbance.cpu == pytest.approx(0.6)
    finally:
        allocator.stop(0.5)
        agent.stop(0.5)
