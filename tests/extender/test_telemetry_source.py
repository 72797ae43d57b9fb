"""TelemetrySource against a real in-process allocator: the node's residents as the policy
core's specs, each converted once while its stored intent stays the same."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from parfusion.v1 import allocator_pb2, allocator_pb2_grpc
from services.allocator.server import RunningAllocator, start_allocator
from services.common.clients import channel
from services.common.config import build_settings
from services.core.convert import intent_to_spec
from services.extender.telemetry import TelemetrySource
from tests.allocator.conftest import batch_intent, online_intent


@pytest.fixture
def allocator(home: Path) -> Iterator[RunningAllocator]:
    settings = build_settings(
        "allocator",
        overrides={"port": 0, "seed_intents": False, "nodeagent_address": "",
                   "gpulane_address": "", "tick_ms": 50.0},
        env={"PARFUSION_HOME": str(home)},
    )  # fmt: skip
    running = start_allocator(settings, port=0, start_loop=True)
    yield running
    running.stop()


def test_residents_are_converted_once_and_follow_the_store(allocator: RunningAllocator) -> None:
    with channel(allocator.address) as ch:
        stub = allocator_pb2_grpc.AllocatorServiceStub(ch)
        for intent in (online_intent("web-0", "web-0"), online_intent("web-1", "web-1"),
                       batch_intent("job", "job")):  # fmt: skip
            stub.SubmitIntent(allocator_pb2.SubmitIntentRequest(intent=intent), timeout=5)

        def fresh() -> tuple[object, ...]:
            listed = stub.ListIntents(allocator_pb2.ListIntentsRequest(), timeout=5).intents
            return tuple(intent_to_spec(i, seq) for seq, i in enumerate(listed))

        source = TelemetrySource(allocator.address)
        try:
            deadline = time.monotonic() + 10
            while (first := source.read()) is None and time.monotonic() < deadline:
                time.sleep(0.05)  # the first plan
            assert first is not None and first.residents == fresh()
            again = source.read()
            assert again is not None and again.residents == first.residents
            assert all(a is b for a, b in zip(again.residents, first.residents, strict=True))
            stub.DeleteIntent(allocator_pb2.DeleteIntentRequest(id="web-0"), timeout=5)
            after = source.read()  # the others moved up one place
            assert after is not None and after.residents == fresh()
            assert [s.seq for s in after.residents] == [0, 1]
        finally:
            source.close()
