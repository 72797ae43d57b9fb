"""The cross-layer step, the shared second half of every policy: a UnitPlan -> Decisions.

With cross-layer control on, deadline work gets its own CPU cores first,
nice 0 and a high cgroup weight, batch the shared rest, nice 10..19 and SCHED_BATCH (SCHED_IDLE
while deadline work is at risk); light deadline work runs on the shared cores at nice 0; and
preemptible batch fills the shared cores with idle-time workers under SCHED_IDLE, which the
kernel runs only on cycles no other work wants, so batch keeps the node busy without holding
units that deadline work needs; GPU shares are handed out per lane in share units, deadline work
first, then batch by the same water-filling greedy as the units. With it off (no-crosslayer,
reference policies) only the pool sizes change and every OS/GPU knob keeps its default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from services.core.cpuset import format_cpuset
from services.core.deadline import level_state, step_up_dwell
from services.core.formulas import cpu_pressure
from services.core.memo import Column, LastDecisions, TickMemo, changed_from
from services.core.model import (
    DEGRADATION_ORDER,
    Decision,
    LaneCapacity,
    PlanInput,
    PlanResult,
)
from services.core.outcome import (
    ADMITTED,
    HELD_DEGRADED,
    SHORT,
    STATE_NAMES,
    UNREACHABLE,
    UnitPlan,
)
from services.core.reasons import reasons
from services.core.table import IntentTable
from services.core.waterfill import select_increments

_LEVEL_NAMES = np.array(DEGRADATION_ORDER, dtype=object)  # index -> name, one gather per tick
_STATE_NAMES = np.array(STATE_NAMES, dtype=object)
CPU_PERIOD_US = 100_000
MIN_CPU_QUOTA_US = 1_000  # the kernel's floor for cpu.max
DEFAULT_GPU_CONCURRENCY_CAP = 4


@dataclass(frozen=True)
class Knobs:
    cross_layer: bool = True  # OS knobs (cpu set, nice, scheduler class, cgroup)
    gpu_intent: bool = True  # GPU lane, share, stream priority, concurrency
    pinned: bool = False  # without cross_layer: each intent's units pinned to its own cores


def _clip(a: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """np.clip's result without its per-call overhead."""
    out: np.ndarray = np.minimum(np.maximum(a, lo), hi)
    return out


def cpu_sets(
    table: IntentTable,
    plan: UnitPlan,
    cpu_ids: tuple[int, ...],
    capacity: int,
    previous: Mapping[str, Decision] | None = None,
) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """CPU sets per intent and whether each one has its cores to itself (but for idle time).

    Deadline work gets exclusive cores sized by its share of the units, least slack first (then
    deadline work the deadline phase did not order, e.g. non-elastic intents holding their
    units), keeping one core for batch when batch runs; one that does not fit takes the
    smallest possible block (one core) if that is left. Batch, light deadline work and deadline
    work for which no core was left share the rest (all the arena when nothing is left).

    Which cores a block is: with `previous` (last tick's Decisions by intent id), an intent that
    keeps a block of the same size keeps its very cores while they are still in the arena, so
    one holder growing or leaving moves no other holder (every move re-pins that intent's
    workers and rebuilds its allocation); the other blocks take the first free run of cores
    (the lowest free cores when no run is long enough). Without history the blocks are packed
    in order from the arena's first core.
    """
    n = table.n
    sets: list[tuple[int, ...]] = [()] * n
    exclusive = np.zeros(n, dtype=bool)
    if not cpu_ids:
        return sets, exclusive
    c = len(cpu_ids)
    running = plan.units > 0
    deadline_running = table.has_deadline & running & ~plan.shared
    batch_running = bool(np.count_nonzero(running & ~table.has_deadline))
    reserve = 1 if batch_running else 0
    order = plan.order[deadline_running[plan.order]]
    unordered = np.ones(n, dtype=bool)
    unordered[order] = False
    ordered = np.concatenate((order, (deadline_running & unordered).nonzero()[0]))
    units = plan.units[ordered].tolist()
    blocks: list[tuple[int, int]] = []  # (row, cores), in the order the cores are handed out
    pos, room = 0, c - reserve
    for i, u in zip(ordered.tolist(), units, strict=True):
        if pos >= room:
            break  # no core left: the rest shares
        k = max(1, u * c // max(capacity, 1))
        if pos + k > room:
            k = 1
        blocks.append((i, k))
        pos += k
    taken: set[int] = set()  # cores in a block already
    placing = blocks
    if previous:
        arena, ids, placing = frozenset(cpu_ids), table.ids, []
        for i, k in blocks:
            held = previous.get(ids[i])
            cores = held.cpu_set if held is not None else ()
            # set operations on the tuple: a thousand holders checked at C speed
            if len(cores) == k and arena.issuperset(cores) and taken.isdisjoint(cores):
                sets[i] = cores
                taken.update(cores)
            else:
                placing.append((i, k))
    free = [core for core in cpu_ids if core not in taken]  # in arena order
    for (i, _), core_block in zip(placing, _runs_for(free, placing), strict=True):
        sets[i] = core_block
        taken.update(core_block)
    for i, _ in blocks:
        exclusive[i] = True
    shared = tuple(core for core in cpu_ids if core not in taken) or cpu_ids
    for i in (running & ~exclusive).nonzero()[0].tolist():
        sets[i] = shared
    return sets, exclusive


def _runs_for(free: list[int], placing: list[tuple[int, int]]) -> list[tuple[int, ...]]:
    """A block of cores per (row, size) in `placing`, in order, from the `free` cores (arena
    order): the first run of consecutive core ids long enough, else the first free cores. One
    pass finds the runs, so placing many blocks costs about the arena's size, not its square."""
    out: list[tuple[int, ...]] = []
    runs = _runs(free)
    for _, k in placing:
        run = next((r for r in runs if r[1] >= k), None)
        if run is None:  # fragmented: the first k free cores, then the runs again
            free = [core for start, length in runs for core in free[start : start + length]]
            out.append(tuple(free[:k]))
            free = free[k:]
            runs = _runs(free)
            continue
        out.append(tuple(free[run[0] : run[0] + k]))
        run[0] += k
        run[1] -= k
    return out


def _runs(cores: list[int]) -> list[list[int]]:
    """[start index, length] of each run of consecutive ids in `cores`."""
    runs: list[list[int]] = []
    for j, core in enumerate(cores):
        if runs and core == cores[j - 1] + 1:
            runs[-1][1] += 1
        else:
            runs.append([j, 1])
    return runs


def pinned_sets(units: np.ndarray, cpu_ids: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The Kubernetes static CPU manager's placement: each intent, in table order, gets as many
    cores of its own as it holds units (Guaranteed pods with integer requests) while cores are
    left; one that no longer fits shares the cores nobody owns (all of them when none are left).
    """
    sets: list[tuple[int, ...]] = [()] * len(units)
    pos = 0
    left_out = []
    for i, u in enumerate(units.tolist()):
        if u <= 0:
            continue
        if pos + u <= len(cpu_ids):
            sets[i] = cpu_ids[pos : pos + u]
            pos += u
        else:
            left_out.append(i)
    shared = cpu_ids[pos:] or cpu_ids
    for i in left_out:
        sets[i] = shared
    return sets


def idle_workers(
    table: IntentTable, plan: UnitPlan, cpu_ids: tuple[int, ...], rank: np.ndarray
) -> np.ndarray:
    """Idle-time workers per intent: the arena's worker slots (one per core) that batch units
    do not already fill go to preemptible elastic batch intents, best rank first, each up to
    its cap. Their pools run under SCHED_IDLE on the whole arena, so they take only the cycles
    no other work wants, on deadline work's own cores too, and give them back at once.
    """
    n = table.n
    extra = np.zeros(n, dtype=np.int64)
    if not cpu_ids:
        return extra
    batch = ~table.has_deadline
    slots = len(cpu_ids) - int(plan.units[batch].sum())
    eligible = (batch & table.preemptible & table.elastic & (plan.units < table.cap)).nonzero()[0]
    if slots <= 0 or eligible.size == 0:
        return extra
    for i in eligible[np.argsort(rank[eligible], kind="stable")].tolist():
        give = min(int(table.cap[i] - plan.units[i]), slots)
        extra[i] = give
        slots -= give
        if slots <= 0:
            break
    return extra


def gpu_shares(
    table: IntentTable,
    plan: UnitPlan,
    lanes: tuple[LaneCapacity, ...],
    rank: np.ndarray,
    running: np.ndarray | None = None,
) -> tuple[list[str], np.ndarray, list[str]]:
    """Lane and share units per intent: deadline work takes its requested share first (least
    slack first; an equal split of the lane when it asked none), then batch shares the rest by
    weighted log utility (gain w/(k+1) per unit), water-filled like the units, each capped at its
    request. Returns (lane name, share units, note) per intent."""
    n = table.n
    lane_of = [""] * n
    share = np.zeros(n)
    note = [""] * n
    available = {lane.name: lane for lane in lanes if lane.available}
    if not np.count_nonzero(table.uses_gpu):
        return lane_of, share, note
    left = {name: float(lane.share_units) for name, lane in available.items()}
    if running is None:
        running = plan.units > 0
    users = (table.uses_gpu & running).nonzero()[0]
    in_order = plan.order[table.uses_gpu[plan.order] & running[plan.order]].tolist()
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


_DECISION_FIELDS = Decision.__struct_fields__


def build_decisions(n: int, **columns: Column) -> tuple[Decision, ...]:
    """n Decisions from one column (list or array) per field (every field given)."""
    if set(columns) != set(_DECISION_FIELDS):
        raise TypeError(f"build_decisions needs exactly the fields {_DECISION_FIELDS}")
    return tuple(map(Decision, *(_as_list(columns[name]) for name in _DECISION_FIELDS)))


def _as_list(column: Column) -> Sequence[Any]:
    return column.tolist() if isinstance(column, np.ndarray) else column


def _rows_of(column: Column, rows: np.ndarray) -> list[Any]:
    if isinstance(column, np.ndarray):
        values: list[Any] = column[rows].tolist()
        return values
    return [column[i] for i in rows.tolist()]


def reuse_or_build(
    n: int, memo: TickMemo | None, level: np.ndarray, **columns: Column
) -> tuple[Decision, ...]:
    """The tick's Decisions: a row whose fields all equal those of the Decision this policy
    built last tick for the same intent (matched by id) keeps that Decision object, and only
    the other rows are built (an equal result, without 23 field writes per unchanged intent).
    Remembers the result."""
    last = memo.last if memo is not None else None
    if last is not None and last.decisions:
        ids: Sequence[str] = columns["intent_id"]  # type: ignore[assignment]  # the table's ids
        changed, src = changed_from(n, columns, last.columns, last.ids, ids)
        rows = changed.nonzero()[0]
        own = last.decisions
        if src is None and rows.size == 0:
            decisions = own
        else:
            kept = list(own) if src is None else [own[j] for j in np.maximum(src, 0).tolist()]
            built = build_decisions(rows.size, **{k: _rows_of(c, rows) for k, c in columns.items()})
            for i, decision in zip(rows.tolist(), built, strict=True):
                kept[i] = decision
            decisions = tuple(kept)
    else:
        decisions = build_decisions(n, **columns)
    if memo is not None:
        memo.last = LastDecisions(decisions, columns, level)
    return decisions


def decide(
    state: PlanInput,
    table: IntentTable,
    plan: UnitPlan,
    policy: str,
    knobs: Knobs,
    rank: np.ndarray,
    memo: TickMemo | None = None,
) -> PlanResult:
    """Materialise the Decisions: one per intent, in PlanInput order (unchanged ones kept from
    last tick through `memo`)."""
    n = table.n
    node = state.node
    capacity = max(int(node.cpu_units), 0)
    units = plan.units
    running = units > 0
    deadline = table.has_deadline
    risk_threshold = state.config.risk_threshold
    # deadline work at risk that CPU could still help (not work out of reach at any units)
    helpable = plan.outcome != UNREACHABLE
    at_risk = bool(
        np.count_nonzero(deadline & running & helpable & (plan.risk > risk_threshold))
        or np.count_nonzero(plan.outcome == SHORT)
    )
    why = reasons(table, plan, policy, state.config.light_load_cores, memo)
    level_backoff, level_raised = level_state(table, plan.level, state.tick, state.config)
    backing_off = ((plan.outcome == HELD_DEGRADED) & (level_backoff > 0)).nonzero()[0]
    waits = step_up_dwell(level_backoff[backing_off], state.config).tolist()
    for i, wait in zip(backing_off.tolist(), waits, strict=True):
        tries = int(level_backoff[i])
        failed = "a step up failed" if tries == 1 else f"{tries} step-ups failed in a row"
        why[i] += f"; {failed}: the next after {wait} ticks at this level"
    shared_work = plan.shared
    extra = np.zeros(n, dtype=np.int64)

    nice_l: Column
    weight_l: Column
    if knobs.cross_layer:
        sets, exclusive = cpu_sets(table, plan, tuple(node.cpu_ids), capacity, state.previous)
        squeezed = (deadline & running & ~exclusive & ~shared_work).nonzero()[0]
        for i in squeezed.tolist():
            why[i] += f"; shares {len(sets[i])} cpus with other work (no dedicated core left)"
        batch_nice = np.rint(19 - 9 * _clip(table.weight * 1001 - 1, 0, 1000) / 1000).astype(int)
        nice = np.where(deadline, 0, np.where(at_risk, 19, batch_nice))
        sched_names = np.array(("idle" if at_risk else "batch", "other"), dtype=object)
        sched = sched_names[deadline.astype(np.int64)]
        weight = np.where(
            deadline,
            _clip(200 * units, 100, 10_000),
            1 if at_risk else _clip(np.rint(100 * units * table.weight), 1, 10_000),
        ).astype(int)
        c = len(node.cpu_ids) or capacity
        quota = np.maximum(np.rint(units * c / max(capacity, 1) * CPU_PERIOD_US), MIN_CPU_QUOTA_US)
        quotas = quota.astype(np.int64).tolist()
        text = {q: f"{q} {CPU_PERIOD_US}" for q in dict.fromkeys(quotas)}  # one per distinct quota
        arena = tuple(node.cpu_ids)
        extra = idle_workers(table, plan, arena, rank)
        scavenging = extra > 0
        nice = np.where(scavenging, 19, nice)
        sched = np.where(scavenging, "idle", sched)
        weight = np.where(scavenging, 1, weight)
        unlimited = ((deadline & running) | scavenging).tolist()
        cpu_max = ["max" if free else text[q] for q, free in zip(quotas, unlimited, strict=True)]
        nice_l, sched_l, weight_l = nice, sched.tolist(), weight
        scavengers = scavenging.nonzero()[0].tolist()
        if scavengers:
            where = f"idle-time workers on cpus {format_cpuset(arena)}"
            for i in scavengers:
                sets[i] = arena
                why[i] += (
                    f"; +{int(extra[i])} {where} (SCHED_IDLE, nice 19: only cycles other work leaves)"
                )
    else:
        sets = pinned_sets(units, tuple(node.cpu_ids)) if knobs.pinned else [()] * n
        nice_l, sched_l, weight_l, cpu_max = [0] * n, ["other"] * n, [100] * n, ["max"] * n

    gpu_on = knobs.cross_layer and knobs.gpu_intent
    prio_l: Column
    conc: Column
    if gpu_on and np.count_nonzero(table.uses_gpu):
        lane_of, share, note = gpu_shares(table, plan, tuple(node.lanes), rank, units + extra > 0)
        indexes = {lane.name: tuple(lane.gpu_indexes) for lane in node.lanes}
        gidx = [indexes.get(name, ()) if name else () for name in lane_of]
        prio = np.where(deadline, 1, -1 if at_risk else 0)
        hint = table.stream_hint
        prio = _clip(np.where(deadline, prio, np.minimum(prio, hint)), -1, 1)
        has_lane = np.fromiter(map(bool, lane_of), bool, n)
        asked = table.concurrency
        default = _clip(units + extra, 1, DEFAULT_GPU_CONCURRENCY_CAP)
        conc = np.where(has_lane, np.where(asked > 0, asked, default), 0)
        prio_l = np.where(has_lane, prio, 0)
        share_l = share
        if any(note):
            why = [w + x if x else w for w, x in zip(why, note, strict=True)]
    else:
        lane_of, gidx, share_l = [""] * n, [()] * n, np.zeros(n)
        prio_l, conc = [0] * n, [0] * n

    held = np.where(shared_work, 0, units)  # what Decision.units records (light work: none)
    same = table.has_prev & (table.prev_units == held)
    since = np.where(same, table.prev_since, state.tick)
    same_level = table.has_prev & (table.prev_level == plan.level)
    level_since = np.where(same_level, table.prev_level_since, state.tick)
    level_names = _LEVEL_NAMES[plan.level].tolist()
    decisions = reuse_or_build(
        n,
        memo,
        plan.level,
        intent_id=table.ids,
        units=held,
        degradation=level_names,
        predicted_p99_ms=plan.predicted_p99_ms,
        slack_ms=plan.slack_ms,
        deadline_risk=plan.risk,
        nmu=plan.nmu,
        state=_STATE_NAMES[np.where(extra > 0, ADMITTED, plan.state)].tolist(),
        reason=why,
        preempted_units=plan.preempted_units,
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
        workers=units + extra,
        level_backoff=level_backoff,
        level_raised=level_raised,
    )
    degraded = int(np.count_nonzero((plan.level > 0) & running))
    return PlanResult(
        policy=policy,
        decisions=decisions,
        gpu_intent_enabled=gpu_on,
        contention=cpu_pressure(node),
        preemptions=plan.preemptions,
        degradations=degraded,
    )
