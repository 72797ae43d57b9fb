"""kube-scheduler's default node choice, vectorised over the cluster, for the simulator.

The same formulas as kube-scheduler (pkg/scheduler/framework/plugins/noderesources and
schedule_one.go), on numpy arrays of every node's allocatable and requested CPU / memory / pods:

* NodeResourcesFit filter: requested + pod request <= allocatable for each resource;
* NodeResourcesFit ``LeastAllocated`` score: per resource ``(allocatable - requested) * 100 /
  allocatable`` (integer division), weighted mean (cpu 1, memory 1);
* NodeResourcesBalancedAllocation: ``(1 - std(requested / allocatable)) * 100`` over cpu and
  memory (population std, fractions capped at 1);
* numFeasibleNodesToFind with the adaptive percentageOfNodesToScore (``50 - nodes/125``, at least
  5 %, at least 100 nodes), scanning from a rotating start index;
* extender scores join as ``score * weight * (MaxNodeScore / MaxExtenderPriority)``;
* selectHost: highest total, ties broken uniformly at random.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10
MIN_FEASIBLE_NODES_TO_FIND = 100
MIN_FEASIBLE_PERCENTAGE = 5


def num_feasible_nodes_to_find(num_all_nodes: int, percentage: int = 0) -> int:
    if num_all_nodes < MIN_FEASIBLE_NODES_TO_FIND:
        return num_all_nodes
    adaptive = percentage
    if adaptive <= 0:
        adaptive = max(50 - num_all_nodes // 125, MIN_FEASIBLE_PERCENTAGE)
    found = num_all_nodes * adaptive // 100
    return max(found, MIN_FEASIBLE_NODES_TO_FIND) if adaptive < 100 else num_all_nodes


@dataclass
class ClusterResources:
    """Allocatable and requested resources of every node, as kube-scheduler's NodeInfo sums them."""

    alloc_cpu_m: np.ndarray  # millicores
    alloc_mem: np.ndarray  # bytes
    alloc_pods: np.ndarray
    req_cpu_m: np.ndarray
    req_mem: np.ndarray
    pods: np.ndarray
    next_start: int = 0

    @classmethod
    def empty(cls, cpu_m: np.ndarray, mem: np.ndarray, pods: np.ndarray) -> ClusterResources:
        n = len(cpu_m)
        return cls(
            cpu_m.astype(np.int64),
            mem.astype(np.int64),
            pods.astype(np.int64),
            np.zeros(n, np.int64),
            np.zeros(n, np.int64),
            np.zeros(n, np.int64),
        )

    def fits(self, cpu_m: int, mem: int) -> np.ndarray:
        return (
            (self.req_cpu_m + cpu_m <= self.alloc_cpu_m)
            & (self.req_mem + mem <= self.alloc_mem)
            & (self.pods + 1 <= self.alloc_pods)
        )

    def feasible_candidates(self, cpu_m: int, mem: int, percentage: int = 0) -> np.ndarray:
        """Node indexes kube-scheduler would score: the first numFeasibleNodesToFind feasible
        nodes from the rotating start index (which then advances past the nodes it examined)."""
        n = len(self.alloc_cpu_m)
        want = num_feasible_nodes_to_find(n, percentage)
        order = np.roll(np.arange(n), -self.next_start)
        positions = np.flatnonzero(self.fits(cpu_m, mem)[order])
        chosen = order[positions[:want]]
        examined = int(positions[want - 1]) + 1 if want and len(positions) >= want else n
        self.next_start = (self.next_start + examined) % n if n else 0
        return chosen

    def scores(self, idx: np.ndarray, cpu_m: int, mem: int) -> np.ndarray:
        """NodeResourcesFit (LeastAllocated) + NodeResourcesBalancedAllocation, weight 1 each."""
        acpu = self.alloc_cpu_m[idx]
        amem = self.alloc_mem[idx]
        rcpu = self.req_cpu_m[idx] + cpu_m
        rmem = self.req_mem[idx] + mem
        least_cpu = np.where(rcpu > acpu, 0, (acpu - rcpu) * MAX_NODE_SCORE // np.maximum(acpu, 1))
        least_mem = np.where(rmem > amem, 0, (amem - rmem) * MAX_NODE_SCORE // np.maximum(amem, 1))
        least = (least_cpu + least_mem) // 2
        fcpu = np.minimum(rcpu / np.maximum(acpu, 1), 1.0)
        fmem = np.minimum(rmem / np.maximum(amem, 1), 1.0)
        std = np.abs(fcpu - fmem) / 2.0  # population std of two values
        balanced = ((1.0 - std) * MAX_NODE_SCORE).astype(np.int64)
        return least + balanced

    def assume(self, node: int, cpu_m: int, mem: int) -> None:
        self.req_cpu_m[node] += cpu_m
        self.req_mem[node] += mem
        self.pods[node] += 1


def extender_contribution(scores: np.ndarray, weight: int) -> np.ndarray:
    return scores.astype(np.int64) * weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY)


def select_host(total: np.ndarray, rng: np.random.Generator) -> int:
    """Index (into ``total``) of the best score, ties uniformly at random (kube-scheduler's
    reservoir sampling picks each tied node with equal probability)."""
    best = np.flatnonzero(total == total.max())
    return int(best[0] if len(best) == 1 else best[rng.integers(len(best))])
