"""This node's ResourceIntents and intent-carrying pods, reconciled into the intent store.

With API access (``allocator.kube_api``: ``incluster`` or ``kubeconfig``) the allocator of node
N list-watches two things (services/common/kube.py):

* ResourceIntent objects whose ``spec.node`` is N (a field selector the CRD makes selectable).
  A ResourceIntent names its node in ``spec.node``; one that names none is adopted by no
  allocator (docs/kubernetes.md: such an object is a template; put the intent on the workload's
  pods to have it follow them);
* pods bound to N (``spec.nodeName=N``) that carry an intent (the ``parfusion.io/intent``
  annotation or ``parfusion.io/*`` labels, read by services/core/podintent.py).

Each becomes a stored intent whose id is the object's UID (what the extender calls a pod's
intent too) and which carries the label ``parfusion.io/source=kubernetes``; it is replaced when
the object's intent changes and deleted when the object goes (or the pod finishes). After every
(re-)list, stored intents with that label and no object are deleted, so a restart catches up
with deletions it missed. Invalid ResourceIntents are not adopted; kubestatus.py writes their
validation error into their status. Intents submitted over gRPC are never touched.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import msgspec

from parfusion.v1 import intent_pb2
from services.allocator.store import IntentStore, content_key
from services.common.errors import DomainError, NotFound
from services.common.kube import Informer, ObjectMeta, PodHead, ResourcePath
from services.core.convert import intent_from_document
from services.core.podintent import intent_name, pod_intent, pod_intent_message
from services.core.validation import normalize_intent

log = logging.getLogger(__name__)

GROUP, VERSION = "parfusion.io", "v1"
SOURCE_LABEL = "parfusion.io/source"
SOURCE_VALUE = "kubernetes"


class ResourceIntentObject(msgspec.Struct):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: dict[str, Any] = msgspec.field(default_factory=dict)
    status: dict[str, Any] | None = None


@dataclass(frozen=True)
class Adopted:
    """One ResourceIntent as the reconciler left it: its intent id, or why it was refused."""

    namespace: str
    name: str
    uid: str
    generation: int
    error: str = ""  # validation message; the intent is not in the store


def resource_intent(obj: ResourceIntentObject, node: str, lanes: tuple[str, ...]) -> Any:
    """The stored form of a ResourceIntent object (raises InvalidArgument naming the field)."""
    doc = {**obj.spec, "id": obj.metadata.uid}
    doc.setdefault("name", intent_name(obj.metadata.name))
    intent = intent_from_document(doc)
    intent.labels[SOURCE_LABEL] = SOURCE_VALUE
    return normalize_intent(intent, known_lanes=lanes, default_node=node)


def pod_resident(obj: PodHead, node: str, lanes: tuple[str, ...]) -> Any | None:
    """The stored form of a bound pod's intent; None when it carries none or has finished (an
    invalid intent is not adopted either: the extender refuses to place such a pod)."""
    if obj.finished:
        return None
    intent = pod_intent_message(pod_intent(obj.metadata))
    if intent is None:
        return None
    intent.labels[SOURCE_LABEL] = SOURCE_VALUE
    try:
        return normalize_intent(intent, known_lanes=lanes, default_node=node)
    except DomainError:
        return None


class IntentReconciler:
    """Keeps the store's Kubernetes-sourced intents equal to this node's objects."""

    def __init__(
        self,
        api_client: Any,
        store: IntentStore,
        node: str,
        lanes: tuple[str, ...] = (),
        timeout_s: float = 5.0,
    ) -> None:
        self.store = store
        self.node = node
        self.lanes = lanes
        self._lock = threading.Lock()  # one reconcile at a time (two informer threads)
        self.resource_intents: dict[str, Adopted] = {}  # namespace/name -> adopted
        self._pods: dict[str, str] = {}  # namespace/name -> intent id
        self._synced_pods = False
        self._synced_intents = False
        self.informers: list[Informer[Any]] = [
            Informer(
                api_client,
                ResourcePath(
                    f"/apis/{GROUP}/{VERSION}/resourceintents", field_selector=f"spec.node={node}"
                ),
                ResourceIntentObject,
                self._sync_intents,
                self._intent_event,
                name="resourceintents",
                timeout_s=timeout_s,
            ),
            Informer(
                api_client,
                ResourcePath("/api/v1/pods", field_selector=f"spec.nodeName={node}"),
                PodHead,
                self._sync_pods,
                self._pod_event,
                name="pods",
                timeout_s=timeout_s,
            ),
        ]

    def start(self) -> None:
        for informer in self.informers:
            informer.start()

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()

    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    # --- ResourceIntents ---------------------------------------------------------------------

    def _adopt(self, obj: ResourceIntentObject) -> Adopted:
        """Store the object's intent (or remove it when invalid); what the publisher reports."""
        meta = obj.metadata
        try:
            intent = resource_intent(obj, self.node, self.lanes)
        except DomainError as exc:
            self._remove(meta.uid)
            return Adopted(meta.namespace, meta.name, meta.uid, meta.generation, error=str(exc))
        self._ensure(intent)
        return Adopted(meta.namespace, meta.name, meta.uid, meta.generation)

    def _sync_intents(self, objects: dict[str, ResourceIntentObject]) -> None:
        with self._lock:
            # built aside, then swapped: the publisher's thread reads this dict
            self.resource_intents = {key: self._adopt(obj) for key, obj in objects.items()}
            self._synced_intents = True
            self._collect()

    def _intent_event(self, kind: str, key: str, obj: ResourceIntentObject) -> None:
        with self._lock:
            if kind == "DELETED" or obj.spec.get("node") != self.node:
                remaining = dict(self.resource_intents)
                gone = remaining.pop(key, None)
                self.resource_intents = remaining
                self._remove(gone.uid if gone else obj.metadata.uid)
            else:
                self.resource_intents = {**self.resource_intents, key: self._adopt(obj)}

    # --- pods --------------------------------------------------------------------------------

    def _take_pod(self, key: str, obj: PodHead) -> None:
        intent = pod_resident(obj, self.node, self.lanes)
        if intent is None:
            gone = self._pods.pop(key, None)
            if gone:
                self._remove(gone)
            return
        self._ensure(intent)
        self._pods[key] = intent.id

    def _sync_pods(self, objects: dict[str, PodHead]) -> None:
        with self._lock:
            self._pods = {}
            for key, obj in objects.items():
                self._take_pod(key, obj)
            self._synced_pods = True
            self._collect()

    def _pod_event(self, kind: str, key: str, obj: PodHead) -> None:
        with self._lock:
            if kind == "DELETED" or obj.spec.nodeName != self.node:
                gone = self._pods.pop(key, None)
                if gone:
                    self._remove(gone)
            else:
                self._take_pod(key, obj)

    # --- the store ---------------------------------------------------------------------------

    def _ensure(self, intent: intent_pb2.ResourceIntent) -> None:
        """Stored as given: submitted, or replaced when the stored content differs."""
        try:
            existing = self.store.get(intent.id)
        except NotFound:
            existing = None
        if existing is not None:
            if content_key(existing) == content_key(intent):
                return
            self.store.delete(intent.id)
        self.store.submit(intent)
        log.info("intent adopted", extra={"id": intent.id, "name": intent.name})

    def _remove(self, intent_id: str) -> None:
        try:
            self.store.delete(intent_id)
            log.info("intent dropped", extra={"id": intent_id})
        except NotFound:
            pass

    def _collect(self) -> None:
        """After both lists: drop Kubernetes-sourced intents whose object is gone."""
        if not (self._synced_intents and self._synced_pods):
            return
        live = {a.uid for a in self.resource_intents.values() if not a.error}
        live |= set(self._pods.values())
        for stored in self.store.list_intents():
            labels = stored.intent.labels
            if labels.get(SOURCE_LABEL) == SOURCE_VALUE and stored.intent.id not in live:
                self._remove(stored.intent.id)
