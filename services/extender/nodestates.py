"""The extender's watch-driven cluster view: Node objects, NodeIntentStates and bound pods.

With API access the extender list-watches (services/common/kube.py), instead of polling:

* Node objects: the node view the NodeNames (nodeCacheCapable) calls need;
* ``NodeIntentState`` objects, one per node, written by that node's allocator: its capacity,
  contention, lanes and resident intents become the node's telemetry in the ClusterView. A
  state is fresh while its last write (the watch event, or on a re-list the heartbeat written
  in it) is at most ``node_state_stale_s`` old; the allocator heartbeats every
  ``state_heartbeat_s`` (10 s by default, the bound 30 s: three missed beats). A stale node
  falls back to its Node object and scores 0 in /prioritize until its allocator writes again:
  a node whose allocator stopped is not preferred;
* pods bound to a node (``spec.nodeName`` set, by any scheduler or by hand) that carry an
  intent: resident on their node at once, before the node's allocator adopts them, and gone
  when the pod goes or finishes.

The watches' callbacks run on their informer threads and update the view under its lock; the
verbs read snapshots, as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import msgspec

from services.common.errors import DomainError
from services.common.kube import Informer, ObjectMeta, PodHead, ResourcePath
from services.core.convert import intent_from_document, intent_to_spec
from services.core.model import IntentSpec, LaneCapacity
from services.core.podintent import pod_intent
from services.core.validation import normalize_intent

from .nodeview import NodeTelemetry
from .protocol import NodeHead
from .verbs import Extender

log = logging.getLogger(__name__)

GROUP, VERSION = "parfusion.io", "v1"


class _Lane(msgspec.Struct):
    name: str = ""
    gpus: int = 0
    shareUnits: int = 0  # noqa: N815
    freeShareUnits: float = 0.0  # noqa: N815


class _Resident(msgspec.Struct):
    id: str = ""
    intent: dict[str, Any] | None = None


class _StateStatus(msgspec.Struct):
    capacityUnits: int = 0  # noqa: N815
    contention: float = 0.0
    lanes: list[_Lane] = msgspec.field(default_factory=list)
    residents: list[_Resident] = msgspec.field(default_factory=list)
    # a node with more residents than the status lists: the others' ids, and the free units
    # after all of them
    omittedResidents: list[str] = msgspec.field(default_factory=list)  # noqa: N815
    freeUnits: int = 0  # noqa: N815
    heartbeat: str = ""


class NodeIntentStateObject(msgspec.Struct):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    status: _StateStatus | None = None


def telemetry_of(obj: NodeIntentStateObject, observed_at: float) -> NodeTelemetry | None:
    """The node telemetry a NodeIntentState carries (None before its first status write)."""
    status = obj.status
    if status is None or not status.capacityUnits:
        return None
    residents: list[IntentSpec] = []
    for seq, resident in enumerate(status.residents):
        if resident.intent is None:
            continue
        try:
            intent = normalize_intent(intent_from_document(resident.intent))
            residents.append(intent_to_spec(intent, seq))
        except (DomainError, KeyError) as exc:  # a hand-edited object: skip, say which
            log.warning("resident not understood", extra={"id": resident.id, "error": str(exc)})
    lanes = tuple(
        LaneCapacity(lane.name, tuple(range(lane.gpus)), lane.shareUnits)
        for lane in status.lanes
        if lane.gpus > 0
    )
    return NodeTelemetry(
        node=obj.metadata.name,
        cpu_units=status.capacityUnits,
        contention=status.contention,
        lanes=lanes or None,  # no GPUs reported: the Node object's lane labels stand
        residents=tuple(residents),
        observed_at=observed_at,
        omitted=frozenset(status.omittedResidents),
        free_units=status.freeUnits,
        free_lane_units={lane.name: lane.freeShareUnits for lane in status.lanes},
    )


def heartbeat_age_s(text: str, now: float) -> float:
    """Seconds since an RFC 3339 heartbeat (infinite when absent or unreadable)."""
    try:
        return max(0.0, now - datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())
    except ValueError:
        return float("inf")


class NodeStateCache:
    """Informers for nodes, NodeIntentStates and bound pods feeding one Extender's view."""

    def __init__(
        self,
        ext: Extender,
        api_client: Any,
        stale_s: float = 30.0,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ext = ext
        self.view = ext.view
        self.stale_s = stale_s
        self._clock = clock
        self._lock = threading.Lock()
        self._states: dict[str, NodeTelemetry] = {}  # node -> its state (fresh or not)
        self._seen: dict[str, float] = {}  # node -> monotonic time of its last write
        self._fresh: set[str] = set()
        self._placed: dict[str, tuple[str, str]] = {}  # pod key -> (intent id, node)
        self._stop = threading.Event()
        self.informers: list[Informer[Any]] = [
            Informer(
                api_client,
                ResourcePath("/api/v1/nodes"),
                NodeHead,
                lambda objs: self.view.learn(objs.values(), source="api"),
                self._node_event,
                name="nodes",
                timeout_s=timeout_s,
            ),
            Informer(
                api_client,
                ResourcePath(f"/apis/{GROUP}/{VERSION}/nodeintentstates"),
                NodeIntentStateObject,
                self._sync_states,
                self._state_event,
                name="nodeintentstates",
                timeout_s=timeout_s,
            ),
            Informer(
                api_client,
                ResourcePath("/api/v1/pods", field_selector="spec.nodeName!="),
                PodHead,
                self._sync_pods,
                self._pod_event,
                name="bound-pods",
                timeout_s=timeout_s,
            ),
        ]
        self._sweeper = threading.Thread(target=self._sweep_loop, name="state-sweep", daemon=True)

    def start(self) -> None:
        for informer in self.informers:
            informer.start()
        self._sweeper.start()

    def stop(self) -> None:
        self._stop.set()
        for informer in self.informers:
            informer.stop()
        self._sweeper.join(timeout=2)

    def _node_event(self, kind: str, _name: str, head: NodeHead) -> None:
        if kind != "DELETED":  # a deleted node is no longer a candidate kube-scheduler sends
            self.view.learn([head], source="api")

    # --- NodeIntentStates --------------------------------------------------------------------

    def _sync_states(self, objects: dict[str, NodeIntentStateObject]) -> None:
        now, wall = self._clock(), time.time()
        with self._lock:
            self._states, self._seen = {}, {}
            for name, obj in objects.items():
                age = heartbeat_age_s(obj.status.heartbeat if obj.status else "", wall)
                report = telemetry_of(obj, wall - min(age, 1e6))
                if report is not None:
                    self._states[name], self._seen[name] = report, now - age
            self._refresh(set(objects) | self._fresh)

    def _state_event(self, kind: str, name: str, obj: NodeIntentStateObject) -> None:
        with self._lock:
            if kind == "DELETED":
                self._states.pop(name, None)
                self._seen.pop(name, None)
            else:
                report = telemetry_of(obj, time.time())
                if report is None:
                    return
                self._states[name], self._seen[name] = report, self._clock()
            self._refresh({name})

    def _refresh(self, names: set[str]) -> None:
        """Put fresh states into the view and take stale ones out (caller holds the lock)."""
        now = self._clock()
        put, gone = [], []
        for name in names:
            seen = self._seen.get(name)
            if seen is not None and now - seen <= self.stale_s:
                put.append(self._states[name])
                self._fresh.add(name)
            elif name in self._fresh or name not in self._states:
                gone.append(name)
                self._fresh.discard(name)
        if put or gone:
            self.view.update_telemetry(put, gone)
        self.ext.stale_nodes = frozenset(set(self._states) - self._fresh)

    def _sweep_loop(self) -> None:
        while not self._stop.wait(min(1.0, self.stale_s / 4)):
            with self._lock:
                now = self._clock()
                expired = {n for n in self._fresh if now - self._seen.get(n, -1e18) > self.stale_s}
                if expired:
                    log.info("node states went stale", extra={"nodes": sorted(expired)[:20]})
                    self._refresh(expired)

    # --- bound pods --------------------------------------------------------------------------

    def _sync_pods(self, objects: dict[str, PodHead]) -> None:
        with self._lock:
            for key in set(self._placed) - set(objects):
                self._unplace(key)
            for key, pod in objects.items():
                self._take_pod(key, pod)

    def _pod_event(self, kind: str, key: str, pod: PodHead) -> None:
        with self._lock:
            if kind == "DELETED":
                self._unplace(key)
            else:
                self._take_pod(key, pod)

    def _take_pod(self, key: str, pod: PodHead) -> None:
        node = pod.spec.nodeName
        found = pod_intent(pod.metadata) if node and not pod.finished else None
        if found is None or found.spec is None:
            self._unplace(key)
            return
        if self._placed.get(key) == (found.spec.id, node):
            return
        self._unplace(key)
        self.view.place(node, found.spec)
        self._placed[key] = (found.spec.id, node)

    def _unplace(self, key: str) -> None:
        placed = self._placed.pop(key, None)
        if placed is not None:
            self.view.forget_placement(placed[0])

    # --- /state ------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        now = self._clock()
        with self._lock:
            ages = {n: round(now - s, 3) for n, s in self._seen.items()}
            fresh = sorted(self._fresh)
        return {
            "stale_after_s": self.stale_s,
            "fresh": fresh[:200],
            "stale": sorted(set(ages) - set(fresh))[:200],
            "fresh_count": len(fresh),
            "state_count": len(ages),
            "age_s": dict(sorted(ages.items())[:200]),
            "bound_pods_with_intent": len(self._placed),
            "watches": {
                i.name: {
                    "synced": i.synced.is_set(),
                    "resource_version": i.resource_version,
                    "errors": i.errors,
                    "last_error": i.last_error,
                }
                for i in self.informers
            },
        }
