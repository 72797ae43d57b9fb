"""What a policy keeps from one tick to the next so that unchanged intents cost almost nothing.

The allocator loop hands the policy the same immutable IntentSpec objects every tick while the
store has not changed, and the previous tick's Decision objects as ``previous``. Both are frozen,
so object identity is a safe key:

* ``SpecColumns``: the intents' own fields as columns, kept while the spec objects are the ones
  they were read from; when some are not (a submit, update or delete: the loop converts only
  the intents the store replaced and keeps the other spec objects), only the new objects are
  read and the rest are gathered from the old columns;
* ``LastDecisions``: the Decision objects the policy built last tick and the field columns they
  were built from. A row whose new fields are all equal (floats compared bit for bit) to those
  of last tick's row for the same intent id keeps that Decision object, and only the other rows
  are built; when ``previous`` holds exactly those objects, the previous units and dwell ticks
  come from their columns instead of attribute reads;
* ``LastReasons``: last tick's reason texts and every column their templates read; a row whose
  inputs are all equal (bit for bit) to last tick's for the same intent id keeps its text, and
  only the other rows are formatted;
* ``table.BaseColumns``: what follows from the spec columns and the node's unit capacity alone
  (caps, minimums, weights, tie rank), kept while both are the same;
* ``LastService``: the service-time columns from the predictor's statistics; a row whose
  ServiceStats object is the one they were computed from (the predictor hands out the same
  object until a new sample arrives) keeps its values, for the same spec columns.

Rows are matched by intent id (``changed_from``), so an intent added or dropped, which moves
the later rows, leaves the others' Decisions and texts in place.

Nothing here changes a result: a hit gives the same columns / an equal Decision / the same
text as a miss. The memo lives on the policy instance (one per allocator loop, experiment run or
preview), never in a module global; each slot is replaced by one assignment, so a concurrent
preview can at worst make the next tick miss.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np

from services.core.model import Decision, IntentSpec, ServiceStats

if TYPE_CHECKING:
    from services.core.table import BaseColumns

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
CLASS_CODES = {"ONLINE": 0, "BATCH": 1, "ROBOT": 2, "URGENT": 3}
_BATCH_CODE = CLASS_CODES["BATCH"]


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
        n = len(specs)
        # ids of objects these columns hold (self.specs keeps them alive), so a match is the object
        at = {id(spec): i for i, spec in enumerate(self.specs)}
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
    cls = np.fromiter(map(CLASS_CODES.get, classes, [_BATCH_CODE] * n), dtype=np.int8, count=n)
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


Column = np.ndarray | Sequence[Any]


@dataclass(frozen=True)
class LastDecisions:
    """The Decisions one tick built and the field columns they were built from."""

    decisions: tuple[Decision, ...]
    columns: Mapping[str, Column]  # one per Decision field
    level: np.ndarray  # degradation level index per row

    @property
    def ids(self) -> Sequence[str]:
        """The intent id of each row (the table's ids tuple)."""
        ids: Sequence[str] = self.columns["intent_id"]  # type: ignore[assignment]
        return ids

    def tick_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """units, since_tick, level_since_tick and level index of these Decisions, as int64."""
        names = ("units", "since_tick", "level_since_tick")
        cols = [np.asarray(self.columns[name], dtype=np.int64).view() for name in names]
        cols.append(np.asarray(self.level, dtype=np.int64).view())
        for col in cols:
            col.flags.writeable = False  # views of what last tick's Decisions were built from
        return cols[0], cols[1], cols[2], cols[3]

    def built(self, previous: Sequence[Decision]) -> bool:
        """Whether `previous` (one per row) is exactly this tick's Decision objects."""
        own = self.decisions
        return len(previous) == len(own) and all(map(operator.is_, previous, own))


def changed_rows(n: int, new: Mapping[str, Column], old: Mapping[str, Column]) -> np.ndarray:
    """Rows where some field differs. Arrays of the same dtype compare element for element (floats
    by their bits, so -0.0 and 0.0 differ and NaN equals itself); lists and tuples by ``!=``, exact
    for the str / tuple-of-int / int values Decisions hold; anything else counts as changed."""
    changed = np.zeros(n, dtype=bool)
    for name, column in new.items():
        before = old.get(name)
        if column is before:
            continue  # the very same column object (the ids while the specs are the same)
        if isinstance(column, np.ndarray) and isinstance(before, np.ndarray):
            if column.dtype != before.dtype or column.shape != before.shape:
                return np.ones(n, dtype=bool)
            if column.dtype.kind == "f":
                column, before = column.view(np.int64), before.view(np.int64)
            changed |= column != before
        elif (
            isinstance(column, list | tuple)
            and isinstance(before, list | tuple)
            and len(before) == n
        ):
            if column != before:  # one C-level pass first; row by row only when some differ
                changed |= np.fromiter(map(operator.ne, column, before), bool, n)
        else:
            return np.ones(n, dtype=bool)
    return changed


def row_map(old_ids: Sequence[str], new_ids: Sequence[str]) -> np.ndarray | None:
    """Per new row, the old row of the same intent id (-1: a new intent); None when the ids are
    the same sequence (rows align as they are)."""
    if old_ids is new_ids or old_ids == new_ids:
        return None
    at = {intent_id: i for i, intent_id in enumerate(old_ids)}
    return np.fromiter(map(at.get, new_ids, itertools.repeat(-1)), np.int64, len(new_ids))


def aligned(old: Mapping[str, Column], src: np.ndarray | None) -> Mapping[str, Column]:
    """Old columns gathered to the new rows (`src` from row_map; a -1 row gets some old row's
    value, which ``changed_from`` marks changed anyway)."""
    if src is None:
        return old
    at = np.maximum(src, 0)
    rows = at.tolist()
    return {
        name: column[at] if isinstance(column, np.ndarray) else [column[j] for j in rows]
        for name, column in old.items()
    }


def changed_from(
    n: int,
    new: Mapping[str, Column],
    old: Mapping[str, Column],
    old_ids: Sequence[str],
    new_ids: Sequence[str],
) -> tuple[np.ndarray, np.ndarray | None]:
    """``changed_rows`` against last tick's columns matched by intent id (intents added,
    dropped or moved since), and the row map used (None: rows aligned as they are)."""
    if not old_ids:
        return np.ones(n, dtype=bool), None
    src = row_map(old_ids, new_ids)
    changed = changed_rows(n, new, aligned(old, src))
    if src is not None:
        changed |= src < 0
    return changed, src


@dataclass(frozen=True)
class LastReasons:
    """The reason texts one tick formatted and the columns they were formatted from."""

    inputs: Mapping[str, Column]  # every column a reason template reads, one value per row
    texts: np.ndarray  # object array of str, read-only
    constants: Mapping[str, Any]  # what every row's text reads besides its columns (policy, ...)
    ids: Sequence[str]  # the intent id of each row

    def kept(
        self, ids: Sequence[str], inputs: Mapping[str, Column], constants: Mapping[str, Any]
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """(this tick's rows whose text must be formatted again: a new intent or some input
        differs, bit for bit; last tick's texts moved to this tick's rows), or None when no
        text can be kept (other constants)."""
        if constants != self.constants or not self.ids:
            return None
        changed, src = changed_from(len(ids), inputs, self.inputs, self.ids, ids)
        texts = self.texts.copy() if src is None else self.texts[np.maximum(src, 0)]
        return changed, texts


@dataclass(frozen=True)
class LastService:
    """Service-time columns (table.service_columns) and what they were computed from."""

    columns: SpecColumns  # the spec columns of that tick
    per_row: list[ServiceStats | None]  # each row's ServiceStats object (None: no samples)
    tail1: np.ndarray
    mean1: np.ndarray
    rel: np.ndarray


@dataclass
class TickMemo:
    """One policy instance's memory of its last tick (see the module docstring)."""

    spec_columns: SpecColumns | None = None
    last: LastDecisions | None = field(default=None, repr=False)
    reasons: LastReasons | None = field(default=None, repr=False)
    base: BaseColumns | None = field(default=None, repr=False)  # filled by table.build_table
    service: LastService | None = field(default=None, repr=False)  # table.service_columns

    def columns_for(self, specs: Sequence[IntentSpec]) -> SpecColumns:
        cached = self.spec_columns
        if cached is not None and cached.read_from(specs):
            return cached
        fresh = read_spec_columns(specs) if cached is None else cached.updated(specs)
        self.spec_columns = fresh
        return fresh
