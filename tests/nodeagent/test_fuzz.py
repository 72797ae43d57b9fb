"""NodeAgentService (modeled backend) under fuzzed requests: every method, bytes mutated from
valid examples. No call may end INTERNAL or UNKNOWN; afterwards the agent is healthy and its
telemetry still answers (a value it accepted never breaks a later call)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import given
from hypothesis import strategies as st

from parfusion.v1 import intent_pb2, nodeagent_pb2, nodeagent_pb2_grpc, telemetry_pb2
from services.common.config import build_settings
from services.nodeagent.server import RunningNodeAgent, start_nodeagent
from tests.fuzzing import FORBIDDEN_CODES, fuzz_settings, proto_bodies, raw_call

SERVICE = nodeagent_pb2.DESCRIPTOR.services_by_name["NodeAgentService"]


def _plan() -> intent_pb2.NodePlan:
    plan = intent_pb2.NodePlan(node="node-0", generation=7, policy="parfusion")
    plan.allocations.add(
        intent_id="on",
        intent_name="online",
        workload_class=intent_pb2.WORKLOAD_CLASS_ONLINE,
        workers=2,
        base_service_ms=10.6,
        parallel_fraction=0.9,
        arrival_rate_per_s=150,
        deadline_ms=53,
        cpu_set=[0, 1],
        gpu_lane="online",
        gpu_indexes=[0],
        stream_priority=1,
    )
    plan.allocations.add(
        intent_id="b",
        workload_class=intent_pb2.WORKLOAD_CLASS_BATCH,
        workers=1,
        base_service_ms=10,
        parallel_fraction=0.95,
        nice=19,
        sched_policy="idle",
    )
    return plan


EXAMPLES = {
    "ApplyNodePlan": nodeagent_pb2.ApplyNodePlanRequest(plan=_plan()),
    "GetNodeTelemetry": nodeagent_pb2.GetNodeTelemetryRequest(drain_samples=True),
    "InjectDisturbance": nodeagent_pb2.InjectDisturbanceRequest(
        disturbance=telemetry_pb2.Disturbance(
            cpu_pressure=0.5, gpu_pressure=0.3, network_pressure=0.2, duration_s=2
        )
    ),
    "ControlProcess": nodeagent_pb2.ControlProcessRequest(pid=1, cpu_set=[0], nice=5),
}
assert set(EXAMPLES) == set(SERVICE.methods_by_name), "a method without a fuzz example"


@pytest.fixture
def agent(home: Path) -> Iterator[RunningNodeAgent]:
    settings = build_settings("nodeagent", overrides={"port": 0, "backend": "modeled"}, env={})
    running = start_nodeagent(settings)
    yield running
    running.stop()


def test_no_request_crashes_the_node_agent(agent: RunningNodeAgent) -> None:
    with grpc.insecure_channel(agent.address) as ch:

        @fuzz_settings()
        @given(data=st.data())
        def fuzz(data: st.DataObject) -> None:
            method = data.draw(st.sampled_from(sorted(EXAMPLES)), label="method")
            body = data.draw(proto_bodies(EXAMPLES[method]), label="body")
            code = raw_call(ch, SERVICE, method, body)
            assert code not in FORBIDDEN_CODES, (method, code)

        fuzz()
        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        stub = nodeagent_pb2_grpc.NodeAgentServiceStub(ch)
        stub.ApplyNodePlan(nodeagent_pb2.ApplyNodePlanRequest(plan=_plan()), timeout=5)
        tel = stub.GetNodeTelemetry(nodeagent_pb2.GetNodeTelemetryRequest(), timeout=5)
        assert tel.telemetry.plan_generation == 7
