"""The ``modeled`` lane-load source: lane utilisation from the modeled node, no GPU needed.

Without a GPU the service has no measured load to show, so this source models it from the
active GPU plan: a lane's utilisation is the share the plan hands out on it per GPU times the
fraction of a request's time that runs on the GPU for the workload class the lane is named after
(configs/model.yaml ``mix``; the batch mix for any other name). It never adds devices (the
device list always comes from NVML) and reports no GPU pressure of its own: modeled GPU
disturbances are injected into the node agent's modeled backend and reach the allocator through
its NodeTelemetry, so counting them here too would count them twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.gpulane.backend import LaneLoad
from services.gpulane.lanes import LaneView
from services.gpulane.nvml import NvmlSnapshot
from services.sim.params import ModelParams, load_model_params


class ModeledLaneLoad:
    name = "modeled"

    def __init__(
        self, _section: Mapping[str, Any] | None = None, *, params: ModelParams | None = None
    ) -> None:
        self.params = params or load_model_params()

    def sample(
        self,
        snapshot: NvmlSnapshot,
        lanes: tuple[LaneView, ...],
        lane_share_percent: Mapping[str, float],
    ) -> LaneLoad:
        per_lane: dict[str, float] = {}
        for lane in lanes:
            mix = self.params.mix.get(lane.name.upper()) or self.params.mix_for("BATCH")
            # lane units are percent of one GPU summed over the lane's GPUs
            share = lane_share_percent.get(lane.name, 0.0) / max(1, len(lane.present))
            per_lane[lane.name] = min(100.0, max(0.0, share * mix.gpu_fraction))
        note = "modeled lane load from the GPU plan's shares (configs/model.yaml mix)"
        if not snapshot.available:
            note += "; no NVML: no GPU present, lanes unavailable"
        return LaneLoad("modeled", 0.0, per_lane, note)
