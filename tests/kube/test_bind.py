"""The extender's Binding through the official client against the real API server: the pods
are bound, and one kept-alive connection carries every bind (an unreleased response would cost
a new TLS handshake per pod: docs/performance.md, "What the extender costs a real
kube-scheduler")."""

from __future__ import annotations

import pytest

from services.extender.kubeapi import connect
from tests.kube.conftest import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def test_binds_reuse_one_connection(cluster: Cluster) -> None:
    names = [f"bind-reuse-{i}" for i in range(5)]
    cluster.plane.apply(
        *(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                # no scheduler serves this name: only the binds below place the pods
                "spec": {
                    "schedulerName": "nobody",
                    "containers": [{"name": "main", "image": "registry.invalid/none:0"}],
                },
            }
            for name in names
        )
    )
    api = connect("kubeconfig", cluster.plane.kubeconfig)
    assert api is not None
    try:
        for name in names:
            api.bind("default", name, "", "node-a")
        for name in names:
            assert cluster.plane.get("pod", name)["spec"]["nodeName"] == "node-a"
        pools = api.api_client.rest_client.pool_manager.pools
        # urllib3's pool container refuses plain iteration (not thread-safe); keys() copies
        opened = sum(pools[key].num_connections for key in pools.keys())  # noqa: SIM118
        assert opened == 1, f"{opened} connections for {len(names)} binds"
    finally:
        api.api_client.close()
        cluster.plane.kubectl("delete", "pod", *names, "--wait=false", check=False)
