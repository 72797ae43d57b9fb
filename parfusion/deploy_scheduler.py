"""The second kube-scheduler (profile ``parfusion-scheduler``, calling the extender), the
admission policy that marks the pods it must send to the extender, and the RBAC of every
PARFusion workload: exactly the API calls each one makes."""

from __future__ import annotations

import json
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
from services.core.podintent import ANNOTATION, LABEL_PREFIX, MARKER

SCHEDULER_NAME = "parfusion-scheduler"
KUBE_SCHEDULER_IMAGE = "registry.k8s.io/kube-scheduler:v1.31.2"
SCHEDULER_CONFIG_PATH = "/etc/kubernetes/parfusion-scheduler/config.yaml"
MARKER_POLICY = "parfusion-intent-marker"


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
                # Called only for pods that request the marker, which the admission policy
                # (marker_policy) adds to every pod of this profile that carries an intent: for
                # a pod without one the extender's answer was a no-op. No node advertises the
                # marker, so kube-scheduler's own resource fit must ignore it.
                "managedResources": [{"name": MARKER, "ignoredByScheduler": True}],
                # GPU-lane and deadline checks must hold: no silent fallback when unreachable.
                "ignorable": False,
            }
        ],
    }


def _cel(text: str) -> str:
    return json.dumps(text)  # a CEL string literal (same escapes as JSON for these names)


def marker_policy() -> list[dict[str, Any]]:
    """A MutatingAdmissionPolicy (admissionregistration.k8s.io/v1, CEL in kube-apiserver, no
    webhook) and its binding: a pod created for ``parfusion-scheduler`` that carries an intent
    (what services/core/podintent.py reads as present: the annotation, or any ``parfusion.io/``
    label) gets ``MARKER: "1"`` in its first container's requests and limits, unless a container
    already requests or limits it. The other pods are left exactly as they are."""
    marker = _cel(MARKER)
    # kube-scheduler's test for "requests a managed resource": any container or init container
    # naming it in requests or limits
    marked = (
        f"c, {marker} in c.?resources.?requests.orValue({{}}) ||\n"
        f"  {marker} in c.?resources.?limits.orValue({{}})"
    )
    conditions = {
        "for-parfusion-scheduler": (
            f'object.spec.?schedulerName.orValue("") == {_cel(SCHEDULER_NAME)}\n'
        ),
        "carries-an-intent": (
            f"{_cel(ANNOTATION)} in object.metadata.?annotations.orValue({{}}) ||\n"
            f"object.metadata.?labels.orValue({{}}).exists(k, k.startsWith({_cel(LABEL_PREFIX)}))\n"
        ),
        # (no container: a list index would fail; API validation refuses the pod after us)
        "not-marked-yet": (
            f"size(object.spec.containers) > 0 &&\n"
            f"!object.spec.containers.exists({marked}) &&\n"
            f"!object.spec.?initContainers.orValue([]).exists({marked})\n"
        ),
    }
    # an extended resource's request must equal its limit (API validation), so both are set;
    # containers merge by name, so this touches the first container's resources only
    mark = (
        "Object{spec: Object.spec{containers: [Object.spec.containers{\n"
        "  name: object.spec.containers[0].name,\n"
        "  resources: Object.spec.containers.resources{\n"
        f'    requests: {{{marker}: "1"}},\n'
        f'    limits: {{{marker}: "1"}}\n'
        "  }\n"
        "}]}}\n"
    )
    api = "admissionregistration.k8s.io/v1"
    meta = object_meta(MARKER_POLICY, SCHEDULER_NAME, namespaced=False)
    return [
        {
            "apiVersion": api,
            "kind": "MutatingAdmissionPolicy",
            "metadata": meta,
            "spec": {
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                        }
                    ]
                },
                "matchConditions": [{"name": n, "expression": e} for n, e in conditions.items()],
                # a pod with an intent that cannot be marked must not be placed without the
                # extender (the extender's ignorable: false, likewise)
                "failurePolicy": "Fail",
                "reinvocationPolicy": "Never",
                "mutations": [
                    {
                        "patchType": "ApplyConfiguration",
                        "applyConfiguration": {"expression": mark},
                    }
                ],
            },
        },
        {
            "apiVersion": api,
            "kind": "MutatingAdmissionPolicyBinding",
            "metadata": meta,
            "spec": {"policyName": MARKER_POLICY},
        },
    ]


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
