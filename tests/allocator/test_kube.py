"""The reconciler's bookkeeping between watch events and the store (the watches themselves run
against the real API server in tests/kube)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from parfusion.v1 import intent_pb2
from services.allocator.kube import SOURCE_LABEL, IntentReconciler, ResourceIntentObject
from services.allocator.store import IntentStore
from services.common.kube import PodHead

ONLINE = {"workloadClass": "ONLINE", "slo": {"deadlineMs": 40}, "parallelism": {"max": 4}}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[IntentStore]:
    s = IntentStore(tmp_path / "intents.db")
    yield s
    s.close()


def _ri(name: str, uid: str, spec: dict[str, Any], generation: int = 1) -> ResourceIntentObject:
    meta = {"name": name, "namespace": "default", "uid": uid, "generation": generation}
    return msgspec.convert({"metadata": meta, "spec": spec}, ResourceIntentObject)


def _pod(name: str, uid: str, node: str, phase: str = "Pending", intent: Any = ONLINE) -> PodHead:
    meta: dict[str, Any] = {"name": name, "namespace": "default", "uid": uid}
    if intent is not None:
        meta["annotations"] = {"parfusion.io/intent": json.dumps(intent)}
    doc = {"metadata": meta, "spec": {"nodeName": node}, "status": {"phase": phase}}
    return msgspec.convert(doc, PodHead)


def _ids(store: IntentStore) -> set[str]:
    return {s.intent.id for s in store.list_intents()}


def test_objects_become_intents_and_leave_with_them(store: IntentStore) -> None:
    rec = IntentReconciler(None, store, "n1")
    own = intent_pb2.ResourceIntent(id="grpc-submitted", name="mine")
    own.workload_class = intent_pb2.WORKLOAD_CLASS_BATCH
    store.submit(own)  # submitted over gRPC: never touched
    rec._sync_intents({"default/web": _ri("web", "u-web", {**ONLINE, "node": "n1"})})
    rec._sync_pods({"default/p": _pod("p", "u-pod", "n1")})
    assert _ids(store) == {"grpc-submitted", "u-web", "u-pod"}
    stored = store.get("u-web")
    assert stored.node == "n1" and stored.labels[SOURCE_LABEL] == "kubernetes"

    # a new generation replaces the stored intent; an invalid one removes it and says why
    rec._intent_event("MODIFIED", "default/web", _ri("web", "u-web", {**ONLINE, "node": "n1",
                                                                     "priority": 900}, 2))  # fmt: skip
    assert store.get("u-web").priority == 900
    rec._intent_event("MODIFIED", "default/web", _ri("web", "u-web", {"workloadClass": "ONLINE",
                                                                     "node": "n1"}, 3))  # fmt: skip
    assert "u-web" not in _ids(store)
    assert "deadline_ms" in rec.resource_intents["default/web"].error
    # moved to another node, deleted, finished: gone
    rec._intent_event("MODIFIED", "default/web", _ri("web", "u-web", {**ONLINE, "node": "n2"}))
    assert "default/web" not in rec.resource_intents
    rec._pod_event("MODIFIED", "default/p", _pod("p", "u-pod", "n1", phase="Succeeded"))
    assert _ids(store) == {"grpc-submitted"}


def test_a_relist_drops_what_went_while_nobody_watched(store: IntentStore) -> None:
    first = IntentReconciler(None, store, "n1")
    first._sync_intents({"default/a": _ri("a", "u-a", {**ONLINE, "node": "n1"})})
    first._sync_pods({"default/p": _pod("p", "u-p", "n1"), "default/q": _pod("q", "u-q", "n1")})
    assert _ids(store) == {"u-a", "u-p", "u-q"}
    # a restart: the objects a and q were deleted meanwhile; nothing is dropped until both lists
    again = IntentReconciler(None, store, "n1")
    again._sync_intents({})
    assert _ids(store) == {"u-a", "u-p", "u-q"}
    again._sync_pods({"default/p": _pod("p", "u-p", "n1")})
    assert _ids(store) == {"u-p"}


def test_pods_without_an_intent_or_elsewhere_are_ignored(store: IntentStore) -> None:
    rec = IntentReconciler(None, store, "n1")
    rec._sync_pods(
        {
            "default/plain": _pod("plain", "u-1", "n1", intent=None),
            "default/bad": _pod("bad", "u-2", "n1", intent={"workloadClass": "ONLINE"}),
        }
    )
    rec._pod_event("ADDED", "default/other", _pod("other", "u-3", "n2"))
    assert _ids(store) == set()
