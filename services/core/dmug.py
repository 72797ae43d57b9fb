"""D-MUG (Deadline-aware Marginal-Utility Greedy): one tick's unit allocation, ``plan_units``.

Phase 0 keeps incumbents' floors (light deadline work and idle-time batch hold no units);
phase 1 (deadline.py) gives deadline work, least slack first, the fewest units that meet its
deadline (URGENT preempts, ONLINE degrades); phase 2 admits batch at its minimum; phase 3
(marginal.py) hands out what is left by marginal utility. ``assess`` judges any allocation,
D-MUG's or a reference policy's, by the same formulas. docs/algorithm.md derives each step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from services.core.columns import rank_by_weight_and_seq
from services.core.deadline import (
    deadline_first_fit,
    hold_levels,
    light_work,
    offered_load,
    walk_ladder,
)
from services.core.formulas import slack_ms
from services.core.marginal import MarginalPhase, gains_at, marginal_phase_fast
from services.core.memo import TickMemo
from services.core.model import DmugConfig, NodeState, PlanInput
from services.core.outcome import (
    ADMITTED,
    BATCH_ADMITTED,
    DEGRADED,
    FIXED,
    HELD_DEGRADED,
    IDLE_TIME,
    MET,
    MET_DEGRADED,
    NOT_ADMITTED,
    PREEMPTED,
    SHARED,
    SHORT,
    THROTTLED,
    UNREACHABLE,
    UnitPlan,
)
from services.core.table import IntentTable, build_table

_AT_AND_ABOVE = np.array([[0, 1]])  # column p + this: the columns p and p + 1


@dataclass(frozen=True)
class DmugOptions:
    """What a policy of the D-MUG family switches on (the ablations turn one thing off)."""

    use_predictor: bool = True
    elastic: bool = True  # False: every intent keeps the units of its first allocation
    degrade: bool = True
    preempt: bool = True
    marginal_phase: bool = True  # False (edf-only): leftovers in deadline order, no NMU ranking
    order: str = "least-slack"  # or "edf"
    hysteresis: bool = True
    idle_batch: bool = True  # preemptible elastic batch runs in idle time, holding no units


def tie_rank(table: IntentTable) -> np.ndarray:
    """Deterministic rank per row (lower wins ties): higher priority weight, then earlier seq.
    Computed once per table (the tick and its cross-layer step both ask; build_table brings it
    from the memo while the specs are the same), read-only."""
    if table.rank is None:
        table.rank = rank_by_weight_and_seq(table.weight, table.seq)
    return table.rank


def floors(table: IntentTable, options: DmugOptions, capacity: int, skip: np.ndarray) -> np.ndarray:
    """Phase 0: what incumbents keep before anything is handed out.

    Elastic incumbents keep their minimum, non-elastic ones their previous units; if the node
    shrank below the sum, the lowest-ranked floors go (preemptible first). Rows in skip (light
    work) keep no floor.
    """
    incumbent = (table.prev_units > 0) & ~skip
    fixed = ~table.elastic | (not options.elastic)
    held = np.minimum(
        np.maximum(table.prev_units, table.min_units), np.maximum(table.cap, table.min_units)
    )
    floor = np.where(fixed, held, table.min_units)
    floor = np.where(incumbent, np.maximum(floor, 0), 0).astype(np.int64)
    if floor.sum() > capacity:
        order = np.lexsort((table.seq, -table.weight, table.preemptible))
        keep = np.cumsum(floor[order]) <= capacity
        dropped = order[~keep]
        floor[dropped] = 0
    return floor


def idle_time_batch(table: IntentTable, options: DmugOptions, node: NodeState) -> np.ndarray:
    """Batch that runs in idle time instead of holding units: preemptible, elastic, and a node
    whose CPUs the cross-layer step can name (SCHED_IDLE workers need a place to run)."""
    if not (options.idle_batch and options.elastic and node.cpu_ids):
        return np.zeros(table.n, dtype=bool)
    idle: np.ndarray = ~table.has_deadline & table.preemptible & table.elastic
    return idle


def plan_units(
    state: PlanInput, options: DmugOptions | None = None, memo: TickMemo | None = None
) -> tuple[IntentTable, UnitPlan]:
    """One tick of D-MUG unit allocation (phases 0-3, see the module docstring); `memo` keeps
    the intents' columns between one policy's ticks (services/core/memo.py)."""
    options = options or DmugOptions()
    table = build_table(state, options.use_predictor, memo)
    n = table.n
    capacity = max(int(state.node.cpu_units), 0)
    load = offered_load(table)
    light = light_work(table, state.config, load)
    reserve = min(int(np.floor(load[light].sum() + 0.5)), capacity)
    idle_rows = idle_time_batch(table, options, state.node)
    units = floors(table, options, capacity - reserve, light | idle_rows)
    free = capacity - reserve - int(units.sum())
    level = np.zeros(n, dtype=np.int64)
    outcome = np.full(n, BATCH_ADMITTED, dtype=np.int64)
    need = np.zeros(n, dtype=np.int64)
    preempted = np.zeros(n, dtype=np.int64)
    preempted_by = np.full(n, -1, dtype=np.int64)
    free_at_ask = np.zeros(n, dtype=np.int64)
    fixed = (~table.elastic | (not options.elastic)) & (table.prev_units > 0) & (units > 0)
    cap = np.where(fixed, units, table.cap)
    table.cap = cap  # the phases below see fixed intents as capped at what they hold

    # Phase 1: deadline phase
    dl = (table.has_deadline & ~fixed & ~light).nonzero()[0]
    if dl.size:
        p_need, meets, lvl = walk_ladder(table, dl, options.degrade)
        p_need = np.where(meets, p_need, table.min_units[dl])
        code = np.where(meets, np.where(lvl > 0, MET_DEGRADED, MET), UNREACHABLE)
        if options.degrade and options.hysteresis:
            hold_levels(table, dl, lvl, p_need, meets, code, state.tick, state.config)
        level[dl] = lvl
        need[dl] = p_need
        outcome[dl] = code
        slack_best = np.asarray(slack_ms(table.deadline[dl], table.latency(dl, cap[dl], lvl)))
        keys: tuple[np.ndarray, ...]
        if options.order == "edf":
            keys = (table.seq[dl], -table.weight[dl], table.deadline[dl])
        else:
            keys = (table.seq[dl], -table.weight[dl], table.deadline[dl], slack_best)
        order = dl[np.lexsort(keys)]
        extra = np.maximum(need - units, 0)
        if int(extra[order].sum()) <= free:
            units[order] += extra[order]
            free -= int(extra[order].sum())
        else:
            free = deadline_first_fit(
                table, options.preempt, order, units, need, free, outcome, preempted, preempted_by,
                free_at_ask,
            )  # fmt: skip
    else:
        order = dl

    # Phase 2: admission of everything else at its minimum
    rank = tie_rank(table)
    rest = (~table.has_deadline & (units == 0) & (preempted == 0) & ~idle_rows).nonzero()[0]
    if rest.size:
        rest = rest[np.argsort(rank[rest], kind="stable")]
        ask = table.min_units[rest]
        if int(ask.sum()) <= free:
            units[rest] = ask
            free -= int(ask.sum())
        else:
            ask_l, units_l = ask.tolist(), rest.tolist()
            for i, a in zip(units_l, ask_l, strict=True):
                if a <= free:
                    units[i] = a
                    free -= a
                else:
                    outcome[i] = NOT_ADMITTED
                    free_at_ask[i] = free
    outcome[fixed] = FIXED
    outcome[idle_rows] = IDLE_TIME

    # Phase 2b: deadline work still at risk (unreachable, or short when it asked) takes free
    # units up to its cap, in deadline order, before batch competes for them by NMU
    if free > 0 and dl.size:
        at_risk = (units[order] > 0) & ((outcome[order] == UNREACHABLE) | (outcome[order] == SHORT))
        for i in order[at_risk].tolist():
            give = min(int(cap[i] - units[i]), free)
            if give > 0:
                units[i] += give
                free -= give
                if free <= 0:
                    break

    # Phase 3: leftover units
    running = ((units > 0) & (preempted == 0) & (units < cap)).nonzero()[0]
    if free > 0 and running.size:
        if options.marginal_phase:
            phase = MarginalPhase(
                rows=running,
                start=units[running],
                level=level[running],
                rank=rank,
                budget=free,
                hysteresis=options.hysteresis,
                tick=state.tick,
                config=state.config,
                # the deadline phase already knows who is late: those it could not serve
                late=(outcome[running] == UNREACHABLE) | (outcome[running] == SHORT),
            )
            units[running] += marginal_phase_fast(table, phase)
        else:
            free = _leftovers_in_order(table, order, rank, running, units, cap, free)

    if np.count_nonzero(light):  # the light work's workers, on shared cores (no units held)
        units[light] = table.min_units[light]
        need[light] = table.min_units[light]
        outcome[light] = SHARED
    return table, assess(
        table,
        units,
        level,
        outcome,
        state.config,
        need=need,
        preempted_units=preempted,
        preempted_by=preempted_by,
        order=order,
        free_at_ask=free_at_ask,
        shared=light,
        shared_reserve=reserve,
    )


def assess(
    table: IntentTable,
    units: np.ndarray,
    level: np.ndarray,
    outcome: np.ndarray,
    config: DmugConfig,
    *,
    need: np.ndarray | None = None,
    preempted_units: np.ndarray | None = None,
    preempted_by: np.ndarray | None = None,
    order: np.ndarray | None = None,
    free_at_ask: np.ndarray | None = None,
    shared: np.ndarray | None = None,
    shared_reserve: int = 0,
) -> UnitPlan:
    """Predicted p99, slack, risk, next-unit NMU and state for a given allocation.

    Every policy, D-MUG or reference, is judged by these same formulas.
    """
    n = table.n
    zeros = np.zeros(n, dtype=np.int64)
    preempted = zeros if preempted_units is None else preempted_units
    # every row at its units and at one unit more, in one evaluation: L(p), risk(p), next NMU
    everyone_rows = table.take(column=True)
    p = units[:, None]
    p_ext = p + _AT_AND_ABOVE
    lat_ext = everyone_rows.latency(p_ext, table.level_factor[level][:, None])
    risk_ext = everyone_rows.risk_at(lat_ext)
    lat = lat_ext[:, 0]
    p99 = np.where(units > 0, lat, 0.0)
    slack = np.where(units > 0, table.deadline - p99, -table.deadline)
    slack = np.where(table.has_deadline, slack, 0.0)
    risk = np.where(units > 0, risk_ext[:, 0], 1.0)
    risk = np.where(table.has_deadline, risk, 0.0)
    st = np.full(n, ADMITTED, dtype=np.int64)
    st[((outcome == MET_DEGRADED) | (outcome == HELD_DEGRADED)) & (units > 0)] = DEGRADED
    late = table.has_deadline & (risk > config.risk_threshold)
    st[late | (units == 0)] = THROTTLED
    st[preempted > 0] = PREEMPTED
    more = (units > 0) & (units < table.cap)
    nxt = np.where(more, gains_at(everyone_rows, p, p_ext, risk_ext)[:, 0], 0.0)
    return UnitPlan(
        units=units,
        level=level,
        state=st,
        outcome=outcome,
        need=zeros if need is None else need,
        preempted_units=preempted,
        preempted_by=np.full(n, -1, np.int64) if preempted_by is None else preempted_by,
        order=table.has_deadline.nonzero()[0] if order is None else order,
        free_at_ask=zeros if free_at_ask is None else free_at_ask,
        predicted_p99_ms=p99,
        slack_ms=slack,
        risk=risk,
        nmu=nxt,
        preemptions=int(np.count_nonzero(preempted > 0)),
        shared=np.zeros(n, dtype=bool) if shared is None else shared,
        shared_reserve=shared_reserve,
    )


def _leftovers_in_order(
    table: IntentTable,
    order: np.ndarray,
    rank: np.ndarray,
    running: np.ndarray,
    units: np.ndarray,
    cap: np.ndarray,
    free: int,
) -> int:
    """edf-only: leftover units go in deadline order, then batch by rank, each up to its cap."""
    in_order = set(order.tolist())
    batch = sorted(
        (int(i) for i in running.tolist() if int(i) not in in_order), key=lambda i: rank[i]
    )
    for i in [int(i) for i in order.tolist() if units[int(i)] > 0] + batch:
        give = min(int(cap[i] - units[i]), free)
        if give > 0:
            units[i] += give
            free -= give
        if free == 0:
            break
    return free
