"""Lane-load sources: where the lane service's GPU pressure and per-lane load figures come from.

One small Protocol and a name -> factory registry, chosen by ``gpulane.backend``. ``nvml``
reports what the driver measures. Other sources (a modeled one for machines without a GPU)
register themselves here; they may model lane utilisation and GPU pressure, labelled with
their backend name, but never add devices: the device list always comes from NVML.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from services.common.registry import choose, lazy
from services.gpulane.lanes import LaneView
from services.gpulane.nvml import NvmlSnapshot


@dataclass(frozen=True)
class LaneLoad:
    backend: str
    gpu_pressure: float  # [0, 1]
    lane_utilization_percent: Mapping[str, float] = field(default_factory=dict)
    note: str = ""


class LaneLoadSource(Protocol):
    """Contract: pure reading, cheap (called on every telemetry request), no device invention.

    ``lane_share_percent`` is the share the active GPU plan gives each lane (sum over its
    intents, in percent of one GPU: a four-GPU lane holds up to 400). The result's ``backend`` names the source ("nvml", "modeled", ...).
    """

    name: str

    def sample(
        self,
        snapshot: NvmlSnapshot,
        lanes: tuple[LaneView, ...],
        lane_share_percent: Mapping[str, float],
    ) -> LaneLoad: ...


# factory(gpulane config section) -> source
LaneLoadFactory = Callable[[Mapping[str, Any]], LaneLoadSource]


class NvmlLaneLoad:
    """Measured load: a lane's utilisation is the mean NVML utilisation of its present GPUs."""

    name = "nvml"

    def __init__(self, _section: Mapping[str, Any] | None = None) -> None:
        pass

    def sample(
        self,
        snapshot: NvmlSnapshot,
        lanes: tuple[LaneView, ...],
        lane_share_percent: Mapping[str, float],
    ) -> LaneLoad:
        util = {d.index: d.utilization_percent for d in snapshot.devices}
        per_lane = {
            lane.name: sum(util[i] for i in lane.present) / len(lane.present)
            for lane in lanes
            if lane.present
        }
        pressure = sum(util.values()) / (100.0 * len(util)) if util else 0.0
        note = "" if snapshot.available else "no NVML: no GPU load measured"
        return LaneLoad("nvml", min(1.0, max(0.0, pressure)), per_lane, note)


# One line per source, e.g. "modeled": lazy("services.gpulane.modeled:ModeledLaneLoad").
REGISTRY: dict[str, LaneLoadFactory] = {
    "nvml": NvmlLaneLoad,
    "modeled": lazy("services.gpulane.modeled:ModeledLaneLoad"),
}


def build_lane_load(name: str, section: Mapping[str, Any]) -> LaneLoadSource:
    """The configured source; an unknown name is a ConfigError listing the known ones (as the
    node agent's backends)."""
    source: LaneLoadSource = choose(REGISTRY, name, "gpulane.backend")(section)
    return source
