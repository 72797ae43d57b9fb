"""The intents as read-only columns, and what follows from them alone.

``SpecColumns``: the specs' own fields, one column each (kept between ticks while the spec
objects are the same, see memo.py); ``BaseColumns``: what they and the node's unit capacity
decide (caps, minimums, weights, tie rank); ``service_columns``: service times at one unit from
the predictor's statistics. CLASS_CODES numbers the workload classes for every column.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from services.core.formulas import DEFAULT_REL_SPREAD, priority_weight, service_at_one_unit
from services.core.model import IntentSpec, ServiceStats

CLASS_CODES = {"ONLINE": 0, "BATCH": 1, "ROBOT": 2, "URGENT": 3}
ONLINE, BATCH, ROBOT, URGENT = (
    CLASS_CODES[name] for name in ("ONLINE", "BATCH", "ROBOT", "URGENT")
)
_STATS_GETTER = operator.attrgetter(
    "count", "mean_ms", "p95_ms", "p99_ms", "observed_units", "latency_correction"
)
_TARGET_GETTER = operator.attrgetter("target_percentile")

NUMERIC_FIELDS = (
    "priority",
    "deadline_ms",
    "min_units",
    "max_units",
    "preferred_units",
    "parallel_fraction",
    "base_service_ms",
    "arrival_rate_per_s",
    "seq",
)
_NUMERIC_GETTER = operator.attrgetter(*NUMERIC_FIELDS)
_OTHER_GETTERS = tuple(
    map(
        operator.attrgetter,
        ("id", "workload_class", "gpu_lane", "gpu_share", "degradation", "preemptible", "elastic",
         "gpu_stream_priority_hint", "gpu_concurrency"),
    )
)  # fmt: skip
_ID = operator.attrgetter("id")


def _ladder_bits(ladder: tuple[str, ...]) -> tuple[bool, bool, bool]:
    return (True, "FP16" in ladder, "INT8" in ladder)


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False  # shared between ticks: an in-place write would go stale
    return a


@dataclass(frozen=True)
class SpecColumns:
    """The intents' fields as read-only columns (index i = position in the intents sequence)."""

    specs: tuple[IntentSpec, ...]
    numeric: np.ndarray  # (len(NUMERIC_FIELDS), n) float64
    ids: tuple[str, ...]
    cls: np.ndarray  # int8 class code
    uses_gpu: np.ndarray
    ladder: np.ndarray  # (n, 3) bool: degradation level allowed
    preemptible: np.ndarray
    elastic: np.ndarray
    stream_hint: np.ndarray  # gpu_stream_priority_hint, int64
    concurrency: np.ndarray  # gpu_concurrency, int64

    def read_from(self, specs: Sequence[IntentSpec]) -> bool:
        """Whether these columns were read from exactly these spec objects, in this order."""
        own = self.specs
        return specs is own or (len(specs) == len(own) and all(map(operator.is_, specs, own)))

    def updated(self, specs: Sequence[IntentSpec]) -> SpecColumns:
        """The columns of `specs`: rows whose spec object is one of these columns' are gathered
        from them, only the other specs are read (all of them when they are most)."""
        n, own = len(specs), self.specs
        k = len(own)
        if n > k and all(map(operator.is_, specs[:k], own)):  # specs appended (submits)
            src = np.full(n, -1, np.int64)
            src[:k] = np.arange(k)
        else:
            # ids of objects these columns hold (self.specs keeps them alive): a match is the object
            at = dict(zip(map(id, own), range(k), strict=True))
            src = np.fromiter(map(at.get, map(id, specs), itertools.repeat(-1)), np.int64, n)
        new_rows = (src < 0).nonzero()[0]
        if 2 * new_rows.size >= n:
            return read_spec_columns(specs)
        part = read_spec_columns([specs[i] for i in new_rows.tolist()])
        old_rows = (src >= 0).nonzero()[0]
        taken = src[old_rows]

        def merged(name: str) -> np.ndarray:
            old, new = getattr(self, name), getattr(part, name)
            axis = 1 if name == "numeric" else 0  # numeric is (field, row); the rest (row, ...)
            shape = list(old.shape)
            shape[axis] = n
            out = np.empty(shape, dtype=old.dtype)
            at_rows: list[Any] = [slice(None)] * old.ndim
            at_rows[axis] = old_rows
            out[tuple(at_rows)] = np.take(old, taken, axis=axis)
            at_rows[axis] = new_rows
            out[tuple(at_rows)] = new
            return _frozen(out)

        arrays = {f.name: merged(f.name) for f in fields(self) if f.name not in ("specs", "ids")}
        return SpecColumns(specs=tuple(specs), ids=tuple(map(_ID, specs)), **arrays)


def read_spec_columns(specs: Sequence[IntentSpec]) -> SpecColumns:
    """One C-level pass per field over the specs, then numpy."""
    n = len(specs)
    # a tuple per intent (attrgetter), flattened straight into one array
    flat = itertools.chain.from_iterable(map(_NUMERIC_GETTER, specs))
    width = len(NUMERIC_FIELDS)
    numeric = np.fromiter(flat, np.float64, n * width).reshape(n, width).T.copy()
    # one C-level map per column (cheaper than transposing n tuples with zip)
    ids, classes, lanes, shares, ladders, preemptible, elastic, hints, concurrency = (
        list(map(get, specs)) for get in _OTHER_GETTERS
    )
    cls = np.fromiter(map(CLASS_CODES.get, classes, [BATCH] * n), dtype=np.int8, count=n)
    uses_gpu = np.fromiter(map(bool, lanes), bool, n) | (np.fromiter(shares, np.float64, n) > 0)
    distinct = {t: k for k, t in enumerate(dict.fromkeys(ladders))}
    bits = np.array([_ladder_bits(t) for t in distinct], dtype=bool).reshape(len(distinct), 3)
    ladder = bits[np.fromiter(map(distinct.__getitem__, ladders), np.int64, n)]
    return SpecColumns(
        specs=tuple(specs),
        numeric=_frozen(numeric),
        ids=tuple(ids),
        cls=_frozen(cls),
        uses_gpu=_frozen(uses_gpu),
        ladder=_frozen(ladder),
        preemptible=_frozen(np.fromiter(preemptible, bool, n)),
        elastic=_frozen(np.fromiter(elastic, bool, n)),
        stream_hint=_frozen(np.fromiter(hints, np.int64, n)),
        concurrency=_frozen(np.fromiter(concurrency, np.int64, n)),
    )


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
    weight = np.asarray(priority_weight(prio))
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


@dataclass(frozen=True)
class LastService:
    """Service-time columns (table.service_columns) and what they were computed from."""

    columns: SpecColumns  # the spec columns of that tick
    per_row: list[ServiceStats | None]  # each row's ServiceStats object (None: no samples)
    tail1: np.ndarray
    mean1: np.ndarray
    rel: np.ndarray


def service_columns(
    specs: Sequence[IntentSpec],
    columns: SpecColumns,
    base: BaseColumns,
    stats: Mapping[str, ServiceStats],
    last: LastService | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, LastService | None]:
    """Tail and mean service time at one unit and the relative spread, per row: from the
    predictor's statistics where an intent has them, else from its base service time.

    Rows whose ServiceStats object is the one `last` tick's columns were computed from (the
    predictor hands out the same object until a new sample arrives), for the same spec columns,
    keep their values; only the others are computed. Read-only arrays, and what to keep for
    the next tick (None: nothing new).
    """
    if not stats:
        return base.tail1, base.tail1, base.rel_spread, None
    n = len(specs)
    per_row = list(map(stats.get, columns.ids))
    if last is not None and last.columns is columns:
        todo = np.fromiter(map(operator.is_not, per_row, last.per_row), bool, n).nonzero()[0]
        if todo.size == 0:
            return last.tail1, last.mean1, last.rel, last
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
        count, mean, p95, p99, units, correction = (
            np.fromiter(flat, np.float64, 6 * k).reshape(k, 6).T
        )
        target = np.fromiter(map(_TARGET_GETTER, (specs[i] for i in rows.tolist())), np.float64, k)
        tail1[rows], mean1[rows], rel[rows] = service_at_one_unit(
            count,
            mean,
            p95,
            p99,
            units,
            base.base_service_ms[rows],
            base.f[rows],
            target,
            correction,
        )
    for a in (tail1, mean1, rel):
        a.flags.writeable = False  # kept for the next tick
    return tail1, mean1, rel, LastService(columns, per_row, tail1, mean1, rel)
