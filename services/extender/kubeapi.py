"""API access for the extender: Bindings and the node list, through the official kubernetes client.

``kube_api`` in the extender's settings picks the mode: ``standalone`` (default: no API, binds are
recorded in the extender's state only), ``incluster`` (the pod's service account) or
``kubeconfig`` (the file in ``kubeconfig``, else $KUBECONFIG / ~/.kube/config). Every call
carries a timeout; the client is synchronous, so callers run it in a worker thread.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import msgspec

from .protocol import NodeHead

log = logging.getLogger(__name__)

MODES = ("standalone", "incluster", "kubeconfig")


class _NodeListHeads(msgspec.Struct):
    items: list[NodeHead] | None = None


_node_list = msgspec.json.Decoder(_NodeListHeads)


@dataclass
class KubeApi:
    """A thin wrapper over CoreV1Api for the two calls the extender makes."""

    core: Any  # kubernetes.client.CoreV1Api
    timeout_s: float
    description: str

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
        # V1Binding; the raw response is enough to know it succeeded.
        self.core.create_namespaced_pod_binding(
            pod, namespace, body, _preload_content=False, _request_timeout=self.timeout_s
        )

    def list_nodes(self) -> list[NodeHead]:
        response = self.core.list_node(_preload_content=False, _request_timeout=self.timeout_s)
        return _node_list.decode(response.data).items or []


def connect(mode: str, kubeconfig: str = "", timeout_s: float = 5.0) -> KubeApi | None:
    """The API for ``mode``; None for standalone. Raises ValueError on an unknown mode."""
    if mode not in MODES:
        raise ValueError(f"extender.kube_api must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "standalone":
        return None
    from kubernetes import client, config

    if mode == "incluster":
        config.load_incluster_config()
        api_client = client.ApiClient()
        description = "in-cluster service account"
    else:
        api_client = config.new_client_from_config(config_file=kubeconfig or None)
        description = f"kubeconfig {kubeconfig or '(default)'}"
    log.info("kubernetes API access", extra={"mode": mode, "via": description})
    return KubeApi(core=client.CoreV1Api(api_client), timeout_s=timeout_s, description=description)


def api_error_message(exc: Exception) -> str:
    """A one-line reason from an ApiException (status, reason and the Status message)."""
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None)
    body = getattr(exc, "body", None)
    detail = ""
    if body:
        try:
            detail = msgspec.json.decode(body).get("message", "")
        except (msgspec.DecodeError, AttributeError):
            detail = str(body)[:200]
    if status is None:
        return f"{type(exc).__name__}: {exc}"
    return f"API {status} {reason or ''}: {detail}".strip()
