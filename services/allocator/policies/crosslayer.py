"""Cross-layer knobs: turns a unit allocation (dmug.UnitPlan) into the tick's Decisions.

Every policy ends here. With cross-layer control on, deadline work gets its own CPU cores first,
nice 0 and a high cgroup weight, batch the shared rest, nice 10..19 and SCHED_BATCH (SCHED_IDLE
while deadline work is at risk); GPU shares are handed out per lane in share units, deadline work
first, then batch by the same water-filling greedy as the units. With it off (no-crosslayer,
reference policies) only the pool sizes change and every OS/GPU knob keeps its default.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from services.allocator.dmug import (
    BATCH_ADMITTED,
    FIXED,
    HELD_DEGRADED,
    MET,
    MET_DEGRADED,
    NOT_ADMITTED,
    SHORT,
    STATE_NAMES,
    UNREACHABLE,
    WAS_PREEMPTED,
    IntentTable,
    UnitPlan,
    cpu_pressure,
)
from services.allocator.model import (
    DEGRADATION_ORDER,
    Decision,
    LaneCapacity,
    PlanInput,
    PlanResult,
)
from services.allocator.waterfill import select_increments

CPU_PERIOD_US = 100_000
MIN_CPU_QUOTA_US = 1_000  # the kernel's floor for cpu.max
DEFAULT_GPU_CONCURRENCY_CAP = 4


@dataclass(frozen=True)
class Knobs:
    cross_layer: bool = True  # OS knobs (cpu set, nice, scheduler class, cgroup)
    gpu_intent: bool = True  # GPU lane, share, stream priority, concurrency


def cpu_sets(table: IntentTable, plan: UnitPlan, cpu_ids: tuple[int, ...], capacity: int):
    """CPU sets per intent and whether each one shares its cores with other work.

    Deadline work gets exclusive cores sized by its share of the units, least slack first (then
    deadline work the deadline phase did not order, e.g. non-elastic intents holding their
    units), keeping one core for batch when batch runs; one that does not fit takes the
    smallest possible block (one core) if that is left. Batch, and deadline work for which no
    core was left, share the rest (all the arena when nothing is left).
    """
    n = table.n
    sets: list[tuple[int, ...]] = [()] * n
    exclusive = np.zeros(n, dtype=bool)
    if not cpu_ids:
        return sets, exclusive
    c = len(cpu_ids)
    running = plan.units > 0
    deadline_running = table.has_deadline & running
    batch_running = bool((running & ~table.has_deadline).any())
    reserve = 1 if batch_running else 0
    order = plan.order[deadline_running[plan.order]]
    unordered = np.ones(n, dtype=bool)
    unordered[order] = False
    ordered = np.concatenate((order, np.flatnonzero(deadline_running & unordered)))
    units = plan.units[ordered].tolist()
    pos, room = 0, c - reserve
    for i, u in zip(ordered.tolist(), units, strict=True):
        if pos >= room:
            break  # no core left: the rest shares
        k = max(1, u * c // max(capacity, 1))
        if pos + k > room:
            k = 1
        sets[i] = cpu_ids[pos : pos + k]
        exclusive[i] = True
        pos += k
    shared = cpu_ids[pos:] or cpu_ids
    for i in np.flatnonzero(running & ~exclusive).tolist():
        sets[i] = shared
    return sets, exclusive


def gpu_shares(table: IntentTable, plan: UnitPlan, lanes: tuple[LaneCapacity, ...], rank):
    """Lane and share units per intent: deadline work takes its requested share first (least
    slack first; an equal split of the lane when it asked none), then batch shares the rest by
    weighted log utility (gain w/(k+1) per unit), water-filled like the units, each capped at its
    request. Returns (lane name, share units, note) per intent."""
    n = table.n
    lane_of = [""] * n
    share = np.zeros(n)
    note = [""] * n
    available = {lane.name: lane for lane in lanes if lane.available}
    if not table.uses_gpu.any():
        return lane_of, share, note
    left = {name: float(lane.share_units) for name, lane in available.items()}
    users = np.flatnonzero(table.uses_gpu & (plan.units > 0))
    in_order = plan.order[table.uses_gpu[plan.order] & (plan.units[plan.order] > 0)].tolist()
    rest = [i for i in users[np.argsort(rank[users], kind="stable")].tolist()]
    seen = set(in_order)
    ordered = in_order + [i for i in rest if i not in seen]
    # lanes: the requested one, else the one with most share units not yet spoken for
    provisional = dict(left)
    users_on: dict[str, int] = dict.fromkeys(available, 0)
    for i in ordered:
        spec = table.specs[i]
        if spec.gpu_lane:
            if spec.gpu_lane not in available:
                note[i] = f"; GPU lane {spec.gpu_lane} unavailable"
                continue
            lane_of[i] = spec.gpu_lane
        elif provisional:
            lane_of[i] = max(sorted(provisional), key=lambda name: provisional[name])
        else:
            note[i] = "; no GPU lane available"
            continue
        provisional[lane_of[i]] -= spec.gpu_share * 100.0
        users_on[lane_of[i]] += 1
    # deadline work first: its requested share, or an equal split of the lane when it asked none
    for i in ordered:
        lane = lane_of[i]
        if lane and table.has_deadline[i]:
            fair = available[lane].share_units / max(users_on[lane], 1)
            want = table.specs[i].gpu_share * 100.0 or fair
            got = min(want, left[lane])
            share[i] = got
            left[lane] -= got
    for name in sorted(available):
        rows = [i for i in ordered if lane_of[i] == name and not table.has_deadline[i]]
        budget = int(left[name])
        if not rows or budget <= 0:
            continue
        demand = [int(round(table.specs[i].gpu_share * 100.0)) or budget for i in rows]
        width = max(demand)
        r = np.array(rows)
        k = np.arange(width)
        gains = table.weight[r][:, None] / (k[None, :] + 1.0)
        gains = np.where(k[None, :] < np.array(demand)[:, None], gains, -np.inf)
        chosen = select_increments(
            gains.ravel(), np.repeat(rank[r], width), np.tile(k, len(rows)), budget
        )
        share[r] = chosen.reshape(len(rows), width).sum(axis=1)
    return lane_of, share, note


def reasons(table: IntentTable, plan: UnitPlan, policy: str) -> list[str]:
    """One human-readable reason per intent, from the outcome code and the numbers behind it.

    Built one outcome group at a time (a comprehension per template) rather than one branch chain
    per intent: at 10,000 intents the formatting is a visible part of the tick.
    """
    n = table.n
    out: list[str] = [""] * n
    units, need, lvl = plan.units, plan.need, plan.level
    lost = plan.preempted_units
    outcome = np.where(lost > 0, WAS_PREEMPTED, plan.outcome)
    outcome = np.where((outcome == BATCH_ADMITTED) & (units == 0), NOT_ADMITTED, outcome)
    outcome = np.where((outcome == BATCH_ADMITTED) & table.has_deadline, -1, outcome)
    levels = DEGRADATION_ORDER

    def group(code: int, *cols: np.ndarray):
        idx = np.flatnonzero(outcome == code)
        return idx.tolist(), zip(*(c[idx].tolist() for c in cols), strict=True)

    p99, d, cap = plan.predicted_p99_ms, table.deadline, table.cap
    idx, rows = group(WAS_PREEMPTED, lost, plan.preempted_by)
    names = [sp.name for sp in table.specs]
    for i, (gone, by) in zip(idx, rows, strict=True):
        who = names[by] if by >= 0 else "work"
        out[i] = f"preempted: {gone} units taken by urgent {who}"
    idx, rows = group(MET, need, d, p99, units - need)
    for i, (nd, dd, pp, extra) in zip(idx, rows, strict=True):
        tail = f"; +{extra} of the leftover units" if extra > 0 else ""
        out[i] = f"deadline phase: {nd} units meet {dd:g} ms (pred p99 {pp:.1f} ms){tail}"
    idx, rows = group(MET_DEGRADED, d, cap, units, lvl, p99)
    for i, (dd, cc, uu, lv, pp) in zip(idx, rows, strict=True):
        out[i] = (
            f"degraded to {levels[lv]}: {dd:g} ms unreachable at {cc} units at NORMAL; "
            f"{uu} units meet it at {levels[lv]} (pred p99 {pp:.1f} ms)"
        )
    idx, rows = group(HELD_DEGRADED, lvl, d, units, p99)
    for i, (lv, dd, uu, pp) in zip(idx, rows, strict=True):
        out[i] = (
            f"holding {levels[lv]}: a lighter level would meet {dd:g} ms, but not yet with "
            f"margin for long enough; {uu} units (pred p99 {pp:.1f} ms)"
        )
    idx, rows = group(UNREACHABLE, d, cap, lvl, units, p99)
    for i, (dd, cc, lv, uu, pp) in zip(idx, rows, strict=True):
        out[i] = (
            f"at risk: {dd:g} ms unreachable even at {cc} units ({levels[lv]}); "
            f"running {uu} units (pred p99 {pp:.1f} ms)"
        )
    idx, rows = group(SHORT, need, d, plan.free_at_ask, units)
    for i, (nd, dd, fr, uu) in zip(idx, rows, strict=True):
        out[i] = f"at risk: needs {nd} units for {dd:g} ms, {fr} free; running {uu}"
    idx, rows = group(NOT_ADMITTED, table.min_units, plan.free_at_ask)
    for i, (mn, fr) in zip(idx, rows, strict=True):
        out[i] = f"not admitted: needs {mn} units, {fr} free"
    idx, rows = group(FIXED, units)
    for i, (uu,) in zip(idx, rows, strict=True):
        out[i] = f"{policy}: holds {uu} units from its first allocation"
    idx, rows = group(-1, units, p99, d)
    for i, (uu, pp, dd) in zip(idx, rows, strict=True):
        out[i] = f"{policy}: {uu} units (pred p99 {pp:.1f} ms for {dd:g} ms)"
    idx, rows = group(BATCH_ADMITTED, units, plan.nmu)
    for i, (uu, nm) in zip(idx, rows, strict=True):
        out[i] = f"{policy}: {uu} units (next-unit nmu {nm:.3g})"
    return out


_DECISION_FIELDS = tuple(f.name for f in dataclasses.fields(Decision))
# Decision is a frozen slots dataclass with no __post_init__: filling its slots column by column
# through the slot descriptors builds the same objects as __init__ at a third of the cost, which
# is most of a 10,000-intent tick. Anything else falls back to __init__.
_FAST_BUILD = not hasattr(Decision, "__post_init__") and set(
    getattr(Decision, "__slots__", ())
) == set(_DECISION_FIELDS)


def build_decisions(n: int, **columns: list) -> tuple[Decision, ...]:
    """n Decisions from one list per field (every field given)."""
    if set(columns) != set(_DECISION_FIELDS):
        raise TypeError(f"build_decisions needs exactly the fields {_DECISION_FIELDS}")
    if not _FAST_BUILD:
        return tuple(map(Decision, *(columns[name] for name in _DECISION_FIELDS)))
    objs = list(map(object.__new__, repeat(Decision, n)))
    for name in _DECISION_FIELDS:
        deque(map(Decision.__dict__[name].__set__, objs, columns[name]), maxlen=0)
    return tuple(objs)


def decide(
    state: PlanInput,
    table: IntentTable,
    plan: UnitPlan,
    policy: str,
    knobs: Knobs,
    rank: np.ndarray,
) -> PlanResult:
    """Materialise the Decisions: one per intent, in PlanInput order."""
    n = table.n
    node = state.node
    capacity = max(int(node.cpu_units), 0)
    units = plan.units
    running = units > 0
    deadline = table.has_deadline
    risk_threshold = state.config.risk_threshold
    # deadline work at risk that CPU could still help (not work out of reach at any units)
    helpable = plan.outcome != UNREACHABLE
    at_risk = bool((deadline & running & helpable & (plan.risk > risk_threshold)).any()) or bool(
        (plan.outcome == SHORT).any()
    )
    why = reasons(table, plan, policy)

    if knobs.cross_layer:
        sets, exclusive = cpu_sets(table, plan, tuple(node.cpu_ids), capacity)
        squeezed = np.flatnonzero(deadline & running & ~exclusive)
        for i in squeezed.tolist():
            why[i] += f"; shares {len(sets[i])} cpus with other work (no dedicated core left)"
        batch_nice = np.rint(19 - 9 * np.clip(table.weight * 1001 - 1, 0, 1000) / 1000).astype(int)
        nice = np.where(deadline, 0, np.where(at_risk, 19, batch_nice))
        sched = np.where(deadline, "other", "idle" if at_risk else "batch")
        weight = np.where(
            deadline,
            np.clip(200 * units, 100, 10_000),
            1 if at_risk else np.clip(np.rint(100 * units * table.weight), 1, 10_000),
        ).astype(int)
        c = len(node.cpu_ids) or capacity
        quota = np.maximum(np.rint(units * c / max(capacity, 1) * CPU_PERIOD_US), MIN_CPU_QUOTA_US)
        uncapped = (deadline & running).tolist()
        memo: dict[int, str] = {}
        cpu_max = [
            "max" if free_run else memo.get(q) or memo.setdefault(q, f"{q} {CPU_PERIOD_US}")
            for free_run, q in zip(uncapped, quota.astype(np.int64).tolist(), strict=True)
        ]
        nice_l, sched_l, weight_l = nice.tolist(), sched.tolist(), weight.tolist()
    else:
        sets = [()] * n
        nice_l, sched_l, weight_l, cpu_max = [0] * n, ["other"] * n, [100] * n, ["max"] * n

    gpu_on = knobs.cross_layer and knobs.gpu_intent
    if gpu_on and table.uses_gpu.any():
        lane_of, share, note = gpu_shares(table, plan, tuple(node.lanes), rank)
        indexes = {lane.name: tuple(lane.gpu_indexes) for lane in node.lanes}
        gidx = [indexes.get(name, ()) if name else () for name in lane_of]
        prio = np.where(deadline, 1, -1 if at_risk else 0)
        prio = np.where(
            deadline, prio, np.minimum(prio, [s.gpu_stream_priority_hint for s in table.specs])
        )
        prio = np.clip(prio, -1, 1)
        conc = [
            (s.gpu_concurrency or max(1, min(u, DEFAULT_GPU_CONCURRENCY_CAP))) if lane else 0
            for s, u, lane in zip(table.specs, units.tolist(), lane_of, strict=True)
        ]
        prio_l = [p if lane else 0 for p, lane in zip(prio.tolist(), lane_of, strict=True)]
        share_l = share.tolist()
        why = [w + x if x else w for w, x in zip(why, note, strict=True)]
    else:
        lane_of, gidx, share_l = [""] * n, [()] * n, [0.0] * n
        prio_l, conc = [0] * n, [0] * n

    same = table.has_prev & (table.prev_units == units)
    since = np.where(same, table.prev_since, state.tick).tolist()
    same_level = table.has_prev & (table.prev_level == plan.level)
    level_since = np.where(same_level, table.prev_level_since, state.tick).tolist()
    level_names = [DEGRADATION_ORDER[v] for v in plan.level.tolist()]
    decisions = build_decisions(
        n,
        intent_id=list(table.ids),
        units=units.tolist(),
        degradation=level_names,
        predicted_p99_ms=plan.predicted_p99_ms.tolist(),
        slack_ms=plan.slack_ms.tolist(),
        deadline_risk=plan.risk.tolist(),
        nmu=plan.nmu.tolist(),
        state=[STATE_NAMES[v] for v in plan.state.tolist()],
        reason=why,
        preempted_units=plan.preempted_units.tolist(),
        cpu_set=sets,
        nice=nice_l,
        sched_policy=sched_l,
        cpu_weight=weight_l,
        cpu_max=cpu_max,
        gpu_lane=lane_of,
        gpu_indexes=gidx,
        gpu_share_percent=share_l,
        stream_priority=prio_l,
        gpu_concurrency=conc,
        since_tick=since,
        level_since_tick=level_since,
    )
    degraded = int(((plan.level > 0) & running).sum())
    return PlanResult(
        policy=policy,
        decisions=decisions,
        gpu_intent_enabled=gpu_on,
        contention=cpu_pressure(node),
        preemptions=plan.preemptions,
        degradations=degraded,
    )
