"""Logical stream priority -> CUDA range (lower number = higher priority)."""

from __future__ import annotations

from typing import Any

import pytest

from services.gpulane import priority
from services.gpulane.priority import ASSUMED_RANGE, PriorityRange, map_priority


@pytest.mark.parametrize(
    ("least", "greatest", "high", "normal", "low"),
    [(0, -5, -5, -2, 0), (0, -1, -1, 0, 0), (0, 0, 0, 0, 0), (0, -2, -2, -1, 0)],
)
def test_mapping_into_device_range(
    least: int, greatest: int, high: int, normal: int, low: int
) -> None:
    rng = PriorityRange(least, greatest, "queried: test")
    assert map_priority(1, rng) == high
    assert map_priority(0, rng) == normal
    assert map_priority(-1, rng) == low
    # higher logical priority never maps to a numerically larger (less urgent) value
    assert map_priority(1, rng) <= map_priority(0, rng) <= map_priority(-1, rng)
    assert not rng.assumed


def test_out_of_range_logical_priority() -> None:
    with pytest.raises(ValueError, match="-1, 0 or 1"):
        map_priority(2, ASSUMED_RANGE)


def test_without_runtime_the_range_is_the_flagged_assumption(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(priority, "cuda_driver_available", lambda: False)
    rng = priority.probe_priority_range(0)
    assert rng is ASSUMED_RANGE
    assert rng.assumed and "assumed" in rng.describe()
    assert (rng.least, rng.greatest) == (0, -5)


class FakeCudaDriver:
    """The GPU boundary only: libcuda's entry points as ctypes would call them (no GPU here)."""

    def __init__(self, least: int, greatest: int, init_error: int = 0) -> None:
        self.least, self.greatest, self.init_error = least, greatest, init_error
        self.calls: list[str] = []
        self.retained = 0

    def cuInit(self, flags: int) -> int:
        self.calls.append("cuInit")
        return self.init_error

    def cuDeviceGet(self, device: Any, ordinal: int) -> int:
        device._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxRetain(self, context: Any, device: Any) -> int:
        self.retained += 1
        context._obj.value = 0x1000 + device.value
        return 0

    def cuCtxSetCurrent(self, context: Any) -> int:
        self.calls.append(f"current {context.value:#x}")
        return 0

    def cuCtxGetStreamPriorityRange(self, least: Any, greatest: Any) -> int:
        least._obj.value, greatest._obj.value = self.least, self.greatest
        return 0

    def cuDevicePrimaryCtxRelease_v2(self, device: Any) -> int:
        self.retained -= 1
        return 0


def test_range_is_read_from_the_device_through_the_driver() -> None:
    cuda = FakeCudaDriver(least=0, greatest=-4)
    assert priority.query_driver(3, cuda) == (0, -4)
    assert cuda.calls == ["cuInit", "current 0x1003"] and cuda.retained == 0


def test_a_driver_error_names_the_call() -> None:
    with pytest.raises(RuntimeError, match="cuInit returned CUDA error 100"):
        priority.query_driver(0, FakeCudaDriver(0, -5, init_error=100))


def test_a_failed_probe_is_an_assumption_that_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    # a real child process: no driver here, and no GPU 4096 where there is one
    monkeypatch.setattr(priority, "cuda_driver_available", lambda: True)
    rng = priority.probe_priority_range(4096, timeout_s=60)
    assert rng.assumed and "the probe on GPU 4096 failed (" in rng.source
    assert (rng.least, rng.greatest) == (0, -5)
