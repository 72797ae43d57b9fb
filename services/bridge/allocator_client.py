"""The bridge's side of AllocatorService: an URGENT ResourceIntent per urgent event, deleted when done.

The intent id is derived from the urgent event id, so submitting again after a bridge restart is
idempotent. Every call carries a deadline and a short, bounded retry: an urgent event cannot wait
for a slow allocator, so when the allocator is unreachable the caller gets an
:class:`AllocatorOutcome` saying so and handles the event locally.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import grpc

from parfusion.v1 import allocator_pb2, allocator_pb2_grpc, intent_pb2
from services.common.clients import call_with_backoff, channel

log = logging.getLogger(__name__)

UNREACHABLE_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED"})


@dataclass(frozen=True, slots=True)
class UrgentIntentTemplate:
    """Resource shape of an urgent robot task; the deadline comes from each event."""

    priority: int = 1000
    min_workers: int = 1
    preferred_workers: int = 2
    base_service_ms: float = 20.0
    parallel_fraction: float = 0.9
    gpu_lane: str = "urgent"
    gpu_share: float = 0.5


@dataclass(frozen=True, slots=True)
class AllocatorOutcome:
    ok: bool
    intent_id: str
    error: str = ""
    code: str = ""  # gRPC status code name when the call failed

    @property
    def unreachable(self) -> bool:
        return not self.ok and self.code in UNREACHABLE_CODES


@dataclass(frozen=True, slots=True)
class PlannedAllocation:
    """What the allocator's plan actually gave an urgent intent (not whether the submit worked)."""

    units: int  # units held against the node's capacity
    workers: int
    state: str  # ADMITTED, THROTTLED, DEGRADED, PREEMPTED
    reason: str
    predicted_p99_ms: float

    @property
    def granted(self) -> bool:
        """The intent runs with at least one unit (ADMITTED or DEGRADED)."""
        return self.units > 0 and self.state in ("ADMITTED", "DEGRADED")


def intent_id_for(event_id: str) -> str:
    return f"bridge-urgent-{event_id}"


def build_urgent_intent(
    event_id: str, name: str, deadline_ms: float, template: UrgentIntentTemplate, node: str = ""
) -> intent_pb2.ResourceIntent:
    return intent_pb2.ResourceIntent(
        id=intent_id_for(event_id),
        name=name,
        workload_class=intent_pb2.WORKLOAD_CLASS_URGENT,
        priority=template.priority,
        slo=intent_pb2.Slo(deadline_ms=deadline_ms),
        parallelism=intent_pb2.Parallelism(
            min=template.min_workers,
            max=max(template.min_workers, template.preferred_workers),
            preferred=template.preferred_workers,
        ),
        speedup=intent_pb2.Speedup(
            parallel_fraction=template.parallel_fraction, base_service_ms=template.base_service_ms
        ),
        gpu=intent_pb2.GpuIntent(
            lane=template.gpu_lane, share=template.gpu_share, stream_priority_hint=1
        ),
        preemptible=False,
        elastic=False,
        node=node,
        labels={"parfusion.io/source": "bridge", "parfusion.io/urgent-event": event_id},
    )


class AllocatorClient:
    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        timeout_s: float = 0.5,
        retry_s: float = 1.0,
        template: UrgentIntentTemplate | None = None,
        node: str = "",
    ) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.template = template or UrgentIntentTemplate()
        self.node = node
        # after an outage the bridge must see the allocator back within a second or two
        self._channel = channel(address, token, max_reconnect_backoff_s=1.0)
        self._stub = allocator_pb2_grpc.AllocatorServiceStub(self._channel)

    def submit_urgent(self, event_id: str, name: str, deadline_ms: float) -> AllocatorOutcome:
        intent = build_urgent_intent(event_id, name, deadline_ms, self.template, self.node)
        request = allocator_pb2.SubmitIntentRequest(intent=intent)
        return self._call(
            "submit", intent.id, lambda: self._stub.SubmitIntent(request, timeout=self.timeout_s)
        )

    def allocation(self, event_id: str) -> PlannedAllocation | None:
        """The urgent intent's allocation in the allocator's latest plan; None while it is not
        planned yet or the allocator does not answer (one call, no retry: the robot's tick
        cannot wait for it)."""
        request = allocator_pb2.GetIntentRequest(id=intent_id_for(event_id))
        try:
            reply = self._stub.GetIntent(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
            log.debug("allocation not read", extra={"event": event_id, "code": code})
            return None
        a = reply.allocation
        if not reply.HasField("allocation") or not a.intent_id:
            return None
        return PlannedAllocation(
            units=a.units,
            workers=a.workers,
            state=intent_pb2.AllocationState.Name(a.state).removeprefix("ALLOCATION_STATE_"),
            reason=a.reason,
            predicted_p99_ms=a.predicted_p99_ms,
        )

    def delete_urgent(self, event_id: str) -> AllocatorOutcome:
        intent_id = intent_id_for(event_id)
        request = allocator_pb2.DeleteIntentRequest(id=intent_id)
        return self._call(
            "delete",
            intent_id,
            lambda: self._stub.DeleteIntent(request, timeout=self.timeout_s),
            gone_is_ok=True,
        )

    def _call(
        self, operation: str, intent_id: str, fn: Any, *, gone_is_ok: bool = False
    ) -> AllocatorOutcome:
        try:
            call_with_backoff(fn, total_s=self.retry_s)
        except grpc.RpcError as exc:
            code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
            if gone_is_ok and code == "NOT_FOUND":
                return AllocatorOutcome(True, intent_id)
            details = exc.details() if hasattr(exc, "details") else str(exc)
            log.warning(
                "allocator call failed",
                extra={
                    "operation": operation,
                    "intent_id": intent_id,
                    "code": code,
                    "details": details,
                },
            )
            return AllocatorOutcome(False, intent_id, details or code, code)
        return AllocatorOutcome(True, intent_id)

    def close(self) -> None:
        self._channel.close()
