"""Fixtures for the bridge tests: a controllable clock, a bridge on a temporary checkpoint, and an
AllocatorService test double reached over real gRPC (the boundary the bridge talks to)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry

from parfusion.v1 import allocator_pb2, allocator_pb2_grpc
from services.bridge.allocator_client import AllocatorClient
from services.bridge.checkpoint import CheckpointStore
from services.bridge.controller import RobotBridge
from services.bridge.metrics import BridgeMetrics
from services.bridge.urgent_intents import AllocatorPort
from services.common.grpc_server import RunningServer, start_grpc_server
from tests.conftest import free_port

TICK_S = 0.2


class Clock:
    """Wall time the tests move by hand, so deadlines and latencies are exact."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def run_ticks(bridge: RobotBridge, clock: Clock, count: int = 1) -> list[str]:
    """Advance the clock by one control period per tick, as the background ticker would."""
    states = []
    for _ in range(count):
        clock.advance(bridge.tick_s)
        bridge.tick()
        states.append(bridge.machine.state.value)
    return states


def make_bridge(
    path: Path, clock: Clock, allocator: AllocatorPort | None = None, *, queue_limit: int = 64
) -> RobotBridge:
    return RobotBridge(
        store=CheckpointStore(path),
        metrics=BridgeMetrics(CollectorRegistry()),
        allocator=allocator,
        tick_s=TICK_S,
        queue_limit=queue_limit,
        clock=clock,
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def checkpoint_path(tmp_path: Path) -> Path:
    return tmp_path / "run" / "bridge" / "checkpoint.json"


@dataclass
class RecordingAllocator(allocator_pb2_grpc.AllocatorServiceServicer):
    """Test double of AllocatorService at the gRPC boundary: it stores what it is sent.

    The allocator's own behaviour is tested in tests/allocator; here only the bridge's calls matter.
    """

    submitted: list[allocator_pb2.SubmitIntentRequest] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    live: dict[str, object] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def SubmitIntent(self, request, context):  # noqa: N802 (gRPC method name)
        with self.lock:
            self.submitted.append(request)
            existed = request.intent.id in self.live
            self.live[request.intent.id] = request.intent
        return allocator_pb2.SubmitIntentResponse(intent=request.intent, already_existed=existed)

    def DeleteIntent(self, request, context):  # noqa: N802
        with self.lock:
            self.deleted.append(request.id)
            if self.live.pop(request.id, None) is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"intent {request.id} not found")
        return allocator_pb2.DeleteIntentResponse(deleted=True)


@dataclass
class AllocatorDouble:
    servicer: RecordingAllocator
    server: RunningServer

    @property
    def address(self) -> str:
        return self.server.address


@pytest.fixture
def recording_allocator() -> Iterator[AllocatorDouble]:
    servicer = RecordingAllocator()
    name = allocator_pb2.DESCRIPTOR.services_by_name["AllocatorService"].full_name
    server = start_grpc_server(
        [(allocator_pb2_grpc.add_AllocatorServiceServicer_to_server, servicer, name)],
        port=0,
        max_workers=4,
    )
    yield AllocatorDouble(servicer, server)
    server.stop(grace=0.1)


@pytest.fixture
def unreachable_address() -> str:
    return f"127.0.0.1:{free_port()}"


def client_for(address: str) -> AllocatorClient:
    return AllocatorClient(address, timeout_s=0.5, retry_s=0.2)
