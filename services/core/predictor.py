"""Predictor: per-intent service-time statistics that feed D-MUG's predicted tail latency.

Telemetry reports observed service times; the predictor keeps, per intent, an EWMA of the mean
and streaming p95/p99 estimates (P-square, Jain & Chlamtac 1985: five markers per quantile), so
memory per intent is constant however many samples arrive. Samples are tied to the parallelism
they ran at (ServiceStats.observed_units); D-MUG rescales them through Amdahl's law. Callers pass
the latency factor the samples ran under (formulas.observation_factor: degradation level and
pressure), and samples are stored divided by it, i.e. as NORMAL-level, pressure-free times. When the
units change, a new regime starts and the previous one keeps answering until the new one has
MIN_SAMPLES samples.

Calibration closes the loop on the latency itself: the model (Amdahl, M/M/1 queueing, pressure
inflation) can be off by tens of percent on a real node (several workers are not one fast
server; pressure the node does not report). Each tick ``calibrate`` compares the tail latency
the node observed with the tail the last plan predicted for the allocation it ran, and keeps a
per-intent correction k (an EWMA in log space, bounded) that ServiceStats carries into D-MUG,
which plans with k x the model's tail. It learns only while the allocation and the prediction
have been steady (the observed percentile comes from a window that lags a change). Pure: no
clock, no I/O.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from services.core.formulas import LATENCY_CEILING_MS
from services.core.model import Decision, ServiceStats

MIN_SAMPLES = 5
CALIBRATION_GAIN = 0.2  # weight of one tick's observed/predicted ratio (log-space EWMA)
CALIBRATION_SETTLE_TICKS = 8  # units and level unchanged this long before a tick counts
CALIBRATION_MIN_COUNT = 50  # completed requests behind the observed percentile
CORRECTION_MIN, CORRECTION_MAX = 0.25, 4.0
CORRECTION_STEP = 0.01  # relative change of k that is handed out as a new ServiceStats


class P2Quantile:
    """Streaming quantile estimate with five markers (P-square); O(1) memory and time per sample.

    The markers' heights, positions and desired positions live in one list of 15 floats (at
    H, N and D below), not three: the garbage collector walks every list on each full
    collection, and with two estimators per intent four lists each were 80,000 of the 200,000
    objects it walked at 10,000 intents. The increments are one shared tuple per quantile."""

    __slots__ = ("q", "markers", "increments", "count")

    def __init__(self, q: float) -> None:
        if not 0.0 < q < 1.0:
            raise ValueError("quantile must be in (0, 1)")
        self.q = q
        self.markers = [0.0] * 5 + [1.0, 2.0, 3.0, 4.0, 5.0]
        self.markers += [1.0, 1.0 + 2 * q, 1.0 + 4 * q, 3.0 + 2 * q, 5.0]
        self.increments = _increments(q)
        self.count = 0

    @property
    def heights(self) -> list[float]:
        """The marker heights (the first samples, sorted, until there are five)."""
        return self.markers[H : H + min(self.count, 5)]

    def add(self, x: float) -> None:
        self.count += 1
        m = self.markers
        if self.count <= 5:
            m[H : H + self.count] = sorted([*m[H : H + self.count - 1], x])
            return
        if x < m[H]:
            m[H] = x
            k = 0
        elif x >= m[H + 4]:
            m[H + 4] = max(m[H + 4], x)
            k = 3
        else:
            k = 0
            while k < 3 and x >= m[H + k + 1]:
                k += 1
        for i in range(k + 1, 5):
            m[N + i] += 1.0
        inc = self.increments
        for i in range(5):
            m[D + i] += inc[i]
        for i in (1, 2, 3):
            d = m[D + i] - m[N + i]
            if (d >= 1.0 and m[N + i + 1] - m[N + i] > 1.0) or (
                d <= -1.0 and m[N + i - 1] - m[N + i] < -1.0
            ):
                step = 1.0 if d > 0 else -1.0
                candidate = self._parabolic(i, step)
                if not m[H + i - 1] < candidate < m[H + i + 1]:
                    candidate = self._linear(i, step)
                m[H + i] = candidate
                m[N + i] += step

    def _parabolic(self, i: int, d: float) -> float:
        m = self.markers
        h0, h1, h2 = m[H + i - 1], m[H + i], m[H + i + 1]
        n0, n1, n2 = m[N + i - 1], m[N + i], m[N + i + 1]
        return h1 + d / (n2 - n0) * (
            (n1 - n0 + d) * (h2 - h1) / (n2 - n1) + (n2 - n1 - d) * (h1 - h0) / (n1 - n0)
        )

    def _linear(self, i: int, d: float) -> float:
        m = self.markers
        j = i + int(d)
        return m[H + i] + d * (m[H + j] - m[H + i]) / (m[N + j] - m[N + i])

    def value(self) -> float:
        if not self.count:
            return 0.0
        if self.count <= 5:
            # exact small-sample quantile (linear interpolation, like numpy's default)
            xs = self.heights
            pos = self.q * (len(xs) - 1)
            lo = int(pos)
            hi = min(lo + 1, len(xs) - 1)
            return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
        return self.markers[H + 2]


H, N, D = 0, 5, 10  # offsets in P2Quantile.markers: heights, positions, desired positions


@functools.cache
def _increments(q: float) -> tuple[float, ...]:
    return (0.0, q / 2, q, (1 + q) / 2, 1.0)


@dataclass
class _Regime:
    units: int
    alpha: float
    mean: float = 0.0
    count: int = 0
    p95: P2Quantile = field(default_factory=lambda: P2Quantile(0.95))
    p99: P2Quantile = field(default_factory=lambda: P2Quantile(0.99))
    # the last stats() answer, until the next sample or another correction: an intent without
    # new samples gives the very same ServiceStats object every tick (cheap to snapshot, and the
    # policy's memo sees it)
    _stats: ServiceStats | None = field(default=None, repr=False, compare=False)

    def add(self, x: float) -> None:
        self._stats = None
        self.count += 1
        self.mean = x if self.count == 1 else self.mean + self.alpha * (x - self.mean)
        self.p95.add(x)
        self.p99.add(x)

    def stats(self, correction: float = 1.0) -> ServiceStats:
        """The regime's statistics carrying the intent's latency correction: one object built
        per change (positional: a tick with new samples for 10,000 intents builds 10,000)."""
        answer = self._stats
        if answer is None or answer.latency_correction != correction:
            p95 = max(self.p95.value(), 0.0)
            p99 = max(self.p99.value(), p95)
            answer = self._stats = ServiceStats(
                self.mean, p95, p99, self.count, self.units, correction
            )
        return answer


@dataclass
class _Calibration:
    """One intent's latency correction and what the last comparison saw."""

    log_k: float = 0.0
    published: float = 1.0  # the k ServiceStats carries (moves in CORRECTION_STEP steps)
    updates: int = 0
    last_tick: int = -1  # the tick it last learnt at (once per tick)
    compared_tick: int = -1  # the tick of the last comparison (error)
    observed_ms: float = 0.0
    predicted_ms: float = 0.0
    error: float | None = None  # predicted / observed - 1 at the last comparison
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=CALIBRATION_SETTLE_TICKS))


@dataclass(frozen=True, slots=True)
class CalibrationState:
    """What the predictor knows about one intent's model error (for gauges and reports)."""

    correction: float
    updates: int
    observed_ms: float
    predicted_ms: float
    error: float | None


class Predictor:
    """Per-intent service-time statistics: EWMA mean plus P-square p95/p99, bounded memory, and a
    per-intent latency correction learnt from observed tail latency."""

    def __init__(self, alpha: float = 0.2, calibration_gain: float = CALIBRATION_GAIN) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1]")
        if not 0.0 <= calibration_gain <= 1.0:
            raise ValueError("calibration_gain must be in [0, 1]")
        self.alpha = alpha
        self.calibration_gain = calibration_gain
        self._current: dict[str, _Regime] = {}
        self._previous: dict[str, _Regime] = {}
        self._calibration: dict[str, _Calibration] = {}
        # snapshot() kept between calls: the ids whose stats may have moved since are redone
        self._snapshot: dict[str, ServiceStats] = {}
        self._dirty: set[str] = set()

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
                self._dirty.add(intent_id)
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

    def calibrate(
        self, intent_id: str, observed_ms: float, count: int, decision: Decision, tick: int
    ) -> float | None:
        """Compare the tail latency the node observed for `intent_id` (the target percentile
        over its window, from `count` completed requests) with what `decision`, the plan it ran
        under, predicted; returns predicted / observed - 1 (None when there is nothing to
        compare). The correction learns only when the decision's units and level have held
        CALIBRATION_SETTLE_TICKS ticks, from the observed tail over the median of the model's
        predictions of those ticks.

        Call before planning, with the tick about to be planned: the decision was made with the
        k published then (ServiceStats.latency_correction), so the model's own prediction is
        decision.predicted_p99_ms / k. A tick learns once, however often telemetry arrives."""
        predicted = decision.predicted_p99_ms
        if not (0.0 < predicted < LATENCY_CEILING_MS and decision.units > 0):
            return None
        if not (0.0 < observed_ms < math.inf) or count < CALIBRATION_MIN_COUNT:
            return None
        cal = self._calibration.get(intent_id)
        if cal is None:
            cal = self._calibration[intent_id] = _Calibration()
        self._dirty.add(intent_id)
        cal.observed_ms, cal.predicted_ms = observed_ms, predicted
        cal.error = predicted / observed_ms - 1.0
        cal.compared_tick = tick
        if tick == cal.last_tick:
            return cal.error
        cal.last_tick = tick
        cal.recent.append(predicted / cal.published)  # the model's own, without k
        settled = min(tick - decision.since_tick, tick - decision.level_since_tick)
        if settled >= CALIBRATION_SETTLE_TICKS and len(cal.recent) == cal.recent.maxlen:
            # the observed percentile spans these ticks: it is compared with the median of the
            # model's predictions over them, which a noisy tick (a service-time estimate near
            # saturation) does not move
            target = math.log(observed_ms / statistics.median(cal.recent))
            cal.log_k += self.calibration_gain * (target - cal.log_k)
            cal.log_k = min(max(cal.log_k, math.log(CORRECTION_MIN)), math.log(CORRECTION_MAX))
            cal.updates += 1
            k = math.exp(cal.log_k)
            if abs(k / cal.published - 1.0) >= CORRECTION_STEP:
                cal.published = k
        return cal.error

    def errors_at(self, tick: int) -> dict[str, float]:
        """Per intent compared at `tick`: the prediction error (predicted / observed - 1)."""
        return {
            intent_id: cal.error
            for intent_id, cal in self._calibration.items()
            if cal.compared_tick == tick and cal.error is not None
        }

    def calibration(self, intent_id: str) -> CalibrationState | None:
        cal = self._calibration.get(intent_id)
        if cal is None:
            return None
        return CalibrationState(
            correction=cal.published,
            updates=cal.updates,
            observed_ms=cal.observed_ms,
            predicted_ms=cal.predicted_ms,
            error=cal.error,
        )

    def stats(self, intent_id: str) -> ServiceStats | None:
        cur = self._current.get(intent_id)
        if cur is None:
            return None
        regime = cur
        if cur.count < MIN_SAMPLES and intent_id in self._previous:
            regime = self._previous[intent_id]
        cal = self._calibration.get(intent_id)
        return regime.stats(1.0 if cal is None else cal.published)

    def snapshot(self) -> dict[str, ServiceStats]:
        """Every intent's stats, by id in sorted order. Only intents observed, calibrated or
        forgotten since the last call are looked at again (``stats`` hands out the same object
        until then), so a tick with few new samples costs no Python code per intent."""
        kept, dirty = self._snapshot, self._dirty
        if dirty:
            added = False
            for intent_id in dirty:
                s = self.stats(intent_id)
                if s is None:
                    kept.pop(intent_id, None)
                else:
                    added = added or intent_id not in kept
                    kept[intent_id] = s
            dirty.clear()
            if added:
                self._snapshot = kept = dict(sorted(kept.items()))
        return dict(kept)

    def forget(self, intent_id: str) -> None:
        self._dirty.add(intent_id)
        self._current.pop(intent_id, None)
        self._previous.pop(intent_id, None)
        self._calibration.pop(intent_id, None)

    def compact(self) -> None:
        """Rebuild the per-intent tables after many intents were forgotten: a dict keeps the
        table of its largest size after its entries are removed."""
        self._current, self._previous = dict(self._current), dict(self._previous)
        self._calibration = dict(self._calibration)
        # the forgotten intents leave the kept snapshot now rather than at the next snapshot()
        self._snapshot = {i: s for i, s in self._snapshot.items() if i in self._current}

    def __len__(self) -> int:
        return len(self._current)
