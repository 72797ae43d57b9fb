"""D-MUG (Deadline-aware Marginal-Utility Greedy): the unit allocation at the heart of every tick.

The node loop, the extender's node scoring, what-if previews and the experiments all call this one
pure core: plain data in (PlanInput), numpy arrays out (UnitPlan), no I/O, no clock, no globals.
The formulas (services/core/formulas.py) are written once and used by every phase, by
the reference policies (``assess``) and by placement scoring. docs/algorithm.md derives each formula and maps it to its code.

Phases of one tick (``plan_units``):
0. incumbents keep a floor (elastic: their minimum; non-elastic: their previous units);
   light deadline work (offered load <= config.light_load_cores, deadline met at its minimum)
   holds no units: its workers share the cores, and the node reserves its summed load, rounded;
   preemptible elastic batch holds no units either where the OS knobs can run it in idle time
   (DmugOptions.idle_batch and a node with CPU ids): the cross-layer step gives it SCHED_IDLE
   workers on the cycles deadline work leaves, so every unit can go to deadline work;
1. deadline phase: least-slack-first, the fewest units whose predicted p99 meets the deadline;
   URGENT preempts preemptible intents; ONLINE walks its degradation ladder when even its maximum
   misses; what still misses is at risk;
2. admission of the remaining (batch) intents at their minimum;
3. marginal-utility phase: leftover units to the largest NMU by water-filling
   (services/core/waterfill.py), equal to the heap greedy increment for increment.

A tick of 100 intents is a few hundred numpy calls on short columns, so their fixed cost counts:
tests on masks are ``np.count_nonzero`` (a fifth of ``.any()``'s per-call cost), and work that
the specs alone decide is kept between ticks (services/core/memo.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# the formulas are re-exported: dmug.<formula> is how callers name them
from services.core.formulas import (  # noqa: F401
    DEFAULT_REL_SPREAD,
    LATENCY_CEILING_MS,
    MAX_UTILISATION,
    MIN_REL_SPREAD,
    amdahl_speedup,
    batch_gain,
    combined_cpu_pressure,
    cpu_pressure,
    deadline_risk,
    latency_inflation,
    predicted_latency_ms,
    pressure_inflation,
    priority_weight,
    service_at_one_unit,
    slack_ms,
)
from services.core.memo import TickMemo
from services.core.model import (
    DmugConfig,
    PlanInput,
)
from services.core.table import (  # noqa: F401
    BATCH,
    LEVEL_INDEX,
    ONLINE,
    ROBOT,
    URGENT,
    Z_CLASS,
    IntentTable,
    Rows,
    build_table,
    rank_by_weight_and_seq,
)
from services.core.waterfill import iron_rows, select_increments, select_increments_heap

IRON_WIDTH = 32  # increments of an S-shaped row that are ironed (the rest keep a running min)
WHOLE_ROWS_CELLS = 1 << 18  # marginal phase: rows x increments evaluated in one block at most
DWELL_BONUS = 1e6  # marginal utility added to units held during the dwell window
_AT_AND_BELOW = np.array([[0], [1]])  # p - this: the rows p and p - 1
_AT_AND_ABOVE = np.array([[0, 1]])  # column p + this: the columns p and p + 1

# UnitPlan.state codes (index into STATE_NAMES)
ADMITTED, THROTTLED, DEGRADED, PREEMPTED = 0, 1, 2, 3
STATE_NAMES = ("ADMITTED", "THROTTLED", "DEGRADED", "PREEMPTED")

# UnitPlan.outcome codes: why the intent has its units (drives the human-readable reason)
MET, MET_DEGRADED, UNREACHABLE, SHORT, BATCH_ADMITTED, NOT_ADMITTED, WAS_PREEMPTED, FIXED = range(8)
HELD_DEGRADED = 8  # NORMAL (or a lighter level) would meet, but the degraded level is held
SHARED = 9  # light deadline work: its workers run on shared cores, charged by offered load
IDLE_TIME = 10  # preemptible elastic batch: no units, idle-time workers under SCHED_IDLE
LEVEL_MARGIN = 0.1  # a lighter level must meet (1 - margin) x deadline before it is taken back


# ----------------------------------------------------------------------------------------------
# Per-tick arrays


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


def units_to_meet(
    table: IntentTable, idx: np.ndarray, level: int | np.ndarray, scale: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """Fewest units in [min, cap] with L(p) <= D at `level` (one for all rows, or one per row),
    and whether that meets D at all (D = scale x deadline; scale < 1 asks for a margin).

    Closed form from L = a / (S - b) (a = T1*m, b = lambda*M1*m/1000): S(p) >= b + a/D, inverted
    through Amdahl, then checked and nudged with the latency formula itself so that the answer
    is exactly what ``predicted_latency_ms`` says.
    """
    r = table.take(idx)
    if scale != 1.0:
        r.deadline = r.deadline * scale
    lf = table.level_factor[level]
    factor = r.inflation * lf
    a = r.tail1 * factor
    b = r.arrival * r.mean1 * factor / 1000.0
    d = np.maximum(r.deadline, 1e-9)
    f = r.f
    s_req = np.maximum(b / MAX_UTILISATION, b + a / d)
    denom = 1.0 / s_req - (1.0 - f)
    with np.errstate(divide="ignore", invalid="ignore"):
        p_real = np.where(denom > 0, f / np.where(denom > 0, denom, 1.0), np.inf)
    lo, hi = table.min_units[idx], r.cap
    p = np.minimum(np.maximum(np.ceil(np.minimum(p_real, 1e12)), lo), np.maximum(hi, lo))
    p = np.where(f <= 0.0, lo, p)  # no parallel part: every p has the latency of the minimum
    p = p.astype(np.int64)
    lat, below = r.latency(p - _AT_AND_BELOW, lf)  # L(p) and L(p - 1), in one evaluation
    for _ in range(2):
        late = (lat > r.deadline) & (p < hi)
        if not np.count_nonzero(late):
            break
        p = p + late
        lat, below = r.latency(p - _AT_AND_BELOW, lf)
    early = (p > lo) & (below <= r.deadline)
    p = p - early
    meets = (early | (lat <= r.deadline)) & (p <= hi)
    return p, meets


# ----------------------------------------------------------------------------------------------
# The marginal-utility phase (selection itself: services/core/waterfill.py)


def marginal_gains(table: IntentTable, rows: np.ndarray, start: np.ndarray, level: np.ndarray, kk):
    """NMU of unit start+k+1 for each row and offset k in kk ((len(rows), width), or (1, width)
    / (width,) for the same offsets in every row; consecutive offsets per row).

    Deadline work: w * (risk(p) - risk(p+1)), priority-weighted risk reduction; batch:
    w * (S(p+1) - S(p)) / S(cap), weighted normalised throughput. Past the cap: -inf.
    """
    r = table.take(rows, column=True)
    p = start[:, None] + kk
    p_ext = np.concatenate((p, p[:, -1:] + 1), axis=1)  # p .. p_last + 1
    risk = None
    if np.count_nonzero(r.has_deadline):
        risk = r.risk(p_ext, table.level_factor[level][:, None])
    return gains_at(r, p, p_ext, risk)


def gains_at(r: Rows, p: np.ndarray, p_ext: np.ndarray, risk: np.ndarray | None) -> np.ndarray:
    """``marginal_gains`` for gathered rows r (column form) at units p, given p_ext = p and one
    unit more per row, and the risk at p_ext (None: no row has a deadline)."""
    dl = r.has_deadline
    deadline_gain = throughput = None
    if risk is not None:
        deadline_gain = r.weight * (risk[:, :-1] - risk[:, 1:])
    if np.count_nonzero(dl) < dl.size:
        speed = amdahl_speedup(r.f, np.maximum(p_ext, 1))
        cap = np.maximum(r.cap, 1)
        throughput = batch_gain(r.weight, speed[:, :-1], speed[:, 1:], amdahl_speedup(r.f, cap))
    if deadline_gain is None:
        assert throughput is not None
        gains = throughput
    elif throughput is None:
        gains = deadline_gain
    else:
        gains = np.where(dl, deadline_gain, throughput)
    return np.where(p < r.cap, gains, -np.inf)


def with_hysteresis(table, rows, start, kk, gains, tick: int, config: DmugConfig):
    """Units an incumbent already holds are worth (1 + min_gain) more, and during the dwell window
    (fewer than dwell ticks since its units last changed) they come first. Both boost a prefix of
    each row, so non-increasing rows stay non-increasing."""
    held = (start[:, None] + kk) < table.prev_units[rows][:, None]
    boosted = np.where(held & (gains > 0), gains * (1.0 + config.hysteresis_min_gain), gains)
    dwell = (tick - table.prev_since[rows]) < config.hysteresis_dwell_ticks
    return np.where(held & dwell[:, None] & (boosted > 0), boosted + DWELL_BONUS, boosted)


@dataclass(frozen=True)
class MarginalPhase:
    """The marginal-utility phase's inputs: which rows compete, from where, for how many units.

    A row's increments pass three steps, identical in the fast and the reference path: rows still
    short of their deadline (S-shaped risk) are ironed to their concave majorant; every row is
    made non-increasing by a running minimum (guards against rounding in S(p+1) - S(p)); then
    hysteresis boosts the units the incumbent already holds.
    """

    rows: np.ndarray  # indexes into the IntentTable
    start: np.ndarray  # units already held
    level: np.ndarray  # degradation level each row runs at
    rank: np.ndarray  # deterministic tie-break (lower first), per table row
    budget: int
    hysteresis: bool = True
    tick: int = 0
    config: DmugConfig = field(default_factory=DmugConfig)
    late: np.ndarray | None = None  # per row: short of its deadline (None: from the latency)

    def room(self, table: IntentTable) -> np.ndarray:
        return np.maximum(table.cap[self.rows] - self.start, 0)

    def shaped(self, table: IntentTable, sel: np.ndarray) -> np.ndarray:
        """Rows whose risk curve is still S-shaped: deadline work late at its current units."""
        rows = self.rows[sel]
        if self.late is not None:
            return table.has_deadline[rows] & self.late[sel]
        late = table.latency(rows, self.start[sel], self.level[sel]) > table.deadline[rows]
        return table.has_deadline[rows] & late

    def finish(self, table, sel, kk, g, carry: np.ndarray | None):
        """Running minimum (continuing `carry` from an earlier block; None: the first block),
        then hysteresis; returns the gains and each row's last running-minimum value."""
        g = np.minimum.accumulate(g, axis=1)
        if carry is not None:
            g = np.minimum(g, carry[:, None])
        last = g[:, -1].copy()
        if self.hysteresis and np.count_nonzero(table.prev_units[self.rows[sel]]):
            g = with_hysteresis(
                table, self.rows[sel], self.start[sel], kk, g, self.tick, self.config
            )
        return g, last

    def block(self, table: IntentTable, sel: np.ndarray, kk: np.ndarray, carry: np.ndarray):
        """Gains of rows sel at offsets kk (len(sel), width) continuing a running minimum `carry`."""
        g = marginal_gains(table, self.rows[sel], self.start[sel], self.level[sel], kk)
        return self.finish(table, sel, kk, g, carry)

    def full_row(self, table: IntentTable, j: int) -> np.ndarray:
        """Row j's whole gain sequence up to its cap."""
        width = int(table.cap[self.rows[j]] - self.start[j])
        if width <= 0:
            return np.zeros(0)
        sel = np.array([j])
        kk = np.arange(width)[None, :]
        g = marginal_gains(table, self.rows[sel], self.start[sel], self.level[sel], kk)
        if self.shaped(table, sel)[0]:
            w = min(width, IRON_WIDTH)
            g[:, :w] = iron_rows(g[:, :w])
        return self.finish(table, sel, kk, g, None)[0][0]


def marginal_phase_reference(table: IntentTable, phase: MarginalPhase) -> np.ndarray:
    """The heap greedy over every full row: the specification the fast path is tested against."""
    rows = [phase.full_row(table, j).tolist() for j in range(len(phase.rows))]
    rank = phase.rank[phase.rows].tolist()
    return np.array(select_increments_heap(rows, rank, phase.budget), dtype=np.int64)


def marginal_phase_fast(table: IntentTable, phase: MarginalPhase) -> np.ndarray:
    """Extra units per row by water-filling, equal to ``marginal_phase_reference``.

    Rows are evaluated in blocks of increments and widened only where a whole block was taken (a
    non-increasing row cannot hide a better increment further out), so the work follows the units
    handed out, not the node's capacity. S-shaped rows are ironed over their first IRON_WIDTH
    increments, as in the reference.
    """
    n = len(phase.rows)
    room = phase.room(table)
    live = (room > 0).nonzero()[0]
    if phase.budget <= 0 or live.size == 0:
        return np.zeros(n, dtype=np.int64)
    shaped = phase.shaped(table, live)
    widest = int(room[live].max())
    if widest * live.size <= WHOLE_ROWS_CELLS:
        width = widest  # small enough to take every row whole: no widening rounds
    else:
        width = min(widest, max(4, 2 * phase.budget // live.size + 2))
    widths = np.zeros(n, dtype=np.int64)
    carry = np.full(n, np.inf)
    blocks_g: list[np.ndarray] = []
    blocks_r: list[np.ndarray] = []
    blocks_k: list[np.ndarray] = []
    # S-shaped rows need their first IRON_WIDTH increments in one block
    if np.count_nonzero(shaped):
        width = max(width, int(min(room[live[shaped]].max(), IRON_WIDTH)))
    kk = np.arange(width)[None, :]  # the same offsets for every row (broadcast)
    g = marginal_gains(table, phase.rows[live], phase.start[live], phase.level[live], kk)
    if np.count_nonzero(shaped):
        iw = min(width, IRON_WIDTH)
        g[shaped, :iw] = iron_rows(g[shaped, :iw])
    g, carry[live] = phase.finish(table, live, kk, g, None)
    blocks_g.append(g.ravel())
    blocks_r.append(np.repeat(live, width))
    blocks_k.append(np.arange(live.size * width) % width)
    widths[live] = width
    while True:
        if len(blocks_g) == 1:
            gains, cand_rows, cand_k = blocks_g[0], blocks_r[0], blocks_k[0]
        else:
            gains = np.concatenate(blocks_g)
            cand_rows = np.concatenate(blocks_r)
            cand_k = np.concatenate(blocks_k)
        chosen = select_increments(gains, phase.rank[phase.rows[cand_rows]], cand_k, phase.budget)
        taken = np.bincount(cand_rows[chosen], minlength=n).astype(np.int64)
        sat = live[(taken[live] == widths[live]) & (widths[live] < room[live])]
        if sat.size == 0:
            return taken
        more = int(min(widths[sat].max(), room[sat].max()))
        kk = widths[sat][:, None] + np.arange(more)[None, :]
        g, carry[sat] = phase.block(table, sat, kk, carry[sat])
        blocks_g.append(g.ravel())
        blocks_r.append(np.repeat(sat, more))
        blocks_k.append(kk.ravel())
        widths[sat] += more


# ----------------------------------------------------------------------------------------------
# The tick


@dataclass
class UnitPlan:
    """Per-intent outcome of the unit allocation, as columns aligned with IntentTable."""

    units: np.ndarray
    level: np.ndarray  # index into DEGRADATION_ORDER
    state: np.ndarray  # index into STATE_NAMES
    outcome: np.ndarray  # MET, MET_DEGRADED, ... (why; drives the reason text)
    need: np.ndarray  # units the deadline phase asked for (0 for batch)
    preempted_units: np.ndarray
    preempted_by: np.ndarray  # table index of the urgent intent that took the units, -1 if none
    order: np.ndarray  # deadline-phase order (least slack first), table indexes
    free_at_ask: np.ndarray  # free units when the intent asked and did not get them
    predicted_p99_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    slack_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    risk: np.ndarray = field(default_factory=lambda: np.zeros(0))
    nmu: np.ndarray = field(default_factory=lambda: np.zeros(0))
    preemptions: int = 0
    shared: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))  # light work
    shared_reserve: int = 0  # units set aside for the light work's summed offered load


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


def offered_load(table: IntentTable) -> np.ndarray:
    """Cores' worth of work each intent brings: arrival rate x mean service at one unit."""
    return table.arrival * table.mean1 * table.inflation / 1000.0


def light_work(table: IntentTable, config: DmugConfig, load: np.ndarray) -> np.ndarray:
    """Deadline work too light to hold whole units: an offered load of at most
    config.light_load_cores (a rare urgent event, a heartbeat) and its deadline met at its
    minimum (load: offered_load(table)). A unit each would idle nearly all the time and
    starve the work that needs it."""
    candidate = table.has_deadline & (table.arrival > 0) & (load <= config.light_load_cores)
    if not np.count_nonzero(candidate):
        return candidate
    idx = candidate.nonzero()[0]
    meets = table.latency(idx, table.min_units[idx], 0) <= table.deadline[idx]
    candidate[idx[~meets]] = False
    return candidate


def idle_time_batch(table: IntentTable, options: DmugOptions, node) -> np.ndarray:
    """Batch that runs in idle time instead of holding units: preemptible, elastic, and a node
    whose CPUs the cross-layer step can name (SCHED_IDLE workers need a place to run)."""
    if not (options.idle_batch and options.elastic and node.cpu_ids):
        return np.zeros(table.n, dtype=bool)
    return ~table.has_deadline & table.preemptible & table.elastic


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
        p_need, meets, lvl = _walk_ladder(table, dl, options.degrade)
        p_need = np.where(meets, p_need, table.min_units[dl])
        code = np.where(meets, np.where(lvl > 0, MET_DEGRADED, MET), UNREACHABLE)
        if options.degrade and options.hysteresis:
            _hold_levels(table, dl, lvl, p_need, meets, code, state.tick, state.config)
        level[dl] = lvl
        need[dl] = p_need
        outcome[dl] = code
        slack_best = slack_ms(table.deadline[dl], table.latency(dl, cap[dl], lvl))
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
            free = _deadline_first_fit(
                table, options, order, units, need, free, outcome, preempted, preempted_by,
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


def _walk_ladder(table: IntentTable, dl: np.ndarray, degrade: bool):
    """Units each deadline row dl needs at NORMAL and, for ONLINE work that misses even at its
    cap, down its degradation ladder (FP16, then INT8) until a level meets; the deepest allowed
    level tried is kept when none does (best effort). Returns (need, meets, level) per row.

    Every level a row may walk to is evaluated in one units_to_meet call (NORMAL for every row,
    a deeper level for each ONLINE row whose ladder allows it), so a tick pays for one call
    instead of up to three; each row's answer is the one a call of its own would give.
    """
    at_level = [np.arange(dl.size)]  # positions into dl evaluated at level 0, 1, 2
    if degrade:
        online = table.cls[dl] == ONLINE
        at_level += [(online & table.ladder[dl, level_i]).nonzero()[0] for level_i in (1, 2)]
    pos = np.concatenate(at_level)
    levels = np.repeat(np.arange(len(at_level)), [a.size for a in at_level])
    p_all, m_all = units_to_meet(table, dl[pos], levels)
    p_need, meets = p_all[: dl.size], m_all[: dl.size]
    lvl = np.zeros(dl.size, dtype=np.int64)
    start = dl.size
    for level_i, rows in enumerate(at_level[1:], start=1):
        end = start + rows.size
        walk = ~meets[rows]  # rows that still miss: they try this level
        idx = rows[walk]
        if idx.size:
            p2, m2 = p_all[start:end][walk], m_all[start:end][walk]
            p_need[idx] = np.where(m2, p2, p_need[idx])
            lvl[idx] = level_i
            meets[idx] = m2
        start = end
    return p_need, meets, lvl


def _hold_levels(table, dl, lvl, p_need, meets, code, tick: int, config: DmugConfig) -> None:
    """Hysteresis on the degradation level (in place, over the deadline rows dl).

    A deeper level than last tick's is taken at once (the deadline is at risk). A lighter one is
    taken only one step at a time, after dwell ticks at the current level, and only when that
    step meets (1 - LEVEL_MARGIN) x deadline; otherwise the previous level is held. This keeps a
    level from flapping on every tick around the point where the lighter level just meets.
    """
    prev = table.prev_level[dl]
    allowed = table.ladder[dl]
    prev = np.where(allowed[np.arange(dl.size), prev], prev, 0)
    lighter = (meets & (prev > lvl) & (table.cls[dl] == ONLINE)).nonzero()[0]
    if lighter.size == 0:
        return
    dwelt = (tick - table.prev_level_since[dl[lighter]]) >= config.hysteresis_dwell_ticks
    # one step: the deepest allowed level below the previous one (at least the one that meets)
    step = lvl[lighter].copy()
    for candidate in (1, 0):
        ok = allowed[lighter, candidate] & (candidate < prev[lighter]) & (candidate > step)
        step = np.where(ok, candidate, step)
    hold = prev[lighter].copy()
    hold_need = p_need[lighter].copy()
    for level_i in (0, 1, 2):
        sel = (hold == level_i).nonzero()[0]
        if sel.size:
            hold_need[sel], _ = units_to_meet(table, dl[lighter[sel]], level_i)
    take = np.zeros(lighter.size, dtype=bool)
    take_need = hold_need.copy()
    for level_i in (0, 1):
        sel = (dwelt & (step == level_i)).nonzero()[0]
        if sel.size:
            p, m = units_to_meet(table, dl[lighter[sel]], level_i, 1.0 - LEVEL_MARGIN)
            take[sel] = m
            take_need[sel] = p
    lvl[lighter] = np.where(take, step, hold)
    p_need[lighter] = np.where(take, take_need, hold_need)
    code[lighter] = np.where(lvl[lighter] == 0, MET, np.where(take, MET_DEGRADED, HELD_DEGRADED))


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


def _deadline_first_fit(
    table, options, order, units, need, free, outcome, preempted, preempted_by, free_at_ask
) -> int:
    """The scarce deadline phase: in order, grant what fits; URGENT preempts; the rest is short.

    Victims are preemptible non-URGENT intents, batch first, then lowest weight, newest first;
    a victim loses all its units (below its minimum it could not run anyway).
    """
    victims_order = np.lexsort((-table.seq, table.weight, table.has_deadline))
    can_lose = table.preemptible & (table.cls != URGENT)
    victims = victims_order[can_lose[victims_order]].tolist()
    is_victim = can_lose.tolist()
    is_urgent = (table.cls == URGENT).tolist()
    u = units.tolist()
    want = need.tolist()
    lost = preempted.tolist()
    by = preempted_by.tolist()
    min_units = table.min_units.tolist()
    code = outcome.tolist()  # plain lists: this loop touches thousands of rows when scarce
    asked_at = free_at_ask.tolist()
    reclaimable = int(units[can_lose].sum())
    cursor = 0
    for i in order.tolist():
        if lost[i]:
            continue
        e = want[i] - u[i]
        if e <= 0:
            continue
        if e > free and options.preempt and is_urgent[i]:
            own = u[i] if is_victim[i] else 0
            if free + reclaimable - own >= e:
                # one pass from a cursor, a second from the start for victims that gained units
                # after the cursor passed them
                for begin in (cursor, 0):
                    k = begin
                    while free < e and k < len(victims):
                        v = victims[k]
                        k += 1
                        if v != i and u[v] > 0:
                            free += u[v]
                            reclaimable -= u[v]
                            lost[v] += u[v]
                            by[v] = i
                            u[v] = 0
                    if begin == cursor:
                        cursor = k
                    if free >= e:
                        break
        if e <= free:
            u[i] += e
            free -= e
            if is_victim[i]:
                reclaimable += e
            continue
        asked_at[i] = free
        if code[i] != UNREACHABLE:
            code[i] = SHORT
        if u[i] == 0 and min_units[i] <= free:
            u[i] = min_units[i]
            free -= u[i]
            if is_victim[i]:
                reclaimable += u[i]
    units[:] = u
    preempted[:] = lost
    preempted_by[:] = by
    outcome[:] = code
    free_at_ask[:] = asked_at
    return free


def _leftovers_in_order(table, order, rank, running, units, cap, free) -> int:
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
