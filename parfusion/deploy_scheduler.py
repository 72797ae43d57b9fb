"""The second kube-scheduler (profile ``parfusion-scheduler``, calling the extender) and the
RBAC of every PARFusion workload: exactly the API calls each one makes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from parfusion.crds import CRD_GROUP
from parfusion.deploy_objects import (
    NAMESPACE,
    NODE_WORKLOAD,
    cluster_binding,
    deployment_of,
    object_meta,
    pod_template,
    service_host,
    workload_name,
)
from parfusion.services import BY_NAME

SCHEDULER_NAME = "parfusion-scheduler"
KUBE_SCHEDULER_IMAGE = "registry.k8s.io/kube-scheduler:v1.31.2"
SCHEDULER_CONFIG_PATH = "/etc/kubernetes/parfusion-scheduler/config.yaml"


def extender_url() -> str:
    return f"http://{service_host('extender')}:{BY_NAME['extender'].port}"


def account_with_role(name: str, rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": object_meta(name, name)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": object_meta(name, name, namespaced=False),
            "rules": rules,
        },
        cluster_binding(name, name, name),
    ]


def rbac_rule(group: str, resources: list[str], verbs: list[str]) -> dict[str, Any]:
    return {"apiGroups": [group], "resources": resources, "verbs": verbs}


def extender_rbac() -> list[dict[str, Any]]:
    """Exactly the calls the extender makes: the three watches of nodestates.py and /bind."""
    return account_with_role(
        workload_name("extender"),
        [
            rbac_rule("", ["nodes", "pods"], ["list", "watch"]),
            rbac_rule("", ["pods/binding"], ["create"]),
            rbac_rule(CRD_GROUP, ["nodeintentstates"], ["list", "watch"]),
        ],
    )


def node_rbac() -> list[dict[str, Any]]:
    """Exactly the calls a node's allocator makes (services/allocator/kube.py, kubestatus.py):
    watch its ResourceIntents and pods, patch their status, create and patch its state."""
    return account_with_role(
        NODE_WORKLOAD,
        [
            rbac_rule("", ["pods"], ["list", "watch"]),
            rbac_rule(CRD_GROUP, ["resourceintents"], ["list", "watch"]),
            rbac_rule(CRD_GROUP, ["resourceintents/status"], ["patch"]),
            rbac_rule(CRD_GROUP, ["nodeintentstates"], ["create"]),
            rbac_rule(CRD_GROUP, ["nodeintentstates/status"], ["patch"]),
        ],
    )


def scheduler_configuration() -> dict[str, Any]:
    """The second scheduler's KubeSchedulerConfiguration: the default plugins plus the extender."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {
            "leaderElect": True,
            "resourceName": SCHEDULER_NAME,
            "resourceNamespace": NAMESPACE,
        },
        "profiles": [{"schedulerName": SCHEDULER_NAME}],
        "extenders": [
            {
                "urlPrefix": extender_url(),
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "preemptVerb": "preempt",
                "bindVerb": "bind",
                # Extender scores 0..10 are scaled by weight * (100 / 10) next to the plugins'.
                "weight": 5,
                "enableHTTPS": False,
                "httpTimeout": "2s",
                # NodeNames instead of full Node objects: the extender keeps its own node view.
                "nodeCacheCapable": True,
                # Empty: this scheduler only serves pods that opted in with
                # schedulerName: parfusion-scheduler, and every one of them is sent (a pod
                # without an intent passes through). A non-empty list would skip pods that
                # request none of its resources, CPU-only intents included.
                "managedResources": [],
                # GPU-lane and deadline checks must hold: no silent fallback when unreachable.
                "ignorable": False,
            }
        ],
    }


def scheduler_manifests() -> list[dict[str, Any]]:
    name = SCHEDULER_NAME
    config_name = f"{name}-config"
    container = {
        "name": "kube-scheduler",
        "image": KUBE_SCHEDULER_IMAGE,
        "command": ["kube-scheduler", f"--config={SCHEDULER_CONFIG_PATH}", "--v=2"],
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": 10259, "scheme": "HTTPS"},
            "initialDelaySeconds": 15,
        },
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": 10259, "scheme": "HTTPS"}},
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "allowPrivilegeEscalation": False,
        },
        "volumeMounts": [
            {
                "name": "config",
                "mountPath": str(Path(SCHEDULER_CONFIG_PATH).parent),
                "readOnly": True,
            }
        ],
    }
    template = pod_template(name, [container], account=name)
    template["spec"]["volumes"] = [{"name": "config", "configMap": {"name": config_name}}]
    rbac_api = "rbac.authorization.k8s.io/v1"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": object_meta(name, name)},
        cluster_binding(f"{name}-as-kube-scheduler", "system:kube-scheduler", name),
        cluster_binding(f"{name}-as-volume-scheduler", "system:volume-scheduler", name),
        {
            "apiVersion": rbac_api,
            "kind": "RoleBinding",
            "metadata": {**object_meta(f"{name}-auth-reader", name), "namespace": "kube-system"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "extension-apiserver-authentication-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}],
        },
        {
            "apiVersion": rbac_api,
            "kind": "Role",
            "metadata": object_meta(f"{name}-leader-election", name),
            "rules": [
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "verbs": ["create"],
                },
                {
                    "apiGroups": ["coordination.k8s.io"],
                    "resources": ["leases"],
                    "resourceNames": [name],
                    "verbs": ["get", "update"],
                },
            ],
        },
        {
            "apiVersion": rbac_api,
            "kind": "RoleBinding",
            "metadata": object_meta(f"{name}-leader-election", name),
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": f"{name}-leader-election",
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NAMESPACE}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": object_meta(config_name, name),
            "data": {
                Path(SCHEDULER_CONFIG_PATH).name: yaml.safe_dump(
                    scheduler_configuration(), sort_keys=False
                )
            },
        },
        deployment_of(name, template),
    ]
