"""The shared gRPC bootstrap: health, reflection, token check, error mapping, metrics endpoint."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from parfusion.v1 import intent_pb2, nodeagent_pb2, nodeagent_pb2_grpc
from services.common.clients import channel
from services.common.errors import InvalidArgument, PermissionDenied
from services.common.grpc_server import RunningServer, start_grpc_server

SERVICE = nodeagent_pb2.DESCRIPTOR.services_by_name["NodeAgentService"].full_name


class _Agent(nodeagent_pb2_grpc.NodeAgentServiceServicer):
    """A minimal servicer that raises domain errors, to exercise the interceptor only: plain
    methods (run in the server's thread pool) and a coroutine (run on its loop)."""

    def GetNodeTelemetry(self, request, context):  # noqa: N802
        return nodeagent_pb2.GetNodeTelemetryResponse()

    def ControlProcess(self, request, context):  # noqa: N802
        if request.pid == 0:
            raise InvalidArgument("must be > 0", field="pid")
        if request.pid == 2:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "aborted from a pool thread")
            raise AssertionError("abort returned")
        raise PermissionDenied(f"pid {request.pid} was not started by the agent")

    def InjectDisturbance(self, request, context):  # noqa: N802
        raise RuntimeError("boom")

    async def ApplyNodePlan(self, request, context):  # noqa: N802
        await asyncio.sleep(0)
        if not request.plan.node:
            raise InvalidArgument("required", field="plan.node")
        if request.plan.node == "abort":
            await context.abort(grpc.StatusCode.ABORTED, "aborted on the loop")
        if request.plan.node == "crash":
            raise KeyError("boom")
        return nodeagent_pb2.ApplyNodePlanResponse(generation=request.plan.generation)


def _start(token: str | None = None) -> RunningServer:
    return start_grpc_server(
        [(nodeagent_pb2_grpc.add_NodeAgentServiceServicer_to_server, _Agent(), SERVICE)],
        port=0,
        metrics_port=0,
        api_token=token,
    )


@pytest.fixture
def server() -> Iterator[RunningServer]:
    s = _start()
    yield s
    s.stop(0)


def test_health_serving_and_not_serving_after_stop() -> None:
    s = _start()
    with grpc.insecure_channel(s.address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for name in ("", SERVICE):
            assert (
                stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=2).status
                == health_pb2.HealthCheckResponse.SERVING
            )
    s.enter_graceful_shutdown()
    with grpc.insecure_channel(s.address) as ch:
        reply = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=2
        )
        assert reply.status == health_pb2.HealthCheckResponse.NOT_SERVING
    s.stop(0)


def test_reflection_lists_services(server: RunningServer) -> None:
    with grpc.insecure_channel(server.address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        replies = list(
            stub.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=2
            )
        )
    names = {s.name for s in replies[0].list_services_response.service}
    assert {SERVICE, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names


def test_domain_errors_map_to_status_codes(server: RunningServer) -> None:
    with grpc.insecure_channel(server.address) as ch:
        stub = nodeagent_pb2_grpc.NodeAgentServiceStub(ch)
        with pytest.raises(grpc.RpcError) as bad:
            stub.ControlProcess(nodeagent_pb2.ControlProcessRequest(pid=0), timeout=2)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "pid" in bad.value.details()
        with pytest.raises(grpc.RpcError) as denied:
            stub.ControlProcess(nodeagent_pb2.ControlProcessRequest(pid=1), timeout=2)
        assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(grpc.RpcError) as crash:
            stub.InjectDisturbance(nodeagent_pb2.InjectDisturbanceRequest(), timeout=2)
        assert crash.value.code() == grpc.StatusCode.INTERNAL


def test_plain_methods_abort_from_their_thread_and_coroutines_map_errors(
    server: RunningServer,
) -> None:
    with grpc.insecure_channel(server.address) as ch:
        stub = nodeagent_pb2_grpc.NodeAgentServiceStub(ch)
        with pytest.raises(grpc.RpcError) as aborted:
            stub.ControlProcess(nodeagent_pb2.ControlProcessRequest(pid=2), timeout=2)
        assert aborted.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert aborted.value.details() == "aborted from a pool thread"

        def apply(node: str) -> grpc.RpcError:
            plan = intent_pb2.NodePlan(node=node, generation=7)
            with pytest.raises(grpc.RpcError) as err:
                stub.ApplyNodePlan(nodeagent_pb2.ApplyNodePlanRequest(plan=plan), timeout=2)
            return err.value

        missing = apply("")
        assert missing.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "plan.node" in missing.details()
        assert apply("abort").code() == grpc.StatusCode.ABORTED
        assert apply("crash").code() == grpc.StatusCode.INTERNAL
        ok = stub.ApplyNodePlan(
            nodeagent_pb2.ApplyNodePlanRequest(plan=intent_pb2.NodePlan(node="n", generation=7)),
            timeout=2,
        )
        assert ok.generation == 7
    body = (
        urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=2)
        .read()
        .decode()
    )
    for code in ("RESOURCE_EXHAUSTED", "INVALID_ARGUMENT", "ABORTED", "INTERNAL", "OK"):
        assert (
            f'parfusion_grpc_requests_total{{code="{code}",method="'
            + ("ControlProcess" if code == "RESOURCE_EXHAUSTED" else "ApplyNodePlan")
            + '",service="NodeAgentService"}'
        ) in body


def test_stop_from_another_thread_ends_the_loop_and_runs_hooks() -> None:
    s = _start()
    order: list[str] = []
    s.on_drain(lambda: order.append("drain"))
    s.on_stop(lambda: order.append("stop"))
    stopper = threading.Thread(target=s.stop, args=(0.5,))
    stopper.start()
    stopper.join(10)
    s.wait()  # returns once stopped
    assert order == ["drain", "stop"]
    assert not s.thread.is_alive() and s.loop.is_closed()
    with grpc.insecure_channel(s.address) as ch, pytest.raises(grpc.RpcError):
        health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=1)
    s.stop()  # a second stop does nothing


def test_token_guards_mutating_calls_only() -> None:
    s = _start(token="s3cret")
    try:
        with grpc.insecure_channel(s.address) as ch:
            stub = nodeagent_pb2_grpc.NodeAgentServiceStub(ch)
            stub.GetNodeTelemetry(
                nodeagent_pb2.GetNodeTelemetryRequest(), timeout=2
            )  # read: allowed
            with pytest.raises(grpc.RpcError) as err:
                stub.ControlProcess(nodeagent_pb2.ControlProcessRequest(pid=5), timeout=2)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with channel(s.address, token="s3cret") as ch:
            stub = nodeagent_pb2_grpc.NodeAgentServiceStub(ch)
            with pytest.raises(grpc.RpcError) as err:
                stub.ControlProcess(nodeagent_pb2.ControlProcessRequest(pid=5), timeout=2)
            assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED  # got past the token check
    finally:
        s.stop(0)


def test_metrics_endpoint_counts_rpcs(server: RunningServer) -> None:
    with grpc.insecure_channel(server.address) as ch:
        nodeagent_pb2_grpc.NodeAgentServiceStub(ch).GetNodeTelemetry(
            nodeagent_pb2.GetNodeTelemetryRequest(), timeout=2
        )
    body = (
        urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=2)
        .read()
        .decode()
    )
    assert (
        'parfusion_grpc_requests_total{code="OK",method="GetNodeTelemetry",service="NodeAgentService"}'
        in body
    )


def test_event_loop_lag_shows_a_loop_held_by_a_blocking_callback(server: RunningServer) -> None:
    """The lag probe samples how late the loop runs a due timer: a coroutine that blocks the
    loop for 0.4 s shows as a sample above 0.25 s, and the probe goes on after it. (The
    histogram is the process's: another server alive in it may add samples of its own.)"""
    from prometheus_client import REGISTRY

    def over_quarter() -> float:
        total = REGISTRY.get_sample_value("parfusion_event_loop_lag_seconds_count") or 0.0
        within = REGISTRY.get_sample_value(
            "parfusion_event_loop_lag_seconds_bucket", {"le": "0.25"}
        )
        return total - (within or 0.0)

    async def hold_the_loop() -> None:
        time.sleep(0.4)  # blocking on purpose: nothing else on the loop runs meanwhile

    before = over_quarter()
    server.call(hold_the_loop())
    deadline = time.monotonic() + 5
    while over_quarter() == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert over_quarter() >= before + 1
    count = REGISTRY.get_sample_value("parfusion_event_loop_lag_seconds_count")
    time.sleep(0.3)  # the probe keeps sampling after the loop is free again
    assert REGISTRY.get_sample_value("parfusion_event_loop_lag_seconds_count") > count


def test_a_taken_port_is_a_clear_error_and_leaves_no_thread() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        before = set(threading.enumerate())
        with pytest.raises(OSError, match=f"cannot bind gRPC server to 127.0.0.1:{port}"):
            start_grpc_server([], port=port)
        assert set(threading.enumerate()) <= before
