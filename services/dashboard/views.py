"""From the latest snapshot to what each panel shows: plain dicts for the Jinja2 template.

One builder per panel; each returns ``{"error": "... unreachable at ..."}`` style context when its
service did not answer, so the template can say so and the other panels render as usual.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Iterable
from typing import Any

from parfusion.v1 import intent_pb2
from services.common.latency import is_unbounded
from services.dashboard import chart
from services.dashboard.observer import LARGE_NODE_EVERY, LARGE_NODE_POOLS, Snapshot, enum_name
from services.dashboard.timeline import Timeline

DEGRADATION_RANK = {"NORMAL": 0, "FP16": 1, "INT8": 2}
# Rows a table shows at most: a node with thousands of intents would otherwise send megabytes
# of HTML every poll. `parfusion plan`, `parfusion intents` and GetPlan give every row.
TABLE_ROWS = 100
CLASS_ORDER = {"URGENT": 0, "ROBOT": 1, "ONLINE": 2, "BATCH": 3}
_UNMET = (intent_pb2.ALLOCATION_STATE_THROTTLED, intent_pb2.ALLOCATION_STATE_PREEMPTED)


def attention(a: Any) -> tuple[int, float]:
    """Sort key of an allocation, most in need of an operator's eye first: throttled,
    preempted or with negative slack, then degraded, then the rest; higher risk first."""
    if a.state in _UNMET or (a.deadline_ms and a.slack_ms < 0):
        level = 0
    elif a.state == intent_pb2.ALLOCATION_STATE_DEGRADED:
        level = 1
    else:
        level = 2
    return level, -a.deadline_risk


def first_rows(items: Iterable[Any], key: Any = None) -> tuple[list[Any], int]:
    """At most TABLE_ROWS items (the first by ``key`` when given) and how many there were."""
    items = list(items)
    if len(items) <= TABLE_ROWS:
        return items, len(items)
    if key is None:
        return items[:TABLE_ROWS], len(items)
    return heapq.nsmallest(TABLE_ROWS, items, key=key), len(items)


def cpu_ranges(cpus: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    ids = sorted(set(cpus))
    out: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


def _intents(snapshot: Snapshot) -> dict[str, Any]:
    reading = snapshot.intents
    if reading is None or not reading.ok or reading.value is None:
        return {}
    return {i.id: i for i in reading.value.intents}


def _value(snapshot: Snapshot, service: str) -> tuple[Any, str]:
    reading = snapshot.reading(service)
    if reading is None:
        return None, f"waiting for the first answer from {service}"
    if not reading.ok:
        return None, reading.error
    return reading.value, ""


def observed_tails(snapshot: Snapshot, intents: dict[str, Any]) -> dict[str, float]:
    """Per intent with a deadline and completed requests: the tail latency the node agent
    observed over its window, at the percentile the prediction stands for (p95 for a target
    percentile <= 95, else p99)."""
    node, _ = _value(snapshot, "nodeagent")
    if node is None or getattr(node, "telemetry", None) is None:
        return {}
    out = {}
    for lat in node.telemetry.latencies:
        intent = intents.get(lat.intent_id)
        if intent is None or not intent.slo.deadline_ms or lat.count == 0:
            continue
        target = intent.slo.target_percentile or 99.0
        out[lat.intent_id] = lat.p95_ms if target <= 95.0 else lat.p99_ms
    return out


def allocation_rows(
    allocations: Iterable[Any],
    intents: dict[str, Any],
    observed: dict[str, float] | None = None,
    *,
    by_class: bool = True,
) -> list[dict[str, Any]]:
    """One row per allocation, by class and name (``by_class``) or in the given order; with
    `observed` (observed_tails), the observed tail beside the prediction and the prediction's
    error (predicted / observed - 1; None: nothing to compare)."""
    rows = []
    for a in allocations:
        intent = intents.get(a.intent_id)
        deadline = a.deadline_ms or (intent.slo.deadline_ms if intent is not None else 0.0)
        seen = (observed or {}).get(a.intent_id, 0.0)
        comparable = seen > 0 and a.units > 0 and not is_unbounded(a.predicted_p99_ms)
        rows.append(
            {
                "name": a.intent_name or (intent.name if intent is not None else a.intent_id),
                "cls": enum_name(intent_pb2.WorkloadClass, a.workload_class)
                if a.workload_class
                else "",
                "workers": a.workers,
                "units": a.units,
                "sched": a.sched_policy or "other",
                "cpus": cpu_ranges(a.cpu_set),
                "nice": a.nice,
                "gpu_lane": a.gpu_lane,
                "gpu_share": a.gpu_share_percent,
                "stream_priority": a.stream_priority,
                "degradation": enum_name(intent_pb2.DegradationLevel, a.degradation)
                if a.degradation
                else "NORMAL",
                "p99": a.predicted_p99_ms,
                "observed": seen if seen > 0 else None,
                "error": a.predicted_p99_ms / seen - 1.0 if comparable else None,
                "deadline": deadline,
                "slack": a.slack_ms,
                "risk": a.deadline_risk,
                "nmu": a.nmu,
                "state": enum_name(intent_pb2.AllocationState, a.state) if a.state else "",
                "reason": a.reason,
                "preempted": a.preempted_units,
            }
        )
    if by_class:
        rows.sort(key=lambda r: (CLASS_ORDER.get(r["cls"], 4), r["name"]))
    return rows


def cockpit(snapshot: Snapshot, timeline: Timeline, now: float) -> dict[str, Any]:
    plan, error = _value(snapshot, "allocator")
    samples, _, _ = timeline.window(now, 5.0)
    online = list(samples[-1].online) if samples else []
    miss = timeline.miss_ratio(now, 30.0)
    degradation = "NORMAL"
    for point in online:
        if DEGRADATION_RANK.get(point.degradation, 0) > DEGRADATION_RANK[degradation]:
            degradation = point.degradation
    return {
        "error": error,
        "online": online,
        "miss_pct": None if miss is None else miss * 100.0,
        "contention": plan.node_plan.contention if plan is not None else None,
        "policy": (plan.policy or plan.node_plan.policy) if plan is not None else None,
        "degradation": degradation,
        "node_stale": bool(plan.node_stale) if plan is not None else False,
        "generation": plan.node_plan.generation if plan is not None else None,
        "decision_ms": plan.node_plan.decision_ms if plan is not None else None,
    }


def allocator(snapshot: Snapshot) -> dict[str, Any]:
    plan, error = _value(snapshot, "allocator")
    if plan is None:
        return {"error": error, "rows": []}
    intents = _intents(snapshot)
    shown, total = first_rows(plan.node_plan.allocations, attention)
    # a cut table keeps the attention order it was cut in
    rows = allocation_rows(
        shown, intents, observed_tails(snapshot, intents), by_class=total == len(shown)
    )
    return {
        "error": "",
        "rows": rows,
        "total": total,
        "policy": plan.policy or plan.node_plan.policy,
        "generation": plan.node_plan.generation,
        "cpu_units": plan.node_plan.cpu_units,
        "contention": plan.node_plan.contention,
        "node_stale": plan.node_stale,
    }


def preview(response: Any, snapshot: Snapshot) -> dict[str, Any]:
    intents = _intents(snapshot)
    shown, total = first_rows(response.preview.allocations, attention)
    ids = {a.intent_id for a in shown}
    now_rows = allocation_rows(
        (a for a in response.current.allocations if a.intent_id in ids), intents
    )
    current = {r["name"]: r for r in now_rows}
    rows = []
    for row in allocation_rows(shown, intents, by_class=total == len(shown)):
        rows.append({"preview": row, "current": current.get(row["name"])})
    return {
        "rows": rows,
        "total": total,
        "preview_contention": response.preview.contention,
        "current_contention": response.current.contention,
        "policy": response.preview.policy,
    }


def policies(snapshot: Snapshot) -> dict[str, Any]:
    reading = snapshot.policies
    if reading is None:
        return {"error": "waiting for the allocator", "groups": [], "active": None}
    if not reading.ok or reading.value is None:
        return {"error": reading.error, "groups": [], "active": None}
    groups: dict[str, list[Any]] = {"parfusion": [], "reference": [], "ablation": []}
    for p in reading.value.policies:
        groups.setdefault(p.kind or "other", []).append(p)
    return {
        "error": "",
        "active": reading.value.active,
        "groups": [(kind, items) for kind, items in groups.items() if items],
        "names": {p.name for p in reading.value.policies},
    }


def intents(snapshot: Snapshot) -> dict[str, Any]:
    reading = snapshot.intents
    if reading is None or not reading.ok or reading.value is None:
        return {"error": reading.error if reading else "waiting for the allocator", "rows": []}
    rows = []
    shown, total = first_rows(reading.value.intents)
    for i in shown:
        rows.append(
            {
                "name": i.name,
                "cls": enum_name(intent_pb2.WorkloadClass, i.workload_class)
                if i.workload_class
                else "",
                "priority": i.priority,
                "deadline": i.slo.deadline_ms,
                "parallelism": f"{i.parallelism.min or 1}-{i.parallelism.max or 'node'}",
                "arrival": i.demand.arrival_rate_per_s,
                "work": i.demand.work_units,
                "gpu": f"{i.gpu.lane or 'any'} {i.gpu.share:.0%}" if i.gpu.share else "-",
                "ladder": "/".join(enum_name(intent_pb2.DegradationLevel, d) for d in i.degradation)
                or "NORMAL",
                "flags": " ".join(
                    f for f, on in (("preemptible", i.preemptible), ("elastic", i.elastic)) if on
                ),
            }
        )
    return {"error": "", "rows": rows, "total": total}


def gpu(snapshot: Snapshot) -> dict[str, Any]:
    response, error = _value(snapshot, "gpulane")
    plan_value, _ = _value(snapshot, "allocator")
    assignments, total = first_rows(plan_value.gpu_plan.assignments if plan_value else ())
    if response is None:
        return {"error": error, "assignments": assignments, "assignments_total": total}
    tel = response.telemetry
    return {
        "error": "",
        "backend": tel.backend,
        "nvml_available": tel.nvml_available,
        "nvml_error": tel.nvml_error,
        "driver": tel.driver_version,
        "devices": list(tel.devices),
        "lanes": list(tel.lanes),
        "gpu_pressure": tel.gpu_pressure,
        "assignments": assignments,
        "assignments_total": total,
        "gpu_intent_enabled": plan_value.gpu_plan.gpu_intent_enabled if plan_value else None,
    }


def node(snapshot: Snapshot) -> dict[str, Any]:
    response, error = _value(snapshot, "nodeagent")
    if response is None:
        return {"error": error}
    tel = response.telemetry
    pools, pools_total = first_rows(tel.pools, lambda p: (-p.workers, -p.queued, p.intent_id))
    return {
        "error": "",
        "backend": tel.backend,
        "cores": list(tel.cpu_percent_per_core),
        "arena": cpu_ranges(tel.arena_cpus),
        "load1": tel.load1,
        "memory_pct": 100.0 * tel.memory_used_bytes / tel.memory_total_bytes
        if tel.memory_total_bytes
        else None,
        "psi": [
            ("cpu", tel.cpu_pressure),
            ("memory", tel.memory_pressure),
            ("io", tel.io_pressure),
        ],
        # the pools with workers and queued work first when there are too many to show
        "pools": pools,
        "pools_total": pools_total,
        "read_every": LARGE_NODE_EVERY if len(tel.pools) > LARGE_NODE_POOLS else 1,
        "disturbance": tel.active_disturbance if tel.disturbance_remaining_s > 0 else None,
        "disturbance_remaining_s": tel.disturbance_remaining_s,
    }


ROBOT_STATES = (
    "IDLE",
    "RUNNING",
    "CHECKPOINTING",
    "PREEMPTED",
    "URGENT_TASK_RUNNING",
    "RESUMING",
    "COMPENSATING",
    "COMPLETED",
)


def robot(snapshot: Snapshot, timeline: Timeline, now: float, window_s: float) -> dict[str, Any]:
    state, error = _value(snapshot, "bridge")
    _, _, spans = timeline.window(now, window_s)
    preemptions = sum(1 for s in spans if s.state == "PREEMPTED")
    details = []
    if isinstance(state, dict):
        for key, value in state.items():
            if key != "state" and value is not None and not isinstance(value, (dict, list)):
                details.append((key, value))
    return {
        "error": error,
        "state": state.get("state") if isinstance(state, dict) else None,
        "details": details[:14],
        "states": ROBOT_STATES,
        "preemptions": preemptions,
        "transitions": [
            (spans[i].start, spans[i - 1].state, spans[i].state)
            for i in range(len(spans) - 1, 0, -1)
        ][:8],
    }


def summary(snapshot: Snapshot, timeline: Timeline, now: float) -> str:
    """One line of the measured state: what a demo stage led to, in the services' own numbers."""
    c = cockpit(snapshot, timeline, now)
    parts = [
        f"{p.name} p99 {p.p99_ms:.0f}/{p.deadline_ms:.0f} ms {p.degradation}" for p in c["online"]
    ]
    if c["miss_pct"] is not None:
        parts.append(f"misses {c['miss_pct']:.1f}%")
    if c["contention"] is not None:
        parts.append(f"contention {c['contention']:.0%}")
    bridge, _ = _value(snapshot, "bridge")
    if isinstance(bridge, dict) and bridge.get("state"):
        parts.append(f"robot {bridge['state']}")
    node_value, _ = _value(snapshot, "nodeagent")
    if node_value is not None and node_value.telemetry.disturbance_remaining_s > 0:
        parts.append("disturbance active")
    return ", ".join(parts)


def services(snapshot: Snapshot, addresses: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    for name, address in addresses.items():
        up = snapshot.up(name)
        out.append({"name": name, "address": address, "up": up})
    return out


def latency(timeline: Timeline, now: float, window_s: float) -> dict[str, Any]:
    """The chart marks every event except robot transitions, which the band below it shows
    on the same time axis (they come in bursts of six and would bury the rest)."""
    samples, events, spans = timeline.window(now, window_s)
    marked = [e for e in events if e.kind != "robot"]
    last = timeline.last()
    charted = len(last.online) if last is not None else 0
    total = last.online_total if last is not None else 0
    return {
        # on a node with more online intents than the chart draws, which ones it draws
        "cut": f"charting {charted} of {total:,} online intents: over their deadline, then "
        "degraded or predicted over it, nearest their deadline first"
        if total > charted
        else "",
        "svg": chart.latency_chart(samples, marked, now=now, window_s=window_s),
        "robot_svg": chart.robot_timeline(spans, now=now, window_s=window_s),
        "legend": [
            {
                "number": i,
                "kind": e.kind,
                "label": e.label,
                "colour": chart.EVENT_COLOURS.get(e.kind),
            }
            for i, e in enumerate(marked, 1)
        ],
    }


def now() -> float:
    return time.time()
