"""Per-intent observed latency from the pools: what telemetry reports and the predictor learns from.

Completions arrive from pool feeder threads; the book keeps a sliding window for percentiles
(the completions of the last ``window_s`` seconds, at most WINDOW of them: the modeled node
reports over the same kind of window, configs/model.yaml service_time.window_s), running counts
and misses, a throughput estimate, and the service-time samples not yet reported (drained by
each telemetry read, so every sample reaches the allocator once). A time window lets a
transient (a pool resized, a burst) leave the observed tail once it is over, so the allocator's
calibration compares its prediction with what the node does now.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Sequence

import numpy as np

from parfusion.v1 import telemetry_pb2
from services.nodeagent.pools import Completion

WINDOW = 2048  # completions kept for percentiles, at most
WINDOW_S = 10.0  # default span of the percentile window (nodeagent.latency_window_s)
RECENT_LIMIT = 512  # service samples per report (bounded message size)
RATE_WINDOW_S = 5.0
# Each pool worker serves one request at a time on one thread: a service time is a request's
# time at parallelism 1 however many workers the pool has (more workers add capacity).
SAMPLE_PARALLELISM = 1


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return float(sorted_values[min(rank, len(sorted_values)) - 1])


class LatencyBook:
    def __init__(
        self, intent_id: str, deadline_ms: float = 0.0, window_s: float = WINDOW_S
    ) -> None:
        if not 0.0 < window_s < math.inf:
            raise ValueError("window_s must be a positive number of seconds")
        self.intent_id = intent_id
        self.deadline_ms = deadline_ms
        self.window_s = window_s
        self._lock = threading.Lock()
        # (end, latency ms, service ms) of the completions in the window, oldest first
        self._window: deque[tuple[float, float, float]] = deque(maxlen=WINDOW)
        self._recent: deque[float] = deque(maxlen=RECENT_LIMIT)
        self._ends: deque[float] = deque()
        self.count = self.misses = self._since_report = 0

    def reset(self) -> None:
        """Forget the window, the counts and the unreported samples (a new measurement starts)."""
        with self._lock:
            for kept in (self._window, self._recent, self._ends):
                kept.clear()
            self.count = self.misses = self._since_report = 0

    def record(self, done: Completion) -> None:
        with self._lock:
            latency = done.latency_ms
            self._window.append((done.end, latency, done.service_ms))
            self._recent.append(done.service_ms)
            self._ends.append(done.end)
            self.count += 1
            self._since_report += 1
            if self.deadline_ms > 0 and latency > self.deadline_ms:
                self.misses += 1

    def items_per_s(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        with self._lock:
            while self._ends and self._ends[0] < now - RATE_WINDOW_S:
                self._ends.popleft()
            return len(self._ends) / RATE_WINDOW_S

    @property
    def has_samples(self) -> bool:
        """Service-time samples wait to be drained."""
        return bool(self._recent)

    def summary(self, drain: bool = True, now: float | None = None) -> telemetry_pb2.LatencySummary:
        """Percentiles over the completions that ended within ``window_s`` before `now`
        (time.monotonic(), the workers' clock, by default)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            window = self._window
            while window and window[0][0] < now - self.window_s:
                window.popleft()
            n = len(window)
            flat = np.fromiter(itertools.chain.from_iterable(window), dtype=float, count=3 * n)
            lat = np.sort(flat[1::3])
            svc = np.sort(flat[2::3])
            recent = list(self._recent)
            since_report = self._since_report
            if drain:
                self._recent.clear()
                self._since_report = 0
        return telemetry_pb2.LatencySummary(
            intent_id=self.intent_id,
            count=self.count,
            p50_ms=_rank(lat, 50),
            p95_ms=_rank(lat, 95),
            p99_ms=_rank(lat, 99),
            mean_ms=float(lat.mean()) if lat.size else 0.0,
            deadline_misses=self.misses,
            service_mean_ms=float(svc.mean()) if svc.size else 0.0,
            service_p99_ms=_rank(svc, 99),
            window_count=since_report,
            recent_service_ms=recent,
            sample_parallelism=SAMPLE_PARALLELISM,
        )


def _rank(sorted_values: np.ndarray, q: float) -> float:
    """percentile() on a sorted numpy array (telemetry runs every tick: keep it cheap)."""
    n = int(sorted_values.size)
    if n == 0:
        return 0.0
    return float(sorted_values[min(max(1, math.ceil(q / 100.0 * n)), n) - 1])
