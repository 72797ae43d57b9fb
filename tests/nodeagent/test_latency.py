"""The latency book: nearest-rank percentiles, misses against the deadline, samples reported once."""

from __future__ import annotations

import pytest

from services.nodeagent.latency import RECENT_LIMIT, LatencyBook, percentile
from services.nodeagent.pools import Completion

NOW = 2.0  # the clock the summaries are read at (every completion below ends before it)


def _done(latency_ms: float, service_ms: float, due: float = 0.0) -> Completion:
    return Completion(
        "web",
        "online",
        due=due,
        start=due + (latency_ms - service_ms) / 1000.0,
        end=due + latency_ms / 1000.0,
        cpu_ms=service_ms,
    )


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (
        50.0,
        99.0,
        100.0,
    )
    assert percentile([], 99) == 0.0


def test_summary_counts_misses_and_drains_recent_samples() -> None:
    book = LatencyBook("web", deadline_ms=50.0)
    for i in range(1, 101):
        book.record(_done(float(i), 1.0 + i / 100))
    first = book.summary(now=NOW)
    assert first.count == 100 and first.deadline_misses == 50
    assert (round(first.p50_ms, 6), round(first.p95_ms, 6), round(first.p99_ms, 6)) == (
        50.0,
        95.0,
        99.0,
    )
    assert len(first.recent_service_ms) == 100 and first.window_count == 100
    assert abs(first.service_mean_ms - 1.505) < 1e-9
    again = book.summary(now=NOW)
    assert list(again.recent_service_ms) == [] and again.window_count == 0 and again.count == 100
    for _ in range(RECENT_LIMIT + 50):
        book.record(_done(10.0, 2.0))
    assert len(book.summary(now=NOW).recent_service_ms) == RECENT_LIMIT  # bounded message size


def test_samples_are_stated_at_parallelism_one() -> None:
    """Each pool worker serves one request on one thread, so the allocator must not rescale
    the samples by the pool's size (services/core/tick.py: observations)."""
    book = LatencyBook("web")
    book.record(_done(12.0, 9.0))
    assert book.summary(now=NOW).sample_parallelism == 1


def test_reset_starts_a_new_window() -> None:
    book = LatencyBook("web", deadline_ms=50.0)
    for i in range(1, 101):
        book.record(_done(float(10 * i), 5.0))
    book.reset()
    book.record(_done(20.0, 5.0))
    got = book.summary(now=NOW)
    assert (got.count, got.deadline_misses, got.p99_ms) == (1, 0, 20.0)
    assert [round(x, 6) for x in got.recent_service_ms] == [5.0]


def test_percentiles_cover_the_last_window_seconds_only() -> None:
    """A transient (a burst of slow requests 12 s ago) leaves the observed tail once it is
    older than the window; counts and misses stay totals."""
    book = LatencyBook("web", deadline_ms=50.5, window_s=10.0)
    for _ in range(50):
        book.record(_done(300.0, 20.0, due=0.0))
    for i in range(1, 101):
        book.record(_done(float(i), 5.0, due=12.0))
    got = book.summary(now=13.0)
    assert (got.p50_ms, got.p99_ms) == pytest.approx((50.0, 99.0))
    assert got.service_p99_ms == pytest.approx(5.0)
    assert got.count == 150 and got.deadline_misses == 100
    later = book.summary(now=23.0)  # nothing completed in the last 10 s
    assert (later.p99_ms, later.mean_ms, later.count) == (0.0, 0.0, 150)
    with pytest.raises(ValueError):
        LatencyBook("web", window_s=0.0)
