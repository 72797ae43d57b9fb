"""NodeAgentService (modeled backend) under fuzzed requests: every method, bytes mutated from
valid examples. No call may end INTERNAL or UNKNOWN; afterwards the agent is healthy and its
telemetry still answers (a value it accepted never breaks a later call)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from parfusion.v1 import nodeagent_pb2, nodeagent_pb2_grpc, telemetry_pb2
from services.common.config import build_settings
from services.nodeagent.server import RunningNodeAgent, start_nodeagent
from tests.fuzzing import fuzz_grpc_service
from tests.nodeagent.test_modeled import plan

SERVICE = nodeagent_pb2.DESCRIPTOR.services_by_name["NodeAgentService"]


EXAMPLES = {
    "ApplyNodePlan": nodeagent_pb2.ApplyNodePlanRequest(plan=plan(online_workers=2)),
    "GetNodeTelemetry": nodeagent_pb2.GetNodeTelemetryRequest(drain_samples=True),
    "InjectDisturbance": nodeagent_pb2.InjectDisturbanceRequest(
        disturbance=telemetry_pb2.Disturbance(
            cpu_pressure=0.5, gpu_pressure=0.3, network_pressure=0.2, duration_s=2
        )
    ),
    "ControlProcess": nodeagent_pb2.ControlProcessRequest(pid=1, cpu_set=[0], nice=5),
}


@pytest.fixture
def agent(home: Path) -> Iterator[RunningNodeAgent]:
    settings = build_settings("nodeagent", overrides={"port": 0, "backend": "modeled"}, env={})
    running = start_nodeagent(settings)
    yield running
    running.stop()


def test_no_request_crashes_the_node_agent(agent: RunningNodeAgent) -> None:
    with grpc.insecure_channel(agent.address) as ch:
        fuzz_grpc_service(ch, SERVICE, EXAMPLES)
        stub = nodeagent_pb2_grpc.NodeAgentServiceStub(ch)
        stub.ApplyNodePlan(
            nodeagent_pb2.ApplyNodePlanRequest(plan=plan(online_workers=2)), timeout=5
        )
        tel = stub.GetNodeTelemetry(nodeagent_pb2.GetNodeTelemetryRequest(), timeout=5)
        assert tel.telemetry.plan_generation == 7
