"""What a policy keeps from one tick to the next so that unchanged intents cost almost nothing.

The allocator loop hands the policy the same immutable IntentSpec objects every tick while the
store has not changed, and the previous tick's Decision objects as ``previous``. Both are frozen,
so object identity is a safe key:

* ``SpecColumns``: the intents' own fields as columns, re-read only when some spec object is
  not the one the columns were read from (any submit, update or delete gives new objects);
* ``LastDecisions``: the Decision objects the policy built last tick and the field columns they
  were built from. When ``previous`` holds exactly those objects, a row whose new fields are all
  equal to last tick's (floats compared bit for bit) keeps its Decision object, and only the
  changed rows are built;
* ``LastReasons``: last tick's reason texts and every column their templates read; a row whose
  inputs are all equal (bit for bit) keeps its text, and only changed rows are formatted;
* ``table.BaseColumns``: what follows from the spec columns and the node's unit capacity alone
  (caps, minimums, weights, tie rank), kept while both are the same.

Nothing here changes a result: a hit gives the same columns / an equal Decision / the same
text as a miss. The
memo lives on the policy instance (one per allocator loop, experiment run or preview), never in
a module global; each slot is replaced by one assignment, so a concurrent preview can at worst
make the next tick miss.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from services.allocator.model import Decision, IntentSpec

if TYPE_CHECKING:
    from services.allocator.table import BaseColumns

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


@dataclass(frozen=True)
class LastReasons:
    """The reason texts one tick formatted and the columns they were formatted from."""

    inputs: Mapping[str, Column]  # every column a reason template reads, one value per row
    texts: np.ndarray  # object array of str, read-only
    constants: Mapping[str, Any]  # what every row's text reads besides its columns (policy, ...)

    def changed(
        self, n: int, inputs: Mapping[str, Column], constants: Mapping[str, Any]
    ) -> np.ndarray | None:
        """Rows whose text must be formatted again (some input differs, bit for bit), or None
        when no row's text can be kept (another table size or other constants)."""
        if constants != self.constants or len(self.texts) != n:
            return None
        return changed_rows(n, inputs, self.inputs)


@dataclass
class TickMemo:
    """One policy instance's memory of its last tick (see the module docstring)."""

    spec_columns: SpecColumns | None = None
    last: LastDecisions | None = field(default=None, repr=False)
    reasons: LastReasons | None = field(default=None, repr=False)
    base: BaseColumns | None = field(default=None, repr=False)  # filled by table.build_table

    def columns_for(self, specs: Sequence[IntentSpec]) -> SpecColumns:
        cached = self.spec_columns
        if cached is not None and cached.read_from(specs):
            return cached
        fresh = read_spec_columns(specs)
        self.spec_columns = fresh
        return fresh
