"""Logical stream priority -> CUDA range (lower number = higher priority)."""

from __future__ import annotations

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
    monkeypatch.setattr(priority, "gpu_runtime_available", lambda: False)
    rng = priority.probe_priority_range(0)
    assert rng is ASSUMED_RANGE
    assert rng.assumed and "assumed" in rng.describe()
    assert (rng.least, rng.greatest) == (0, -5)
