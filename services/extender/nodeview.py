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
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from services.core.model import DmugConfig, IntentSpec, LaneCapacity
from services.core.placement import view_of

from .columns import NodeColumns
from .noderecord import NodeRecord
from .protocol import NodeHead

LANE_LABEL = "parfusion.io/lane-"
CPU_UNITS_LABEL = "parfusion.io/cpu-units"
SHARE_UNITS_PER_GPU = 100


def cpu_quantity(text: str | None) -> int:
    """Whole CPU units from a Kubernetes quantity ("8", "7910m", "1.5", "2k"); bad input is 0."""
    if not text:
        return 0
    text = text.strip()
    try:
        if text.endswith("m"):
            return int(float(text[:-1]) // 1000)
        if text.endswith("k"):
            return int(float(text[:-1]) * 1000)
        return int(float(text))
    except ValueError:
        return 0


def record_from_head(head: NodeHead, source: str = "request") -> NodeRecord:
    labels = head.metadata.labels or {}
    status = head.status
    allocatable = (status.allocatable if status else None) or {}
    cpu = cpu_quantity(labels.get(CPU_UNITS_LABEL)) or cpu_quantity(allocatable.get("cpu"))
    lanes: list[LaneCapacity] = []
    gpu_index = 0
    for key in sorted(labels):
        if key.startswith(LANE_LABEL):
            count = cpu_quantity(labels[key])
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
    _merged: dict[str, NodeRecord] = field(default_factory=dict)
    bindings: list[Binding] = field(default_factory=list)
    columns: NodeColumns = field(default_factory=NodeColumns)
    _versions: dict[str, str] = field(default_factory=dict)  # name -> Node resourceVersion
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # --- writers ---------------------------------------------------------------------------

    def learn(self, heads: Iterable[NodeHead], source: str = "request") -> None:
        """Remember these node objects (for NodeNames calls too). A node whose resourceVersion
        is the one already seen is skipped: kube-scheduler resends unchanged nodes every cycle."""
        versions = self._versions
        changed = []
        for head in heads:
            meta = head.metadata
            if meta.resourceVersion and versions.get(meta.name) == meta.resourceVersion:
                continue
            rec = record_from_head(head, source)
            old = self._objects.get(rec.name)
            versions[rec.name] = meta.resourceVersion
            if (
                old is None
                or old.cpu_units != rec.cpu_units
                or old.lanes != rec.lanes
                or old.schedulable != rec.schedulable
            ):
                changed.append(rec)
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

    def place(self, node: str, intent: IntentSpec) -> None:
        """Make a bound pod's intent resident on its node (later filters see the capacity gone)."""
        with self._lock:
            self._placed.setdefault(node, {})[intent.id] = intent
            self._merge(node)

    def forget_placement(self, intent_id: str) -> None:
        with self._lock:
            for node, placed in self._placed.items():
                if placed.pop(intent_id, None) is not None:
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
        residents = placed
        if tel is not None:
            known = {i.id for i in tel.residents}
            residents = tel.residents + tuple(i for i in placed if i.id not in known)
            rec = replace(
                rec,
                cpu_units=tel.cpu_units or rec.cpu_units,
                contention=tel.contention,
                lanes=tel.lanes if tel.lanes is not None else rec.lanes,
                telemetry_at=tel.observed_at,
            )
        free = {lane.name: float(lane.share_units) for lane in rec.lanes if lane.available}
        for intent in residents:
            if intent.gpu_share > 0 and intent.gpu_lane in free:
                free[intent.gpu_lane] -= intent.gpu_share * SHARE_UNITS_PER_GPU
        rec = replace(rec, residents=residents, free_lane_units=free)
        if self.derive_placement:
            rec = replace(rec, placement=view_of(rec.state, residents, {}, self.dmug))
        self._merged[name] = rec
        self.columns.put(rec)

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
