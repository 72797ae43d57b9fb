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
from collections.abc import Callable, Sequence

from parfusion.v1 import intent_pb2, nodeagent_pb2, telemetry_pb2
from services.common.errors import FailedPrecondition, InvalidArgument
from services.common.malloc import FlushPoint
from services.core.convert import DEGRADATION_TO_MODEL
from services.nodeagent import metrics
from services.nodeagent.allocation import check_allocation, check_unique
from services.nodeagent.backend import BackendOptions, next_generation
from services.sim.disturbance import disturbance_from_proto, disturbance_to_proto
from services.sim.node import IntentRun, ModeledNode
from services.sim.params import ModelParams, load_model_params
from services.sim.workload import Assignment, WorkloadProfile, default_arrivals

log = logging.getLogger(__name__)

MAX_CATCH_UP_S = 30.0  # after a longer silence the model simulates only the last 30 s
BACKGROUND_STEP_S = 0.1  # the served model advances about this often
BACKGROUND_MAX_LAG_S = 1.0  # and skips model time it is further behind than this
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
        background: bool = False,
    ) -> None:
        self.options = options
        self.params = params or load_model_params()
        self.node = ModeledNode(self.params, seed=seed, keep_history=keep_history)
        self.arena = tuple(range(self.params.cpu_units))
        self._clock = clock
        self._origin = clock()
        self._lock = threading.Lock()
        self._generation = 0
        # per intent: how much slower than declared its work really runs (experiments' drift)
        self._drift: dict[str, float] = {}
        self._units: dict[str, int] = {}  # units held per intent in the plan in force
        # the Assignment each pool was last reported with: a changed_pools_only telemetry reports
        # only pools whose Assignment object changed (a plan replaces it, never edits it)
        self._pools_reported: dict[str, Assignment] = {}
        self._stopping = threading.Event()
        self._background: threading.Thread | None = None
        if background:
            self._background = threading.Thread(
                target=self._advance_loop, name="modeled-node", daemon=True
            )
            self._background.start()
        log.info(
            "modeled backend ready",
            extra={"cpu_units": self.params.cpu_units, "gpus": self.params.gpu_count},
        )

    # -- time ------------------------------------------------------------------------------

    def _sync(self) -> None:
        """Advance the model to the clock (caller holds the lock). In the background mode the
        model's own thread does this and RPCs read the model as it stands."""
        if self._background is None:
            self._advance(MAX_CATCH_UP_S)

    def _advance(self, max_lag_s: float, pause: Callable[[], None] | None = None) -> None:
        lag = (self._clock() - self._origin) - self.node.now_s
        if lag > max_lag_s:
            self._origin += lag - max_lag_s
            metrics.MODEL_SKIPPED.inc(lag - max_lag_s)
            lag = max_lag_s
        if lag > 0:
            self.node.advance(lag, pause)

    def _advance_loop(self) -> None:
        """The served node's own time: it steps in this thread, letting RPCs in every few dozen
        intents. When a step takes longer than the time it simulates (10,000 intents on a small
        machine), the model skips what it cannot simulate (counted) and the thread sleeps as
        long as it worked, so the simulation takes at most about half a core."""
        flush = FlushPoint()  # this thread's malloc cache, emptied after a large shrink
        while not self._stopping.is_set():
            began = time.monotonic()
            with self._lock:
                self._advance(BACKGROUND_MAX_LAG_S, self._let_rpcs_in)
            flush()
            spent = time.monotonic() - began
            self._stopping.wait(max(BACKGROUND_STEP_S - spent, spent))

    def _let_rpcs_in(self) -> None:
        """Release the model's lock for a moment (called by the step, which holds it)."""
        self._lock.release()
        time.sleep(0.0005)  # long enough for a waiting RPC thread to take the lock
        self._lock.acquire()

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
            base_service_ms=(a.base_service_ms or self.options.default_service_ms)
            * self._drift.get(a.intent_id, 1.0),
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
        checked = self._checked(plan)
        units = self._units_held({a.intent_id: a.units for a in plan.allocations})
        with self._lock:
            self._sync()
            self.node.set_profiles(p for p, _ in checked)
            self.node.apply({p.intent_id: a for p, a in checked}, gpu_intent_enabled=True)
            self._generation = next_generation(plan.generation, self._generation)
            self._units = units
        return self._applied(checked)

    def apply_changes(
        self, plan: intent_pb2.NodePlan, removed: Sequence[str]
    ) -> list[nodeagent_pb2.AppliedAllocation]:
        """A plan delta: ``plan`` holds the allocations that changed, ``removed`` the intents that
        left; every other intent keeps its allocation. All or nothing, like apply."""
        checked = self._checked(plan)
        with self._lock:
            held = dict(self._units)
        for intent_id in removed:
            held.pop(intent_id, None)
        held.update({a.intent_id: a.units for a in plan.allocations})
        units = self._units_held(held)
        with self._lock:
            self._sync()
            self.node.change(checked, removed, gpu_intent_enabled=True)
            self._generation = next_generation(plan.generation, self._generation)
            self._units = units
        return self._applied(checked)

    def _checked(self, plan: intent_pb2.NodePlan) -> list[tuple[WorkloadProfile, Assignment]]:
        checked = [self._validate(i, a) for i, a in enumerate(plan.allocations)]
        check_unique([p.intent_id for p, _ in checked])
        return checked

    def _units_held(self, units: dict[str, int]) -> dict[str, int]:
        # Units held are bounded by the arena; workers may be more (light work on shared
        # cores, idle-time batch): the model charges those through its interference terms.
        total = sum(units.values())
        if total > len(self.arena):
            raise FailedPrecondition(
                f"the plan holds {total} units; the modeled arena has {len(self.arena)}"
            )
        return units

    def _applied(
        self, checked: list[tuple[WorkloadProfile, Assignment]]
    ) -> list[nodeagent_pb2.AppliedAllocation]:
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

    def telemetry(
        self, drain: bool = True, sampled_only: bool = False, changed_pools_only: bool = False
    ) -> telemetry_pb2.NodeTelemetry:
        with self._lock:
            self._sync()
            return self._telemetry(drain, sampled_only, changed_pools_only)

    def _telemetry(
        self, drain: bool = True, sampled_only: bool = False, changed_pools_only: bool = False
    ) -> telemetry_pb2.NodeTelemetry:
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
        # the served model may lag the clock by up to a step: a disturbance's time left runs
        # on the clock, so one that has ended is reported ended before the model catches up
        now = (
            node.now_s
            if self._background is None
            else max(node.now_s, self._clock() - self._origin)
        )
        if active is not None and active.remaining_s(now) > 0:
            tel.active_disturbance.CopyFrom(disturbance_to_proto(active.spec))
            tel.disturbance_remaining_s = active.remaining_s(now)
        # only the draining reader (the allocator's loop) moves what counts as reported
        reported: dict[str, Assignment] = {}
        if changed_pools_only:
            reported = self._pools_reported if drain else dict(self._pools_reported)
        for intent_id, run in node.runs.items():
            if reported.get(intent_id) is not run.assignment:
                self._pool(tel, intent_id, run)
                reported[intent_id] = run.assignment
            if sampled_only and not run.stats.has_recent:
                continue
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
        if drain:
            if len(reported) > len(node.runs):  # forget the pools that are gone
                reported = {i: a for i, a in reported.items() if i in node.runs}
            self._pools_reported = reported
        return tel

    def pool_ids(self) -> set[str]:
        with self._lock:
            return set(self.node.runs)

    def _pool(self, tel: telemetry_pb2.NodeTelemetry, intent_id: str, run: IntentRun) -> None:
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

    def set_service_drift(self, intent_id: str, factor: float) -> None:
        """From the next plan on, `intent_id`'s requests take `factor` x its declared base
        service time: the drift between what an intent declares and what it costs, which only
        observations reveal (the experiments' `drift` event)."""
        if not 0.0 < factor < 100.0:
            raise ValueError("drift factor must be in (0, 100)")
        with self._lock:
            self._drift[intent_id] = factor

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
        self._stopping.set()
        if self._background is not None:
            self._background.join(timeout=5)


def served(options: BackendOptions) -> ModeledBackend:
    """The node agent's modeled backend: the model advances in its own thread (wall clock)."""
    return ModeledBackend(options, background=True)
