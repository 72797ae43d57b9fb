"""The bridge's control loop: a preemptible mission, an EDF queue of urgent events, one tick at a time.

Each tick moves the robot by one unit in its current state (see statemachine.TRANSITIONS):

- RUNNING: one mission step. An urgent event is pending: stop at the next safe point (every
  ``safe_point_interval`` steps), unless waiting for it is predicted to miss the urgent deadline
  while stopping at once would meet it; then stop now and roll back to the last safe point.
- CHECKPOINTING: write the durable checkpoint (the mission at its last safe point).
- PREEMPTED: hand the robot to the earliest-deadline urgent event and submit its URGENT intent
  to the allocator (which preempts batch units); with nothing queued, resume the mission.
- URGENT_TASK_RUNNING: one unit of the urgent task's work; when done, delete its intent.
- RESUMING: load the mission back from the checkpoint on disk.
- COMPENSATING: re-plan the steps lost since the checkpoint; they are redone as normal steps.

Deadlines are wall-clock times so they survive a restart of the bridge with the checkpoint.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from services.bridge.allocator_client import AllocatorOutcome, PlannedAllocation
from services.bridge.checkpoint import CheckpointStore
from services.bridge.metrics import BridgeMetrics
from services.bridge.mission import Mission, UrgentEvent
from services.bridge.statemachine import (
    Event,
    IllegalTransition,
    State,
    StateMachine,
    Transition,
    legal_events,
)
from services.bridge.validation import MissionSpec, UrgentSpec
from services.bridge.views import mission_view, transitions_view, urgent_view

log = logging.getLogger(__name__)

DELETE_RETRY_S = 2.0  # between attempts to delete an intent the allocator did not take back


class AllocatorPort(Protocol):
    address: str

    def submit_urgent(self, event_id: str, name: str, deadline_ms: float) -> AllocatorOutcome: ...

    def delete_urgent(self, event_id: str) -> AllocatorOutcome: ...

    def allocation(self, event_id: str) -> PlannedAllocation | None: ...


class RobotBridge:
    """The robot's mission and urgent work, driven by :meth:`tick`; safe to call from any thread."""

    def __init__(
        self,
        *,
        store: CheckpointStore,
        metrics: BridgeMetrics,
        allocator: AllocatorPort | None,
        tick_s: float,
        queue_limit: int = 64,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.metrics = metrics
        self.allocator = allocator
        self.tick_s = tick_s
        self.queue_limit = queue_limit
        self.clock = clock
        self.machine = StateMachine(clock)
        self.machine.subscribe(lambda t: metrics.set_state(t.target))
        self._lock = threading.RLock()
        self.mission: Mission | None = None
        self.queue: list[tuple[float, int, UrgentEvent]] = []
        self.active: UrgentEvent | None = None
        self.finished: deque[UrgentEvent] = deque(maxlen=20)
        # intents whose DeleteIntent failed: an URGENT intent left behind would hold units forever
        self.undeleted: list[str] = []
        self._next_delete_retry = 0.0
        self.ticks = 0
        self._seq = 0
        self._resume_started_at: float | None = None
        self.preemption_reason = ""
        self.allocator_status: dict[str, Any] = {
            "address": allocator.address if allocator else "",
            "mode": "grpc" if allocator else "disabled",
            "reachable": None,
            "last_error": "",
        }

    # --- requests -----------------------------------------------------------------------

    def start_mission(self, spec: MissionSpec) -> Mission:
        with self._lock:
            self.machine.check(
                Event.START_MISSION, f"a mission cannot start in state {self.machine.state.value}"
            )
            mission = Mission(id=uuid.uuid4().hex[:12], spec=spec, started_at=self.clock())
            mission.plan = self._plan(mission)
            self.mission = mission
            self._save("mission_start")
            self.machine.fire(Event.START_MISSION)
            log.info("mission started", extra={"mission": mission.id, "steps": spec.steps})
            return mission

    def cancel_mission(self) -> Mission:
        with self._lock:
            self.machine.check(
                Event.CANCEL, f"no mission to cancel in state {self.machine.state.value}"
            )
            assert self.mission is not None
            self._end_mission("cancelled")
            self.machine.fire(Event.CANCEL)
            return self.mission

    def submit_urgent(self, spec: UrgentSpec, source: str = "http") -> UrgentEvent:
        with self._lock:
            if len(self.queue) >= self.queue_limit:
                raise IllegalTransition(
                    self.machine.state,
                    Event.START_URGENT,
                    f"urgent queue is full ({self.queue_limit} waiting)",
                )
            self._seq += 1
            event = UrgentEvent(
                id=uuid.uuid4().hex[:12],
                spec=spec,
                arrived_at=self.clock(),
                seq=self._seq,
                source=source,
            )
            self._enqueue(event)
            self.metrics.urgent_received.labels(source).inc()
            self._save("urgent_arrived")
            log.info(
                "urgent event queued",
                extra={
                    "urgent": event.id,
                    "urgent_name": spec.name,
                    "deadline_ms": spec.deadline_ms,
                },
            )
            return event

    def tick(self, count: int = 1) -> None:
        for _ in range(count):
            with self._lock:
                self._tick_once()

    # --- the loop -------------------------------------------------------------------------

    def _tick_once(self) -> None:
        self.ticks += 1
        if self.undeleted and self.clock() >= self._next_delete_retry:
            self._retry_delete()
        self.metrics.ticks.inc()
        state = self.machine.state
        if state in (State.IDLE, State.COMPLETED):
            if self.queue:
                self._start_next_urgent()
        elif state is State.RUNNING:
            self._mission_step()
        elif state is State.CHECKPOINTING:
            self._save("preemption")
            self.machine.fire(Event.CHECKPOINT_SAVED)
        elif state is State.PREEMPTED:
            if self.queue:
                self._start_next_urgent()
            else:
                self.machine.fire(Event.RESUME)
        elif state is State.URGENT_TASK_RUNNING:
            self._urgent_step()
        elif state is State.RESUMING:
            self._load_checkpoint()
        elif state is State.COMPENSATING:
            self._compensate()

    def _mission_step(self) -> None:
        mission = self.mission
        assert mission is not None
        if self.queue and mission.at_safe_point():
            self._preempt("safe_point")
            return
        if self.queue and self._must_stop_now(mission):
            self._preempt("rollback")
            return
        mission.step += 1
        self.machine.fire(Event.STEP)
        if mission.step >= mission.spec.steps:
            self._end_mission("met" if self._within_deadline(mission) else "missed")
            self.machine.fire(Event.COMPLETE)
        elif mission.at_safe_point():
            mission.checkpoint_step = mission.step
            self._save("safe_point")
            if self.queue:
                self._preempt("safe_point")
        else:
            self._save("progress", durable=False)

    def _must_stop_now(self, mission: Mission) -> bool:
        """Roll back only when waiting is predicted to miss the deadline and stopping now meets it."""
        head = self.queue[0][2]
        left_s = head.deadline_at - self.clock()
        # two control ticks between stopping and the urgent task's start: checkpoint, hand-over
        now_s = (2 + head.spec.work) * self.tick_s
        wait_s = now_s + mission.steps_to_safe_point() * self.tick_s
        return wait_s > left_s >= now_s

    def _preempt(self, reason: str) -> None:
        mission = self.mission
        assert mission is not None
        now = self.clock()
        for _, _, event in self.queue:
            if event.mission_stopped_at is None:
                event.mission_stopped_at = now
                self.metrics.time_to_safe_point.observe(max(0.0, now - event.arrived_at))
        mission.preemptions += 1
        self.preemption_reason = reason
        log.info(
            "mission preempted",
            extra={"mission": mission.id, "step": mission.step, "reason": reason},
        )
        self.machine.fire(Event.PREEMPT)

    def _start_next_urgent(self) -> None:
        _, _, event = heapq.heappop(self.queue)
        self.metrics.queue_depth.set(len(self.queue))
        self.active = event
        if self.allocator is None:
            event.allocator = "disabled"
        else:
            outcome = self.allocator.submit_urgent(
                event.id, event.spec.name, event.spec.deadline_ms
            )
            event.allocator = (
                "submitted" if outcome.ok else "unreachable" if outcome.unreachable else "rejected"
            )
            event.allocator_error = outcome.error
            self._note_allocator("submit", outcome)
            self._read_allocation(event)
        self.metrics.urgent_handling.labels(
            "allocator" if event.intent_submitted else "local"
        ).inc()
        event.started_at = self.clock()
        self.metrics.preemption_latency.observe(max(0.0, event.started_at - event.arrived_at))
        self.machine.fire(Event.START_URGENT)
        self._save("urgent_started")

    def _read_allocation(self, event: UrgentEvent) -> None:
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

    def _urgent_step(self) -> None:
        event = self.active
        assert event is not None
        self._read_allocation(event)
        event.done += 1
        self.machine.fire(Event.URGENT_STEP)
        if event.done < event.spec.work:
            self._save("urgent_progress", durable=False)
            return
        now = self.clock()
        event.finished_at = now
        elapsed = now - event.arrived_at
        event.outcome = "met" if now <= event.deadline_at else "missed"
        self.metrics.urgent_completion.observe(max(0.0, elapsed))
        self.metrics.urgent_deadline_ratio.observe(elapsed * 1000.0 / event.spec.deadline_ms)
        self.metrics.urgent_completed.labels(event.outcome).inc()
        if event.outcome == "missed":
            self.metrics.urgent_deadline_misses.inc()
        self.metrics.urgent_allocated_units.set(0)
        if event.intent_submitted and self.allocator is not None:
            outcome = self.allocator.delete_urgent(event.id)
            event.intent_deleted = outcome.ok
            self._note_allocator("delete", outcome)
            if not outcome.ok:
                self.undeleted.append(event.id)
                self._next_delete_retry = now + DELETE_RETRY_S
        self.finished.appendleft(event)
        self.active = None
        log.info(
            "urgent task done",
            extra={"urgent": event.id, "outcome": event.outcome, "elapsed_s": round(elapsed, 4)},
        )
        if self.mission is not None and self.mission.live:
            self._resume_started_at = now
            self.machine.fire(Event.URGENT_DONE)
        else:
            self.machine.fire(Event.URGENT_DONE_IDLE)
        self._save("urgent_done")

    def _retry_delete(self) -> None:
        if not self.clean_up_leftovers():
            self._next_delete_retry = self.clock() + DELETE_RETRY_S

    def clean_up_leftovers(self) -> bool:
        """Delete the URGENT intents a failed DeleteIntent left at the allocator, oldest first,
        stopping at the first failure; True when none is left. The app calls this on its own
        timer (not the control tick), so they go as soon as the allocator is back."""
        with self._lock:
            if self.allocator is None:
                self.undeleted.clear()
                return True
            while self.undeleted:
                outcome = self.allocator.delete_urgent(self.undeleted[0])
                self._note_allocator("delete", outcome)
                if not outcome.ok:
                    return False
                self.undeleted.pop(0)
                log.info("left-over urgent intent deleted", extra={"intent_id": outcome.intent_id})
                self._save("intent_deleted")
            return True

    def _load_checkpoint(self) -> None:
        """Resume from what is on disk, not from memory: the same path a restarted bridge takes."""
        mission = self.mission
        assert mission is not None
        document = self.store.load()
        stored = (document or {}).get("mission") or {}
        if stored.get("id") == mission.id:
            mission.checkpoint_step = int(stored["checkpoint_step"])
        else:
            log.warning(
                "checkpoint on disk is not this mission's; resuming from memory",
                extra={"mission": mission.id},
            )
        self.machine.fire(Event.RESTORED)

    def _compensate(self) -> None:
        mission = self.mission
        assert mission is not None
        started = time.perf_counter()
        lost = mission.step - mission.checkpoint_step
        mission.step = mission.checkpoint_step
        mission.plan = self._plan(mission)
        self.metrics.replan.observe(time.perf_counter() - started)
        mission.steps_redone += lost
        self.metrics.steps_redone.inc(lost)
        now = self.clock()
        if self._resume_started_at is not None:
            self.metrics.resume_latency.observe(max(0.0, now - self._resume_started_at))
            self._resume_started_at = None
        self._save("resumed")
        log.info(
            "mission resumed",
            extra={"mission": mission.id, "step": mission.step, "steps_redone": lost},
        )
        self.machine.fire(Event.COMPENSATED)

    def _plan(self, mission: Mission) -> dict[str, Any]:
        """The rest of the mission from its current step: safe points ahead and the deadline forecast."""
        interval = mission.spec.safe_point_interval
        remaining = mission.spec.steps - mission.step
        next_safe = min(mission.spec.steps, (mission.step // interval + 1) * interval)
        finish_at = self.clock() + remaining * self.tick_s
        plan: dict[str, Any] = {
            "from_step": mission.step,
            "remaining_steps": remaining,
            "next_safe_point": next_safe,
            "safe_points_left": len(range(next_safe, mission.spec.steps + 1, interval)),
            "predicted_finish_in_ms": round(remaining * self.tick_s * 1000.0, 3),
            "deadline_at_risk": False,
        }
        if mission.spec.deadline_ms > 0:
            deadline_at = mission.started_at + mission.spec.deadline_ms / 1000.0
            plan["deadline_at_risk"] = finish_at > deadline_at
        return plan

    # --- restart ----------------------------------------------------------------------------

    def restore(self) -> bool:
        """On start: bring back the urgent queue and a live mission from the checkpoint on disk."""
        with self._lock:
            document = self.store.load()
            if document is None:
                return False
            self.undeleted = [str(event_id) for event_id in document.get("undeleted", [])]
            events = [UrgentEvent.from_doc(d) for d in document.get("queue", [])]
            if document.get("active"):
                interrupted = UrgentEvent.from_doc(document["active"])
                interrupted.done, interrupted.started_at, interrupted.allocator = 0, None, "pending"
                events.append(interrupted)
            for event in events:
                self._seq = max(self._seq, event.seq)
                self._enqueue(event)
            stored = document.get("mission")
            if not stored:
                return bool(events)
            mission = Mission.from_doc(stored)
            self.mission = mission
            if not mission.live:
                return bool(events)
            mission.restarts += 1
            self._resume_started_at = self.clock()
            log.info(
                "restoring mission from checkpoint",
                extra={
                    "mission": mission.id,
                    "checkpoint_step": mission.checkpoint_step,
                    "step": mission.step,
                },
            )
            self.machine.fire(Event.RESTORE)
            return True

    # --- helpers ------------------------------------------------------------------------------

    def _enqueue(self, event: UrgentEvent) -> None:
        heapq.heappush(self.queue, (event.deadline_at, event.seq, event))
        self.metrics.queue_depth.set(len(self.queue))

    def _within_deadline(self, mission: Mission) -> bool:
        if mission.spec.deadline_ms <= 0:
            return True
        return self.clock() - mission.started_at <= mission.spec.deadline_ms / 1000.0

    def _end_mission(self, outcome: str) -> None:
        mission = self.mission
        assert mission is not None
        mission.outcome = outcome
        mission.ended_at = self.clock()
        self.metrics.missions.labels(outcome).inc()
        self._save("mission_end")
        log.info("mission ended", extra={"mission": mission.id, "outcome": outcome})

    def _note_allocator(self, operation: str, outcome: AllocatorOutcome) -> None:
        self.allocator_status["reachable"] = outcome.ok or not outcome.unreachable
        if outcome.ok:
            self.allocator_status["last_error"] = ""  # an answer: the old failure is over
            return
        reason = "unreachable" if outcome.unreachable else "rejected"
        self.allocator_status["last_error"] = f"{operation}: {outcome.code} {outcome.error}".strip()
        self.metrics.allocator_failures.labels(operation, reason).inc()

    def _save(self, reason: str, *, durable: bool = True) -> None:
        document = {
            "saved_at": self.clock(),
            "reason": reason,
            "state": self.machine.state.value,
            "mission": self.mission.to_doc() if self.mission else None,
            "queue": [event.to_doc() for _, _, event in sorted(self.queue)],
            "active": self.active.to_doc() if self.active else None,
            "undeleted": list(self.undeleted),
        }
        self.store.save(document, durable=durable)
        if durable:
            self.metrics.checkpoints.labels(reason).inc()

    # --- views ----------------------------------------------------------------------------------

    def subscribe(self, listener: Callable[[Transition], None]) -> None:
        self.machine.subscribe(listener)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            state = self.machine.state
            return {
                "state": state.value,
                "legal_events": [e.value for e in legal_events(state)],
                "accepts_mission": self.machine.allows(Event.START_MISSION),
                "mission": mission_view(self.mission, state, self.clock()),
                "urgent": {
                    "active": urgent_view(self.active) if self.active else None,
                    "queue": [urgent_view(e) for _, _, e in sorted(self.queue)],
                    "recent": [urgent_view(e) for e in self.finished],
                    "handled_locally": bool(self.active and not self.active.intent_submitted),
                },
                "preemption": {"reason": self.preemption_reason},
                "allocator": {**self.allocator_status, "undeleted_intents": len(self.undeleted)},
                "ticks": self.ticks,
                "tick_ms": self.tick_s * 1000.0,
                "checkpoint": {"path": str(self.store.path)},
                "transitions": transitions_view(self.machine.history),
            }
