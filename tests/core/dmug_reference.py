"""Reference implementations D-MUG's fast marginal phase is tested and benchmarked against.

The heap greedy pops the best next increment of any row, one at a time, over every row's whole
gain sequence: the specification that water-filling (services/core/waterfill.py) over blocks
of increments (services/core/marginal.py) must equal, increment for increment.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from services.core.marginal import IRON_WIDTH, MarginalPhase, marginal_gains
from services.core.table import IntentTable
from services.core.waterfill import iron_rows


def select_increments_heap(
    rows: Sequence[Sequence[float]], rank: Sequence[int], budget: int
) -> list[int]:
    """Reference greedy (O(U log N)): pop the best next increment of any row, `budget` times."""
    heap = [(-row[0], rank[r], 0, r) for r, row in enumerate(rows) if len(row) and row[0] > 0]
    heapq.heapify(heap)
    taken = [0] * len(rows)
    for _ in range(max(budget, 0)):
        if not heap:
            break
        _, rk, kk, r = heapq.heappop(heap)
        taken[r] += 1
        nxt = kk + 1
        if nxt < len(rows[r]) and rows[r][nxt] > 0:
            heapq.heappush(heap, (-rows[r][nxt], rk, nxt, r))
    return taken


def full_row(phase: MarginalPhase, table: IntentTable, j: int) -> np.ndarray:
    """Row j's whole gain sequence up to its cap."""
    width = int(table.cap[phase.rows[j]] - phase.start[j])
    if width <= 0:
        return np.zeros(0)
    sel = np.array([j])
    kk = np.arange(width)[None, :]
    g = marginal_gains(table, phase.rows[sel], phase.start[sel], phase.level[sel], kk)
    if phase.shaped(table, sel)[0]:
        w = min(width, IRON_WIDTH)
        g[:, :w] = iron_rows(g[:, :w])
    return phase.finish(table, sel, kk, g, None)[0][0]


def marginal_phase_reference(table: IntentTable, phase: MarginalPhase) -> np.ndarray:
    """The heap greedy over every full row: the specification the fast path is tested against."""
    rows = [full_row(phase, table, j).tolist() for j in range(len(phase.rows))]
    rank = phase.rank[phase.rows].tolist()
    return np.array(select_increments_heap(rows, rank, phase.budget), dtype=np.int64)
