"""Lane map parsing and resolution against the GPUs NVML reports (absent GPUs never faked)."""

from __future__ import annotations

import pytest

from services.common.config import ConfigError
from services.gpulane.lanes import parse_lanes, resolve_lanes
from services.gpulane.nvml import Nvml, NvmlSnapshot
from tests.gpulane.fake_nvml import h200_node

REFERENCE = {"online": [0, 1], "batch": [2, 3, 4, 5], "robot": [6], "urgent": [7]}


@pytest.mark.parametrize(
    "raw",
    [{}, [], {"online": [0, 0]}, {"online": [-1]}, {"online": "0,1"}, {"": [0]}, {"x": [True]}],
)
def test_bad_lane_maps_are_rejected(raw: object) -> None:
    with pytest.raises(ConfigError, match="gpulane.lanes"):
        parse_lanes(raw)


def test_no_nvml_every_lane_unavailable_with_reason() -> None:
    views = resolve_lanes(parse_lanes(REFERENCE), NvmlSnapshot(False, "NVML unavailable: gone"))
    assert [v.available for v in views] == [False] * 4
    assert all(v.present == () for v in views)
    assert all("NVML unavailable: gone" in v.reason for v in views)


def test_two_gpu_node_keeps_only_present_gpus() -> None:
    views = {
        v.name: v for v in resolve_lanes(parse_lanes(REFERENCE), Nvml(h200_node(2)).snapshot())
    }
    assert views["online"].present == (0, 1) and views["online"].available
    assert views["online"].reason == ""
    assert not views["batch"].available
    assert views["batch"].reason == "GPUs 2,3,4,5 not present (NVML reports 0,1)"
    assert views["urgent"].configured == (7,) and views["urgent"].present == ()


def test_partially_present_lane_runs_on_what_is_there() -> None:
    views = {
        v.name: v for v in resolve_lanes(parse_lanes(REFERENCE), Nvml(h200_node(4)).snapshot())
    }
    assert views["batch"].present == (2, 3)
    assert views["batch"].available
    assert "GPUs 4,5 absent" in views["batch"].reason
