"""The extender's view of the cluster's nodes: what kube-scheduler sends, enriched with telemetry.

Sources, in the order they override each other:

1. Node objects: every NodeList a /filter or /prioritize request carries, and (with API access)
   the periodic node list. ``status.allocatable.cpu`` gives the CPU units; GPU lanes come from
   node labels ``parfusion.io/lane-<name>: "<gpu count>"`` (set by an operator or the node
   agent); ``parfusion.io/cpu-units`` overrides the CPU count.
2. Telemetry from the allocator / GPU-lane service of a node, when reachable (telemetry.py):
   measured contention, the lanes with the GPUs actually present, the intents resident there.
3. Bindings this extender made: the intents it placed are resident on their node until the
   allocator's own telemetry for that node takes over.

Packaged sample nodes (samples.py) join only with the explicit ``sample_nodes`` flag.

Every number read from a node is bounded before anything is sized by it: CPU units by
``MAX_CPU_UNITS``, GPUs on a lane (and on the node) by ``MAX_GPUS_PER_NODE``. A value beyond,
or one that is not a finite quantity (``inf``, ``1e400``), is a ProtocolError naming the
field (400 for a request); a node from the API server with such a value is skipped and logged.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from services.core.model import DmugConfig, IntentSpec, LaneCapacity
from services.core.placement import NodeView, view_of

from .columns import NodeColumns
from .noderecord import NodeRecord
from .protocol import NodeHead, ProtocolError

log = logging.getLogger(__name__)

LANE_LABEL = "parfusion.io/lane-"
CPU_UNITS_LABEL = "parfusion.io/cpu-units"
SHARE_UNITS_PER_GPU = 100
MAX_CPU_UNITS = 4096  # more CPUs than any one machine has today
MAX_GPUS_PER_NODE = 64  # the densest nodes hold 8-16 GPUs
MEMO_RESIDENTS = 256  # placements of nodes with at most this many residents are memoised


def cpu_quantity(text: str | None, *, limit: int = MAX_CPU_UNITS, field: str = "cpu") -> int:
    """Whole units from a Kubernetes quantity ("8", "7910m", "1.5", "2k"); text that is not a
    quantity is 0 (the node is then not usable). A finite value above ``limit``, or ``inf`` /
    ``nan`` / ``1e400``, is a ProtocolError naming ``field``: nothing is sized by it."""
    if not text:
        return 0
    text = text.strip()
    scale = 1.0
    if text.endswith("m"):
        text, scale = text[:-1], 0.001
    elif text.endswith("k"):
        text, scale = text[:-1], 1000.0
    if len(text) > 32:
        raise ProtocolError(f"{field}: {len(text)} characters is not a quantity", field=field)
    try:
        value = float(text) * scale
    except ValueError:
        return 0
    if not math.isfinite(value) or value > limit:
        raise ProtocolError(
            f"{field}: {text!r} is beyond what a node can hold (at most {limit})", field=field
        )
    return max(0, int(value))


def record_from_head(head: NodeHead, source: str = "request", where: str = "node") -> NodeRecord:
    """The record of one Node object; ``where`` prefixes the field in a ProtocolError."""
    labels = head.metadata.labels or {}
    status = head.status
    allocatable = (status.allocatable if status else None) or {}
    cpu = cpu_quantity(
        labels.get(CPU_UNITS_LABEL), field=f"{where}.metadata.labels[{CPU_UNITS_LABEL}]"
    ) or cpu_quantity(allocatable.get("cpu"), field=f"{where}.status.allocatable.cpu")
    lanes: list[LaneCapacity] = []
    gpu_index = 0
    for key in sorted(labels):
        if key.startswith(LANE_LABEL):
            field = f"{where}.metadata.labels[{key}]"
            count = cpu_quantity(labels[key], limit=MAX_GPUS_PER_NODE, field=field)
            if gpu_index + count > MAX_GPUS_PER_NODE:
                raise ProtocolError(
                    f"{field}: lanes add up to {gpu_index + count} GPUs, more than a node can "
                    f"hold (at most {MAX_GPUS_PER_NODE})",
                    field=field,
                )
            indexes = tuple(range(gpu_index, gpu_index + count))
            gpu_index += count
            lanes.append(LaneCapacity(key[len(LANE_LABEL) :], indexes, SHARE_UNITS_PER_GPU * count))
    ready = True
    for cond in (status.conditions if status else None) or ():
        if cond.type == "Ready":
            ready = cond.status == "True"
    cordoned = bool(head.spec and head.spec.unschedulable)
    return NodeRecord(
        name=head.metadata.name,
        cpu_units=cpu,
        lanes=tuple(lanes),
        schedulable=ready and not cordoned,
        source=source,
    )


@dataclass(frozen=True, slots=True)
class NodeTelemetry:
    """What a node's own allocator and GPU-lane service report (telemetry.py fills it)."""

    node: str
    cpu_units: int
    contention: float
    lanes: tuple[LaneCapacity, ...] | None  # None: GPU-lane service not reachable
    residents: tuple[IntentSpec, ...]
    observed_at: float
    # a node with more residents than its NodeIntentState lists: the ids of the others, and
    # the free units and lane share units after all of them, as that node's allocator counted
    omitted: frozenset[str] = frozenset()
    free_units: int = 0
    free_lane_units: Mapping[str, float] = field(default_factory=dict)


@dataclass
class Binding:
    pod: str  # namespace/name
    pod_uid: str
    node: str
    intent_id: str
    at: float
    mode: str  # "api" or "standalone"


@dataclass
class ClusterView:
    """Thread-safe store of node records; reads are lock-free snapshots of immutable records."""

    dmug: DmugConfig = field(default_factory=DmugConfig)
    derive_placement: bool = True  # False: residents only (a simulator arm that never scores)
    max_bindings: int = 10_000
    _objects: dict[str, NodeRecord] = field(default_factory=dict)
    _telemetry: dict[str, NodeTelemetry] = field(default_factory=dict)
    _placed: dict[str, dict[str, IntentSpec]] = field(default_factory=dict)
    _placed_on: dict[str, set[str]] = field(default_factory=dict)  # intent id -> its nodes
    _merged: dict[str, NodeRecord] = field(default_factory=dict)
    bindings: list[Binding] = field(default_factory=list)
    columns: NodeColumns = field(default_factory=NodeColumns)
    # name -> the NodeHead last learned: protocol._heads hands out one object per distinct
    # node bytes, so the same object means the same node (a resourceVersion is only a claim)
    _seen: dict[str, NodeHead] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # D-MUG's view of a node per (node state but its name, resident shapes): every bound pod
    # re-derives its node's view, and replicas on same-shaped nodes share one
    _placements: OrderedDict[tuple[object, ...], NodeView] = field(default_factory=OrderedDict)

    # --- writers ---------------------------------------------------------------------------

    def learn(self, heads: Iterable[NodeHead], source: str = "request") -> None:
        """Remember these node objects (for NodeNames calls too). A node whose bytes are the
        ones already learned is skipped: kube-scheduler resends unchanged nodes every cycle. (Not
        by resourceVersion: a request claiming a known version with other content would
        otherwise shadow the real node.)"""
        known = self._seen
        changed = []
        seen: dict[str, NodeHead] = {}
        for i, head in enumerate(heads):
            meta = head.metadata
            if known.get(meta.name) is head:
                continue
            try:
                rec = record_from_head(head, source, f"Nodes.items[{i}]")
            except ProtocolError as exc:
                if source == "request":
                    raise  # the whole request is refused: nothing of it is learned
                log.warning("node skipped", extra={"node": meta.name, "error": str(exc)})
                continue
            old = self._objects.get(rec.name)
            seen[rec.name] = head
            if (
                old is None
                or old.cpu_units != rec.cpu_units
                or old.lanes != rec.lanes
                or old.schedulable != rec.schedulable
            ):
                changed.append(rec)
        known.update(seen)
        if changed:
            with self._lock:
                for rec in changed:
                    self._objects[rec.name] = rec
                    self._merge(rec.name)

    def set_telemetry(self, reports: Sequence[NodeTelemetry]) -> None:
        with self._lock:
            names = set(self._telemetry) | {r.node for r in reports}
            self._telemetry = {r.node: r for r in reports}
            for name in names:
                self._merge(name)

    def update_telemetry(self, reports: Sequence[NodeTelemetry], gone: Iterable[str] = ()) -> None:
        """Replace these nodes' telemetry and drop the ``gone`` ones'; the rest stay as they are
        (the NodeIntentState watch: one node per event)."""
        with self._lock:
            names = {r.node for r in reports} | set(gone)
            for name in gone:
                self._telemetry.pop(name, None)
            for report in reports:
                self._telemetry[report.node] = report
            for name in names:
                self._merge(name)

    def place(self, node: str, intent: IntentSpec) -> None:
        """Make a bound pod's intent resident on its node (later filters see the capacity gone)."""
        with self._lock:
            placed = self._placed.setdefault(node, {})
            held = placed.get(intent.id)
            if held is not None and held == replace(
                intent, node=held.node, gpu_lane=intent.gpu_lane or held.gpu_lane
            ):
                # the bind's reservation (node and lane filled in), reported again by the
                # bound-pod watch: keep it, lane included
                return
            placed[intent.id] = intent
            self._placed_on.setdefault(intent.id, set()).add(node)
            self._merge(node)

    def forget_placement(self, intent_id: str) -> None:
        with self._lock:
            for node in self._placed_on.pop(intent_id, ()):
                placed = self._placed.get(node)
                if placed is not None and placed.pop(intent_id, None) is not None:
                    if not placed:
                        del self._placed[node]
                    self._merge(node)

    def record_binding(self, binding: Binding) -> None:
        with self._lock:
            self.bindings.append(binding)
            del self.bindings[: -self.max_bindings]

    def _merge(self, name: str) -> None:
        obj = self._objects.get(name)
        tel = self._telemetry.get(name)
        placed = tuple(self._placed.get(name, {}).values())
        if obj is None and tel is None:
            self._merged.pop(name, None)
            self.columns.drop(name)
            return
        rec = obj or NodeRecord(
            name=name, cpu_units=tel.cpu_units if tel else 0, source="telemetry"
        )
        residents = counted = placed
        cut = tel if tel is not None and tel.omitted else None
        if tel is not None:
            known = {i.id for i in tel.residents} | tel.omitted
            counted = tuple(i for i in placed if i.id not in known)  # not adopted yet
            residents = tel.residents + counted
            rec = replace(
                rec,
                cpu_units=tel.cpu_units or rec.cpu_units,
                contention=tel.contention,
                lanes=tel.lanes if tel.lanes is not None else rec.lanes,
                telemetry_at=tel.observed_at,
            )
        free = {lane.name: float(lane.share_units) for lane in rec.lanes if lane.available}
        if cut is not None:  # the allocator's own count after every resident, listed or not
            free = {
                name: min(cut.free_lane_units.get(name, units), units)
                for name, units in free.items()
            }
        for intent in counted if cut is not None else residents:
            if intent.gpu_share > 0 and intent.gpu_lane in free:
                free[intent.gpu_lane] -= intent.gpu_share * SHARE_UNITS_PER_GPU
        rec = replace(rec, residents=residents, free_lane_units=free)
        if self.derive_placement and cut is not None:
            # the allocator's free units less what the pods it has not adopted yet commit
            view = self._placement(rec, counted)
            taken = view.total_units - view.free_units
            free_units = max(min(cut.free_units, view.total_units) - taken, 0)  # hand-edited?
            rec = replace(rec, placement=replace(view, free_units=free_units))
        elif self.derive_placement:
            rec = replace(rec, placement=self._placement(rec, residents))
        self._merged[name] = rec
        self.columns.put(rec)

    def _placement(self, rec: NodeRecord, residents: Sequence[IntentSpec]) -> NodeView:
        """view_of(rec.state, residents), memoised on what it depends on: the node state without
        its name and the residents without their identity (id, name, node, order). Nodes with
        more than MEMO_RESIDENTS residents are not memoised: many nodes rarely share such a set,
        and each key would hold a copy of it (3 MB at 10,000), one more per change."""
        if len(residents) > MEMO_RESIDENTS:
            return replace(view_of(rec.state, residents, {}, self.dmug), name=rec.name)
        state = replace(rec.state, name="")
        shapes = Counter(replace(i, id="", name="", node="", seq=0) for i in residents)
        key = (state, frozenset(shapes.items()))
        view = self._placements.get(key)
        if view is None:
            view = view_of(state, residents, {}, self.dmug)
            self._placements[key] = view
            while len(self._placements) > 4096:
                self._placements.popitem(last=False)
        return replace(view, name=rec.name)

    # --- readers ---------------------------------------------------------------------------

    def get(self, name: str) -> NodeRecord | None:
        return self._merged.get(name)

    def lookup(self, names: Sequence[str]) -> list[NodeRecord | None]:
        merged = self._merged
        return [merged.get(n) for n in names]

    def rows_of(self, names: Sequence[str]) -> np.ndarray:
        return self.columns.rows_of(names)

    def __len__(self) -> int:
        return len(self._merged)

    def snapshot(self) -> Mapping[str, NodeRecord]:
        return dict(self._merged)

    def summary(self, limit: int = 50) -> dict[str, object]:
        merged = self.snapshot()
        sources: dict[str, int] = {}
        for rec in merged.values():
            sources[rec.source] = sources.get(rec.source, 0) + 1
        return {
            "count": len(merged),
            "sources": sources,
            "with_telemetry": sum(1 for r in merged.values() if r.telemetry_at is not None),
            "nodes": [
                {
                    "name": r.name,
                    "cpu_units": r.cpu_units,
                    "schedulable": r.schedulable,
                    "contention": round(r.contention, 4),
                    "lanes": {lane.name: len(lane.gpu_indexes) for lane in r.lanes},
                    "free_lane_units": dict(r.free_lane_units),
                    "free_units": r.placement.free_units if r.placement else r.cpu_units,
                    "residents": [i.id for i in r.residents],
                    "source": r.source,
                    "telemetry_age_s": None
                    if r.telemetry_at is None
                    else round(time.time() - r.telemetry_at, 3),
                }
                for r in sorted(merged.values(), key=lambda r: r.name)[:limit]
            ],
        }
