"""Realistic core/v1 Node and Pod objects: the packaged sample nodes, smoke requests, benchmarks.

The shapes follow what the API server returns for a kubelet-registered node (labels, addresses,
capacity/allocatable, conditions, nodeInfo, an image list) so that request sizes and decode
costs match a real cluster. The sample nodes join the extender's node view only when it runs
with ``sample_nodes: true`` / ``--sample-nodes`` (standalone demos, no cluster).
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from .nodeview import LANE_LABEL
from .podintent import ANNOTATION

# name, CPU cores, {lane: GPU count}
SAMPLE_NODES: tuple[tuple[str, int, dict[str, int]], ...] = (
    ("gpu-node-a", 64, {"online": 2, "batch": 4, "robot": 1, "urgent": 1}),
    ("gpu-node-b", 32, {"online": 2}),
    ("cpu-node-c", 32, {}),
    ("edge-node-d", 8, {"robot": 1}),
)

_IMAGES = (
    "registry.k8s.io/kube-proxy:v1.31.2",
    "registry.k8s.io/pause:3.10",
    "nvcr.io/nvidia/k8s-device-plugin:v0.16.2",
    "ghcr.io/parfusion/parfusion:0.1.0",
    "docker.io/library/python:3.11-slim",
    "nvcr.io/nvidia/tritonserver:24.09-py3",
    "docker.io/calico/node:v3.28.1",
    "docker.io/calico/cni:v3.28.1",
)


def node_object(
    name: str, cpu: int, lanes: dict[str, int] | None = None, *, index: int = 0, ready: bool = True
) -> dict[str, Any]:
    lanes = lanes or {}
    gpus = sum(lanes.values())
    labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": f"p5.{cpu}xlarge" if gpus else f"c7i.{cpu}xlarge",
        "topology.kubernetes.io/region": "eu-west-1",
        "topology.kubernetes.io/zone": f"eu-west-1{'abc'[index % 3]}",
    }
    labels.update({f"{LANE_LABEL}{lane}": str(count) for lane, count in lanes.items()})
    capacity = {
        "cpu": str(cpu),
        "ephemeral-storage": "488245288Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": f"{cpu * 8 * 1024 * 1024}Ki",
        "pods": "110",
    }
    if gpus:
        capacity["nvidia.com/gpu"] = str(gpus)
    allocatable = dict(
        capacity, cpu=f"{cpu * 1000 - 90}m", memory=f"{cpu * 8 * 1024 * 1024 - 358400}Ki"
    )
    octet = index % 250 + 1
    return {
        "metadata": {
            "name": name,
            "uid": f"8c0f1d2e-{index:04x}-4b6a-9e7d-{index:012x}",
            "resourceVersion": str(100_000 + index),
            "creationTimestamp": "2026-11-30T08:00:00Z",
            "labels": labels,
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd/containerd.sock",
            },
        },
        "spec": {"podCIDR": f"10.244.{octet}.0/24", "podCIDRs": [f"10.244.{octet}.0/24"]},
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": [
                _condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                _condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                _condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                _condition("Ready", "True" if ready else "False", "KubeletReady"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": f"10.0.{index // 250}.{octet}"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": f"{index:032x}",
                "systemUUID": f"ec2{index:05x}-0000-0000-0000-000000000000",
                "bootID": f"b00{index:05x}-0000-0000-0000-000000000000",
                "kernelVersion": "6.8.0-1015-aws",
                "osImage": "Ubuntu 24.04.1 LTS",
                "containerRuntimeVersion": "containerd://1.7.22",
                "kubeletVersion": "v1.31.2",
                "kubeProxyVersion": "v1.31.2",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": [
                {
                    "names": [f"{image}@sha256:{(index * 7 + k):064x}", image],
                    "sizeBytes": 30_000_000 + k * 1_000_003,
                }
                for k, image in enumerate(_IMAGES)
            ],
        },
    }


def _condition(kind: str, status: str, reason: str) -> dict[str, str]:
    return {
        "type": kind,
        "status": status,
        "lastHeartbeatTime": "2026-12-02T16:00:00Z",
        "lastTransitionTime": "2026-11-30T08:00:00Z",
        "reason": reason,
        "message": f"kubelet {reason}",
    }


def sample_node_objects() -> list[dict[str, Any]]:
    return [
        node_object(name, cpu, lanes, index=i) for i, (name, cpu, lanes) in enumerate(SAMPLE_NODES)
    ]


def cluster_node_objects(count: int, seed_offset: int = 0) -> list[dict[str, Any]]:
    """``count`` nodes mixing the sample shapes (for benchmarks and tests at scale)."""
    out = []
    for i in range(count):
        _, cpu, lanes = SAMPLE_NODES[(i + seed_offset) % len(SAMPLE_NODES)]
        out.append(node_object(f"node-{i:05d}", cpu, lanes, index=i))
    return out


def pod_object(
    name: str,
    *,
    namespace: str = "default",
    uid: str = "",
    intent: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    cpu: str = "500m",
    memory: str = "512Mi",
) -> dict[str, Any]:
    annotations = {"kubectl.kubernetes.io/last-applied-configuration": "{}"}
    if intent is not None:
        annotations[ANNOTATION] = json.dumps(intent, separators=(",", ":"))
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid
            or f"5d3c7a10-0000-4000-8000-{zlib.crc32((namespace + '/' + name).encode()):012d}",
            "resourceVersion": "4242",
            "creationTimestamp": "2026-12-02T16:30:00Z",
            "labels": {"app": name.rsplit("-", 1)[0], **(labels or {})},
            "annotations": annotations,
        },
        "spec": {
            "schedulerName": "parfusion-scheduler",
            "containers": [
                {
                    "name": "main",
                    "image": "ghcr.io/parfusion/parfusion:0.1.0",
                    "resources": {
                        "requests": {"cpu": cpu, "memory": memory},
                        "limits": {"cpu": cpu, "memory": memory},
                    },
                    "terminationMessagePath": "/dev/termination-log",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "priority": 0,
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            ],
        },
        "status": {"phase": "Pending", "qosClass": "Guaranteed"},
    }


ONLINE_INTENT: dict[str, Any] = {
    "name": "detector",
    "workload_class": "ONLINE",
    "priority": 700,
    "slo": {"deadline_ms": 40},
    "parallelism": {"min": 2, "max": 8},
    "speedup": {"parallel_fraction": 0.9, "base_service_ms": 60},
    "demand": {"arrival_rate_per_s": 20},
    "gpu": {"lane": "online", "share": 0.5},
}


def extender_args(
    pod: dict[str, Any], nodes: list[dict[str, Any]], by_names: bool
) -> dict[str, Any]:
    """ExtenderArgs exactly as kube-scheduler marshals it (Go field names, the unused mode null)."""
    if by_names:
        return {"Pod": pod, "Nodes": None, "NodeNames": [n["metadata"]["name"] for n in nodes]}
    return {"Pod": pod, "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None}
