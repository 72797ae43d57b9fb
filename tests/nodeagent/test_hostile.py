"""The node agent against hostile calls (issue items 6, 8, 9), over real gRPC, modeled backend:
a generation it accepts never breaks a later call, draining samples needs the token, and bytes
that are not a message are INVALID_ARGUMENT logged once."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from parfusion.v1 import intent_pb2, nodeagent_pb2, nodeagent_pb2_grpc
from services.common.clients import channel
from services.common.config import build_settings
from services.common.errors import InvalidArgument
from services.core.validation import normalize_intent
from services.nodeagent.backend import MAX_PLAN_GENERATION
from services.nodeagent.server import RunningNodeAgent, start_nodeagent

TOKEN = "s3cret-token"


def _start(token: str | None = None) -> RunningNodeAgent:
    env = {"PARFUSION_API_TOKEN": token} if token else {}
    overrides = {"port": 0, "backend": "modeled"}
    return start_nodeagent(build_settings("nodeagent", overrides=overrides, env=env))


@pytest.fixture
def agent(home: Path) -> Iterator[RunningNodeAgent]:
    running = _start()
    yield running
    running.stop()


@pytest.fixture
def locked_agent(home: Path) -> Iterator[RunningNodeAgent]:
    running = _start(TOKEN)
    yield running
    running.stop()


def _plan(generation: int) -> intent_pb2.NodePlan:
    return intent_pb2.NodePlan(node="node-0", generation=generation, policy="parfusion")


def test_a_huge_generation_never_breaks_later_calls(agent: RunningNodeAgent) -> None:
    with channel(agent.address) as ch:
        stub = nodeagent_pb2_grpc.NodeAgentServiceStub(ch)
        with pytest.raises(grpc.RpcError) as err:
            stub.ApplyNodePlan(nodeagent_pb2.ApplyNodePlanRequest(plan=_plan(2**64 - 1)), timeout=5)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "plan.generation" in err.value.details()
        # the largest accepted one, then plans without a generation: telemetry keeps working
        stub.ApplyNodePlan(
            nodeagent_pb2.ApplyNodePlanRequest(plan=_plan(MAX_PLAN_GENERATION)), timeout=5
        )
        for _ in range(2):
            stub.ApplyNodePlan(nodeagent_pb2.ApplyNodePlanRequest(plan=_plan(0)), timeout=5)
            tel = stub.GetNodeTelemetry(nodeagent_pb2.GetNodeTelemetryRequest(), timeout=5)
            assert 1 <= tel.telemetry.plan_generation <= MAX_PLAN_GENERATION


def test_draining_samples_needs_the_token(locked_agent: RunningNodeAgent) -> None:
    with channel(locked_agent.address) as ch:
        stub = nodeagent_pb2_grpc.NodeAgentServiceStub(ch)
        stub.GetNodeTelemetry(nodeagent_pb2.GetNodeTelemetryRequest(), timeout=5)  # a read: free
        for metadata in (
            (),
            (("authorization", "Bearer wrong"),),
            (("authorization", "Basic " + TOKEN),),
        ):
            with pytest.raises(grpc.RpcError) as err:
                stub.GetNodeTelemetry(
                    nodeagent_pb2.GetNodeTelemetryRequest(drain_samples=True),
                    metadata=metadata,
                    timeout=5,
                )
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, metadata
            assert "drain_samples" in err.value.details()
        stub.GetNodeTelemetry(
            nodeagent_pb2.GetNodeTelemetryRequest(drain_samples=True),
            metadata=(("authorization", f"Bearer {TOKEN}"),),
            timeout=5,
        )


def test_malformed_bytes_are_invalid_argument_logged_once(
    agent: RunningNodeAgent, caplog: pytest.LogCaptureFixture
) -> None:
    with channel(agent.address) as ch, caplog.at_level(logging.DEBUG):
        raw = ch.unary_unary(
            "/parfusion.v1.NodeAgentService/ApplyNodePlan",
            request_serializer=lambda b: b,
            response_deserializer=lambda b: b,
        )
        for junk in (b"\xff\xff\xff\xff", b"\x0a\xff\xff\xff\xff\x0f", b"\x08" + b"\xff" * 11):
            with pytest.raises(grpc.RpcError) as err:
                raw(junk, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "not a valid message" in err.value.details()
        tel = nodeagent_pb2_grpc.NodeAgentServiceStub(ch).GetNodeTelemetry(
            nodeagent_pb2.GetNodeTelemetryRequest(), timeout=5
        )
        assert tel.telemetry.backend == "modeled"
    lines = [r for r in caplog.records if "malformed" in r.getMessage()]
    assert len(lines) <= 1 and all(r.levelno <= logging.INFO for r in lines)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_plan_numbers_beyond_an_intents_bounds_are_invalid_argument(
    agent: RunningNodeAgent,
) -> None:
    """Found by the fuzzing: an arrival rate of 1e300 reached the model's Poisson draw and
    every later ApplyNodePlan was INTERNAL."""
    with channel(agent.address) as ch:
        stub = nodeagent_pb2_grpc.NodeAgentServiceStub(ch)
        for name, value in (
            ("arrival_rate_per_s", 1e300),
            ("base_service_ms", 1e12),
            ("base_service_ms", 1e-300),  # items per second beyond any counter
            ("deadline_ms", float("inf")),
        ):
            plan = _plan(5)
            plan.allocations.add(
                intent_id="on", workload_class=intent_pb2.WORKLOAD_CLASS_ONLINE, workers=1
            )
            setattr(plan.allocations[0], name, value)
            with pytest.raises(grpc.RpcError) as err:
                stub.ApplyNodePlan(nodeagent_pb2.ApplyNodePlanRequest(plan=plan), timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"allocations[0].{name}" in err.value.details()
        tel = stub.GetNodeTelemetry(nodeagent_pb2.GetNodeTelemetryRequest(), timeout=5)
        assert tel.telemetry.backend == "modeled"


def test_an_intent_cannot_carry_a_service_time_the_agent_would_refuse() -> None:
    """The allocator's validation has the same floor, so no accepted intent leads to it."""
    intent = intent_pb2.ResourceIntent(
        name="tiny",
        workload_class=intent_pb2.WORKLOAD_CLASS_BATCH,
        speedup=intent_pb2.Speedup(parallel_fraction=0.9, base_service_ms=1e-300),
    )
    with pytest.raises(InvalidArgument, match="speedup.base_service_ms"):
        normalize_intent(intent)
