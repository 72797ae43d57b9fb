"""Reference policies: what a node does without D-MUG, judged by the same predictions.

`baseline` is the Kubernetes default (static requests = preferred or min, admitted by priority
while they fit, equal CPU weights, no preemption, no degradation, no OS or GPU knobs); `fifo`
serves intents first-come (IntentSpec.seq), each up to its cap; `static` is static
partitioning: fixed preferred units, each intent pinned to cores of its own (the Kubernetes
static CPU manager with Guaranteed pods), never reacting to observed service times; `loadbalance-only` spreads the units evenly.
Their predicted p99, slack and risk come from assess, so experiments compare like with like.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from services.core.crosslayer import Knobs, decide
from services.core.dmug import assess, tie_rank
from services.core.memo import TickMemo
from services.core.model import PlanInput, PlanResult
from services.core.outcome import BATCH_ADMITTED, NOT_ADMITTED
from services.core.table import IntentTable, build_table

NO_KNOBS = Knobs(cross_layer=False, gpu_intent=False)
PINNED = Knobs(cross_layer=False, gpu_intent=False, pinned=True)


def _first_fit(
    ask: np.ndarray, order: np.ndarray, capacity: int, floor: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, int]:
    """Grant ask[i] in `order` while it fits; if it does not, grant `floor[i]` when that fits."""
    units = np.zeros(len(ask), dtype=np.int64)
    outcome = np.full(len(ask), BATCH_ADMITTED, dtype=np.int64)
    free = capacity
    for i in order.tolist():
        a = int(ask[i])
        if a > free and floor is not None and int(floor[i]) <= free:
            a = max(int(floor[i]), free)
        if a <= free:
            units[i] = a
            free -= a
        else:
            outcome[i] = NOT_ADMITTED
    return units, outcome, free


def _requests(table: IntentTable) -> np.ndarray:
    asked: np.ndarray = np.minimum(
        np.where(table.preferred > 0, table.preferred, table.min_units), table.cap
    )
    return asked


def baseline_units(table: IntentTable, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((np.arange(table.n), table.seq, -table.weight))
    units, outcome, _ = _first_fit(_requests(table), order, capacity)
    return units, outcome


def fifo_units(table: IntentTable, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((np.arange(table.n), table.seq))
    units, outcome, _ = _first_fit(table.cap, order, capacity, floor=table.min_units)
    return units, outcome


def static_units(table: IntentTable, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((np.arange(table.n), table.seq))
    units, outcome, _ = _first_fit(_requests(table), order, capacity)
    return units, outcome


def loadbalance_units(table: IntentTable, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Even spread: raise a common level t, each intent holding clip(t, min, cap), to the largest
    t that fits; the remainder goes one unit each in submission order."""
    n = table.n
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.lexsort((np.arange(n), table.seq))
    units, outcome, _ = _first_fit(table.min_units, order, capacity)
    admitted = units > 0
    lo, hi = 0, int(table.cap.max()) if n else 0
    while lo < hi:
        t = (lo + hi + 1) // 2
        level = np.where(admitted, np.clip(t, table.min_units, table.cap), 0)
        if level.sum() <= capacity:
            lo = t
        else:
            hi = t - 1
    units = np.where(admitted, np.clip(lo, table.min_units, table.cap), 0).astype(np.int64)
    free = capacity - int(units.sum())
    for i in order.tolist():
        if free <= 0:
            break
        if admitted[i] and units[i] < table.cap[i]:
            units[i] += 1
            free -= 1
    return units, outcome


@dataclass
class ReferencePolicy:
    name: str
    kind: str
    description: str
    units_fn: Callable[[IntentTable, int], tuple[np.ndarray, np.ndarray]]
    use_predictor: bool = True
    sticky: bool = False  # keep the units of the first allocation (no feedback)
    knobs: Knobs = NO_KNOBS
    memo: TickMemo = field(default_factory=TickMemo, repr=False, compare=False)

    def allocate(self, state: PlanInput) -> PlanResult:
        table = build_table(state, self.use_predictor, self.memo)
        capacity = max(int(state.node.cpu_units), 0)
        units, outcome = self.units_fn(table, capacity)
        if self.sticky:
            held = (table.prev_units > 0) & (table.prev_units <= table.cap)
            if int(np.where(held, table.prev_units, 0).sum()) <= capacity:
                units = np.where(held, table.prev_units, units)
                over = int(units.sum()) - capacity
                for i in np.flatnonzero(~held)[::-1].tolist():
                    if over <= 0:
                        break
                    over -= int(units[i])
                    units[i] = 0
                    outcome[i] = NOT_ADMITTED
        level = np.zeros(table.n, dtype=np.int64)
        plan = assess(table, units, level, outcome, state.config)
        return decide(state, table, plan, self.name, self.knobs, tie_rank(table), self.memo)


def baseline() -> ReferencePolicy:
    return ReferencePolicy(
        "baseline",
        "reference",
        "Kubernetes default: static requests (preferred or min) by priority, equal shares, no knobs",
        baseline_units,
    )


def fifo() -> ReferencePolicy:
    return ReferencePolicy(
        "fifo", "reference", "first come first served by submission order, each up to its cap",
        fifo_units,
    )  # fmt: skip


def static() -> ReferencePolicy:
    return ReferencePolicy(
        "static",
        "reference",
        "static partitioning: preferred units fixed at the first allocation, each pinned to "
        "cores of its own (Kubernetes static CPU manager), no feedback from observed times",
        static_units,
        use_predictor=False,
        sticky=True,
        knobs=PINNED,
    )


def loadbalance_only() -> ReferencePolicy:
    return ReferencePolicy(
        "loadbalance-only",
        "reference",
        "units spread evenly across intents, ignoring deadlines and utility",
        loadbalance_units,
    )
