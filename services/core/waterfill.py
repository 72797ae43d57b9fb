"""Greedy hand-out of increments with concave utilities, by water-filling.

D-MUG's marginal-utility phase and the GPU share split both give out a budget of units, one at a
time, to whoever gains most from the next one. With non-increasing gains per row that greedy is
the water-filling rule "take every increment whose gain is above a threshold lambda" (Gross 1956;
Federgruen & Groenevelt 1986), which numpy evaluates in one partition instead of a Python heap
loop (the heap itself, the specification, is in tests/core/dmug_reference.py). S-shaped rows
are first ironed to the slopes of their least concave majorant so the rule applies.
"""

from __future__ import annotations

import numpy as np

__all__ = ["iron_rows", "select_increments"]


def select_increments(
    gains: np.ndarray, rank: np.ndarray, k: np.ndarray, budget: int
) -> np.ndarray:
    """Water-filling: pick the `budget` best increments by (gain desc, rank asc, k asc).

    With non-increasing gains per row this equals popping a heap keyed the same way (the greedy),
    because every row's picks form a prefix. The threshold lambda is the budget-th largest gain;
    everything above it is taken, ties at lambda in (rank, k) order. Only positive gains count.
    Returns a boolean mask over the candidates.
    """
    chosen = np.zeros(gains.shape, dtype=bool)
    positive = gains > 0
    if budget <= 0 or not positive.any():
        return chosen
    pos_idx = positive.nonzero()[0]
    if pos_idx.size <= budget:
        chosen[pos_idx] = True
        return chosen
    g = gains[pos_idx]
    lam = -np.partition(-g, budget - 1)[budget - 1]
    above = pos_idx[g > lam]
    chosen[above] = True
    ties = pos_idx[g == lam]
    need = budget - above.size
    if need > 0:
        order = np.lexsort((k[ties], rank[ties]))
        chosen[ties[order[:need]]] = True
    return chosen


def iron_rows(gains: np.ndarray) -> np.ndarray:
    """Slopes of the least concave majorant of each row's cumulative utility.

    Equivalently the decreasing isotonic regression of the gains:
    g'_k = min_{i<=k} max_{j>=k} mean(g_i..g_j). -inf entries (past the cap) stay -inf.
    Vectorised over rows; O(K^2) per row, so callers pass at most IRON_WIDTH columns.
    """
    r, width = gains.shape
    finite = np.isfinite(gains)
    cum = np.zeros((r, width + 1))
    cum[:, 1:] = np.cumsum(np.where(finite, gains, 0.0), axis=1)
    idx = np.arange(width)
    length = (idx[None, :] - idx[:, None] + 1).astype(np.float64)
    mean = (cum[:, None, 1:] - cum[:, :width, None]) / np.where(length > 0, length, 1.0)
    valid = (idx[None, :] >= idx[:, None])[None, :, :] & finite[:, None, :]
    mean = np.where(valid, mean, -np.inf)
    best_after = np.maximum.accumulate(mean[:, :, ::-1], axis=2)[:, :, ::-1]
    best_after = np.where((idx[:, None] <= idx[None, :])[None, :, :], best_after, np.inf)
    return np.where(finite, best_after.min(axis=1), -np.inf)
