"""D-MUG's marginal-utility phase: leftover units to the largest next-unit utility (NMU).

``marginal_gains`` evaluates the NMU of each row's next units (risk reduction for deadline
work, normalised throughput for batch); ``MarginalPhase`` shapes the rows (ironing, running
minimum, hysteresis) and ``marginal_phase_fast`` hands the budget out by water-filling
(waterfill.py), equal to the heap greedy over whole rows (tests/core/dmug_reference.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from services.core.formulas import amdahl_speedup, batch_gain
from services.core.model import DmugConfig
from services.core.table import IntentTable, Rows
from services.core.waterfill import iron_rows, select_increments

IRON_WIDTH = 32  # increments of an S-shaped row that are ironed (the rest keep a running min)
WHOLE_ROWS_CELLS = 1 << 18  # rows x increments evaluated in one block at most
DWELL_BONUS = 1e6  # marginal utility added to units held during the dwell window


def marginal_gains(
    table: IntentTable, rows: np.ndarray, start: np.ndarray, level: np.ndarray, kk: np.ndarray
) -> np.ndarray:
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
        speed = np.asarray(amdahl_speedup(r.f, np.maximum(p_ext, 1)))
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


def with_hysteresis(
    table: IntentTable,
    rows: np.ndarray,
    start: np.ndarray,
    kk: np.ndarray,
    gains: np.ndarray,
    tick: int,
    config: DmugConfig,
) -> np.ndarray:
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

    A row's increments pass three steps (the reference over whole rows takes the same ones): rows still
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
        room: np.ndarray = np.maximum(table.cap[self.rows] - self.start, 0)
        return room

    def shaped(self, table: IntentTable, sel: np.ndarray) -> np.ndarray:
        """Rows whose risk curve is still S-shaped: deadline work late at its current units."""
        rows = self.rows[sel]
        if self.late is not None:
            late: np.ndarray = self.late[sel]
        else:
            late = table.latency(rows, self.start[sel], self.level[sel]) > table.deadline[rows]
        shaped: np.ndarray = table.has_deadline[rows] & late
        return shaped

    def finish(
        self,
        table: IntentTable,
        sel: np.ndarray,
        kk: np.ndarray,
        g: np.ndarray,
        carry: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
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

    def block(
        self, table: IntentTable, sel: np.ndarray, kk: np.ndarray, carry: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Gains of rows sel at offsets kk (len(sel), width) continuing a running minimum `carry`."""
        g = marginal_gains(table, self.rows[sel], self.start[sel], self.level[sel], kk)
        return self.finish(table, sel, kk, g, carry)


def marginal_phase_fast(table: IntentTable, phase: MarginalPhase) -> np.ndarray:
    """Extra units per row by water-filling, equal to the heap greedy over whole rows.

    Rows are evaluated in blocks of increments and widened only where a whole block was taken (a
    non-increasing row cannot hide a better increment further out), so the work follows the units
    handed out, not the node's capacity. S-shaped rows are ironed over their first IRON_WIDTH
    increments.
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
