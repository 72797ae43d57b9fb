"""Per-intent bookkeeping of what the modeled node served: sliding windows, totals, history.

The modeled backend reports LatencySummary from the sliding window (like the real pools do) and
drains the service-time samples once per telemetry pull; the headless experiments keep the
whole history to compute run-level percentiles and per-second series.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from services.sim.queue import EMPTY, StepOutcome


@dataclass(frozen=True, slots=True)
class LatencyView:
    count: int
    window_count: int  # requests (batch: sampled items) since the last drain
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    deadline_misses: int
    service_mean_ms: float
    service_p99_ms: float


def percentiles(values: np.ndarray, qs: tuple[float, ...] = (50, 95, 99)) -> list[float]:
    """Linear-interpolation percentiles (numpy's default method) from one sort.

    np.percentile is costly per call in its generality; telemetry asks for three of them per
    intent on every tick, so one sort and direct indexing keep the headless runs fast.
    """
    n = int(values.size)
    if n == 0:
        return [0.0 for _ in qs]
    ordered = np.sort(values)
    out = []
    for q in qs:
        rank = q / 100.0 * (n - 1)
        lo = int(rank)
        hi = min(lo + 1, n - 1)
        out.append(float(ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)))
    return out


@dataclass
class IntentStats:
    deadline_ms: float
    window_s: float
    recent_max: int
    keep_history: bool = False
    completed: int = 0
    late: int = 0
    dropped: int = 0
    items_done: float = 0.0
    _window: deque[tuple[float, np.ndarray, np.ndarray]] = field(default_factory=deque)
    _recent: deque[float] = field(default_factory=deque)
    _since_report: int = 0
    history_latency: list[np.ndarray] = field(default_factory=list)
    history_arrival: list[np.ndarray] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._recent = deque(maxlen=self.recent_max)

    @property
    def misses(self) -> int:
        return self.late + self.dropped

    def record(self, now_s: float, outcome: StepOutcome) -> None:
        lat = outcome.latency_ms
        self.completed += int(lat.size)
        if self.deadline_ms > 0 and lat.size:
            self.late += int(np.count_nonzero(lat > self.deadline_ms))
        self.dropped += outcome.dropped
        self._since_report += int(lat.size)
        if lat.size:
            self._window.append((now_s, lat, outcome.service_ms))
            self._recent.extend(outcome.service_ms.tolist())
        while self._window and self._window[0][0] < now_s - self.window_s:
            self._window.popleft()
        if self.keep_history and lat.size:
            self.history_latency.append(lat)
            self.history_arrival.append(outcome.arrival_s)

    def record_batch(self, now_s: float, items: float, service_ms: np.ndarray) -> None:
        """Batch progress: items done this step and a few item service-time samples."""
        self.items_done += items
        self._since_report += int(service_ms.size)
        self._recent.extend(service_ms.tolist())
        if service_ms.size:
            self._window.append((now_s, EMPTY, service_ms))
        while self._window and self._window[0][0] < now_s - self.window_s:
            self._window.popleft()

    @property
    def has_recent(self) -> bool:
        """Samples wait to be drained."""
        return bool(self._recent)

    def peek_recent(self) -> list[float]:
        return list(self._recent)

    def drain_recent(self) -> list[float]:
        samples = list(self._recent)
        self._recent.clear()
        self._since_report = 0
        return samples

    def view(self) -> LatencyView:
        """Latency percentiles over the sliding window; counts since the intent started."""
        if self._window:
            lat = np.concatenate([w[1] for w in self._window])
            svc = np.concatenate([w[2] for w in self._window])
        else:
            lat = svc = np.empty(0)
        p50, p95, p99 = percentiles(lat)
        (s99,) = percentiles(svc, (99,))
        return LatencyView(
            count=self.completed,
            window_count=self._since_report,
            p50_ms=p50,
            p95_ms=p95,
            p99_ms=p99,
            mean_ms=float(lat.mean()) if lat.size else 0.0,
            deadline_misses=self.misses,
            service_mean_ms=float(svc.mean()) if svc.size else 0.0,
            service_p99_ms=s99,
        )

    def all_latencies(self) -> np.ndarray:
        return np.concatenate(self.history_latency) if self.history_latency else np.empty(0)

    def all_arrivals(self) -> np.ndarray:
        return np.concatenate(self.history_arrival) if self.history_arrival else np.empty(0)
