"""Runs the co-run phases on the real backend and records raw samples per phase.

One RealBackend (the node agent's own pools) for the whole run, pools kept warm across
phases. A phase applies its plan (or starts the policy controller), replays the
repetition's precomputed arrival schedule, measures a window after a warm-up, then gives
requests that arrived in the window a bounded drain; whatever is still unfinished is
counted with the latency it had reached (censored, a lower bound) and as a miss.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from experiments.cpu_corun.controller import PolicyController
from experiments.cpu_corun.profiles import PhaseSpec, Profile
from experiments.cpu_corun.workload import (
    BATCH,
    ONLINE,
    URGENT,
    URGENT_RATE_PER_S,
    Calibration,
    Router,
    allocation,
    intent_specs,
    poisson,
)
from parfusion.v1 import intent_pb2
from services.nodeagent.pools import Completion
from services.nodeagent.real import RealBackend


@dataclass
class PhaseRun:
    phase: str
    load: float | None
    repetition: int
    order: int
    measure_s: float
    rate_per_s: float
    online_latency_ms: list[float] = field(default_factory=list)
    online_service_ms: list[float] = field(default_factory=list)
    online_scheduled: int = 0
    online_censored: int = 0
    batch_items: int = 0
    urgent_start_ms: list[float] = field(default_factory=list)
    urgent_latency_ms: list[float] = field(default_factory=list)
    urgent_scheduled: int = 0
    urgent_censored: int = 0
    controller_cpu_fraction: float | None = None
    ticks: int = 0
    errors: list[str] = field(default_factory=list)
    plan_trace: list[dict[str, Any]] = field(default_factory=list)
    host_load1: float = 0.0
    host_cpu_percent: float = 0.0
    foreign_cores: float = 0.0  # CPU used by processes outside this benchmark, in cores
    # policy phases: median |predicted / observed online p99 - 1| over the phase's ticks (%)
    prediction_error_pct: float | None = None
    prediction_error_late_pct: float | None = None  # the same over the phase's second half
    # the second half's median of predicted / observed - 1, signed (< 0: the plan predicted
    # less than the node showed), and the online intent's correction k when the phase ended
    prediction_bias_late_pct: float | None = None
    latency_correction: float | None = None

    @property
    def batch_items_per_s(self) -> float:
        return self.batch_items / self.measure_s if self.measure_s > 0 else 0.0


def static_plan(
    phase: PhaseSpec, cal: Calibration, rate: float, generation: int
) -> intent_pb2.NodePlan:
    """Fixed pools: every arena core for online and for batch, no affinity, the phase's knobs."""
    w = cal.workers
    online_w = 0 if phase.kind == "batch-alone" else w
    batch_w = 0 if phase.kind == "online-alone" else w
    urgent_w = 1 if phase.co_run else 0
    return intent_pb2.NodePlan(
        node="bench",
        generation=generation,
        policy=phase.name,
        allocations=[
            allocation(URGENT, urgent_w, cal),
            allocation(ONLINE, online_w, cal, rate),
            allocation(BATCH, batch_w, cal, nice=phase.batch_nice, sched_policy=phase.batch_sched),
        ],
    )


@dataclass
class Schedules:
    """The arrivals of one (repetition, load), replayed identically by every phase."""

    online: list[float]
    urgent: list[float]


def schedules(seed: int, rate: float, seconds: float) -> Schedules:
    rng = random.Random(seed)
    return Schedules(
        online=poisson(rate, seconds, rng), urgent=poisson(URGENT_RATE_PER_S, seconds, rng)
    )


class PhaseRunner:
    def __init__(
        self,
        backend: RealBackend,
        router: Router,
        cal: Calibration,
        profile: Profile,
        tick_s: float,
    ) -> None:
        self.backend = backend
        self.router = router
        self.cal = cal
        self.profile = profile
        self.tick_s = tick_s
        self._generation = 100

    def run(
        self,
        phase: PhaseSpec,
        load: float | None,
        repetition: int,
        order: int,
        measure_s: float,
        seed: int,
    ) -> PhaseRun:
        cal, prof = self.cal, self.profile
        rate = (load or 0.0) * cal.capacity_per_s
        result = PhaseRun(
            phase=phase.name,
            load=load,
            repetition=repetition,
            order=order,
            measure_s=measure_s,
            rate_per_s=rate,
        )
        span = prof.warmup_s + measure_s
        plan = schedules(seed, rate, span)
        self.backend.urgent_preempts_batch = phase.urgent_preempts_batch
        controller: PolicyController | None = None
        self._generation += 1
        try:
            if phase.kind == "policy":
                controller = PolicyController(
                    phase.policy,
                    self.backend,
                    intent_specs(cal, rate),
                    cal,
                    rate,
                    tick_s=self.tick_s,
                )
                controller.start()
            else:
                applied = self.backend.apply(static_plan(phase, cal, rate, self._generation))
                result.errors.extend(enforcement_errors(applied))
        except Exception as exc:
            result.errors.append(f"{phase.name} could not start: {type(exc).__name__}: {exc}")
            return result
        self.router.take()
        psutil.cpu_percent()
        marks = cpu_marks()
        t0 = time.monotonic() + 0.02
        start, end = t0 + prof.warmup_s, t0 + span
        online_due = [t0 + x for x in plan.online] if phase.kind != "batch-alone" else []
        urgent_due = [t0 + x for x in plan.urgent] if phase.co_run else []
        self.backend.request_source(ONLINE).schedule(online_due)
        self.backend.request_source(URGENT).schedule(urgent_due)
        wall0 = time.monotonic()
        _sleep_until(start)
        # the controller calibrates on the measured window's tail only: not the previous
        # phase's, nor the warm-up's (pools resized, queues settling)
        self.backend.reset_books()
        _sleep_until(end)
        in_window = [d for d in online_due if start <= d < end]
        urgent_window = [d for d in urgent_due if start <= d < end]
        done: list[Completion] = []
        cutoff = end + prof.drain_s

        def finished() -> bool:
            got = sum(
                1
                for c in done
                if c.kind == "online" and c.intent_id == ONLINE and start <= c.due < end
            )
            return got >= len(in_window)

        while True:
            done.extend(self.router.take())
            if finished() or time.monotonic() >= cutoff:
                break
            time.sleep(0.02)
        cutoff = time.monotonic()
        if controller is not None:
            controller.stop()
            result.ticks = controller.ticks
            result.errors.extend(controller.errors[:5])
            result.controller_cpu_fraction = controller.cpu_seconds / max(cutoff - wall0, 1e-6)
            result.plan_trace = _trace(controller)
            signed = [t.prediction_error[ONLINE] for t in controller.log
                      if ONLINE in t.prediction_error]  # fmt: skip
            if signed:
                errors = [abs(e) for e in signed]
                result.prediction_error_pct = 100.0 * statistics.median(errors)
                # the second half: after the correction has had the phase's first half to learn
                late = len(signed) // 2
                result.prediction_error_late_pct = 100.0 * statistics.median(errors[late:])
                result.prediction_bias_late_pct = 100.0 * statistics.median(signed[late:])
            if controller.log and ONLINE in controller.log[-1].correction:
                result.latency_correction = controller.log[-1].correction[ONLINE]
        for intent_id in (ONLINE, URGENT):
            self.backend.request_source(intent_id).clear()
        done.extend(self.router.take())
        result.host_load1 = os.getloadavg()[0]
        result.host_cpu_percent = psutil.cpu_percent()
        result.foreign_cores = foreign_cores(marks, cpu_marks())
        self._collect(result, done, in_window, urgent_window, start, end, cutoff)
        return result

    def _collect(
        self,
        result: PhaseRun,
        done: list[Completion],
        in_window: list[float],
        urgent_window: list[float],
        start: float,
        end: float,
        cutoff: float,
    ) -> None:
        online = [c for c in done if c.intent_id == ONLINE and start <= c.due < end]
        urgent = [c for c in done if c.intent_id == URGENT and start <= c.due < end]
        result.online_latency_ms = [c.latency_ms for c in online]
        result.online_service_ms = [c.service_ms for c in online]
        result.online_scheduled = len(in_window)
        result.online_censored = _censor(result.online_latency_ms, in_window, online, cutoff)
        result.urgent_latency_ms = [c.latency_ms for c in urgent]
        result.urgent_start_ms = [c.start_delay_ms for c in urgent]
        result.urgent_scheduled = len(urgent_window)
        result.urgent_censored = _censor(result.urgent_latency_ms, urgent_window, urgent, cutoff)
        result.urgent_start_ms.extend(
            (cutoff - d) * 1000.0 for d in _missing(urgent_window, urgent)
        )
        result.batch_items = sum(1 for c in done if c.intent_id == BATCH and start <= c.end < end)


def enforcement_errors(applied: list[Any]) -> list[str]:
    """Knobs the kernel refused (e.g. lowering nice without CAP_SYS_NICE): the phase is suspect."""
    return [f"{a.intent_id}: {a.note}" for a in applied if "Error" in a.note]


def cpu_marks() -> tuple[float, float, float]:
    """(wall, busy CPU seconds of the whole host, CPU seconds of this process and its children)."""
    t = psutil.cpu_times()
    busy = sum(
        getattr(t, f) for f in t._fields if f not in ("idle", "iowait", "guest", "guest_nice")
    )
    own = os.times()
    ours = own.user + own.system + own.children_user + own.children_system
    for child in psutil.Process().children(recursive=True):
        try:
            c = child.cpu_times()
            ours += c.user + c.system
        except psutil.Error:
            pass
    return time.monotonic(), busy, ours


def foreign_cores(before: tuple[float, float, float], after: tuple[float, float, float]) -> float:
    """Cores' worth of CPU the rest of the host used between two marks (other users' load)."""
    wall = max(after[0] - before[0], 1e-6)
    return max(0.0, ((after[1] - before[1]) - (after[2] - before[2])) / wall)


def _missing(due: list[float], done: list[Completion]) -> list[float]:
    left = Counter(due)
    left.subtract(Counter(c.due for c in done))
    return [d for d, n in left.items() for _ in range(max(0, n))]


def _censor(latencies: list[float], due: list[float], done: list[Completion], cutoff: float) -> int:
    """Unfinished requests join the sample with the latency they had reached (a lower bound)."""
    missing = _missing(due, done)
    latencies.extend((cutoff - d) * 1000.0 for d in missing)
    return len(missing)


def _trace(controller: PolicyController) -> list[dict[str, Any]]:
    """Plan changes only (the first plan and every tick where workers or knobs moved)."""
    out: list[dict[str, Any]] = []
    last: tuple[Any, ...] | None = None
    for t in controller.log:
        key = (
            tuple(sorted(t.workers.items())),
            tuple(sorted(t.nice.items())),
            tuple(sorted(t.sched.items())),
        )
        if key != last:
            out.append(
                {"at_s": round(t.at_s, 3), "workers": t.workers, "nice": t.nice, "sched": t.sched}
            )
            last = key
    return out[:50]


def _sleep_until(t: float, check: Callable[[], None] | None = None) -> None:
    while True:
        left = t - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.1))
