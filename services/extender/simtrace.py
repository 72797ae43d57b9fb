"""A seeded cluster and pod trace for the scheduler simulator.

Nodes cycle through the packaged sample shapes (a full 8-lane GPU node, an online-lane node, a
CPU-only node, an edge node with a robot lane) in a seeded order. Pods arrive one after another:
online inference (deadline, GPU lane ``online``), robot control (tight deadline, lane ``robot``),
batch jobs (no deadline, half of them on lane ``batch``) and plain pods without an intent. Each
intent travels the way it would in a cluster, as the pod's ``parfusion.io/intent`` annotation, and
is read back through the extender's own pod-intent path (the allocator's validation included).
Pods stay for the whole trace (no departures): the comparison is about where they land.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np

from .podintent import PodIntent, pod_intent
from .protocol import NodeHead, Pod
from .samples import SAMPLE_NODES, node_object, pod_object

CLASS_MIX = (("online", 0.35), ("robot", 0.15), ("batch", 0.40), ("plain", 0.10))
GIB = 1 << 30


@dataclass(frozen=True)
class SimPod:
    name: str
    kind: str  # online, robot, batch, plain
    cpu_m: int
    mem: int
    intent: PodIntent


@dataclass(frozen=True)
class SimCluster:
    names: list[str]
    heads: list[NodeHead]
    cpu_m: np.ndarray
    mem: np.ndarray
    pods: np.ndarray


def _intent_doc(kind: str, rng: np.random.Generator) -> dict | None:
    if kind == "online":
        return {
            "workload_class": "ONLINE",
            "priority": int(rng.integers(500, 800)),
            "slo": {"deadline_ms": float(rng.choice([30, 40, 60, 80]))},
            "parallelism": {"min": int(rng.integers(1, 3)), "max": 8},
            "speedup": {
                "parallel_fraction": float(rng.uniform(0.85, 0.95)),
                "base_service_ms": float(rng.uniform(30, 120)),
            },
            "demand": {"arrival_rate_per_s": float(rng.uniform(5, 30))},
            "gpu": {"lane": "online", "share": float(rng.choice([0.25, 0.5]))},
            "degradation": ["NORMAL", "FP16", "INT8"],
        }
    if kind == "robot":
        return {
            "workload_class": "ROBOT",
            "slo": {"deadline_ms": float(rng.choice([15, 25, 40]))},
            "parallelism": {"min": 1, "max": 4},
            "speedup": {
                "parallel_fraction": float(rng.uniform(0.6, 0.9)),
                "base_service_ms": float(rng.uniform(10, 40)),
            },
            "demand": {"arrival_rate_per_s": float(rng.uniform(10, 50))},
            "gpu": {"lane": "robot", "share": 0.25},
        }
    if kind == "batch":
        doc = {
            "workload_class": "BATCH",
            "parallelism": {"min": int(rng.integers(2, 9)), "max": 16},
            "speedup": {
                "parallel_fraction": float(rng.uniform(0.9, 0.99)),
                "base_service_ms": 100.0,
            },
            "demand": {"work_units": float(rng.integers(100, 10_000))},
            "preemptible": True,
        }
        if rng.random() < 0.5:
            doc["gpu"] = {"lane": "batch", "share": float(rng.choice([0.5, 1.0]))}
        return doc
    return None


def make_cluster(nodes: int, seed: int) -> SimCluster:
    rng = np.random.default_rng(seed)
    shapes = rng.integers(0, len(SAMPLE_NODES), size=nodes)
    names, heads, cpu, mem, pods = [], [], [], [], []
    for i, shape in enumerate(shapes):
        _, cores, lanes = SAMPLE_NODES[int(shape)]
        obj = node_object(f"node-{i:05d}", cores, lanes, index=i)
        heads.append(msgspec.convert(obj, NodeHead))
        names.append(obj["metadata"]["name"])
        alloc = obj["status"]["allocatable"]
        cpu.append(int(alloc["cpu"].rstrip("m")))
        mem.append(int(alloc["memory"].rstrip("Ki")) * 1024)
        pods.append(int(alloc["pods"]))
    return SimCluster(names, heads, np.array(cpu), np.array(mem), np.array(pods))


def make_pods(count: int, seed: int) -> list[SimPod]:
    rng = np.random.default_rng(seed + 1)
    kinds = [k for k, _ in CLASS_MIX]
    weights = np.array([w for _, w in CLASS_MIX])
    out = []
    for i, k in enumerate(rng.choice(len(kinds), size=count, p=weights / weights.sum())):
        kind = kinds[int(k)]
        doc = _intent_doc(kind, rng)
        name = f"{kind}-{i:05d}"
        units = int(doc["parallelism"]["min"]) if doc else 1
        mem = int(rng.integers(1, 9)) * GIB
        obj = pod_object(
            name, namespace="sim", uid=f"sim-{seed}-{i:05d}", intent=doc, cpu=f"{units * 1000}m"
        )
        found = pod_intent(msgspec.convert(obj, Pod))
        out.append(SimPod(name, kind, units * 1000, mem, found))
    return out
