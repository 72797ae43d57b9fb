"""AllocatorService under fuzzed requests: every method, bytes mutated from valid examples
(extremes, unknown enums, invalid UTF-8, damaged bytes). No call may end INTERNAL or UNKNOWN,
and afterwards the allocator is healthy, its loop still plans and its store still answers.
``make fuzz`` runs 10,000 inputs (PARFUSION_FUZZ_EXAMPLES); ``make test`` a few hundred."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import grpc
import pytest

from parfusion.v1 import allocator_pb2, allocator_pb2_grpc, intent_pb2, telemetry_pb2
from services.allocator.server import RunningAllocator
from services.core.convert import intents_in_file
from tests.conftest import ROOT
from tests.fuzzing import fuzz_grpc_service

SERVICE = allocator_pb2.DESCRIPTOR.services_by_name["AllocatorService"]
INTENT = intents_in_file(ROOT / "configs" / "intents" / "online-inference.yaml")[0]
EXAMPLES = {
    "SubmitIntent": allocator_pb2.SubmitIntentRequest(intent=INTENT),
    "GetIntent": allocator_pb2.GetIntentRequest(id="intent-1"),
    "ListIntents": allocator_pb2.ListIntentsRequest(
        workload_class=intent_pb2.WORKLOAD_CLASS_ONLINE
    ),
    "DeleteIntent": allocator_pb2.DeleteIntentRequest(id="intent-1"),
    "GetPlan": allocator_pb2.GetPlanRequest(known_generation=3, deltas=True),
    "WatchPlans": allocator_pb2.WatchPlansRequest(include_current=True, deltas=True),
    "PreviewPlan": allocator_pb2.PreviewPlanRequest(
        disturbance=telemetry_pb2.Disturbance(cpu_pressure=0.5, gpu_pressure=0.2),
        arrival_rate_scale=2.0,
        policy="baseline",
    ),
    "SetPolicy": allocator_pb2.SetPolicyRequest(name="baseline"),
    "ListPolicies": allocator_pb2.ListPoliciesRequest(),
    "ReportTelemetry": allocator_pb2.ReportTelemetryRequest(
        node=telemetry_pb2.NodeTelemetry(node="node-0", backend="modeled", arena_cpus=[0, 1])
    ),
}


@pytest.fixture
def target(
    start: Callable[..., RunningAllocator],
) -> Iterator[tuple[RunningAllocator, grpc.Channel]]:
    running = start(start_loop=True, max_intents=64, tick_ms=20)
    with grpc.insecure_channel(running.address) as ch:
        yield running, ch


def test_no_request_crashes_the_allocator(target: tuple[RunningAllocator, grpc.Channel]) -> None:
    running, ch = target
    fuzz_grpc_service(ch, SERVICE, EXAMPLES)
    # alive afterwards: the store answers, the loop still plans what it accepted
    stub = allocator_pb2_grpc.AllocatorServiceStub(ch)
    stub.ListIntents(allocator_pb2.ListIntentsRequest(), timeout=5)
    before = stub.GetPlan(allocator_pb2.GetPlanRequest(), timeout=5).node_plan.generation
    deadline = time.monotonic() + 10
    while stub.GetPlan(allocator_pb2.GetPlanRequest(), timeout=5).node_plan.generation == before:
        assert time.monotonic() < deadline, "the control loop stopped planning"
        time.sleep(0.05)
