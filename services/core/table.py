"""The tick's intents as columns (IntentTable): what every D-MUG phase and every policy reads.

``build_table`` turns PlanInput into numpy columns: the specs' own fields (read once and kept
between ticks by services/core/memo.py while the spec objects stay the same), the capacity
caps, the contention inflation, the predictor's service times and the previous plan. ``Rows``
gathers the model parameters of the rows one step works on and evaluates the latency and risk
formulas (services/core/formulas.py) on them.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from services.core.formulas import (
    DEFAULT_REL_SPREAD,
    deadline_risk,
    latency_inflation,
    predicted_latency_ms,
    priority_weight,
    service_at_one_unit,
    slack_ms,
)
from services.core.memo import (
    CLASS_CODES,
    LastService,
    SpecColumns,
    TickMemo,
    read_spec_columns,
)
from services.core.model import (
    DEGRADATION_ORDER,
    Decision,
    IntentSpec,
    PlanInput,
    ServiceStats,
)

Z_CLASS = CLASS_CODES
ONLINE, BATCH, ROBOT, URGENT = (
    CLASS_CODES[name] for name in ("ONLINE", "BATCH", "ROBOT", "URGENT")
)
LEVEL_INDEX = {name: i for i, name in enumerate(DEGRADATION_ORDER)}

_PREVIOUS_GETTER = operator.attrgetter("units", "since_tick", "level_since_tick")
_LEVEL_GETTER = operator.attrgetter("degradation")
_STATS_GETTER = operator.attrgetter("count", "mean_ms", "p95_ms", "p99_ms", "observed_units")
_TARGET_GETTER = operator.attrgetter("target_percentile")
_NO_PREVIOUS = Decision("", 0)  # stands in for "no previous decision" (units 0, NORMAL)


@dataclass
class IntentTable:
    """The tick's intents as columns (index i = position in PlanInput.intents)."""

    specs: Sequence[IntentSpec]
    ids: Sequence[str]
    cls: np.ndarray
    weight: np.ndarray
    deadline: np.ndarray
    has_deadline: np.ndarray
    min_units: np.ndarray
    cap: np.ndarray
    preferred: np.ndarray
    f: np.ndarray
    tail1: np.ndarray
    mean1: np.ndarray
    rel_spread: np.ndarray
    arrival: np.ndarray
    inflation: np.ndarray
    uses_gpu: np.ndarray
    ladder: np.ndarray  # (n, 3) bool: level allowed
    preemptible: np.ndarray
    elastic: np.ndarray
    seq: np.ndarray
    prev_units: np.ndarray
    prev_since: np.ndarray
    has_prev: np.ndarray
    level_factor: np.ndarray  # (3,) latency multiplier per degradation level
    prev_level: np.ndarray  # previous decision's degradation level (index), 0 if none
    prev_level_since: np.ndarray  # tick at which that level was taken
    stream_hint: np.ndarray  # the specs' gpu_stream_priority_hint
    concurrency: np.ndarray  # the specs' gpu_concurrency (0: the default)
    previous: list[Decision] | None = None  # previous decision per row (_NO_PREVIOUS if none)
    rank: np.ndarray | None = None  # tie rank (dmug.tie_rank), filled on first use

    @property
    def n(self) -> int:
        return len(self.specs)

    def take(self, idx=None, column: bool = False) -> Rows:
        """The model parameters of rows idx (all rows when None), as (k,) or (k, 1) columns."""
        every = (self.tail1, self.mean1, self.f, self.arrival, self.inflation, self.deadline,
                 self.rel_spread, self.has_deadline, self.weight, self.cap)  # fmt: skip
        if idx is None:
            return Rows(*(c[:, None] for c in every)) if column else Rows(*every)
        at = np.asarray(idx)[:, None] if column else idx  # (k, 1) columns in the same gather
        return Rows(*(c[at] for c in every))

    def latency(self, idx, p, level=0):
        """L(p) for rows idx at units p and degradation level (scalar or array), gathering only
        the columns the latency formula reads."""
        return predicted_latency_ms(
            self.tail1[idx], self.mean1[idx], self.f[idx], p, self.arrival[idx],
            self.inflation[idx] * self.level_factor[level],
        )  # fmt: skip

    def risk(self, idx, p, level=0):
        return self.take(idx).risk(p, self.level_factor[level])


@dataclass(slots=True)
class Rows:
    """Model parameters gathered once for the rows one step works on."""

    tail1: np.ndarray
    mean1: np.ndarray
    f: np.ndarray
    arrival: np.ndarray
    inflation: np.ndarray
    deadline: np.ndarray
    rel_spread: np.ndarray
    has_deadline: np.ndarray
    weight: np.ndarray
    cap: np.ndarray

    def latency(self, p, level_factor):
        return predicted_latency_ms(
            self.tail1, self.mean1, self.f, p, self.arrival, self.inflation * level_factor
        )

    def risk_at(self, latency):
        r = deadline_risk(slack_ms(self.deadline, latency), latency, self.rel_spread)
        return np.where(self.has_deadline, r, 0.0)

    def risk(self, p, level_factor):
        return self.risk_at(self.latency(p, level_factor))


@dataclass(frozen=True)
class BaseColumns:
    """What the table derives from the specs' own columns and the node's unit capacity alone:
    read-only, kept between ticks (in the memo) while both are the same."""

    source: SpecColumns
    capacity: int
    deadline: np.ndarray  # the specs' deadline_ms
    seq: np.ndarray  # the specs' seq
    base_service_ms: np.ndarray  # as given (tail1 is its floor at 1e-6)
    f: np.ndarray
    has_deadline: np.ndarray
    min_units: np.ndarray
    cap: np.ndarray
    preferred: np.ndarray
    uses_gpu: np.ndarray  # as float, for the inflation formula
    network_bound: np.ndarray
    tail1: np.ndarray  # base service time at one unit (before observations)
    rel_spread: np.ndarray
    weight: np.ndarray
    arrival: np.ndarray
    rank: np.ndarray  # tie rank (dmug.tie_rank)


def rank_by_weight_and_seq(weight: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """Rank per row, lower first: higher weight, then earlier seq, then position (read-only)."""
    n = len(weight)
    order = np.lexsort((np.arange(n), seq, -weight))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    rank.flags.writeable = False
    return rank


def base_columns(columns: SpecColumns, capacity: int) -> BaseColumns:
    prio, deadline, mn, mx, pref, f, base, arrival, seq = columns.numeric
    cls = columns.cls
    mn = np.maximum(mn, 1)
    cap = np.where(mx > 0, np.minimum(mx, capacity), capacity)
    mn = np.minimum(mn, np.maximum(cap, 1))
    weight = priority_weight(prio)
    derived = BaseColumns(
        source=columns,
        capacity=capacity,
        deadline=deadline,
        seq=seq,
        base_service_ms=base,
        f=np.minimum(np.maximum(f, 0.0), 1.0),
        has_deadline=(cls != BATCH) & (deadline > 0),
        min_units=mn.astype(np.int64),
        cap=cap.astype(np.int64),
        preferred=pref.astype(np.int64),
        uses_gpu=columns.uses_gpu.astype(np.float64),
        network_bound=((cls == ONLINE) | (cls == ROBOT)).astype(np.float64),
        tail1=np.maximum(base, 1e-6),
        rel_spread=np.full(len(cls), DEFAULT_REL_SPREAD),
        weight=weight,
        arrival=np.where(cls == BATCH, 0.0, np.maximum(arrival, 0.0)),
        rank=rank_by_weight_and_seq(weight, seq),
    )
    for value in vars(derived).values():
        if isinstance(value, np.ndarray):
            value.flags.writeable = False  # shared between ticks: a stray write raises
    return derived


def service_columns(
    specs: Sequence[IntentSpec],
    columns: SpecColumns,
    base: BaseColumns,
    stats: Mapping[str, ServiceStats],
    memo: TickMemo | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tail and mean service time at one unit and the relative spread, per row: from the
    predictor's statistics where an intent has them, else from its base service time.

    With `memo`, rows whose ServiceStats object is the one last tick's columns were computed
    from (the predictor hands out the same object until a new sample arrives), for the same
    spec columns, keep their values; only the others are computed. Read-only arrays.
    """
    if not stats:
        return base.tail1, base.tail1, base.rel_spread
    n = len(specs)
    per_row = list(map(stats.get, columns.ids))
    last = memo.service if memo is not None else None
    if last is not None and last.columns is columns:
        todo = np.fromiter(map(operator.is_not, per_row, last.per_row), bool, n).nonzero()[0]
        if todo.size == 0:
            return last.tail1, last.mean1, last.rel
        tail1, mean1, rel = last.tail1.copy(), last.mean1.copy(), last.rel.copy()
        tail1[todo], mean1[todo], rel[todo] = (
            base.tail1[todo],
            base.tail1[todo],
            base.rel_spread[todo],
        )
    else:
        todo = np.arange(n)
        tail1, mean1, rel = base.tail1.copy(), base.tail1.copy(), base.rel_spread.copy()
    todo_l = todo.tolist()
    wanted = [per_row[i] for i in todo_l]
    seen = np.fromiter(map(operator.is_not, wanted, itertools.repeat(None)), bool, len(todo_l))
    rows = todo[seen]
    if rows.size:
        k = rows.size
        observed = itertools.compress(wanted, seen.tolist())
        flat = itertools.chain.from_iterable(map(_STATS_GETTER, observed))
        count, mean, p95, p99, units = np.fromiter(flat, np.float64, 5 * k).reshape(k, 5).T
        target = np.fromiter(map(_TARGET_GETTER, (specs[i] for i in rows.tolist())), np.float64, k)
        tail1[rows], mean1[rows], rel[rows] = service_at_one_unit(
            count, mean, p95, p99, units, base.base_service_ms[rows], base.f[rows], target
        )
    for a in (tail1, mean1, rel):
        a.flags.writeable = False  # kept for the next tick
    if memo is not None:
        memo.service = LastService(columns, per_row, tail1, mean1, rel)
    return tail1, mean1, rel


def build_table(
    state: PlanInput, use_predictor: bool = True, memo: TickMemo | None = None
) -> IntentTable:
    """The tick's intents as columns: the specs' own fields and what follows from them and the
    node's capacity (kept in `memo` between ticks while the spec objects and the capacity are
    the same), then this tick's pressure, stats and previous plan."""
    specs = state.intents
    n = len(specs)
    capacity = max(int(state.node.cpu_units), 0)
    columns = memo.columns_for(specs) if memo is not None else read_spec_columns(specs)
    base = memo.base if memo is not None else None
    if base is None or base.source is not columns or base.capacity != capacity:
        base = base_columns(columns, capacity)
        if memo is not None:
            memo.base = base
    ids, cls = columns.ids, columns.cls
    f = base.f
    inflation = latency_inflation(
        state.node, state.config.contention_gain, base.uses_gpu, base.network_bound
    )
    stats = state.stats if use_predictor else {}
    tail1, mean1, rel = service_columns(specs, columns, base, stats, memo)
    prevs: list[Decision] | None = None
    if state.previous:
        prevs = list(map(state.previous.get, ids, itertools.repeat(_NO_PREVIOUS, n)))
        has_prev = np.fromiter(map(operator.is_not, prevs, itertools.repeat(_NO_PREVIOUS)), bool, n)
        last = memo.last if memo is not None else None
        if last is not None and last.built(prevs):
            # the previous plan is the one this policy built last tick: its columns are at hand
            prev_units, prev_since, prev_level_since, prev_level = last.tick_columns()
        else:
            flat = itertools.chain.from_iterable(map(_PREVIOUS_GETTER, prevs))
            prev_units, prev_since, prev_level_since = (
                np.fromiter(flat, np.int64, 3 * n).reshape(n, 3).T.copy()
            )
            levels = map(LEVEL_INDEX.get, map(_LEVEL_GETTER, prevs), itertools.repeat(0))
            prev_level = np.fromiter(levels, np.int64, n)
    else:
        prev_units = np.zeros(n, dtype=np.int64)
        prev_since = np.zeros(n, dtype=np.int64)
        has_prev = np.zeros(n, dtype=bool)
        prev_level = np.zeros(n, dtype=np.int64)
        prev_level_since = np.zeros(n, dtype=np.int64)
    speed = state.config.degradation_speedup
    return IntentTable(
        specs=specs,
        ids=ids,
        cls=cls,
        weight=base.weight,
        deadline=base.deadline,
        has_deadline=base.has_deadline,
        min_units=base.min_units,
        cap=base.cap,
        preferred=base.preferred,
        f=f,
        tail1=tail1,
        mean1=mean1,
        rel_spread=rel,
        arrival=base.arrival,
        inflation=np.asarray(inflation, dtype=np.float64),  # (n,): the row columns broadcast
        uses_gpu=columns.uses_gpu,
        ladder=columns.ladder,
        preemptible=columns.preemptible,
        elastic=columns.elastic,
        seq=base.seq,
        prev_units=prev_units,
        prev_since=prev_since,
        has_prev=has_prev,
        level_factor=np.array([float(speed.get(lvl, 1.0)) for lvl in DEGRADATION_ORDER]),
        prev_level=prev_level,
        prev_level_since=prev_level_since,
        stream_hint=columns.stream_hint,
        concurrency=columns.concurrency,
        previous=prevs,
        rank=base.rank,
    )
