"""The "never" latency: one sentinel, written as infinity by every view."""

from __future__ import annotations

from services.common.latency import UNBOUNDED_MS, format_ms, is_unbounded
from services.core.formulas import predicted_latency_ms


def test_the_allocator_predicts_the_sentinel_for_a_queue_that_does_not_drain() -> None:
    overloaded = float(predicted_latency_ms(100.0, 100.0, 0.5, 2, 50.0, 1.0))
    assert overloaded == UNBOUNDED_MS and is_unbounded(overloaded)


def test_latency_and_slack_read_as_infinity_only_when_unbounded() -> None:
    assert format_ms(12.345) == "12.3 ms"
    assert format_ms(UNBOUNDED_MS) == "∞ ms"
    assert format_ms(3_600_000.0 - UNBOUNDED_MS) == "−∞ ms"  # slack of the longest deadline
    assert format_ms(-3_600_000.0) == "-3600000.0 ms"  # a real (if dire) slack stays a number
    assert format_ms(UNBOUNDED_MS, unit="") == "∞"
    assert format_ms(None) == "-"
    assert not is_unbounded(3_600_000.0)
