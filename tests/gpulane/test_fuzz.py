"""GpuLaneService under fuzzed requests (an 8-GPU node behind the NVML boundary): every method,
bytes mutated from valid examples. No call may end INTERNAL or UNKNOWN; afterwards the service
is healthy and still applies the valid plan."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from parfusion.v1 import gpulane_pb2, gpulane_pb2_grpc
from services.common.config import build_settings
from services.common.grpc_server import RunningServer, start_grpc_server
from services.gpulane.nvml import Nvml
from services.gpulane.server import SERVICE_NAME, GpuLaneServicer, build_controller
from tests.fuzzing import fuzz_grpc_service
from tests.gpulane.fake_nvml import h200_node
from tests.gpulane.plans import demo_plan

SERVICE = gpulane_pb2.DESCRIPTOR.services_by_name["GpuLaneService"]
EXAMPLES = {
    "ApplyGpuPlan": gpulane_pb2.ApplyGpuPlanRequest(plan=demo_plan()),
    "GetGpuTelemetry": gpulane_pb2.GetGpuTelemetryRequest(),
    "PreviewCommands": gpulane_pb2.PreviewCommandsRequest(plan=demo_plan()),
}


@pytest.fixture
def server(home: Path) -> Iterator[RunningServer]:
    settings = build_settings("gpulane", env={})
    servicer = GpuLaneServicer(build_controller(settings, nvml=Nvml(h200_node())))
    running = start_grpc_server(
        [(gpulane_pb2_grpc.add_GpuLaneServiceServicer_to_server, servicer, SERVICE_NAME)], port=0
    )
    yield running
    running.stop(0)


def test_no_request_crashes_the_gpu_lane_service(server: RunningServer) -> None:
    with grpc.insecure_channel(server.address) as ch:
        fuzz_grpc_service(ch, SERVICE, EXAMPLES)
        stub = gpulane_pb2_grpc.GpuLaneServiceStub(ch)
        reply = stub.ApplyGpuPlan(gpulane_pb2.ApplyGpuPlanRequest(plan=demo_plan()), timeout=5)
        assert reply.mode == gpulane_pb2.APPLY_MODE_DRY_RUN
        assert (
            len(
                stub.GetGpuTelemetry(
                    gpulane_pb2.GetGpuTelemetryRequest(), timeout=5
                ).telemetry.devices
            )
            == 8
        )
