"""Predictor: per-intent service-time statistics that feed D-MUG's predicted tail latency.

Telemetry reports observed service times; the predictor keeps, per intent, an EWMA of the mean
and streaming p95/p99 estimates (P-square, Jain & Chlamtac 1985: five markers per quantile), so
memory per intent is constant however many samples arrive. Samples are tied to the parallelism
they ran at (ServiceStats.observed_units); D-MUG rescales them through Amdahl's law. Callers pass
the latency factor the samples ran under (formulas.observation_factor: degradation level and
pressure), and samples are stored divided by it, i.e. as NORMAL-level, pressure-free times. When the
units change, a new regime starts and the previous one keeps answering until the new one has
MIN_SAMPLES samples. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from services.core.model import ServiceStats

MIN_SAMPLES = 5


class P2Quantile:
    """Streaming quantile estimate with five markers (P-square); O(1) memory and time per sample."""

    __slots__ = ("q", "heights", "positions", "desired", "increments", "count")

    def __init__(self, q: float) -> None:
        if not 0.0 < q < 1.0:
            raise ValueError("quantile must be in (0, 1)")
        self.q = q
        self.heights: list[float] = []
        self.positions = [1.0, 2.0, 3.0, 4.0, 5.0]
        self.desired = [1.0, 1.0 + 2 * q, 1.0 + 4 * q, 3.0 + 2 * q, 5.0]
        self.increments = [0.0, q / 2, q, (1 + q) / 2, 1.0]
        self.count = 0

    def add(self, x: float) -> None:
        self.count += 1
        h = self.heights
        if self.count <= 5:
            h.append(x)
            h.sort()
            return
        if x < h[0]:
            h[0] = x
            k = 0
        elif x >= h[4]:
            h[4] = max(h[4], x)
            k = 3
        else:
            k = 0
            while k < 3 and x >= h[k + 1]:
                k += 1
        pos = self.positions
        for i in range(k + 1, 5):
            pos[i] += 1.0
        for i in range(5):
            self.desired[i] += self.increments[i]
        for i in (1, 2, 3):
            d = self.desired[i] - pos[i]
            if (d >= 1.0 and pos[i + 1] - pos[i] > 1.0) or (
                d <= -1.0 and pos[i - 1] - pos[i] < -1.0
            ):
                step = 1.0 if d > 0 else -1.0
                candidate = self._parabolic(i, step)
                if not h[i - 1] < candidate < h[i + 1]:
                    candidate = self._linear(i, step)
                h[i] = candidate
                pos[i] += step

    def _parabolic(self, i: int, d: float) -> float:
        h, n = self.heights, self.positions
        return h[i] + d / (n[i + 1] - n[i - 1]) * (
            (n[i] - n[i - 1] + d) * (h[i + 1] - h[i]) / (n[i + 1] - n[i])
            + (n[i + 1] - n[i] - d) * (h[i] - h[i - 1]) / (n[i] - n[i - 1])
        )

    def _linear(self, i: int, d: float) -> float:
        h, n = self.heights, self.positions
        j = i + int(d)
        return h[i] + d * (h[j] - h[i]) / (n[j] - n[i])

    def value(self) -> float:
        if not self.heights:
            return 0.0
        if self.count <= 5:
            # exact small-sample quantile (linear interpolation, like numpy's default)
            xs = self.heights
            pos = self.q * (len(xs) - 1)
            lo = int(pos)
            hi = min(lo + 1, len(xs) - 1)
            return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
        return self.heights[2]


@dataclass
class _Regime:
    units: int
    alpha: float
    mean: float = 0.0
    count: int = 0
    p95: P2Quantile = field(default_factory=lambda: P2Quantile(0.95))
    p99: P2Quantile = field(default_factory=lambda: P2Quantile(0.99))
    # the last stats() answer, until the next sample: an intent without new samples gives the
    # very same ServiceStats object every tick (cheap to snapshot, and the policy's memo sees it)
    _stats: ServiceStats | None = field(default=None, repr=False, compare=False)

    def add(self, x: float) -> None:
        self._stats = None
        self.count += 1
        self.mean = x if self.count == 1 else self.mean + self.alpha * (x - self.mean)
        self.p95.add(x)
        self.p99.add(x)

    def stats(self) -> ServiceStats:
        if self._stats is None:
            p95 = max(self.p95.value(), 0.0)
            p99 = max(self.p99.value(), p95)
            self._stats = ServiceStats(
                mean_ms=self.mean,
                p95_ms=p95,
                p99_ms=p99,
                count=self.count,
                observed_units=self.units,
            )
        return self._stats


class Predictor:
    """Per-intent service-time statistics: EWMA mean plus P-square p95/p99, bounded memory."""

    def __init__(self, alpha: float = 0.2) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1]")
        self.alpha = alpha
        self._current: dict[str, _Regime] = {}
        self._previous: dict[str, _Regime] = {}

    def observe(
        self, intent_id: str, service_ms: float, units: int = 1, factor: float = 1.0
    ) -> None:
        """Record one observed service time (ms) of `intent_id` running at `units` under latency
        factor `factor` (stored as service_ms / factor)."""
        self.observe_many(intent_id, (service_ms,), units, factor)

    def observe_many(
        self, intent_id: str, samples: Iterable[float], units: int = 1, factor: float = 1.0
    ) -> None:
        """``observe`` for each sample in turn (a bad sample raises; those before it are kept),
        with the factor checked and the regime looked up once per call."""
        if not 0.0 < factor < float("inf"):
            raise ValueError("factor must be a finite, positive number")
        regime: _Regime | None = None
        for x in samples:
            if not x >= 0.0 or x == float("inf"):
                raise ValueError("service_ms must be a finite, non-negative number")
            if regime is None:
                regime = self._regime(intent_id, max(int(units), 1))
            regime.add(float(x) / factor)

    def _regime(self, intent_id: str, units: int) -> _Regime:
        """The intent's current regime at `units` (a change of units starts a new one)."""
        cur = self._current.get(intent_id)
        if cur is None or cur.units != units:
            if cur is not None and cur.count >= MIN_SAMPLES:
                self._previous[intent_id] = cur
            cur = _Regime(units=units, alpha=self.alpha)
            self._current[intent_id] = cur
        return cur

    def stats(self, intent_id: str) -> ServiceStats | None:
        cur = self._current.get(intent_id)
        if cur is None:
            return None
        if cur.count < MIN_SAMPLES and intent_id in self._previous:
            return self._previous[intent_id].stats()
        return cur.stats()

    def snapshot(self) -> dict[str, ServiceStats]:
        out = {}
        for intent_id in sorted(self._current):
            s = self.stats(intent_id)
            if s is not None:
                out[intent_id] = s
        return out

    def forget(self, intent_id: str) -> None:
        self._current.pop(intent_id, None)
        self._previous.pop(intent_id, None)

    def __len__(self) -> int:
        return len(self._current)
