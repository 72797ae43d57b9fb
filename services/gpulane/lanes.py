"""The lane map: configured lanes (name -> GPU indexes) resolved against the GPUs NVML reports.

The config carries the 8xH200 reference map (four lanes over GPUs 0-7). At run time a lane
keeps only the GPUs that are present; a lane with none is unavailable and says why. Nothing is
ever filled in for an absent GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services.common.config import ConfigError
from services.gpulane.nvml import NvmlSnapshot


@dataclass(frozen=True)
class LaneSpec:
    name: str
    indexes: tuple[int, ...]


@dataclass(frozen=True)
class LaneView:
    name: str
    configured: tuple[int, ...]
    present: tuple[int, ...]
    reason: str

    @property
    def available(self) -> bool:
        return bool(self.present)


def parse_lanes(raw: Any) -> tuple[LaneSpec, ...]:
    """Validate gpulane.lanes: a mapping of lane name to a list of distinct GPU indexes."""
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError("gpulane.lanes: expected a mapping of lane name to GPU indexes")
    lanes = []
    for name, indexes in raw.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"gpulane.lanes: lane name {name!r} must be a non-empty string")
        if not isinstance(indexes, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in indexes
        ):
            raise ConfigError(f"gpulane.lanes.{name}: expected a list of GPU indexes >= 0")
        if len(set(indexes)) != len(indexes):
            raise ConfigError(f"gpulane.lanes.{name}: GPU indexes repeat")
        lanes.append(LaneSpec(name, tuple(indexes)))
    return tuple(lanes)


def _fmt(indexes: tuple[int, ...]) -> str:
    return ",".join(str(i) for i in indexes) or "none"


def resolve_lanes(lanes: tuple[LaneSpec, ...], snapshot: NvmlSnapshot) -> tuple[LaneView, ...]:
    present_all = set(snapshot.present_indexes)
    views = []
    for lane in lanes:
        present = tuple(i for i in lane.indexes if i in present_all)
        absent = tuple(i for i in lane.indexes if i not in present_all)
        if not snapshot.available:
            reason = f"no GPU: {snapshot.error or 'NVML unavailable'}"
        elif not present:
            reason = (
                f"GPUs {_fmt(lane.indexes)} not present "
                f"(NVML reports {_fmt(snapshot.present_indexes)})"
            )
        elif absent:
            reason = f"GPUs {_fmt(absent)} absent; lane runs on {_fmt(present)}"
        else:
            reason = ""
        views.append(LaneView(lane.name, lane.indexes, present, reason))
    return tuple(views)


def lane_by_name(views: tuple[LaneView, ...], name: str) -> LaneView | None:
    for view in views:
        if view.name == name:
            return view
    return None
