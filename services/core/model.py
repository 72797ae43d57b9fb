"""Plain data for the policy core: what a policy reads (PlanInput) and what it decides (PlanResult).

No protobuf, no I/O, no clock: the allocator server converts protos to these, and the extender,
the what-if preview and the experiments build them directly, so every caller runs the same core.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import msgspec

_INTENT_ID = operator.attrgetter("intent_id")

WorkloadClass = Literal["ONLINE", "BATCH", "ROBOT", "URGENT"]
Degradation = Literal["NORMAL", "FP16", "INT8"]
AllocationState = Literal["ADMITTED", "THROTTLED", "DEGRADED", "PREEMPTED"]
SchedPolicy = Literal["other", "batch", "idle"]

DEADLINE_CLASSES: frozenset[str] = frozenset({"ONLINE", "ROBOT", "URGENT"})
DEGRADATION_ORDER: tuple[Degradation, ...] = ("NORMAL", "FP16", "INT8")


@dataclass(frozen=True, slots=True)
class IntentSpec:
    """One ResourceIntent, validated (see docs/intent-spec.md for ranges and defaults)."""

    id: str
    name: str
    workload_class: WorkloadClass
    priority: int = 500
    deadline_ms: float = 0.0  # 0 = no deadline (BATCH)
    target_percentile: float = 99.0
    max_miss_ratio: float = 0.01
    min_units: int = 1
    max_units: int = 0  # 0 = node capacity
    preferred_units: int = 0
    parallel_fraction: float = 0.9
    base_service_ms: float = 10.0
    arrival_rate_per_s: float = 0.0
    work_units: float = 0.0
    gpu_lane: str = ""
    gpu_share: float = 0.0
    gpu_memory_bytes: int = 0
    gpu_stream_priority_hint: int = 0
    gpu_concurrency: int = 0
    degradation: tuple[Degradation, ...] = ("NORMAL",)
    preemptible: bool = False
    elastic: bool = True
    node: str = ""
    seq: int = 0  # submission order (FIFO tie-break, determinism)

    @property
    def has_deadline(self) -> bool:
        return self.workload_class in DEADLINE_CLASSES and self.deadline_ms > 0


@dataclass(frozen=True, slots=True)
class ServiceStats:
    """Predictor output for one intent: observed service time at the parallelism it ran with."""

    mean_ms: float
    p95_ms: float
    p99_ms: float
    count: int
    observed_units: int = 1  # parallelism the samples were observed at
    # observed / modelled tail latency, learnt per intent (Predictor.calibrate): what the model
    # misses (queueing beyond M/M/1, pressure it does not see) scales the predicted tail
    latency_correction: float = 1.0


@dataclass(frozen=True, slots=True)
class LaneCapacity:
    name: str
    gpu_indexes: tuple[int, ...]  # present GPUs only; empty = lane unavailable
    share_units: int = 100  # allocatable share units per lane (percent of one GPU x GPUs)

    @property
    def available(self) -> bool:
        return bool(self.gpu_indexes)


@dataclass(frozen=True, slots=True)
class Disturbance:
    cpu: float = 0.0  # [0, 1]
    gpu: float = 0.0
    network: float = 0.0


@dataclass(frozen=True, slots=True)
class NodeState:
    name: str
    cpu_units: int  # allocatable worker units (arena cores)
    cpu_ids: tuple[int, ...] = ()  # the arena's CPU ids, for cpu-set placement
    lanes: tuple[LaneCapacity, ...] = ()
    contention: float = 0.0  # [0, 1] measured node pressure (PSI / utilisation)
    disturbance: Disturbance = field(default_factory=Disturbance)
    stale: bool = False


@dataclass(frozen=True, slots=True)
class DmugConfig:
    # relative NMU gain needed to move a unit: below 10 % the predictor's noise alone swapped
    # units between two deadline intents every second or two on the modeled node
    hysteresis_min_gain: float = 0.1
    # ticks a decision's units (and a degraded level) hold before they may shrink (step back
    # up): 20 ticks of 250 ms = 5 s, the stability window (services/core/stability.py)
    hysteresis_dwell_ticks: int = 20
    risk_threshold: float = 0.5
    # deadline work whose offered load (arrival rate x mean service at one unit) is at most this
    # many cores runs its workers on shared cores instead of holding whole units (light work)
    light_load_cores: float = 0.1
    contention_gain: float = 1.0  # how much pressure inflates predicted latency
    degradation_speedup: Mapping[str, float] = field(
        default_factory=lambda: {"NORMAL": 1.0, "FP16": 0.6, "INT8": 0.4}
    )


class Decision(msgspec.Struct, frozen=True, gc=False):
    """The policy's answer for one intent this tick (becomes an Allocation proto).

    A frozen msgspec Struct: immutable and hashable like a frozen dataclass, and built by a
    C-level constructor, which matters where a tick builds thousands of them. Outside the
    cyclic collector's reach (``gc=False``): its fields are strings, numbers and tuples of
    ints, which can form no cycle, and a full collection at 10,000 intents, which holds the
    interpreter lock, is about a tenth shorter for it (docs/performance.md).
    """

    intent_id: str
    units: int
    degradation: Degradation = "NORMAL"
    predicted_p99_ms: float = 0.0
    slack_ms: float = 0.0
    deadline_risk: float = 0.0
    nmu: float = 0.0
    state: AllocationState = "ADMITTED"
    reason: str = ""
    preempted_units: int = 0
    cpu_set: tuple[int, ...] = ()
    nice: int = 0
    sched_policy: SchedPolicy = "other"
    cpu_weight: int = 100  # cgroup v2 cpu.weight
    cpu_max: str = "max"
    gpu_lane: str = ""
    gpu_indexes: tuple[int, ...] = ()
    gpu_share_percent: float = 0.0
    stream_priority: int = 0  # logical -1 low, 0 normal, 1 high
    gpu_concurrency: int = 0
    since_tick: int = 0  # tick at which units last changed (hysteresis dwell)
    level_since_tick: int = 0  # tick at which the degradation level last changed
    # processes the pool runs; -1: one per unit. Light deadline work runs workers without
    # holding units; preemptible batch adds idle-time workers (SCHED_IDLE) on shared cores
    workers: int = -1
    # step-ups of the degradation level that failed in a row (a lighter level left for a deeper
    # one within its probe window): the next step up waits dwell x 2**level_backoff ticks
    level_backoff: int = 0
    level_raised: bool = False  # the level was taken by a step up still on probation

    @property
    def pool_size(self) -> int:
        return self.units if self.workers < 0 else self.workers


@dataclass(frozen=True, slots=True)
class PlanInput:
    intents: Sequence[IntentSpec]
    node: NodeState
    stats: Mapping[str, ServiceStats] = field(default_factory=dict)
    previous: Mapping[str, Decision] = field(default_factory=dict)
    tick: int = 0
    config: DmugConfig = field(default_factory=DmugConfig)


@dataclass(frozen=True, slots=True)
class PlanResult:
    policy: str
    decisions: tuple[Decision, ...]
    gpu_intent_enabled: bool = True
    contention: float = 0.0
    preemptions: int = 0
    degradations: int = 0

    def by_id(self) -> dict[str, Decision]:
        decisions = self.decisions
        return dict(zip(map(_INTENT_ID, decisions), decisions, strict=True))


@dataclass(frozen=True, slots=True)
class PlacementScore:
    """The extender's view of one node for one pod's intent, from the same core."""

    fits: bool
    reason: str
    nmu: float
    slack_ms: float
    deadline_risk: float
    units: int
    score: int  # 0..10 (kube-scheduler MaxExtenderPriority)
