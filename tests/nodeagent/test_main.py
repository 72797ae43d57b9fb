"""The agent as a process: healthy over gRPC, and neither SIGTERM nor SIGKILL leaves a worker behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from parfusion.v1 import intent_pb2, nodeagent_pb2, nodeagent_pb2_grpc
from tests.conftest import ROOT, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _start(home: Path, port: int, metrics_port: int | None = None) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PARFUSION_HOME": str(home),
        "PYTHONPATH": str(ROOT),
        "PARFUSION_NODEAGENT_BACKEND": "real",
    }
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.nodeagent",
            "--port",
            str(port),
            "--metrics-port",
            str(metrics_port or free_port()),
        ],
        cwd=ROOT,
        env=env,
    )


def _serve_plan(port: int) -> list[int]:
    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    health = health_pb2_grpc.HealthStub(ch)
    deadline = time.monotonic() + 20
    while True:
        try:
            if (
                health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1).status
                == health_pb2.HealthCheckResponse.SERVING
            ):
                break
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    stub = nodeagent_pb2_grpc.NodeAgentServiceStub(ch)
    plan = intent_pb2.NodePlan(
        generation=1,
        allocations=[
            intent_pb2.Allocation(
                intent_id="web",
                workload_class=intent_pb2.WORKLOAD_CLASS_ONLINE,
                workers=2,
                arrival_rate_per_s=5,
            ),
            intent_pb2.Allocation(
                intent_id="train",
                workload_class=intent_pb2.WORKLOAD_CLASS_BATCH,
                workers=1,
                nice=19,
            ),
        ],
    )
    stub.ApplyNodePlan(nodeagent_pb2.ApplyNodePlanRequest(plan=plan), timeout=10)
    tel = stub.GetNodeTelemetry(nodeagent_pb2.GetNodeTelemetryRequest(), timeout=5).telemetry
    ch.close()
    return [pid for pool in tel.pools for pid in pool.pids]


def _gone(pids: list[int], timeout: float = 8.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not any(
            psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
            for p in pids
        ):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_agent_exit_leaves_no_worker(home: Path, sig: signal.Signals) -> None:
    port, metrics_port = free_port(), free_port()
    proc = _start(home, port, metrics_port)
    try:
        pids = _serve_plan(port)
        assert len(pids) == 3
        assert all(psutil.Process(p).ppid() == proc.pid for p in pids)
        metrics = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
        assert 'parfusion_nodeagent_plans_applied_total{outcome="applied"} 1.0' in metrics
        assert "parfusion_nodeagent_owned_processes 3.0" in metrics
        proc.send_signal(sig)
        proc.wait(15)
        assert _gone(pids), "worker processes outlived the agent"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_unknown_backend_fails_at_start_with_a_clear_message(home: Path) -> None:
    env = {
        **os.environ,
        "PARFUSION_HOME": str(home),
        "PYTHONPATH": str(ROOT),
        "PARFUSION_NODEAGENT_BACKEND": "nope",
    }
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.nodeagent",
            "--port",
            str(free_port()),
            "--metrics-port",
            "0",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode != 0
    assert "unknown backend 'nope'" in out.stderr
