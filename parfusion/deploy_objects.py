"""The building blocks of PARFusion's Kubernetes objects: names, labels, metadata, pod
templates, Deployments and ClusterRoleBindings, shared by the workloads (deploy.py) and the
RBAC and second scheduler (deploy_scheduler.py)."""

from __future__ import annotations

from typing import Any

NAMESPACE = "parfusion-system"
PART_OF = "parfusion"
NODE_SERVICES = ("allocator", "nodeagent", "gpulane")
NODE_WORKLOAD = "parfusion-node"


def workload_name(service: str) -> str:
    return NODE_WORKLOAD if service in NODE_SERVICES else f"parfusion-{service}"


def service_host(service: str) -> str:
    """The in-cluster DNS name other pods use for a service."""
    return f"{workload_name(service)}.{NAMESPACE}.svc"


def component_labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": component, "app.kubernetes.io/part-of": PART_OF}


def object_meta(name: str, component: str, namespaced: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": component_labels(component)}
    if namespaced:
        meta["namespace"] = NAMESPACE
    return meta


def data_volumes() -> list[dict[str, Any]]:
    return [{"name": d, "emptyDir": {}} for d in ("run", "logs", "results")]


def pod_template(
    component: str, containers: list[dict[str, Any]], account: str | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers, "volumes": data_volumes()}
    if account:
        spec["serviceAccountName"] = account
    else:
        spec["automountServiceAccountToken"] = False
    return {"metadata": {"labels": component_labels(component)}, "spec": spec}


def deployment_of(name: str, template: dict[str, Any], replicas: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(name, name),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": component_labels(name)},
            "template": template,
        },
    }


def cluster_binding(name: str, role: str, account: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": object_meta(name, account, namespaced=False),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}],
    }
