"""AllocatorService calls over real gRPC: the URGENT intent's shape, idempotent ids, timeouts when down."""

from __future__ import annotations

import time

from parfusion.v1 import intent_pb2
from services.bridge.allocator_client import (
    UrgentIntentTemplate,
    build_urgent_intent,
    intent_id_for,
)
from tests.bridge.conftest import AllocatorDouble, client_for


def test_the_urgent_intent_carries_the_event_deadline_and_is_not_preemptible() -> None:
    intent = build_urgent_intent(
        "e1", "fall-detected", 750.0, UrgentIntentTemplate(gpu_lane="urgent")
    )
    assert intent.id == intent_id_for("e1") == "bridge-urgent-e1"
    assert intent.workload_class == intent_pb2.WORKLOAD_CLASS_URGENT
    assert intent.slo.deadline_ms == 750.0
    assert not intent.preemptible and not intent.elastic
    assert intent.priority == 1000 and intent.gpu.lane == "urgent"
    assert intent.parallelism.min <= intent.parallelism.preferred <= intent.parallelism.max


def test_submit_and_delete_reach_the_allocator(recording_allocator: AllocatorDouble) -> None:
    client = client_for(recording_allocator.address)
    try:
        submitted = client.submit_urgent("e1", "fall-detected", 500.0)
        assert submitted.ok and submitted.intent_id == "bridge-urgent-e1"
        assert client.submit_urgent("e1", "fall-detected", 500.0).ok  # same id: idempotent resubmit
        assert [r.intent.id for r in recording_allocator.servicer.submitted] == [
            "bridge-urgent-e1"
        ] * 2
        assert client.delete_urgent("e1").ok
        again = client.delete_urgent(
            "e1"
        )  # NOT_FOUND: the intent is already gone, which is the goal
        assert again.ok
        assert recording_allocator.servicer.deleted == ["bridge-urgent-e1", "bridge-urgent-e1"]
    finally:
        client.close()


def test_an_unreachable_allocator_is_reported_within_the_retry_budget(
    unreachable_address: str,
) -> None:
    client = client_for(unreachable_address)
    try:
        started = time.monotonic()
        outcome = client.submit_urgent("e1", "fall-detected", 500.0)
        assert time.monotonic() - started < 3.0
        assert not outcome.ok and outcome.unreachable and outcome.code == "UNAVAILABLE"
        assert client.delete_urgent("e1").unreachable
    finally:
        client.close()
