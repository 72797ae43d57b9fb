"""What this node's allocator tells the API server: ResourceIntent status and its NodeIntentState.

A daemon thread reads the loop's published plan (``loop.current()``, the same snapshot GetPlan
and WatchPlans serve; nothing in the loop changes) once per ``status_interval_s`` and writes:

* each adopted ResourceIntent's ``.status`` through the status subresource: decision, units,
  workers, degradation, predicted and observed p99, slack, risk, reason, conditions
  (Admitted / Degraded / Throttled / Preempted) and observedGeneration; an invalid one gets
  ``decision: Invalid`` and the validation message. Only on change, at most once per
  ``status_min_interval_s`` per object unless its decision changed, and never more than
  ``status_writes_per_s`` in all (a token bucket);
* the cluster-scoped ``NodeIntentState`` named after the node: capacity and free units, lanes and
  their free share units, contention, the residents (class, priority, units, slack, risk and
  the intent itself, so the extender scores with the allocator's own view) and a heartbeat.
  Written when a scoring input changes (capacity, free units, lanes, contention to 0.05,
  resident set or units), at most once per ``state_min_interval_s``, and otherwise every
  ``state_heartbeat_s`` so the extender can tell a live node from a dead one.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from google.protobuf import json_format
from prometheus_client import Counter

from parfusion.v1 import intent_pb2
from services.allocator.kube import GROUP, VERSION, IntentReconciler
from services.allocator.loop import ControlLoop
from services.common.kube import TokenBucket, api_error_message, connect
from services.core import convert
from services.core.model import IntentSpec
from services.core.placement import view_of

log = logging.getLogger(__name__)

DECISIONS = {
    intent_pb2.ALLOCATION_STATE_ADMITTED: "Admitted",
    intent_pb2.ALLOCATION_STATE_THROTTLED: "Throttled",
    intent_pb2.ALLOCATION_STATE_DEGRADED: "Degraded",
    intent_pb2.ALLOCATION_STATE_PREEMPTED: "Preempted",
}
CONDITIONS = ("Admitted", "Degraded", "Throttled", "Preempted")
NEVER_MS = 1e9  # the plan's "never": the queue would not drain
API_WRITES = Counter(
    "parfusion_allocator_kube_writes_total",
    "Writes to the Kubernetes API: ResourceIntent status, NodeIntentState; failed publish rounds",
    ["kind", "outcome"],
)


@dataclass(frozen=True)
class PublishConfig:
    status_interval_s: float = 1.0
    status_min_interval_s: float = 5.0
    status_writes_per_s: float = 10.0
    state_min_interval_s: float = 1.0
    state_heartbeat_s: float = 10.0


# Residents a NodeIntentState lists in full (the newest; the others by id only): a status
# is one API object, and the API server refuses one over 3 MiB (etcd, 1.5 MiB by default).
# 500 listed intents are about 0.3 MB; the ids of 10,000 more (the store's default limit)
# about 0.2 MB.
STATE_RESIDENTS = 500


def _decision(allocation: intent_pb2.Allocation | None) -> str:
    return DECISIONS.get(allocation.state, "Pending") if allocation else "Pending"


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ms(value: float) -> float:
    return round(value, 3) if math.isfinite(value) and abs(value) < NEVER_MS else NEVER_MS


def intent_status(
    allocation: intent_pb2.Allocation | None,
    observed_p99_ms: float | None,
    generation: int,
    node: str,
    error: str = "",
) -> dict[str, Any]:
    """A ResourceIntent's status without conditions' transition times (compared for change)."""
    status: dict[str, Any] = {"observedGeneration": generation, "node": node}
    if error:
        return {**status, "decision": "Invalid", "reason": error}
    if allocation is None:
        return {**status, "decision": "Pending", "reason": "waiting for the next plan"}
    degradation = convert.DEGRADATION_TO_MODEL.get(allocation.degradation, "NORMAL")
    status.update(
        decision=DECISIONS.get(allocation.state, "Pending"),
        units=allocation.units,
        workers=allocation.workers,
        degradation=degradation,
        predictedP99Ms=_ms(allocation.predicted_p99_ms),
        slackMs=_ms(allocation.slack_ms),
        deadlineRisk=round(allocation.deadline_risk, 4),
        reason=allocation.reason,
    )
    if allocation.gpu_lane:
        status["gpuLane"] = allocation.gpu_lane
    if observed_p99_ms is not None:
        status["observedP99Ms"] = _ms(observed_p99_ms)
    return status


def conditions(status: dict[str, Any], previous: list[dict[str, Any]] | None) -> list[dict]:
    """Kubernetes-style conditions from the decision, keeping unchanged transition times."""
    decision = status["decision"]
    before = {c["type"]: c for c in previous or []}
    now = now_rfc3339()
    out = []
    for kind in CONDITIONS:
        if kind == "Admitted":
            value = decision in ("Admitted", "Degraded", "Throttled")
        else:
            value = decision == kind
        if decision in ("Pending", "Invalid"):
            value = False
        truth = "True" if value else "False"
        reason = decision if value or kind == "Admitted" else f"Not{kind}"
        old = before.get(kind)
        changed = old is None or old.get("status") != truth
        out.append(
            {
                "type": kind,
                "status": truth,
                "reason": reason,
                "message": status.get("reason", "")[:1024] if value or kind == "Admitted" else "",
                "observedGeneration": status["observedGeneration"],
                "lastTransitionTime": now if changed or old is None else old["lastTransitionTime"],
            }
        )
    return out


class StatusPublisher:
    """The thread that writes ResourceIntent status and this node's NodeIntentState."""

    def __init__(
        self,
        api_client: Any,
        loop: ControlLoop,
        reconciler: IntentReconciler,
        node: str,
        config: PublishConfig,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from kubernetes import client

        self.custom = client.CustomObjectsApi(api_client)
        self.loop = loop
        self.reconciler = reconciler
        self.node = node
        self.config = config
        self.timeout_s = timeout_s
        self._clock = clock
        self._bucket = TokenBucket(
            config.status_writes_per_s, max(1, int(config.status_writes_per_s))
        )
        self._written: dict[str, tuple[dict[str, Any], list[dict], float]] = {}  # uid -> ...
        self._state_key: Any = None
        # per resident id: the stored intent its spec and document were made from (a stored
        # intent is replaced, never changed), the spec, and the document once listed
        self._residents: dict[str, tuple[Any, IntentSpec, dict[str, Any] | None]] = {}
        self._state_at = -math.inf
        self._state_created = False
        self.writes = {"status": 0, "state": 0, "errors": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kube-status", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.config.status_interval_s):
            try:
                self.publish_once()
            except Exception as exc:  # the API may be down; the node loop never depends on it
                self.writes["errors"] += 1
                API_WRITES.labels("publish", "error").inc()
                log.warning("status publish failed", extra={"error": api_error_message(exc)})

    def publish_once(self) -> None:
        self._publish_state()
        self._publish_statuses()

    # --- ResourceIntent status ---------------------------------------------------------------

    def _publish_statuses(self) -> None:
        stats = self.loop.service_stats()
        now = self._clock()
        adopted = list(self.reconciler.resource_intents.values())
        live = {a.uid for a in adopted}
        self._written = {uid: w for uid, w in self._written.items() if uid in live}
        for item in adopted:
            observed = stats.get(item.uid)
            status = intent_status(
                None if item.error else self.loop.allocation(item.uid),
                observed.p99_ms if observed is not None and observed.count else None,
                item.generation,
                self.node,
                item.error,
            )
            previous = self._written.get(item.uid)
            if previous is not None:
                if previous[0] == status:
                    continue
                urgent = (
                    previous[0].get("decision") != status["decision"]
                    or previous[0].get("observedGeneration") != status["observedGeneration"]
                )
                if not urgent and now - previous[2] < self.config.status_min_interval_s:
                    continue
            if not self._bucket.take():
                return  # the rest wait for the next round
            conds = conditions(status, previous[1] if previous else None)
            body = {"status": {**status, "conditions": conds, "updatedAt": now_rfc3339()}}
            try:
                self.custom.patch_namespaced_custom_object_status(
                    GROUP,
                    VERSION,
                    item.namespace,
                    "resourceintents",
                    item.name,
                    body,
                    _request_timeout=self.timeout_s,
                )
            except Exception as exc:
                if getattr(exc, "status", None) == 404:  # deleted meanwhile: the watch says so
                    continue
                raise
            self.writes["status"] += 1
            API_WRITES.labels("status", "ok").inc()
            self._written[item.uid] = (status, conds, now)

    # --- NodeIntentState ---------------------------------------------------------------------

    def node_state(self) -> tuple[dict[str, Any], Any]:
        """(the NodeIntentState status, the part of it whose change is worth a write)."""
        node = self.loop.node_state()
        current = self.loop.current()
        allocations = {a.intent_id: a for a in current.node_plan.allocations} if current else {}
        here = ("", self.node)
        stored = [s for s in self.loop.store.list_intents() if s.intent.node in here]
        specs = self._specs(stored)
        free = view_of(node, specs, {}, self.loop.config.dmug).free_units
        lane_free = {lane.name: float(lane.share_units) for lane in node.lanes if lane.available}
        for spec in specs:
            if spec.gpu_share > 0 and spec.gpu_lane in lane_free:
                lane_free[spec.gpu_lane] -= spec.gpu_share * 100
        allocated = [allocations.get(spec.id) for spec in specs]
        cut = max(len(stored) - STATE_RESIDENTS, 0)  # the newest STATE_RESIDENTS are listed
        residents = []
        for s, spec, allocation in zip(stored[cut:], specs[cut:], allocated[cut:], strict=True):
            residents.append(
                {
                    "id": spec.id,
                    "name": spec.name,
                    "class": spec.workload_class,
                    "priority": spec.priority,
                    "units": allocation.units if allocation else 0,
                    "slackMs": _ms(allocation.slack_ms) if allocation else 0.0,
                    "deadlineRisk": round(allocation.deadline_risk, 4) if allocation else 0.0,
                    "decision": _decision(allocation),
                    "intent": self._document(s),
                }
            )
        lanes = [
            {
                "name": lane.name,
                "gpus": len(lane.gpu_indexes),
                "shareUnits": lane.share_units,
                "freeShareUnits": round(lane_free[lane.name], 3),
            }
            for lane in node.lanes
            if lane.available
        ]
        status = {
            "nodeName": self.node,
            "capacityUnits": node.cpu_units,
            "freeUnits": free,
            "contention": round(node.contention, 4),
            "stale": node.stale,
            "policy": self.loop.policy_name,
            "planGeneration": current.generation if current else 0,
            "lanes": lanes,
            "residents": residents,
            "residentsTotal": len(stored),
            "omittedResidents": [spec.id for spec in specs[:cut]],
        }
        key = (
            node.cpu_units,
            free,
            round(node.contention * 20),
            tuple(
                (spec.id, a.units if a else 0, _decision(a))
                for spec, a in zip(specs, allocated, strict=True)
            ),
            tuple((lane["name"], lane["freeShareUnits"]) for lane in lanes),
        )
        return status, key

    def _specs(self, stored: list[Any]) -> list[IntentSpec]:
        """The residents' specs, made once per stored intent."""
        cache, kept = self._residents, {}
        for s in stored:
            entry = cache.get(s.intent.id)
            if entry is None or entry[0] is not s:
                entry = (s, convert.intent_to_spec(s.intent, seq=s.seq), None)
            kept[s.intent.id] = entry
        self._residents = kept
        return [entry[1] for entry in kept.values()]

    def _document(self, stored: Any) -> dict[str, Any]:
        """A listed resident's intent as the NodeIntentState carries it, made once."""
        held, spec, document = self._residents[stored.intent.id]
        if document is None:
            document = json_format.MessageToDict(stored.intent)
            document.pop("createdAt", None)
            self._residents[stored.intent.id] = (held, spec, document)
        return document

    def _publish_state(self) -> None:
        status, key = self.node_state()
        since = self._clock() - self._state_at
        changed = key != self._state_key
        if not (changed and since >= self.config.state_min_interval_s) and (
            since < self.config.state_heartbeat_s
        ):
            return
        body = {"status": {**status, "heartbeat": now_rfc3339()}}
        if not self._state_created:
            self._create_state()
        try:
            self.custom.patch_cluster_custom_object_status(
                GROUP, VERSION, "nodeintentstates", self.node, body, _request_timeout=self.timeout_s
            )
        except Exception as exc:
            if getattr(exc, "status", None) == 404:  # deleted by someone: create it again
                self._state_created = False
            raise
        self.writes["state"] += 1
        API_WRITES.labels("state", "ok").inc()
        self._state_key, self._state_at = key, self._clock()

    def _create_state(self) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "NodeIntentState",
            "metadata": {"name": self.node},
            "spec": {"nodeName": self.node},
        }
        try:
            self.custom.create_cluster_custom_object(
                GROUP, VERSION, "nodeintentstates", body, _request_timeout=self.timeout_s
            )
        except Exception as exc:
            if getattr(exc, "status", None) != 409:  # 409: it exists (a restart)
                raise
        self._state_created = True


@dataclass
class KubeSync:
    """The reconciler and the publisher of one node, started together, stopped together."""

    reconciler: IntentReconciler
    publisher: StatusPublisher
    description: str

    def stop(self) -> None:
        self.publisher.stop()
        self.reconciler.stop()


def start_kube_sync(settings: Any, loop: ControlLoop, lanes: tuple[str, ...]) -> KubeSync | None:
    """With ``allocator.kube_api`` set, reconcile this node's intents and publish its state;
    None in the standalone default (no API, nothing started). Raises ValueError on a bad mode."""
    found = connect(
        "allocator", settings.get_str("kube_api", "standalone"), settings.get_str("kubeconfig", "")
    )
    if found is None:
        return None
    api_client, description = found
    timeout = settings.get_float("api_timeout_s", 5.0)
    reconciler = IntentReconciler(api_client, loop.store, settings.node_name, lanes, timeout)
    config = PublishConfig(
        status_interval_s=settings.get_float("status_interval_s", 1.0),
        status_min_interval_s=settings.get_float("status_min_interval_s", 5.0),
        status_writes_per_s=settings.get_float("status_writes_per_s", 10.0),
        state_min_interval_s=settings.get_float("state_min_interval_s", 1.0),
        state_heartbeat_s=settings.get_float("state_heartbeat_s", 10.0),
    )
    publisher = StatusPublisher(api_client, loop, reconciler, settings.node_name, config, timeout)
    reconciler.start()
    publisher.start()
    return KubeSync(reconciler, publisher, description)
