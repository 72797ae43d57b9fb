"""NodeAgentService over real gRPC with the real backend: plans run pools, telemetry reports them."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import psutil
import pytest

from parfusion.v1 import intent_pb2, nodeagent_pb2, nodeagent_pb2_grpc, telemetry_pb2
from services.common.clients import channel
from services.common.config import build_settings
from services.nodeagent import osctl
from services.nodeagent.server import RunningNodeAgent, start_nodeagent

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def agent(home: Path) -> Iterator[RunningNodeAgent]:
    settings = build_settings(
        "nodeagent",
        overrides={"port": 0, "backend": "real", "max_workers": 4},
        env=dict(os.environ),
    )
    running = start_nodeagent(settings)
    try:
        yield running
    finally:
        pids = running.backend.owned_pids()
        running.stop()
        alive = [
            p
            for p in pids
            if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        ]
        assert not alive, f"orphans after stop: {alive}"


def _stub(agent: RunningNodeAgent) -> nodeagent_pb2_grpc.NodeAgentServiceStub:
    return nodeagent_pb2_grpc.NodeAgentServiceStub(channel(agent.address))


def _plan(
    generation: int, online_workers: int, batch_workers: int, cpu: int
) -> intent_pb2.NodePlan:
    return intent_pb2.NodePlan(
        node="node-0",
        generation=generation,
        policy="parfusion",
        allocations=[
            intent_pb2.Allocation(
                intent_id="web",
                workload_class=intent_pb2.WORKLOAD_CLASS_ONLINE,
                workers=online_workers,
                cpu_set=[cpu],
                nice=0,
                base_service_ms=2.0,
                arrival_rate_per_s=40.0,
                deadline_ms=50.0,
                cgroup=intent_pb2.CgroupPlan(path="parfusion/web", cpu_weight=400, cpu_max="max"),
            ),
            intent_pb2.Allocation(
                intent_id="train",
                workload_class=intent_pb2.WORKLOAD_CLASS_BATCH,
                workers=batch_workers,
                nice=19,
                sched_policy="idle",
                base_service_ms=2.0,
                parallel_fraction=0.9,
            ),
        ],
    )


def test_plan_runs_pools_and_telemetry_reports_them(agent: RunningNodeAgent, home: Path) -> None:
    stub = _stub(agent)
    cpu = agent.backend.arena[0]  # type: ignore[attr-defined]
    reply = stub.ApplyNodePlan(
        nodeagent_pb2.ApplyNodePlanRequest(plan=_plan(3, 2, 1, cpu)), timeout=10
    )
    assert reply.generation == 3
    assert [(a.intent_id, a.workers) for a in reply.applied] == [("web", 2), ("train", 1)]
    assert reply.applied[0].cgroup_mode in ("dry-run", "unavailable")
    recorded = json.loads(Path(reply.cgroup_plan_path).read_text())
    assert Path(reply.cgroup_plan_path).is_relative_to(home / "run")
    assert recorded["mode"] in ("dry-run", "unavailable")
    web = next(g for g in recorded["groups"] if g["intent_id"] == "web")
    assert web["cpu_weight"] == 400 and len(web["pids"]) == 2

    # Wait (on a busy host, workers take a while to import numpy) without draining samples.
    book = agent.backend.book("web")  # type: ignore[attr-defined]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and (
        book.count <= 10 or agent.backend.book("train").count == 0
    ):  # type: ignore[attr-defined]
        time.sleep(0.05)
    time.sleep(0.3)
    tel = stub.GetNodeTelemetry(nodeagent_pb2.GetNodeTelemetryRequest(), timeout=5).telemetry
    assert tel.backend == "real" and tel.plan_generation == 3
    assert len(tel.cpu_percent_per_core) == psutil.cpu_count()
    assert tel.memory_total_bytes > tel.memory_used_bytes > 0
    assert list(tel.arena_cpus) == list(agent.backend.arena)  # type: ignore[attr-defined]
    assert tel.cpu_pressure.available == Path("/proc/pressure/cpu").exists()
    pools = {p.intent_id: p for p in tel.pools}
    assert (
        pools["web"].workers == 2
        and pools["web"].kind == "online"
        and list(pools["web"].cpu_set) == [cpu]
    )
    assert pools["train"].nice == 19 and pools["train"].sched_policy == "idle"
    for pid in pools["web"].pids:
        state = osctl.read_sched_state(pid)
        assert state.cpus_allowed == (cpu,) and state.nice == 0
    batch_state = osctl.read_sched_state(pools["train"].pids[0])
    assert batch_state.sched_policy == "idle" and batch_state.nice == 19
    lat = {s.intent_id: s for s in tel.latencies}
    assert lat["web"].count > 10
    assert 0 < lat["web"].p50_ms <= lat["web"].p95_ms <= lat["web"].p99_ms
    assert 0 < len(lat["web"].recent_service_ms) <= 512
    assert lat["web"].sample_parallelism == 1  # one request per single-threaded worker
    assert pools["train"].items_per_s > 0
    again = stub.GetNodeTelemetry(nodeagent_pb2.GetNodeTelemetryRequest(), timeout=5).telemetry
    drained = {s.intent_id: s for s in again.latencies}["web"]
    assert (
        len(drained.recent_service_ms) < len(lat["web"].recent_service_ms) + 5
    )  # samples reported once
    agent.backend.reset_books()  # type: ignore[attr-defined]
    assert book.count < 10  # a new window: only what completed since

    # Resize at run time; the removed intent's pool goes away.
    old_batch = set(pools["train"].pids)
    shrink = _plan(4, 1, 0, cpu)
    del shrink.allocations[1]
    stub.ApplyNodePlan(nodeagent_pb2.ApplyNodePlanRequest(plan=shrink), timeout=10)
    tel = stub.GetNodeTelemetry(nodeagent_pb2.GetNodeTelemetryRequest(), timeout=5).telemetry
    assert [(p.intent_id, p.workers) for p in tel.pools] == [("web", 1)]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in old_batch):
        time.sleep(0.05)
    assert not any(
        psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        for p in old_batch
    )


def test_bad_plan_is_rejected_whole_and_nothing_changes(agent: RunningNodeAgent) -> None:
    stub = _stub(agent)
    cpu = agent.backend.arena[0]  # type: ignore[attr-defined]
    stub.ApplyNodePlan(nodeagent_pb2.ApplyNodePlanRequest(plan=_plan(1, 1, 1, cpu)), timeout=10)
    bad = _plan(2, 2, 2, cpu)
    bad.allocations[1].nice = 42
    with pytest.raises(grpc.RpcError) as err:
        stub.ApplyNodePlan(nodeagent_pb2.ApplyNodePlanRequest(plan=bad), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "allocations[1].nice" in err.value.details()
    tel = stub.GetNodeTelemetry(nodeagent_pb2.GetNodeTelemetryRequest(), timeout=5).telemetry
    assert tel.plan_generation == 1
    assert sorted((p.intent_id, p.workers) for p in tel.pools) == [("train", 1), ("web", 1)]


def test_control_process_only_for_own_workers(agent: RunningNodeAgent) -> None:
    stub = _stub(agent)
    cpu = agent.backend.arena[-1]  # type: ignore[attr-defined]
    stub.ApplyNodePlan(nodeagent_pb2.ApplyNodePlanRequest(plan=_plan(1, 1, 0, cpu)), timeout=10)
    foreign = os.getppid()
    before = (os.getpriority(os.PRIO_PROCESS, foreign), os.sched_getaffinity(foreign))
    for pid in (foreign, os.getpid(), 1, 0):
        with pytest.raises(grpc.RpcError) as err:
            stub.ControlProcess(
                nodeagent_pb2.ControlProcessRequest(pid=pid, cpu_set=[cpu], nice=10), timeout=5
            )
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert (os.getpriority(os.PRIO_PROCESS, foreign), os.sched_getaffinity(foreign)) == before
    own = next(iter(agent.backend.owned_pids()))
    reply = stub.ControlProcess(
        nodeagent_pb2.ControlProcessRequest(pid=own, cpu_set=[cpu], nice=5), timeout=5
    )
    assert (reply.pid, list(reply.cpu_set), reply.nice) == (own, [cpu], 5)
    assert osctl.read_sched_state(own).nice == 5


def test_real_stress_is_refused_by_default(agent: RunningNodeAgent) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _stub(agent).InjectDisturbance(
            nodeagent_pb2.InjectDisturbanceRequest(
                disturbance=telemetry_pb2.Disturbance(cpu_pressure=0.5, duration_s=1)
            ),
            timeout=5,
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "allow_real_stress" in err.value.details()
    assert not agent.backend.owned_pids()
