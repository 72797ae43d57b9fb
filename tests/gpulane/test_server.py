"""GpuLaneService over gRPC on free ports: status codes, reflection-visible service, metrics,
and the real `python -m services.gpulane` process becoming healthy (as `make run` needs)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from parfusion.v1 import gpulane_pb2, gpulane_pb2_grpc
from services.common.config import build_settings
from services.common.grpc_server import RunningServer, start_grpc_server
from services.gpulane.nvml import Nvml
from services.gpulane.server import SERVICE_NAME, GpuLaneServicer, build_controller
from tests.conftest import ROOT, free_port
from tests.gpulane.fake_nvml import FakeGpu, h200_node
from tests.gpulane.plans import demo_plan


@pytest.fixture
def server(home: Path) -> Iterator[RunningServer]:
    settings = build_settings("gpulane", env={})
    fake = h200_node(gpu7=FakeGpu(utilization=90, pids=[31337]))
    servicer = GpuLaneServicer(build_controller(settings, nvml=Nvml(fake)))
    running = start_grpc_server(
        [(gpulane_pb2_grpc.add_GpuLaneServiceServicer_to_server, servicer, SERVICE_NAME)],
        port=0,
        metrics_port=0,
    )
    yield running
    running.stop(0)


def test_apply_preview_telemetry_over_grpc(server: RunningServer, home: Path) -> None:
    with grpc.insecure_channel(server.address) as ch:
        stub = gpulane_pb2_grpc.GpuLaneServiceStub(ch)
        reply = stub.ApplyGpuPlan(gpulane_pb2.ApplyGpuPlanRequest(plan=demo_plan()), timeout=5)
        assert reply.mode == gpulane_pb2.APPLY_MODE_DRY_RUN
        assert Path(reply.recorded_path).is_relative_to(home / "run")
        assert any(
            c.stdin.startswith("set_default_active_thread_percentage") for c in reply.commands
        )
        preview = stub.PreviewCommands(gpulane_pb2.PreviewCommandsRequest(), timeout=5)
        assert [d.intent_id for d in preview.decisions] == [d.intent_id for d in reply.decisions]
        telemetry = stub.GetGpuTelemetry(gpulane_pb2.GetGpuTelemetryRequest(), timeout=5).telemetry
        assert len(telemetry.devices) == 8 and not telemetry.devices[7].idle
        with pytest.raises(grpc.RpcError) as busy:
            stub.ApplyGpuPlan(
                gpulane_pb2.ApplyGpuPlanRequest(
                    plan=demo_plan(), mode=gpulane_pb2.APPLY_MODE_APPLY
                ),
                timeout=5,
            )
        assert busy.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "GPU 7" in busy.value.details()
        bad = demo_plan()
        bad.assignments[0].share_percent = -5
        with pytest.raises(grpc.RpcError) as invalid:
            stub.ApplyGpuPlan(gpulane_pb2.ApplyGpuPlanRequest(plan=bad), timeout=5)
        assert invalid.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "plan.assignments[0].share_percent" in invalid.value.details()
    body = (
        urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5)
        .read()
        .decode()
    )
    assert 'parfusion_gpulane_lane_share_percent{lane="online"} 40.0' in body
    assert "parfusion_gpulane_plans_applied_total" in body
    assert 'parfusion_gpulane_apply_refused_total{reason="busy"}' in body


@pytest.mark.integration
@pytest.mark.slow
def test_service_process_becomes_healthy_without_gpu(home: Path) -> None:
    port, metrics_port = free_port(), free_port()
    env = {**os.environ, "PARFUSION_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop("PARFUSION_ENABLE_GPU_LOAD", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.gpulane",
            "--port",
            str(port),
            "--metrics-port",
            str(metrics_port),
        ],
        cwd=home,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        status = None
        while time.monotonic() < deadline:
            try:
                with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
                    status = (
                        health_pb2_grpc.HealthStub(ch)
                        .Check(health_pb2.HealthCheckRequest(), timeout=1)
                        .status
                    )
                break
            except grpc.RpcError:
                time.sleep(0.2)
        assert status == health_pb2.HealthCheckResponse.SERVING
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = gpulane_pb2_grpc.GpuLaneServiceStub(ch)
            telemetry = stub.GetGpuTelemetry(
                gpulane_pb2.GetGpuTelemetryRequest(), timeout=5
            ).telemetry
        body = (
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
            .read()
            .decode()
        )
        if not telemetry.nvml_available:
            assert list(telemetry.devices) == []
            assert all(not lane.available for lane in telemetry.lanes)
            assert "parfusion_gpulane_nvml_available 0.0" in body
            assert 'parfusion_gpulane_lane_available{lane="online"} 0.0' in body
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert "gpu load off" in err
