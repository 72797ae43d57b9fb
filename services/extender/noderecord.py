"""One node as the extender scores it (NodeRecord): read by the node view and its columns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from services.core.model import IntentSpec, LaneCapacity, NodeState
from services.core.placement import NodeView


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """One node as the extender scores it."""

    name: str
    cpu_units: int
    lanes: tuple[LaneCapacity, ...] = ()
    contention: float = 0.0
    schedulable: bool = True  # not cordoned and Ready
    source: str = "request"  # request, api, sample, telemetry
    residents: tuple[IntentSpec, ...] = ()
    telemetry_at: float | None = None
    # derived in ClusterView._merge from the residents:
    free_lane_units: Mapping[str, float] = field(default_factory=dict)  # lanes with GPUs present
    placement: NodeView | None = None  # D-MUG's view: units the residents are committed to

    def lane_free(self, name: str) -> float | None:
        """Share units free on a lane with GPUs present; None when the lane is not there."""
        return self.free_lane_units.get(name)

    @property
    def state(self) -> NodeState:
        return NodeState(
            name=self.name,
            cpu_units=self.cpu_units,
            lanes=self.lanes,
            contention=self.contention,
        )

    def lane(self, name: str) -> LaneCapacity | None:
        for lane in self.lanes:
            if lane.name == name:
                return lane
        return None
