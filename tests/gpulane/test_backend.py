"""Lane-load sources: the NVML one, and the fallback for a configured source not registered."""

from __future__ import annotations

import pytest

from services.common.config import ConfigError
from services.common.registry import lazy
from services.gpulane import backend
from services.gpulane.lanes import parse_lanes, resolve_lanes
from services.gpulane.nvml import Nvml, NvmlSnapshot
from tests.gpulane.fake_nvml import FakeGpu, h200_node

LANES = parse_lanes({"online": [0, 1], "batch": [2, 3]})


def test_nvml_source_measures_lane_utilisation() -> None:
    snap = Nvml(h200_node(2, gpu0=FakeGpu(utilization=80), gpu1=FakeGpu(utilization=20))).snapshot()
    load = backend.NvmlLaneLoad().sample(snap, resolve_lanes(LANES, snap), {})
    assert load.backend == "nvml"
    assert load.lane_utilization_percent == {"online": 50.0}
    assert load.gpu_pressure == pytest.approx(0.5)


def test_no_nvml_zero_pressure_and_a_note() -> None:
    snap = NvmlSnapshot(False, "no driver")
    load = backend.NvmlLaneLoad().sample(snap, resolve_lanes(LANES, snap), {})
    assert load.gpu_pressure == 0.0 and load.lane_utilization_percent == {}
    assert "no NVML" in load.note


def test_an_unknown_backend_is_a_config_error_naming_the_known_ones() -> None:
    with pytest.raises(
        ConfigError, match=r"gpulane.backend: unknown backend 'bogus' \(known: modeled, nvml\)"
    ):
        backend.build_lane_load("bogus", {})


def test_lazy_factory_imports_on_first_use(monkeypatch: pytest.MonkeyPatch) -> None:
    factory = lazy("services.gpulane.backend:NvmlLaneLoad")
    monkeypatch.setattr(backend, "REGISTRY", {"nvml-lazy": factory})
    assert backend.build_lane_load("nvml-lazy", {}).name == "nvml"
