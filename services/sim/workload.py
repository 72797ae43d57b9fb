"""What the modeled node runs: one WorkloadProfile per intent and the Assignment the plan gave it.

A profile is the intent's workload shape (how requests arrive, how long they take at one unit,
their deadline, where their time goes); an assignment is the enforcement side of one plan entry
(units, degradation, CPU placement, nice, GPU lane and share). The modeled node backend builds
both from the NodePlan allocations it receives (the experiments drive that same backend), so
the model itself never sees protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from services.sim.params import WorkMix

Arrivals = Literal["poisson", "periodic", "backlog"]


@dataclass(frozen=True, slots=True)
class WorkloadProfile:
    intent_id: str
    name: str
    workload_class: str
    base_service_ms: float
    parallel_fraction: float
    deadline_ms: float = 0.0
    arrival_rate_per_s: float = 0.0
    arrivals: Arrivals = "poisson"
    work_units: float = 0.0
    mix: WorkMix = WorkMix()

    @property
    def is_batch(self) -> bool:
        return self.arrivals == "backlog"

    def speedup(self, units: float) -> float:
        """Amdahl S(p) = 1 / ((1 - f) + f / p) (p may be fractional: idle-time workers)."""
        if units <= 0:
            return 0.0
        f = self.parallel_fraction
        return 1.0 / ((1.0 - f) + f / units)


@dataclass(frozen=True, slots=True)
class Assignment:
    """One plan entry as the node enforces it."""

    units: int = 0
    degradation: str = "NORMAL"
    cpu_set: tuple[int, ...] = ()
    nice: int = 0
    sched_policy: str = "other"
    gpu_lane: str = ""
    gpu_indexes: tuple[int, ...] = ()
    gpu_share_percent: float = 0.0
    stream_priority: int = 0

    @property
    def deprioritised(self) -> bool:
        return self.nice >= 10 or self.sched_policy in ("batch", "idle")


def default_arrivals(workload_class: str) -> Arrivals:
    if workload_class == "BATCH":
        return "backlog"
    if workload_class in ("ROBOT", "URGENT"):
        return "periodic"
    return "poisson"
