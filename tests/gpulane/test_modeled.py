"""The modeled lane-load source: load from the plan's shares, no invented devices, no pressure."""

from __future__ import annotations

import pytest

from services.gpulane.backend import REGISTRY, build_lane_load
from services.gpulane.lanes import LaneView
from services.gpulane.modeled import ModeledLaneLoad
from services.gpulane.nvml import NvmlSnapshot

LANES = (
    LaneView("online", (0, 1), (0, 1), ""),
    LaneView("batch", (2, 3, 4, 5), (2, 3, 4, 5), ""),
    LaneView("robot", (6,), (), "GPU 6 not present"),
)


def test_registered_and_built_by_name() -> None:
    assert "modeled" in REGISTRY
    assert build_lane_load("modeled", {}).name == "modeled"


def test_lane_load_follows_the_plan_shares_and_the_class_mix() -> None:
    source = ModeledLaneLoad({})
    online = source.params.mix["ONLINE"].gpu_fraction
    batch = source.params.mix["BATCH"].gpu_fraction
    load = source.sample(NvmlSnapshot(available=True), LANES, {"online": 100.0, "batch": 400.0})
    assert load.backend == "modeled"
    assert load.lane_utilization_percent["online"] == pytest.approx(50.0 * online)
    assert load.lane_utilization_percent["batch"] == pytest.approx(100.0 * batch)
    assert load.lane_utilization_percent["robot"] == 0.0  # no share on an absent lane
    assert load.gpu_pressure == 0.0  # GPU disturbances arrive through the node agent


def test_no_nvml_is_said_and_no_device_is_added() -> None:
    load = ModeledLaneLoad({}).sample(NvmlSnapshot(available=False, error="no driver"), LANES, {})
    assert "no NVML" in load.note
    assert all(v == 0.0 for v in load.lane_utilization_percent.values())
