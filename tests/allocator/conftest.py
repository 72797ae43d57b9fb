"""Allocator test fixtures: settings on free ports, an in-process allocator, and peer servers.

The node agent and gpulane peers here are small in-test servicers of their real protos
(NodeAgentService, GpuLaneService), standing in only at the boundary the allocator talks to:
they record the plans pushed to them and answer the telemetry the test sets. The closed loop
with the real node agent is tested with the node agent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from parfusion.v1 import (
    allocator_pb2_grpc,
    gpulane_pb2,
    gpulane_pb2_grpc,
    intent_pb2,
    nodeagent_pb2,
    nodeagent_pb2_grpc,
    telemetry_pb2,
)
from services.allocator.server import RunningAllocator, start_allocator
from services.common.config import ServiceSettings, build_settings
from services.common.grpc_server import RunningServer, start_grpc_server

NODEAGENT = nodeagent_pb2.DESCRIPTOR.services_by_name["NodeAgentService"].full_name
GPULANE = gpulane_pb2.DESCRIPTOR.services_by_name["GpuLaneService"].full_name


class PeerAgent(nodeagent_pb2_grpc.NodeAgentServiceServicer):
    """NodeAgentService peer: records ApplyNodePlan, answers GetNodeTelemetry with ``telemetry``."""

    def __init__(self) -> None:
        self.telemetry = telemetry_pb2.NodeTelemetry(
            node="node-0", backend="modeled", arena_cpus=[0, 1, 2, 3]
        )
        self.plans: list[intent_pb2.NodePlan] = []
        self.pulls = 0
        self.lock = threading.Lock()

    def GetNodeTelemetry(self, request: Any, context: Any) -> Any:  # noqa: N802
        with self.lock:
            self.pulls += 1
            tel = telemetry_pb2.NodeTelemetry()
            tel.CopyFrom(self.telemetry)
            del self.telemetry.latencies[:]  # recent samples are reported once, like the agent does
        return nodeagent_pb2.GetNodeTelemetryResponse(telemetry=tel)

    def ApplyNodePlan(self, request: Any, context: Any) -> Any:  # noqa: N802
        with self.lock:
            self.plans.append(request.plan)
        return nodeagent_pb2.ApplyNodePlanResponse(generation=request.plan.generation)


class PeerGpuLane(gpulane_pb2_grpc.GpuLaneServiceServicer):
    """GpuLaneService peer: records ApplyGpuPlan, answers GetGpuTelemetry with ``telemetry``."""

    def __init__(self) -> None:
        self.telemetry = telemetry_pb2.GpuTelemetry(nvml_available=False)
        self.plans: list[intent_pb2.GpuPlan] = []

    def GetGpuTelemetry(self, request: Any, context: Any) -> Any:  # noqa: N802
        return gpulane_pb2.GetGpuTelemetryResponse(telemetry=self.telemetry)

    def ApplyGpuPlan(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.plans.append(request.plan)
        return gpulane_pb2.ApplyGpuPlanResponse(generation=request.plan.generation)


@dataclass
class Peers:
    agent: PeerAgent = field(default_factory=PeerAgent)
    gpulane: PeerGpuLane = field(default_factory=PeerGpuLane)
    agent_server: RunningServer | None = None
    gpulane_server: RunningServer | None = None
    agent_port: int = 0
    gpulane_port: int = 0

    def start_agent(self) -> None:
        self.agent_server = start_grpc_server(
            [(nodeagent_pb2_grpc.add_NodeAgentServiceServicer_to_server, self.agent, NODEAGENT)],
            port=self.agent_port,
        )
        self.agent_port = self.agent_server.port

    def stop_agent(self) -> None:
        if self.agent_server is not None:
            self.agent_server.stop(0)
            self.agent_server = None

    def start_gpulane(self) -> None:
        self.gpulane_server = start_grpc_server(
            [(gpulane_pb2_grpc.add_GpuLaneServiceServicer_to_server, self.gpulane, GPULANE)],
            port=self.gpulane_port,
        )
        self.gpulane_port = self.gpulane_server.port

    def stop(self) -> None:
        self.stop_agent()
        if self.gpulane_server is not None:
            self.gpulane_server.stop(0)
            self.gpulane_server = None


@pytest.fixture
def peers() -> Iterator[Peers]:
    p = Peers()
    p.start_agent()
    p.start_gpulane()
    yield p
    p.stop()


SettingsFactory = Callable[..., ServiceSettings]


@pytest.fixture
def make_settings(home: Path) -> SettingsFactory:
    """Allocator settings in the test's home; no peers and no seeding unless asked."""

    def make(**overrides: Any) -> ServiceSettings:
        base: dict[str, Any] = {
            "port": 0,
            "metrics_port": None,
            "seed_intents": False,
            "nodeagent_address": "",
            "gpulane_address": "",
            "tick_ms": 50,
            "cpu_units": 4,
        }
        base.update(overrides)
        return build_settings("allocator", overrides=base)

    return make


@pytest.fixture
def start(make_settings: SettingsFactory) -> Iterator[Callable[..., RunningAllocator]]:
    """Start an in-process allocator on a free port; every one started is stopped afterwards."""
    started: list[RunningAllocator] = []

    def go(
        *, start_loop: bool = False, metrics_port: int | None = None, **overrides: Any
    ) -> RunningAllocator:
        running = start_allocator(
            make_settings(**overrides), port=0, metrics_port=metrics_port, start_loop=start_loop
        )
        started.append(running)
        return running

    yield go
    for running in started:
        running.stop(0)


@pytest.fixture
def stub_for() -> Iterator[Callable[[str], allocator_pb2_grpc.AllocatorServiceStub]]:
    channels: list[grpc.Channel] = []

    def make(address: str) -> allocator_pb2_grpc.AllocatorServiceStub:
        ch = grpc.insecure_channel(address)
        channels.append(ch)
        return allocator_pb2_grpc.AllocatorServiceStub(ch)

    yield make
    for ch in channels:
        ch.close()


def online_intent(
    name: str = "web", intent_id: str = "", deadline_ms: float = 50.0, **fields: Any
) -> intent_pb2.ResourceIntent:
    intent = intent_pb2.ResourceIntent(
        id=intent_id,
        name=name,
        workload_class=intent_pb2.WORKLOAD_CLASS_ONLINE,
        slo=intent_pb2.Slo(deadline_ms=deadline_ms),
        parallelism=intent_pb2.Parallelism(min=1, max=4),
        speedup=intent_pb2.Speedup(parallel_fraction=0.9, base_service_ms=20),
        demand=intent_pb2.Demand(arrival_rate_per_s=10),
        **fields,
    )
    return intent


def batch_intent(
    name: str = "job", intent_id: str = "", **fields: Any
) -> intent_pb2.ResourceIntent:
    return intent_pb2.ResourceIntent(
        id=intent_id,
        name=name,
        workload_class=intent_pb2.WORKLOAD_CLASS_BATCH,
        parallelism=intent_pb2.Parallelism(min=1, max=8),
        demand=intent_pb2.Demand(work_units=100),
        preemptible=True,
        **fields,
    )
