"""The ``modeled`` node backend: the NodeAgentService surface over the modeled node, no real load.

It starts no process and burns no CPU. A NodePlan's allocations (workers, degradation, cpu set,
nice, scheduling policy, GPU lane / share / stream priority, and the workload shape each
allocation carries) drive services.sim.ModeledNode, which simulates Poisson and periodic
requests, batch backlogs and disturbances; telemetry is the NodeTelemetry the real backend
reports (per-intent p50/p95/p99, recent service times drained once, pools, per-core load, CPU
pressure in PSI percent), labelled ``backend: modeled``, so the allocator plans on it exactly as
on real pools. Model time follows the injected clock: the wall clock in the service, a simulated
clock in the headless experiments, which drive this same class.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from parfusion.v1 import intent_pb2, nodeagent_pb2, telemetry_pb2
from services.common.errors import FailedPrecondition, InvalidArgument
from services.core.convert import DEGRADATION_TO_MODEL
from services.nodeagent.allocation import check_allocation, check_unique
from services.nodeagent.backend import BackendOptions, next_generation
from services.sim.disturbance import disturbance_from_proto, disturbance_to_proto
from services.sim.node import ModeledNode
from services.sim.params import ModelParams, load_model_params
from services.sim.workload import Assignment, WorkloadProfile, default_arrivals

log = logging.getLogger(__name__)

MAX_CATCH_UP_S = 30.0  # after a longer silence the model simulates only the last 30 s
MODELED_MEMORY_BYTES = 2 * 1024**4  # a DGX H200 has 2 TB of system memory
MEMORY_PER_UNIT_BYTES = 4 * 1024**3  # [assumption] resident memory per busy worker unit


class ModeledBackend:
    name = "modeled"

    def __init__(
        self,
        options: BackendOptions,
        *,
        params: ModelParams | None = None,
        clock: Callable[[], float] = time.monotonic,
        seed: int = 0,
        keep_history: bool = False,
    ) -> None:
        self.options = options
        self.params = params or load_model_params()
        self.node = ModeledNode(self.params, seed=seed, keep_history=keep_history)
        self.arena = tuple(range(self.params.cpu_units))
        self._clock = clock
        self._origin = clock()
        self._lock = threading.Lock()
        self._generation = 0
        log.info(
            "modeled backend ready",
            extra={"cpu_units": self.params.cpu_units, "gpus": self.params.gpu_count},
        )

    # -- time ------------------------------------------------------------------------------

    def _sync(self) -> None:
        """Advance the model to the clock (caller holds the lock)."""
        lag = (self._clock() - self._origin) - self.node.now_s
        if lag > MAX_CATCH_UP_S:
            self._origin += lag - MAX_CATCH_UP_S
            lag = MAX_CATCH_UP_S
        if lag > 0:
            self.node.advance(lag)

    # -- plan ------------------------------------------------------------------------------

    def _validate(self, index: int, a: intent_pb2.Allocation) -> tuple[WorkloadProfile, Assignment]:
        arena = f"are outside the modeled arena 0-{len(self.arena) - 1}"
        cls, policy = check_allocation(index, a, self.arena, arena)
        where = f"allocations[{index}]"
        bad_gpus = [i for i in a.gpu_indexes if i >= self.params.gpu_count]
        if bad_gpus:
            raise InvalidArgument(
                f"GPUs {bad_gpus} are not on the modeled node", field=f"{where}.gpu_indexes"
            )
        profile = WorkloadProfile(
            intent_id=a.intent_id,
            name=a.intent_name or a.intent_id,
            workload_class=cls,
            base_service_ms=a.base_service_ms or self.options.default_service_ms,
            parallel_fraction=a.parallel_fraction or 0.9,
            deadline_ms=a.deadline_ms if cls != "BATCH" else 0.0,
            arrival_rate_per_s=a.arrival_rate_per_s if cls != "BATCH" else 0.0,
            arrivals=default_arrivals(cls),
            work_units=math.inf if cls == "BATCH" else 0.0,
            mix=self.params.mix_for(cls),
        )
        assignment = Assignment(
            units=a.workers,
            degradation=DEGRADATION_TO_MODEL.get(a.degradation, "NORMAL"),
            cpu_set=tuple(a.cpu_set),
            nice=a.nice,
            sched_policy=policy,
            gpu_lane=a.gpu_lane,
            gpu_indexes=tuple(a.gpu_indexes),
            gpu_share_percent=a.gpu_share_percent,
            stream_priority=a.stream_priority,
        )
        return profile, assignment

    def apply(self, plan: intent_pb2.NodePlan) -> list[nodeagent_pb2.AppliedAllocation]:
        checked = [self._validate(i, a) for i, a in enumerate(plan.allocations)]
        check_unique([p.intent_id for p, _ in checked])
        # Units held are bounded by the arena; workers may be more (light work on shared
        # cores, idle-time batch): the model charges those through its interference terms.
        units = sum(a.units for a in plan.allocations)
        if units > len(self.arena):
            raise FailedPrecondition(
                f"the plan holds {units} units; the modeled arena has {len(self.arena)}"
            )
        with self._lock:
            self._sync()
            self.node.set_profiles(p for p, _ in checked)
            self.node.apply({p.intent_id: a for p, a in checked}, gpu_intent_enabled=True)
            self._generation = next_generation(plan.generation, self._generation)
        return [
            nodeagent_pb2.AppliedAllocation(
                intent_id=p.intent_id,
                workers=a.units,
                cpu_set=list(a.cpu_set or self.arena),
                nice=a.nice,
                cgroup_mode="dry-run",
                note="modeled node: no process started",
            )
            for p, a in checked
        ]

    def cgroup_plan_path(self) -> str:
        return ""  # the modeled node plans no cgroups

    # -- telemetry -------------------------------------------------------------------------

    def telemetry(self, drain: bool = True) -> telemetry_pb2.NodeTelemetry:
        with self._lock:
            self._sync()
            return self._telemetry(drain)

    def _telemetry(self, drain: bool = True) -> telemetry_pb2.NodeTelemetry:
        node = self.node
        cpu_p, _, _ = node.pressures()
        per_core = self._per_core_percent(cpu_p)
        busy_units = sum(per_core) / 100.0
        tel = telemetry_pb2.NodeTelemetry(
            node=self.options.node_name,
            backend=self.name,
            cpu_percent_per_core=per_core,
            load1=busy_units,
            memory_total_bytes=MODELED_MEMORY_BYTES,
            memory_used_bytes=min(
                MODELED_MEMORY_BYTES, int(busy_units * MEMORY_PER_UNIT_BYTES) + 64 * 1024**3
            ),
            # PSI is modeled for CPU only (percent, like /proc/pressure/cpu avg10).
            cpu_pressure=telemetry_pb2.Pressure(
                some_avg10=100.0 * node.cpu_pressure(), full_avg10=100.0 * cpu_p, available=True
            ),
            memory_pressure=telemetry_pb2.Pressure(available=False),
            io_pressure=telemetry_pb2.Pressure(available=False),
            arena_cpus=list(self.arena),
            plan_generation=self._generation,
        )
        tel.observed_at.GetCurrentTime()
        active = node.active_disturbance()
        if active is not None:
            tel.active_disturbance.CopyFrom(disturbance_to_proto(active.spec))
            tel.disturbance_remaining_s = active.remaining_s(node.now_s)
        for intent_id, run in node.runs.items():
            view = run.stats.view()
            recent = run.stats.drain_recent() if drain else run.stats.peek_recent()
            tel.latencies.append(
                telemetry_pb2.LatencySummary(
                    intent_id=intent_id,
                    count=view.count if run.queue is not None else int(run.stats.items_done),
                    p50_ms=view.p50_ms,
                    p95_ms=view.p95_ms,
                    p99_ms=view.p99_ms,
                    mean_ms=view.mean_ms,
                    deadline_misses=view.deadline_misses,
                    service_mean_ms=view.service_mean_ms,
                    service_p99_ms=view.service_p99_ms,
                    window_count=view.window_count,
                    recent_service_ms=recent,
                )
            )
            a = run.assignment
            items_per_s = 0.0
            if run.queue is None and run.mean_service_ms > 0:
                items_per_s = 1000.0 / run.mean_service_ms
            elif run.queue is not None and run.mean_service_ms > 0:
                items_per_s = min(run.profile.arrival_rate_per_s, 1000.0 / run.mean_service_ms)
            tel.pools.append(
                telemetry_pb2.PoolStatus(
                    intent_id=intent_id,
                    kind="batch" if run.queue is None else "online",
                    workers=a.units,
                    cpu_set=list(a.cpu_set or self.arena),
                    nice=a.nice,
                    queued=run.queue.queued if run.queue is not None else 0,
                    items_per_s=items_per_s,
                    sched_policy=a.sched_policy,
                )
            )
        return tel

    def _per_core_percent(self, cpu_pressure: float) -> list[float]:
        """Busy share of each modeled core: pinned pools on their cpus, the rest spread evenly."""
        cores = len(self.arena)
        busy = [cpu_pressure] * cores
        spread = 0.0
        for run in self.node.runs.values():
            a = run.assignment
            if a.units <= 0:
                continue
            load = a.units * run.busy
            if a.cpu_set:
                for cpu in a.cpu_set:
                    busy[cpu] += load / len(a.cpu_set)
            else:
                spread += load
        return [100.0 * min(1.0, b + spread / cores) for b in busy]

    # -- disturbance and processes ---------------------------------------------------------

    def inject_disturbance(self, disturbance: telemetry_pb2.Disturbance) -> tuple[bool, float]:
        """Accepted on the modeled node: it slows the model, no real stress is started."""
        spec = disturbance_from_proto(disturbance)
        with self._lock:
            self._sync()
            self.node.inject(spec)
        log.info(
            "modeled disturbance injected",
            extra={
                "cpu": spec.cpu,
                "gpu": spec.gpu,
                "network": spec.network,
                "duration_s": spec.duration_s,
                "source": spec.source,
            },
        )
        return True, spec.duration_s

    def owned_pids(self) -> set[int]:
        return set()  # the modeled node starts no process

    def stop(self) -> None:
        pass
