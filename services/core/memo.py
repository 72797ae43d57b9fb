"""What a policy keeps from one tick to the next so that unchanged intents cost almost nothing.

The loop hands a policy the same frozen IntentSpec objects while the store is unchanged, and
last tick's Decisions as ``previous``; TickMemo keeps the columns read from them (columns.py)
and the Decisions and reason texts built last tick, reused row by row where the inputs are
equal bit for bit (rows matched by intent id). A hit gives the same result as a miss. The memo
lives on the policy instance, never in a module global.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from services.core.columns import (
    BaseColumns,
    LastService,
    SpecColumns,
    read_spec_columns,
)
from services.core.model import Decision, IntentSpec

Column = np.ndarray | Sequence[Any]
# a plan's hysteresis state per row: units, since_tick, level_since_tick, level index,
# level_backoff, level_raised (LastDecisions.tick_columns)
TickColumns = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
_TICK_FIELDS = ("units", "since_tick", "level_since_tick", "level_backoff", "level_raised")


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

    def tick_columns(self) -> TickColumns:
        """units, since_tick, level_since_tick, level index, level_backoff and level_raised of
        these Decisions, as int64."""
        cols = [np.asarray(self.columns[name], dtype=np.int64).view() for name in _TICK_FIELDS]
        cols.insert(3, np.asarray(self.level, dtype=np.int64).view())
        for col in cols:
            col.flags.writeable = False  # views of what last tick's Decisions were built from
        return cols[0], cols[1], cols[2], cols[3], cols[4], cols[5]

    def tick_columns_of(
        self, previous: Sequence[Decision], missing: Decision
    ) -> TickColumns | None:
        """``tick_columns`` for `previous` (one Decision per row) when it is exactly this tick's
        Decisions, possibly followed by rows without one (`missing`: intents appended since, as
        every tick under a stream of submits has), whose columns are 0; else None."""
        own = self.decisions
        k, n = len(own), len(previous)
        if n < k or not all(map(operator.is_, itertools.islice(previous, k), own)):
            return None
        if n == k:
            return self.tick_columns()
        if not all(
            map(operator.is_, itertools.islice(previous, k, None), itertools.repeat(missing))
        ):
            return None
        zeros = np.zeros(n - k, dtype=np.int64)
        a, b, c, d, e, f = (np.concatenate((col, zeros)) for col in self.tick_columns())
        return a, b, c, d, e, f


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


def appended_to(old_ids: Sequence[str], new_ids: Sequence[str]) -> bool:
    """Whether ``new_ids`` are ``old_ids`` with others after them (submits append): every old
    row keeps its place."""
    k = len(old_ids)
    return len(new_ids) > k and new_ids[:k] == old_ids


_Row = TypeVar("_Row")


def previous_rows(
    old_ids: Sequence[str],
    new_ids: Sequence[str],
    old_rows: Sequence[_Row],
    by_id: Callable[[str], _Row | None],
) -> Iterator[_Row | None]:
    """Per new id, its row of the last call (``old_rows``, in ``old_ids``' order): by position
    while the old rows kept their place, with None for rows appended after them (no lookups);
    else looked up with ``by_id`` (None: a new id)."""
    if new_ids == old_ids or appended_to(old_ids, new_ids):
        return itertools.chain(old_rows, itertools.repeat(None, len(new_ids) - len(old_ids)))
    return map(by_id, new_ids)


def row_map(old_ids: Sequence[str], new_ids: Sequence[str]) -> np.ndarray | None:
    """Per new row, the old row of the same intent id (-1: a new intent); None when the ids are
    the same sequence (rows align as they are)."""
    return _row_map(old_ids, new_ids)[0]


def _row_map(old_ids: Sequence[str], new_ids: Sequence[str]) -> tuple[np.ndarray | None, bool]:
    """``row_map``, and whether the new ids are the old ones with others appended."""
    if old_ids is new_ids or old_ids == new_ids:
        return None, False
    k = len(old_ids)
    if appended_to(old_ids, new_ids):  # no lookups
        src = np.full(len(new_ids), -1, np.int64)
        src[:k] = np.arange(k)
        return src, True
    at = dict(zip(old_ids, range(k), strict=True))
    src = np.fromiter(map(at.get, new_ids, itertools.repeat(-1)), np.int64, len(new_ids))
    return src, False


def aligned(old: Mapping[str, Column], src: np.ndarray | None) -> Mapping[str, Column]:
    """Old columns gathered to the new rows (`src` from row_map; a -1 row gets some old row's
    value, which ``changed_from`` marks changed anyway)."""
    if src is None:
        return old
    at = np.maximum(src, 0)
    rows = at.tolist()
    gather = operator.itemgetter(*rows) if len(rows) > 1 else lambda c: tuple(c[j] for j in rows)
    return {
        name: column[at] if isinstance(column, np.ndarray) else list(gather(column))
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
    src, appended = _row_map(old_ids, new_ids)
    if appended:  # the old rows are the first k: compared in place, not gathered
        k = len(old_ids)
        changed = np.ones(n, dtype=bool)
        changed[:k] = changed_rows(k, {name: column[:k] for name, column in new.items()}, old)
        return changed, src
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
