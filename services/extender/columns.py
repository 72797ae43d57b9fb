"""Columnar copy of the node view, so one pod's decision over thousands of nodes is array work.

Each node has a row. Per row: CPU units, the share units free on every lane (NaN where the lane
is not present) and the id of its *placement class*: nodes whose D-MUG view is equal in
everything but the name (free and total units, usable lanes, pressure) get the same id, so the
placement core scores each class once however many nodes share it (a cluster of a few node
shapes has a few dozen classes, not thousands of nodes). Writers hold the ClusterView lock; a
reader may see one row a bind later than another, never a torn array (growth swaps arrays).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from services.core.placement import NodeView

from .noderecord import NodeRecord

PlacementKey = tuple[int, int, frozenset[str], float, object]


def placement_key(view: NodeView) -> PlacementKey:
    return (
        view.free_units,
        view.total_units,
        view.lanes_available,
        view.contention,
        view.disturbance,
    )


class NodeColumns:
    def __init__(self, capacity: int = 64) -> None:
        self.rows: dict[str, int] = {}
        self.records: list[NodeRecord | None] = []
        self.names: list[str] = []
        self.cpu_units = np.full(capacity, -1, dtype=np.int64)
        self.klass = np.full(capacity, -1, dtype=np.int64)
        self.lane_free: dict[str, np.ndarray] = {}
        self.class_ids: dict[PlacementKey, int] = {}
        self.class_views: list[NodeView] = []
        self.version = 0
        self._cache: dict[bytes | tuple[str, ...], Candidates] = {}

    def __len__(self) -> int:
        return len(self.records)

    def _grow(self, need: int) -> None:
        size = len(self.cpu_units)
        if need <= size:
            return
        new = max(need, 2 * size)

        def grown(arr: np.ndarray, fill: float) -> np.ndarray:
            out = np.full(new, fill, dtype=arr.dtype)
            out[:size] = arr
            return out

        self.cpu_units = grown(self.cpu_units, -1)
        self.klass = grown(self.klass, -1)
        self.lane_free = {k: grown(v, np.nan) for k, v in self.lane_free.items()}

    def put(self, rec: NodeRecord) -> None:
        row = self.rows.get(rec.name)
        if row is None:
            row = len(self.records)
            self._grow(row + 1)
            self.rows[rec.name] = row
            self.records.append(rec)
            self.names.append(rec.name)
        else:
            self.records[row] = rec
        self.cpu_units[row] = rec.cpu_units
        for lane, arr in self.lane_free.items():
            if lane not in rec.free_lane_units:
                arr[row] = np.nan
        for lane, free in rec.free_lane_units.items():
            column = self.lane_free.get(lane)
            if column is None:
                column = np.full(len(self.cpu_units), np.nan)
                self.lane_free[lane] = column
            column[row] = free
        if rec.placement is not None:
            key = placement_key(rec.placement)
            klass = self.class_ids.get(key)
            if klass is None:
                klass = len(self.class_views)
                self.class_ids[key] = klass
                self.class_views.append(rec.placement)
            self.klass[row] = klass
        else:
            self.klass[row] = -1
        self.version += 1

    def drop(self, name: str) -> None:
        row = self.rows.get(name)
        if row is None:
            return
        self.records[row] = None
        self.cpu_units[row] = -1
        self.klass[row] = -1
        for arr in self.lane_free.values():
            arr[row] = np.nan
        self.version += 1

    def rows_of(self, names: Sequence[str]) -> np.ndarray:
        return self.candidates(names).rows

    def candidates(self, names: Sequence[str], key: bytes | None = None) -> Candidates:
        """Rows for a candidate list, -1 for a name the view does not know.

        kube-scheduler sends the same candidate list over and over (the nodes it found feasible),
        so the last few lists are kept (keyed by the list's JSON bytes when the caller has them),
        with whatever else was derived from them; an entry with
        unknown names is recomputed once the view has grown (rows never move once assigned)."""
        cache_key: bytes | tuple[str, ...] = key if key is not None else tuple(names)
        hit = self._cache.get(cache_key)
        if hit is not None and (hit.complete or hit.known == len(self.rows)):
            return hit
        get = self.rows.get
        rows = np.array([get(n, -1) for n in names], dtype=np.int64)
        entry = Candidates(rows, len(self.rows), bool((rows >= 0).all()))
        if len(self._cache) >= 8:
            self._cache.pop(next(iter(self._cache)))
        self._cache[cache_key] = entry
        return entry


@dataclass
class Candidates:
    rows: np.ndarray
    known: int  # rows in the view when computed
    complete: bool  # every name had a row
    host_heads: list[bytes] | None = None  # protocol.host_heads of the names, once asked
