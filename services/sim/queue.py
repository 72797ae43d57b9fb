"""One deadline intent's request queue: arrivals, FIFO service with the plan of the moment, timeouts.

Requests arrive (Poisson or periodic, drawn per step with numpy), wait in FIFO order and are
served one at a time by the intent's pool, whose speed is set by the plan in force when each
request starts (the pool's units run one request in parallel, the intent's Amdahl model). A
request still waiting ``timeout`` after its arrival is dropped (the client gave up). Start times
follow the Lindley recursion, vectorised with a cumulative sum; only a step in which a request
times out falls back to an exact per-request loop. Work is conserved by construction:
``arrived == completed + dropped + queued`` after every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

EMPTY = np.empty(0, dtype=np.float64)


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """Requests whose service started in one step (their departure is then fixed)."""

    latency_ms: np.ndarray  # departure - arrival
    service_ms: np.ndarray  # service time alone, no queueing
    arrival_s: np.ndarray
    dropped: int


class RequestQueue:
    def __init__(self, rng: np.random.Generator, sigma: float) -> None:
        self._rng = rng
        self._sigma = sigma
        self._arrival = EMPTY  # waiting requests' arrival times (s), sorted
        self._work = EMPTY  # their service-time multipliers (lognormal, median 1)
        self._busy_until = 0.0
        self._next_periodic: float | None = None
        self.arrived = 0
        self.completed = 0
        self.dropped = 0

    @property
    def queued(self) -> int:
        return int(self._arrival.size)

    @property
    def busy_until(self) -> float:
        return self._busy_until

    def arrive(self, t0: float, t1: float, rate_per_s: float, periodic: bool) -> int:
        """Draw this step's arrivals in [t0, t1) and append them to the queue."""
        if rate_per_s <= 0 or t1 <= t0:
            self._next_periodic = None
            return 0
        if periodic:
            period = 1.0 / rate_per_s
            start = t0 if self._next_periodic is None else max(self._next_periodic, t0)
            times = np.arange(start, t1, period, dtype=np.float64)
            self._next_periodic = float(times[-1] + period) if times.size else start
        else:
            n = int(self._rng.poisson(rate_per_s * (t1 - t0)))
            times = t0 + np.sort(self._rng.random(n)) * (t1 - t0)
        work = (
            self._rng.lognormal(0.0, self._sigma, times.size)
            if self._sigma > 0
            else (np.ones(times.size))
        )
        self._arrival = np.concatenate((self._arrival, times))
        self._work = np.concatenate((self._work, work))
        self.arrived += int(times.size)
        return int(times.size)

    def serve(self, t1: float, mean_service_s: float, timeout_s: float) -> StepOutcome:
        """Start every request that can start before t1 at the current speed; drop timed-out ones.

        ``mean_service_s`` is the median service time under the current plan (inf = the pool
        has no units, nothing starts).
        """
        a, w = self._arrival, self._work
        if a.size == 0:
            return StepOutcome(EMPTY, EMPTY, EMPTY, 0)
        if not math.isfinite(mean_service_s):
            expired = int(np.searchsorted(a, t1 - timeout_s, side="left"))
            self._keep_from(expired)
            self.dropped += expired
            # No worker ran in this step: what waits starts at t1 at the earliest, not back
            # at its arrival once the pool has units again.
            self._busy_until = max(self._busy_until, t1)
            return StepOutcome(EMPTY, EMPTY, EMPTY, expired)
        s = w * mean_service_s
        before = np.concatenate(([0.0], np.cumsum(s)[:-1]))
        start = before + np.maximum(np.maximum.accumulate(a - before), self._busy_until)
        stop = (start >= t1) | (start - a > timeout_s)
        k = int(np.argmax(stop)) if bool(stop.any()) else int(a.size)
        served = slice(0, k)
        lat = start[served] + s[served] - a[served]
        svc = s[served]
        arr = a[served]
        if k:
            self._busy_until = float(start[k - 1] + s[k - 1])
        dropped = 0
        if k < a.size and start[k] - a[k] > timeout_s and a[k] + timeout_s < t1:
            extra_lat, extra_svc, extra_arr, dropped, k = self._serve_exact(
                k, t1, mean_service_s, timeout_s
            )
            lat = np.concatenate((lat, extra_lat))
            svc = np.concatenate((svc, extra_svc))
            arr = np.concatenate((arr, extra_arr))
        self._keep_from(k)
        self.completed += int(lat.size)
        self.dropped += dropped
        return StepOutcome(lat * 1000.0, svc * 1000.0, arr, dropped)

    def _serve_exact(
        self, k: int, t1: float, mean_service_s: float, timeout_s: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
        """Per-request loop from index k, where the first timeout happens."""
        a, w = self._arrival, self._work
        busy = self._busy_until
        lat: list[float] = []
        svc: list[float] = []
        arr: list[float] = []
        dropped = 0
        i = k
        n = int(a.size)
        while i < n:
            ai = float(a[i])
            start = max(ai, busy)
            if start - ai > timeout_s:
                if ai + timeout_s >= t1:
                    break  # it may still start after a faster plan next step
                dropped += 1
                i += 1
                continue
            if start >= t1:
                break
            si = float(w[i]) * mean_service_s
            busy = start + si
            lat.append(busy - ai)
            svc.append(si)
            arr.append(ai)
            i += 1
        self._busy_until = busy
        return np.array(lat), np.array(svc), np.array(arr), dropped, i

    def _keep_from(self, k: int) -> None:
        self._arrival = self._arrival[k:]
        self._work = self._work[k:]

    def drop_all(self) -> int:
        """The intent was deleted: whatever still waits is dropped."""
        n = self.queued
        self._keep_from(n)
        self.dropped += n
        return n
