"""The URGENT intents the bridge holds at the allocator, one per urgent task.

Submitted when the task starts, read for the allocation the allocator's plan gave it, deleted
when the task is done. An intent whose DeleteIntent failed is kept in ``undeleted`` (and in the
checkpoint) and deleted again until the allocator takes it back: an URGENT intent left behind
would hold units forever. ``status`` is what the bridge last learnt of the allocator.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from services.bridge.allocator_client import AllocatorOutcome, PlannedAllocation
from services.bridge.metrics import BridgeMetrics
from services.bridge.mission import UrgentEvent

log = logging.getLogger(__name__)

DELETE_RETRY_S = 2.0  # between attempts to delete an intent the allocator did not take back


class AllocatorPort(Protocol):
    address: str

    def submit_urgent(self, event_id: str, name: str, deadline_ms: float) -> AllocatorOutcome: ...

    def delete_urgent(self, event_id: str) -> AllocatorOutcome: ...

    def allocation(self, event_id: str) -> PlannedAllocation | None: ...


class UrgentIntents:
    """Bookkeeping of urgent events' intents at the allocator; the caller holds the bridge's lock."""

    def __init__(
        self, allocator: AllocatorPort | None, metrics: BridgeMetrics, clock: Callable[[], float]
    ) -> None:
        self.allocator = allocator
        self.metrics = metrics
        self.clock = clock
        # intents whose DeleteIntent failed: an URGENT intent left behind would hold units forever
        self.undeleted: list[str] = []
        self.next_delete_retry = 0.0
        self.status: dict[str, Any] = {
            "address": allocator.address if allocator else "",
            "mode": "grpc" if allocator else "disabled",
            "reachable": None,
            "last_error": "",
        }

    def submit(self, event: UrgentEvent) -> None:
        """Submit the event's URGENT intent as its task starts (nothing without an allocator)."""
        if self.allocator is None:
            event.allocator = "disabled"
            return
        outcome = self.allocator.submit_urgent(event.id, event.spec.name, event.spec.deadline_ms)
        event.allocator = (
            "submitted" if outcome.ok else "unreachable" if outcome.unreachable else "rejected"
        )
        event.allocator_error = outcome.error
        self.note("submit", outcome)
        self.read_allocation(event)

    def read_allocation(self, event: UrgentEvent) -> None:
        """What the allocator's plan gave the event's intent: granted (units) or throttled (with
        the plan's reason). Until its first plan the event stays "submitted"."""
        if self.allocator is None or not event.intent_submitted:
            return
        planned = self.allocator.allocation(event.id)
        if planned is None:
            return
        first = event.allocation is None
        event.allocator = "granted" if planned.granted else "throttled"
        event.allocation = {
            "units": planned.units,
            "workers": planned.workers,
            "state": planned.state,
            "reason": planned.reason,
            "predicted_p99_ms": planned.predicted_p99_ms,
        }
        self.metrics.urgent_allocated_units.set(planned.units if planned.granted else 0)
        if first:
            self.metrics.urgent_allocations.labels(planned.state).inc()
            log.info(
                "urgent allocation",
                extra={"urgent": event.id, "units": planned.units, "state": planned.state},
            )

    def delete(self, event: UrgentEvent, now: float) -> None:
        """Delete the done event's intent; on failure keep it for a retry."""
        if not event.intent_submitted or self.allocator is None:
            return
        outcome = self.allocator.delete_urgent(event.id)
        event.intent_deleted = outcome.ok
        self.note("delete", outcome)
        if not outcome.ok:
            self.undeleted.append(event.id)
            self.next_delete_retry = now + DELETE_RETRY_S

    def retry_due(self) -> bool:
        return bool(self.undeleted) and self.clock() >= self.next_delete_retry

    def retry_later(self) -> None:
        self.next_delete_retry = self.clock() + DELETE_RETRY_S

    def clean_up(self, on_deleted: Callable[[], None]) -> bool:
        """Delete the left-over intents, oldest first, stopping at the first failure and calling
        ``on_deleted`` after each; True when none is left."""
        if self.allocator is None:
            self.undeleted.clear()
            return True
        while self.undeleted:
            outcome = self.allocator.delete_urgent(self.undeleted[0])
            self.note("delete", outcome)
            if not outcome.ok:
                return False
            self.undeleted.pop(0)
            log.info("left-over urgent intent deleted", extra={"intent_id": outcome.intent_id})
            on_deleted()
        return True

    def note(self, operation: str, outcome: AllocatorOutcome) -> None:
        self.status["reachable"] = outcome.ok or not outcome.unreachable
        if outcome.ok:
            self.status["last_error"] = ""  # an answer: the old failure is over
            return
        reason = "unreachable" if outcome.unreachable else "rejected"
        self.status["last_error"] = f"{operation}: {outcome.code} {outcome.error}".strip()
        self.metrics.allocator_failures.labels(operation, reason).inc()

    def view(self) -> dict[str, Any]:
        return {**self.status, "undeleted_intents": len(self.undeleted)}
