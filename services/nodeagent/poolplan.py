"""A NodePlan as the real backend's pool specs: checked, capped and paced before anything runs.

``pool_spec`` turns one allocation into its pool's spec (service time per degradation level,
cpu set clipped to the arena, cgroup plan); ``worker_cuts`` applies nodeagent.max_workers
(deadline classes keep workers first), ``arrival_scale`` scales the online arrivals of the pools
that have workers into nodeagent.max_load_fraction, and ``batch_duty`` paces batch workers into
what online work leaves of that fraction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from parfusion.v1 import intent_pb2
from services.nodeagent import cgroupfs
from services.nodeagent.allocation import check_allocation
from services.nodeagent.pools import OsKnobs

CAP_ORDER = ("URGENT", "ROBOT", "ONLINE", "BATCH")  # who keeps workers when the cap bites
BATCH_ITEM_MS = 8.0  # default batch item; items stay <= 10 ms so urgent work waits little
BATCH_ITEM_MAX_MS = 10.0
DEGRADE_FACTOR = {
    intent_pb2.DEGRADATION_LEVEL_FP16: 0.6,
    intent_pb2.DEGRADATION_LEVEL_INT8: 0.4,
}
MIN_BATCH_DUTY = 0.05


@dataclass(frozen=True)
class PoolSpec:
    """One allocation, validated and capped: what the pool for this intent must look like."""

    intent_id: str
    workload_class: str
    workers: int
    knobs: OsKnobs
    service_ms: float
    parallel_fraction: float
    rate_per_s: float
    deadline_ms: float
    group: cgroupfs.GroupPlan
    note: str = ""

    @property
    def kind(self) -> str:
        return "batch" if self.workload_class == "BATCH" else "online"


def pool_spec(
    index: int,
    a: intent_pb2.Allocation,
    machine_cpus: Sequence[int],
    arena: tuple[int, ...],
    default_service_ms: float,
) -> PoolSpec:
    """allocations[index] checked (check_allocation) and turned into its pool's spec: the cpu
    set clipped to the arena, the service time at the allocation's degradation level."""
    cls, policy = check_allocation(index, a, machine_cpus, "do not exist on this node")
    note = []
    cpus = tuple(sorted(set(a.cpu_set) & set(arena)))
    if a.cpu_set and len(cpus) < len(set(a.cpu_set)):
        note.append("cpu set clipped to the arena")
    cpus = cpus or arena
    factor = DEGRADE_FACTOR.get(a.degradation, 1.0)
    if cls == "BATCH":
        service = min(a.base_service_ms or BATCH_ITEM_MS, BATCH_ITEM_MAX_MS)
    else:
        service = (a.base_service_ms or default_service_ms) * factor
    cg = a.cgroup
    group = cgroupfs.plan_group(
        a.intent_id,
        cls,
        path=cg.path,
        cpu_weight=cg.cpu_weight,
        cpu_max=cg.cpu_max,
        cpuset_cpus=cg.cpuset_cpus or ",".join(map(str, cpus)),
    )
    return PoolSpec(
        intent_id=a.intent_id,
        workload_class=cls,
        workers=a.workers,
        knobs=OsKnobs(cpu_set=cpus, nice=a.nice, sched_policy=policy),
        service_ms=service,
        parallel_fraction=a.parallel_fraction or 0.9,
        rate_per_s=a.arrival_rate_per_s,
        deadline_ms=a.deadline_ms,
        group=group,
        note="; ".join(note),
    )


def worker_cuts(specs: Iterable[PoolSpec], max_workers: int) -> dict[str, int]:
    """The worker cap across pools (max_workers), deadline classes first: the intents it cuts,
    with the workers each keeps (the others keep what their allocation asks)."""
    by_class: dict[str, list[PoolSpec]] = {cls: [] for cls in CAP_ORDER}
    for spec in specs:
        if spec.workers:
            by_class[spec.workload_class].append(spec)
    left, cuts = max_workers, {}
    for cls in CAP_ORDER:
        for spec in by_class[cls]:
            workers = min(spec.workers, left)
            left -= workers
            if workers < spec.workers:
                cuts[spec.intent_id] = workers
    return cuts


def cut(spec: PoolSpec, workers: int) -> PoolSpec:
    """The spec with the workers the cap leaves it, saying so."""
    note = f"capped to {workers} workers by nodeagent.max_workers"
    return replace(spec, workers=workers, note="; ".join(filter(None, [spec.note, note])))


def offered_load(spec: PoolSpec) -> float:
    """Cores' worth of requests an online pool is offered (0 for batch)."""
    return spec.rate_per_s * spec.service_ms / 1000.0 if spec.kind == "online" else 0.0


def arrival_scale(online_load: float, cap_cores: float) -> float:
    """The factor on online arrival rates that keeps their load within cap_cores."""
    return cap_cores / online_load if online_load > cap_cores > 0 else 1.0


def scale_note(scale: float) -> str:
    return f"arrival rate scaled x{scale:.2f} by nodeagent.max_load_fraction"


def batch_duty(online_load: float, batch_workers: int, cap_cores: float) -> float:
    """Batch duty so online + batch stay within cap_cores (max_load_fraction of the arena)."""
    duty = 1.0 if batch_workers == 0 else (cap_cores - online_load) / batch_workers
    return max(MIN_BATCH_DUTY, min(1.0, duty))
