"""Plain data of the robot's work: a mission's progress and an urgent event's life, as checkpointed.

Both round-trip through JSON (``to_doc`` / ``from_doc``) so the checkpoint on disk holds exactly
what the controller needs to resume after a restart. Times are wall-clock seconds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from services.bridge.validation import MissionSpec, UrgentSpec


@dataclass
class Mission:
    id: str
    spec: MissionSpec
    started_at: float
    step: int = 0
    checkpoint_step: int = 0
    steps_redone: int = 0
    preemptions: int = 0
    restarts: int = 0
    outcome: str = ""  # "", "met", "missed", "cancelled"
    ended_at: float | None = None
    plan: dict[str, Any] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        return not self.outcome

    def at_safe_point(self) -> bool:
        return self.step % self.spec.safe_point_interval == 0

    def steps_to_safe_point(self) -> int:
        interval = self.spec.safe_point_interval
        return min(interval - self.step % interval, self.spec.steps - self.step)

    def to_doc(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["spec"] = asdict(self.spec)
        return doc

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Mission:
        fields = dict(doc)
        fields["spec"] = MissionSpec(**fields["spec"])
        return cls(**fields)


@dataclass
class UrgentEvent:
    id: str
    spec: UrgentSpec
    arrived_at: float
    seq: int
    source: str = "http"
    done: int = 0
    mission_stopped_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    # pending; submitted (the allocator holds the intent, not planned yet); granted or throttled
    # (what its plan gave: see `allocation`); unreachable, rejected, disabled (handled locally)
    allocator: str = "pending"
    allocator_error: str = ""
    # the allocator's plan for the intent: units, workers, state, reason, predicted_p99_ms
    allocation: dict[str, Any] | None = None
    intent_deleted: bool | None = None
    outcome: str = ""  # "", "met", "missed"

    @property
    def deadline_at(self) -> float:
        return self.arrived_at + self.spec.deadline_ms / 1000.0

    @property
    def intent_submitted(self) -> bool:
        """The allocator holds this event's URGENT intent (it must be deleted when done)."""
        return self.allocator in ("submitted", "granted", "throttled")

    def to_doc(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["spec"] = asdict(self.spec)
        return doc

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> UrgentEvent:
        fields = dict(doc)
        fields["spec"] = UrgentSpec(**fields["spec"])
        return cls(**fields)
