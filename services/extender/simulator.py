"""Cluster-scale scheduler simulator: kube-scheduler's default choice vs default plus the extender.

Replays the seeded trace (simtrace.py) onto N nodes twice:

* ``default``: kube-scheduler's NodeResourcesFit filter, LeastAllocated + BalancedAllocation
  scores over the numFeasibleNodesToFind nodes it examines (kubescore.py);
* ``extender``: the same, plus this extender's /filter over those candidates and its /prioritize
  scores at the deploy/ weight, then a /bind re-check: the very ``Extender`` methods the HTTP
  app calls, in-process, on the same node records.

Both arms then judge the result the same *modeled* way (no pods run): each node's final
resident intents go through the allocator's own D-MUG policy (``parfusion``), and a deadline
intent counts as a miss when its predicted p99 misses the deadline (risk over the threshold, or
no units) or when it landed on a node without the GPU lane it needs. Also reported: pods left
pending, placement spread (pods per node, CPU requested fraction), GPU-lane share use.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from services.core.model import DmugConfig
from services.core.policies.registry import get_policy
from services.core.tick import plan_tick

from .kubescore import ClusterResources, extender_contribution, select_host
from .nodeview import SHARE_UNITS_PER_GPU, ClusterView
from .scoring import OK, ScoringConfig
from .simtrace import SimCluster, SimPod, make_cluster, make_pods
from .verbs import Extender

EXTENDER_WEIGHT = 5  # deploy/scheduler/kube-scheduler-config.yaml


@dataclass
class ArmOutcome:
    name: str
    placed: dict[str, int] = field(default_factory=dict)  # pod name -> node index
    pending: list[str] = field(default_factory=list)
    extender_calls: int = 0
    seconds: float = 0.0


def run_arm(
    name: str,
    cluster: SimCluster,
    pods: list[SimPod],
    use_extender: bool,
    seed: int,
    progress: Any = None,
) -> tuple[ArmOutcome, ClusterView, ClusterResources]:
    started = time.perf_counter()
    rng = np.random.default_rng(seed + 2)
    config = ScoringConfig(dmug=DmugConfig())
    view = ClusterView(dmug=config.dmug, derive_placement=use_extender)
    view.learn(cluster.heads, source="sim")
    ext = Extender(view, config)
    res = ClusterResources.empty(cluster.cpu_m, cluster.mem, cluster.pods)
    names = cluster.names
    out = ArmOutcome(name)
    for pod in pods:
        idx = res.feasible_candidates(pod.cpu_m, pod.mem)
        spec = pod.intent.spec
        asks = use_extender and pod.intent.present
        rows = None
        if asks and len(idx):
            candidates = [names[i] for i in idx]
            rows = view.rows_of(candidates)
            outcome = ext.filter_rows(pod.intent, candidates, rows)
            out.extender_calls += 1
            idx = idx[outcome.kept]
            rows = rows[outcome.kept]
        if not len(idx):
            out.pending.append(pod.name)
            if progress is not None:
                progress.update(1)
            continue
        if len(idx) == 1:  # kube-scheduler skips scoring with one feasible node
            pick = 0
        else:
            total = res.scores(idx, pod.cpu_m, pod.mem)
            if asks and rows is not None:
                ext_scores = np.array(ext.prioritize_rows(pod.intent, rows))
                total = total + extender_contribution(ext_scores, EXTENDER_WEIGHT)
                out.extender_calls += 1
            pick = select_host(total, rng)
        node = int(idx[pick])
        if spec is not None:
            lane = spec.gpu_lane
            if asks:  # /bind: re-check under the extender's own rules, then reserve
                decision = ext.check_node(spec, names[node])
                if decision.outcome != OK:
                    out.pending.append(pod.name)
                    continue
                lane = decision.lane or lane
            view.place(names[node], replace(spec, node=names[node], gpu_lane=lane))
        res.assume(node, pod.cpu_m, pod.mem)
        out.placed[pod.name] = node
        if progress is not None:
            progress.update(1)
    out.seconds = time.perf_counter() - started
    return out, view, res


def judge(
    cluster: SimCluster,
    pods: list[SimPod],
    arm: ArmOutcome,
    view: ClusterView,
    res: ClusterResources,
) -> dict[str, Any]:
    """The modeled verdict: every node's residents through the allocator's D-MUG policy."""
    policy = get_policy("parfusion")
    threshold = DmugConfig().risk_threshold
    by_pod = {p.name: p for p in pods}
    per_class: dict[str, Counter[str]] = {}
    lane_misses = 0
    for rec in view.snapshot().values():
        if not rec.residents:
            continue
        result = plan_tick(policy, None, rec.residents, rec.state)
        decisions = result.by_id()
        for intent in rec.residents:
            c = per_class.setdefault(intent.workload_class, Counter())
            c["placed"] += 1
            wrong_lane = intent.gpu_share > 0 and rec.lane_free(intent.gpu_lane) is None
            lane_misses += int(wrong_lane)
            if not intent.has_deadline:
                continue
            c["deadline_pods"] += 1
            d = decisions[intent.id]
            late = d.units == 0 or d.deadline_risk > threshold
            if late or wrong_lane:
                c["deadline_misses"] += 1
    for name in arm.pending:
        spec = by_pod[name].intent.spec
        per_class.setdefault(spec.workload_class if spec else "NONE", Counter())["pending"] += 1
    deadline_pods = sum(c["deadline_pods"] for c in per_class.values())
    misses = sum(c["deadline_misses"] for c in per_class.values())
    counts = np.bincount(
        np.array(list(arm.placed.values()), dtype=np.int64), minlength=len(cluster.names)
    )
    cpu_fraction = res.req_cpu_m / np.maximum(res.alloc_cpu_m, 1)
    return {
        "placed": len(arm.placed),
        "pending": len(arm.pending),
        "deadline_pods": deadline_pods,
        "deadline_misses": misses,
        "deadline_pending": sum(1 for n in arm.pending if _has_deadline(by_pod[n])),
        "deadline_miss_ratio": round(misses / deadline_pods, 4) if deadline_pods else 0.0,
        "gpu_lane_mismatches": lane_misses,
        "per_class": {
            k: {m: (round(v, 3) if isinstance(v, float) else v) for m, v in sorted(c.items())}
            for k, c in sorted(per_class.items())
        },
        "spread": {
            "nodes_used": int((counts > 0).sum()),
            "pods_per_node_mean": round(float(counts.mean()), 3),
            "pods_per_node_std": round(float(counts.std()), 3),
            "pods_per_node_max": int(counts.max()) if len(counts) else 0,
            "cpu_requested_fraction_mean": round(float(cpu_fraction.mean()), 4),
            "cpu_requested_fraction_std": round(float(cpu_fraction.std()), 4),
        },
        "gpu_lanes": lane_use(view),
        "extender_calls": arm.extender_calls,
    }


def _has_deadline(pod: SimPod) -> bool:
    return pod.intent.spec is not None and pod.intent.spec.has_deadline


def lane_use(view: ClusterView) -> dict[str, dict[str, float]]:
    """Per lane: share units held / share units present across the cluster."""
    capacity: dict[str, float] = defaultdict(float)
    held: dict[str, float] = defaultdict(float)
    for rec in view.snapshot().values():
        for lane in rec.lanes:
            if lane.available:
                capacity[lane.name] += lane.share_units
        for intent in rec.residents:
            if intent.gpu_share > 0 and rec.lane_free(intent.gpu_lane) is not None:
                held[intent.gpu_lane] += intent.gpu_share * SHARE_UNITS_PER_GPU
    return {
        lane: {
            "share_units": float(capacity[lane]),
            "held": round(float(held[lane]), 2),
            "use": round(held[lane] / capacity[lane], 4) if capacity[lane] else 0.0,
        }
        for lane in sorted(capacity)
    }


def simulate(nodes: int, pods: int, seed: int, progress: bool = False) -> dict[str, Any]:
    cluster = make_cluster(nodes, seed)
    trace = make_pods(pods, seed)
    report: dict[str, Any] = {
        "config": {
            "nodes": nodes,
            "pods": pods,
            "seed": seed,
            "extender_weight": EXTENDER_WEIGHT,
            "pod_mix": dict(sorted(Counter(p.kind for p in trace).items())),
            "modeled": True,
        },
        "arms": {},
        "timing_s": {},
    }
    for arm_name, use_extender in (("default", False), ("extender", True)):
        bar = _bar(len(trace), f"sim {arm_name}", progress)
        arm, view, res = run_arm(arm_name, cluster, trace, use_extender, seed, bar)
        if bar is not None:
            bar.close()
        report["arms"][arm_name] = judge(cluster, trace, arm, view, res)
        report["timing_s"][arm_name] = round(arm.seconds, 3)
    return report


def _bar(total: int, desc: str, enabled: bool):  # type: ignore[no-untyped-def]
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="pod", leave=False)


def markdown(report: dict[str, Any]) -> str:
    cfg = report["config"]
    arms = report["arms"]
    lines = [
        f"# Scheduler simulation: {cfg['nodes']} nodes, {cfg['pods']} pods (seed {cfg['seed']})",
        "",
        "Modeled, not measured: no pod runs. Deadline misses are the allocator's D-MUG verdict on",
        "each node's final residents (predicted p99 over the deadline, no units, or a pod on a node",
        "without the GPU lane it needs). Default = kube-scheduler's NodeResourcesFit",
        "(LeastAllocated) + BalancedAllocation; extender = the same plus PARFusion's /filter,",
        f"/prioritize (weight {cfg['extender_weight']}) and /bind re-check, called in-process.",
        "",
        f"Pod mix: {', '.join(f'{k} {v}' for k, v in cfg['pod_mix'].items())}.",
        "",
        "| metric | default | default + extender |",
        "|---|---:|---:|",
    ]
    rows: Iterable[tuple[str, Any]] = (
        ("pods placed", lambda a: a["placed"]),
        ("pods pending (no feasible node)", lambda a: a["pending"]),
        ("deadline pods placed", lambda a: a["deadline_pods"]),
        ("deadline pods pending", lambda a: a["deadline_pending"]),
        ("modeled deadline misses", lambda a: a["deadline_misses"]),
        ("modeled deadline miss ratio", lambda a: f"{a['deadline_miss_ratio']:.2%}"),
        ("pods on a node without their GPU lane", lambda a: a["gpu_lane_mismatches"]),
        ("nodes used", lambda a: a["spread"]["nodes_used"]),
        ("pods per node, std", lambda a: a["spread"]["pods_per_node_std"]),
        ("pods per node, max", lambda a: a["spread"]["pods_per_node_max"]),
        ("CPU requested fraction, mean", lambda a: a["spread"]["cpu_requested_fraction_mean"]),
        ("CPU requested fraction, std", lambda a: a["spread"]["cpu_requested_fraction_std"]),
    )
    for label, get in rows:
        lines.append(f"| {label} | {get(arms['default'])} | {get(arms['extender'])} |")
    for lane in arms["default"]["gpu_lanes"]:
        d = arms["default"]["gpu_lanes"][lane]["use"]
        e = arms["extender"]["gpu_lanes"][lane]["use"]
        lines.append(f"| GPU lane {lane} share use | {d:.1%} | {e:.1%} |")
    lines += [
        "",
        "Per class (default / extender):",
        "",
        "| class | placed | pending | deadline misses |",
        "|---|---|---|---|",
    ]
    classes = sorted(set(arms["default"]["per_class"]) | set(arms["extender"]["per_class"]))
    for cls in classes:
        d = arms["default"]["per_class"].get(cls, {})
        e = arms["extender"]["per_class"].get(cls, {})
        lines.append(
            f"| {cls} | {d.get('placed', 0)} / {e.get('placed', 0)} | {d.get('pending', 0)} / {e.get('pending', 0)}"
            f" | {d.get('deadline_misses', 0)} / {e.get('deadline_misses', 0)} |"
        )
    t = report["timing_s"]
    lines += ["", f"Simulation time: default {t['default']} s, extender {t['extender']} s.", ""]
    return "\n".join(lines)
