"""API access for the extender: Bindings (and the client the watches of nodestates.py share), through the official kubernetes client.

``kube_api`` in the extender's settings picks the mode: ``standalone`` (default: no API, binds are
recorded in the extender's state only), ``incluster`` (the pod's service account) or
``kubeconfig`` (the file in ``kubeconfig``, else $KUBECONFIG / ~/.kube/config). Every call
carries a timeout; the client is synchronous, so callers run it in a worker thread.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from services.common import kube

log = logging.getLogger(__name__)

MODES = kube.MODES


@dataclass
class KubeApi:
    """A thin wrapper over CoreV1Api for the two calls the extender makes."""

    core: Any  # kubernetes.client.CoreV1Api
    timeout_s: float
    description: str
    api_client: Any = None  # kubernetes.client.ApiClient, for the watches (nodestates.py)

    def bind(self, namespace: str, pod: str, uid: str, node: str) -> None:
        """POST pods/<pod>/binding, the subresource kube-scheduler's DefaultBinder uses (raises ApiException)."""
        from kubernetes import client

        body = client.V1Binding(
            api_version="v1",
            kind="Binding",
            metadata=client.V1ObjectMeta(name=pod, namespace=namespace, uid=uid or None),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        # The API answers with a Status, which the generated model cannot deserialise as a
        # V1Binding; the raw response is enough to know it succeeded. Read and released, or
        # urllib3 never gets the connection back and every bind pays a new TLS handshake (4-5
        # ms of CPU per bind against about 1 ms when the connection is kept).
        reply = self.core.create_namespaced_pod_binding(
            pod, namespace, body, _preload_content=False, _request_timeout=self.timeout_s
        )
        reply.read()
        reply.release_conn()


def connect(mode: str, kubeconfig: str = "", timeout_s: float = 5.0) -> KubeApi | None:
    """The API for ``mode``; None for standalone. Raises ValueError on an unknown mode."""
    found = kube.connect("extender", mode, kubeconfig)
    if found is None:
        return None
    from kubernetes import client

    api_client, description = found
    return KubeApi(
        core=client.CoreV1Api(api_client),
        timeout_s=timeout_s,
        description=description,
        api_client=api_client,
    )


api_error_message = kube.api_error_message
