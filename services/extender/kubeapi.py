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
from urllib.parse import quote

from services.common import kube

log = logging.getLogger(__name__)

MODES = kube.MODES


@dataclass
class KubeApi:
    """The extender's API access: its Bindings, and the client the watches share."""

    api_client: Any  # kubernetes.client.ApiClient
    timeout_s: float
    description: str

    def bind(self, namespace: str, pod: str, uid: str, node: str) -> None:
        """POST pods/<pod>/binding, the subresource kube-scheduler's DefaultBinder uses (raises ApiException)."""
        metadata: dict[str, str] = {"name": pod, "namespace": namespace}
        if uid:
            metadata["uid"] = uid  # the API refuses the binding if the pod was replaced
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(pod, safe='')}/binding"
        reply = kube.request(self.api_client, "POST", path, timeout=self.timeout_s, body=body)
        # read and released, or urllib3 never gets the connection back and every bind pays a
        # new TLS handshake (4-5 ms of CPU per bind against about 1 ms when the connection is kept)
        reply.read()
        reply.release_conn()


def connect(mode: str, kubeconfig: str = "", timeout_s: float = 5.0) -> KubeApi | None:
    """The API for ``mode``; None for standalone. Raises ValueError on an unknown mode."""
    found = kube.connect("extender", mode, kubeconfig)
    if found is None:
        return None
    api_client, description = found
    return KubeApi(api_client=api_client, timeout_s=timeout_s, description=description)


api_error_message = kube.api_error_message
