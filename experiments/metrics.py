"""What one policy run achieved, as plain JSON-ready numbers (the experiments' result rows).

Latencies come from the modeled node's history of every request (departure - arrival, so
queueing counts); a miss is a request over its deadline or dropped after waiting too long;
miss % = misses / (completed + dropped). Batch throughput is items per simulated second. The
urgent response time of one event is the time from the event to the first completed urgent
request (it includes the wait for the controller's next tick). Preemptions and degradations
count changes: an intent losing units to urgent work, an intent moving down its
NORMAL -> FP16 -> INT8 ladder. The prediction error of a deadline intent is its last plan's
predicted tail over the tail the node observed over its window, minus 1, every tick; "steady"
ticks are at least SETTLE_S after the run's start and the end of every event.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from experiments.runner import PolicyRun
from services.sim.node import IntentRun
from services.sim.stats import percentiles

LEVEL_RANK = {"NORMAL": 0, "FP16": 1, "INT8": 2}
SETTLE_S = 10.0  # one telemetry window (configs/model.yaml window_s): observed tails lag a change


def _r(x: float, digits: int = 4) -> float:
    return float(round(float(x), digits))


def latency_block(runs: list[IntentRun]) -> dict[str, Any]:
    lat = [r.stats.all_latencies() for r in runs]
    values = np.concatenate(lat) if lat else np.empty(0)
    completed = sum(r.stats.completed for r in runs)
    late = sum(r.stats.late for r in runs)
    dropped = sum(r.stats.dropped for r in runs)
    served = completed + dropped
    p50, p95, p99 = percentiles(values)
    return {
        "requests": served,
        "completed": completed,
        "late": late,
        "dropped": dropped,
        "p50_ms": _r(p50),
        "p95_ms": _r(p95),
        "p99_ms": _r(p99),
        "miss_pct": _r(100.0 * (late + dropped) / served) if served else 0.0,
    }


def urgent_responses(run: PolicyRun, urgent: list[IntentRun]) -> list[float | None]:
    """Per urgent event: seconds from the event to its first completed request (None: never)."""
    starts = [e["at_s"] for e in run.events if e["kind"] == "urgent_start"]
    out: list[float | None] = []
    for at in starts:
        departures = [
            r.stats.all_arrivals() + r.stats.all_latencies() / 1000.0
            for r in urgent
            if r.stats.completed
        ]
        done = np.concatenate(departures) if departures else np.empty(0)
        after = done[done >= at]
        out.append(_r((float(after.min()) - at) * 1000.0, 3) if after.size else None)
    return out


def decision_changes(run: PolicyRun) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(unit changes, degradation decisions) tick by tick, as the controller made them."""
    units_changes: list[dict[str, Any]] = []
    degradations: list[dict[str, Any]] = []
    prev_units: dict[str, int] = {}
    prev_level: dict[str, str] = {}
    for tick in run.ticks:
        for intent_id, units in tick.units.items():
            before = prev_units.get(intent_id)
            if before is not None and before != units:
                units_changes.append(
                    {
                        "t_s": _r(tick.t_s, 3),
                        "intent": intent_id,
                        "from": before,
                        "to": units,
                        "state": tick.state[intent_id],
                        "reason": tick.reason[intent_id],
                    }
                )
            level = tick.degradation[intent_id]
            was = prev_level.get(intent_id, "NORMAL")
            if level != was:
                degradations.append(
                    {
                        "t_s": _r(tick.t_s, 3),
                        "intent": intent_id,
                        "from": was,
                        "to": level,
                        "predicted_p99_ms": _r(tick.predicted_p99_ms[intent_id], 3),
                        "reason": tick.reason[intent_id],
                    }
                )
            prev_units[intent_id] = units
            prev_level[intent_id] = level
    return units_changes, degradations


def count_preemptions(run: PolicyRun) -> int:
    """Intents that started losing units to urgent work (a new preemption, not each tick of it)."""
    count = 0
    was: dict[str, int] = {}
    for tick in run.ticks:
        for intent_id, lost in tick.preempted_units.items():
            if lost > 0 and was.get(intent_id, 0) == 0:
                count += 1
            was[intent_id] = lost
    return count


def per_second_series(run: PolicyRun, runs: list[IntentRun], seconds: float) -> dict[str, list]:
    """Online p99 and miss % per simulated second (by arrival time)."""
    n = max(1, int(np.ceil(seconds)))
    arrivals = [r.stats.all_arrivals() for r in runs]
    lat = [r.stats.all_latencies() for r in runs]
    a = np.concatenate(arrivals) if arrivals else np.empty(0)
    v = np.concatenate(lat) if lat else np.empty(0)
    deadlines = (
        np.concatenate(
            [np.full(x.size, r.profile.deadline_ms) for r, x in zip(runs, lat, strict=True)]
        )
        if lat
        else np.empty(0)
    )
    bucket = np.minimum((a).astype(np.int64), n - 1) if a.size else a.astype(np.int64)
    p99: list[float] = []
    miss: list[float] = []
    for s in range(n):
        sel = bucket == s
        values = v[sel]
        p99.append(_r(percentiles(values, (99,))[0], 3) if values.size else 0.0)
        miss.append(_r(100.0 * float(np.mean(values > deadlines[sel])), 3) if values.size else 0.0)
    return {"second": list(range(n)), "online_p99_ms": p99, "online_late_pct": miss}


def steady_ticks(run: PolicyRun) -> list[bool]:
    """Per tick: no event active and none ended (nor the run started) within SETTLE_S."""
    spans = [(0.0, 0.0)]
    open_at: dict[str, float] = {}  # per event ("urgent", "fleet"): when it started
    for e in run.events:
        what, _, edge = e["kind"].rpartition("_")
        if what in ("urgent", "fleet") and edge == "start":
            open_at[what] = e["at_s"]
        elif what in ("urgent", "fleet") and edge == "end":
            spans.append((open_at.get(what, e["at_s"]), e["at_s"]))
        elif e["kind"] == "disturbance":
            spans.append((e["at_s"], e["at_s"] + e["duration_s"]))
        else:  # a load step or a service-time drift: a change at one instant
            spans.append((e["at_s"], e["at_s"]))
    return [all(not a <= t.t_s < b + SETTLE_S for a, b in spans) for t in run.ticks]


def prediction_errors(run: PolicyRun) -> dict[str, dict[str, Any]]:
    """Per deadline intent: median and 90th percentile of |prediction error| (%) over all ticks
    that had one and over the steady ones (None when there were none)."""
    steady = steady_ticks(run)
    out: dict[str, dict[str, Any]] = {}
    intents = sorted({i for t in run.ticks for i in t.prediction_error})
    for i in intents:
        every = [abs(t.prediction_error[i]) for t in run.ticks if i in t.prediction_error]
        calm = [
            abs(t.prediction_error[i])
            for t, ok in zip(run.ticks, steady, strict=True)
            if ok and i in t.prediction_error
        ]
        out[i] = {"ticks": len(every), "steady_ticks": len(calm)}
        for name, values in (("all", every), ("steady", calm)):
            if values:
                p50, p90 = percentiles(np.asarray(values) * 100.0, (50, 90))
                out[i][f"{name}_median_pct"], out[i][f"{name}_p90_pct"] = _r(p50, 2), _r(p90, 2)
            else:
                out[i][f"{name}_median_pct"] = out[i][f"{name}_p90_pct"] = None
    return out


def stability(run: PolicyRun) -> dict[str, Any]:
    """Units and level changes and flaps (a change within services.core.stability.STABLE_S of
    the intent's previous one), over the run and over its steady ticks."""
    steady = steady_ticks(run)
    out: dict[str, Any] = {}
    for name, ticks in (
        ("all", run.ticks),
        ("steady", [t for t, ok in zip(run.ticks, steady, strict=True) if ok]),
    ):
        flapping = sorted({i for t in ticks for i in t.changes.flapping})
        out[name] = {
            "ticks": len(ticks),
            "units_changes": sum(t.changes.units for t in ticks),
            "level_changes": sum(t.changes.levels for t in ticks),
            "flaps": sum(t.changes.flaps for t in ticks),
            "flapping": flapping,
        }
    return out


def summarize(run: PolicyRun) -> dict[str, Any]:
    node = run.backend.node
    seconds = run.scenario.seconds
    every = list(node.runs.values()) + node.retired
    by_class: dict[str, list[IntentRun]] = {}
    for r in every:
        by_class.setdefault(r.profile.workload_class, []).append(r)
    batch_items = sum(r.stats.items_done for r in by_class.get("BATCH", []))
    responses = urgent_responses(run, by_class.get("URGENT", []))
    units_changes, degradations = decision_changes(run)
    arrived, completed, dropped, queued = node.conservation()
    ticks = run.ticks
    intents = sorted({i for t in ticks for i in t.units})
    known = [x for x in responses if x is not None]
    return {
        "policy": run.policy,
        "online": latency_block(by_class.get("ONLINE", [])),
        "robot": latency_block(by_class.get("ROBOT", [])),
        "urgent": {
            **latency_block(by_class.get("URGENT", [])),
            "response_ms": responses,
            "response_max_ms": max(known) if known else None,
        },
        "batch": {
            "items": _r(batch_items, 2),
            "items_per_s": _r(batch_items / seconds, 3),
        },
        "preemptions": count_preemptions(run),
        "degradations": sum(1 for d in degradations if LEVEL_RANK[d["to"]] > LEVEL_RANK[d["from"]]),
        "degraded_tick_pct": _r(
            100.0 * sum(t.degradations for t in ticks) / max(1, sum(len(t.units) for t in ticks)), 3
        ),
        "per_intent": {
            r.profile.intent_id: latency_block(
                [x for x in every if x.profile.intent_id == r.profile.intent_id]
            )
            for r in every
            if r.queue is not None
        },
        "conservation": {
            "arrived": arrived,
            "completed": completed,
            "dropped": dropped,
            "queued": queued,
            "holds": arrived == completed + dropped + queued,
        },
        "prediction_error": prediction_errors(run),
        "stability": stability(run),
        "decision_changes": units_changes,
        "degradation_decisions": degradations,
        "timeline": {
            "t_s": [_r(t.t_s, 3) for t in ticks],
            "units": {i: [t.units.get(i, 0) for t in ticks] for i in intents},
            "level": {
                i: [LEVEL_RANK[t.degradation.get(i, "NORMAL")] for t in ticks] for i in intents
            },
            "contention": [_r(t.contention, 4) for t in ticks],
            "disturbance_cpu": [_r(t.disturbance[0], 3) for t in ticks],
            **per_second_series(run, by_class.get("ONLINE", []), seconds),
        },
    }
