"""services/common/kube.py's list + watch against the real API server."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from services.common.kube import Informer, ResourcePath, connect
from services.extender.nodestates import NodeIntentStateObject
from tests.kube.conftest import NODES, Cluster, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_an_expired_resource_version_relists_and_events_follow(cluster: Cluster) -> None:
    found = connect("test", "kubeconfig", cluster.plane.kubeconfig)
    assert found is not None
    syncs: list[set[str]] = []
    events: list[tuple[str, str]] = []
    lock = threading.Lock()

    def on_event(kind: str, key: str, _obj: Any) -> None:
        with lock:
            events.append((kind, key))

    informer = Informer(
        found[0],
        ResourcePath("/apis/parfusion.io/v1/nodeintentstates"),
        NodeIntentStateObject,
        lambda objects: syncs.append(set(objects)),
        on_event,
        name="test-nodes",
    )
    informer.resource_version = "1"  # long compacted out of the watch cache: 410 Gone
    informer.start()
    try:
        wait_for(lambda: syncs, "the re-list after 410 Gone")
        assert set(NODES) <= syncs[0] and informer.errors == 0
        # the allocators' heartbeats arrive as watch events
        wait_for(lambda: ("MODIFIED", "node-b") in events, "node-b's heartbeat as a watch event")
    finally:
        informer.stop()
