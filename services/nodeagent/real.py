"""The real backend: NodePlans become PARFusion-owned worker pools on the arena cores.

Each allocation maps to one pool (ONLINE/ROBOT/URGENT: requests from an open-loop Poisson
generator at the intent's rate; BATCH: Amdahl GEMM jobs). Apply validates the whole plan
before touching anything, caps the synthetic load (nodeagent.max_workers,
max_load_fraction), resizes pools, enforces CPU set / nice / scheduling policy on the
workers, and records (dry-run) or writes (delegated) the cgroup v2 plan. Urgent requests
hold batch items back at the item boundary while they run.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from parfusion.v1 import intent_pb2, nodeagent_pb2, telemetry_pb2
from services.common.config import ConfigError
from services.common.errors import DomainError, FailedPrecondition, InvalidArgument
from services.nodeagent import cgroupfs, osctl, procfs
from services.nodeagent.allocation import check_unique
from services.nodeagent.backend import BackendOptions, next_generation
from services.nodeagent.latency import LatencyBook
from services.nodeagent.poolplan import BATCH_ITEM_MS, PoolSpec, batch_duty, capped, pool_spec
from services.nodeagent.pools import Completion, OsKnobs, WorkerPool, measure_rep_ms
from services.nodeagent.sources import AmdahlJobSource, RequestSource, Task

log = logging.getLogger(__name__)

ONLINE_N = 96  # online/urgent request kernel: reps of a 96 x 96 product
BATCH_N = 160  # batch item kernel
ARRIVAL_HORIZON_S = 0.2


class IntentRuntime:
    """A running pool, its work source and its latency book."""

    def __init__(self, spec: PoolSpec, matrix_n: int, reps: int, backend: RealBackend) -> None:
        self.intent_id = spec.intent_id
        self.workload_class = spec.workload_class
        self.book = LatencyBook(spec.intent_id, spec.deadline_ms, backend.options.latency_window_s)
        self.source: RequestSource | AmdahlJobSource
        if spec.kind == "batch":
            self.source = AmdahlJobSource(spec.parallel_fraction)
        else:
            self.source = RequestSource()
        urgent = spec.workload_class == "URGENT"
        self.pool = WorkerPool(
            spec.intent_id,
            spec.kind,
            self.source,
            matrix_n=matrix_n,
            reps=reps,
            on_complete=self._complete,
            on_start=backend.preempt_batch if urgent else None,
            on_finish=backend.release_batch if urgent else None,
        )
        self.rate_per_s = 0.0
        self.service_ms = spec.service_ms
        self.next_arrival = time.monotonic()
        self.spec = spec
        self.listeners: list[Callable[[Completion], None]] = []
        self.serving = False  # the request generator has started for this intent

    def _complete(self, done: Completion) -> None:
        self.book.record(done)
        for listener in self.listeners:
            listener(done)

    def stop(self) -> None:
        self.source.close()
        self.pool.stop()


class RealBackend:
    name = "real"

    def __init__(
        self,
        options: BackendOptions,
        *,
        arena: tuple[int, ...] | None = None,
        generate_arrivals: bool = True,
        pace_batch: bool = True,
        urgent_preempts_batch: bool = True,
        seed: int | None = None,
    ) -> None:
        self.options = options
        self.arena = arena or procfs.most_idle_cores(options.arena_cores, options.idle_sample_s)
        self.machine_cpus = osctl.online_cpus()
        self._sampler = procfs.NodeSampler()
        self._rep_ms = measure_rep_ms((ONLINE_N, BATCH_N))
        self._generate = generate_arrivals
        self._pace_batch = pace_batch
        self.urgent_preempts_batch = urgent_preempts_batch
        self._rng = random.Random(seed)
        self._lock = threading.RLock()
        self._intents: dict[str, IntentRuntime] = {}
        self._stopping: list[IntentRuntime] = []
        self._preempted: dict[int, list[AmdahlJobSource]] = {}
        self._generation = 0
        self._stress: WorkerPool | None = None
        self._disturbance: telemetry_pb2.Disturbance | None = None
        self._disturbance_until = 0.0
        self._writer: cgroupfs.DelegatedWriter | None = None
        if options.cgroup_mode == "delegated":
            if not options.cgroup_delegated_path:
                raise ConfigError(
                    "nodeagent.cgroup_delegated_path: required when cgroup_mode is delegated"
                )
            try:
                self._writer = cgroupfs.DelegatedWriter(Path(options.cgroup_delegated_path))
            except DomainError as exc:
                raise ConfigError(f"nodeagent.cgroup_delegated_path: {exc}") from exc
        self.detection = cgroupfs.detect(
            options.cgroup_delegated_path if self._writer else "",
            mount_override=options.cgroup_root,
        )
        self._plan_path = options.run_dir / "nodeagent" / "cgroup-plan.json"
        self._last_groups: list[cgroupfs.GroupPlan] | None = None
        self._running = threading.Event()
        self._running.set()
        self._arrivals = threading.Thread(target=self._arrival_loop, name="arrivals", daemon=True)
        if generate_arrivals:
            self._arrivals.start()
        log.info(
            "real backend ready",
            extra={"arena": ",".join(map(str, self.arena)), "cgroup": self.detection.reason},
        )

    @property
    def _cap_cores(self) -> float:
        """Cores' worth of synthetic load the arena may carry (nodeagent.max_load_fraction)."""
        return len(self.arena) * self.options.max_load_fraction

    # -- plan ---------------------------------------------------------------------------------
    def apply(self, plan: intent_pb2.NodePlan) -> list[nodeagent_pb2.AppliedAllocation]:
        specs = [
            pool_spec(i, a, self.machine_cpus, self.arena, self.options.default_service_ms)
            for i, a in enumerate(plan.allocations)
        ]
        ids = [s.intent_id for s in specs]
        check_unique(ids)
        specs = capped(specs, self.options.max_workers, self._cap_cores, self._generate)
        with self._lock:
            changed = {
                s.intent_id
                for s in specs
                if s.intent_id in self._intents and self._intents[s.intent_id].spec.kind != s.kind
            }
            for gone in (set(self._intents) - set(ids)) | changed:
                old = self._intents.pop(gone)
                self._stopping.append(old)
                threading.Thread(target=self._retire, args=(old,), daemon=True).start()
            for spec in specs:
                n = BATCH_N if spec.kind == "batch" else ONLINE_N
                reps = max(1, round(spec.service_ms / self._rep_ms[n]))
                runtime = self._intents.get(spec.intent_id) or IntentRuntime(spec, n, reps, self)
                if spec.intent_id not in self._intents:
                    self._intents[spec.intent_id] = runtime
                runtime.pool.reps = reps
                runtime.book.deadline_ms = spec.deadline_ms
                runtime.service_ms = spec.service_ms
                if runtime.rate_per_s == 0 and spec.rate_per_s > 0:
                    runtime.next_arrival = time.monotonic()
                runtime.rate_per_s = spec.rate_per_s
                runtime.spec = spec
                runtime.pool.set_knobs(spec.knobs)
                runtime.pool.resize(spec.workers)
            self._pace(specs)
            self._generation = next_generation(plan.generation, self._generation)
            self._cgroups(specs)
            return [
                nodeagent_pb2.AppliedAllocation(
                    intent_id=s.intent_id,
                    workers=self._intents[s.intent_id].pool.size,
                    cpu_set=list(s.knobs.cpu_set),
                    nice=s.knobs.nice,
                    cgroup_mode=self._cgroup_mode(),
                    note="; ".join(
                        filter(
                            None, [s.note, self._intents[s.intent_id].pool.last_enforcement_error]
                        )
                    ),
                )
                for s in specs
            ]

    def _pace(self, specs: list[PoolSpec]) -> None:
        """Batch duty so online + batch stay within max_load_fraction of the arena."""
        if not self._pace_batch:
            return
        duty = batch_duty(specs, self._cap_cores)
        for s in specs:
            if s.kind == "batch":
                self._intents[s.intent_id].pool.duty = duty

    def _cgroup_mode(self) -> str:
        if self._writer is not None:
            return "delegated"
        return "dry-run" if self.detection.unified else "unavailable"

    def _cgroups(self, specs: list[PoolSpec]) -> None:
        groups = [
            replace(s.group, pids=tuple(self._intents[s.intent_id].pool.pids())) for s in specs
        ]
        if groups == self._last_groups:
            return  # same groups, same pids: nothing to record or write (plans arrive every tick)
        self._last_groups = groups
        rec = cgroupfs.CgroupRecord(
            generation=self._generation,
            mode=self._cgroup_mode(),
            detection=self.detection,
            groups=groups,
        )
        if self._writer is not None:
            owned = self.owned_pids()
            for g in groups:
                try:
                    rec.written.extend(self._writer.apply(g, owned))
                except (DomainError, OSError) as exc:
                    rec.errors.append(f"{g.path}: {exc}")
        cgroupfs.record(rec, self._plan_path)

    def cgroup_plan_path(self) -> str:
        return str(self._plan_path)

    # -- urgent preempts batch ----------------------------------------------------------------
    def preempt_batch(self, task: Task) -> None:
        if not self.urgent_preempts_batch:
            return
        with self._lock:
            held = [
                r.source for r in self._intents.values() if isinstance(r.source, AmdahlJobSource)
            ]
            self._preempted[id(task)] = held
        for source in held:
            source.pause()

    def release_batch(self, task: Task) -> None:
        with self._lock:
            held = self._preempted.pop(id(task), [])
        for source in held:
            source.resume()

    # -- arrivals -----------------------------------------------------------------------------
    def _arrival_loop(self) -> None:
        while self._running.is_set():
            horizon = time.monotonic() + ARRIVAL_HORIZON_S
            with self._lock:
                runtimes = [
                    r
                    for r in self._intents.values()
                    if isinstance(r.source, RequestSource) and r.rate_per_s > 0
                ]
            for r in runtimes:
                if not r.serving:
                    # Arrivals start when the pool first serves, not while its first workers are
                    # still starting (afterwards they never wait: the generator is open loop).
                    if r.pool.ready_count() == 0:
                        continue
                    r.serving = True
                    r.next_arrival = time.monotonic()
                due: list[float] = []
                while r.next_arrival < horizon:
                    r.next_arrival += self._rng.expovariate(r.rate_per_s)
                    due.append(r.next_arrival)
                assert isinstance(r.source, RequestSource)
                r.source.schedule(due)
            time.sleep(ARRIVAL_HORIZON_S / 2)

    def source(self, intent_id: str) -> RequestSource | AmdahlJobSource:
        """The work source of one intent's pool (the co-run benchmark schedules into it)."""
        with self._lock:
            return self._intents[intent_id].source

    def request_source(self, intent_id: str) -> RequestSource:
        """The timed request queue of an ONLINE/ROBOT/URGENT intent's pool."""
        source = self.source(intent_id)
        if not isinstance(source, RequestSource):
            raise InvalidArgument(
                f"{intent_id} is a batch intent: it has no request queue", field="intent_id"
            )
        return source

    def reset_books(self) -> None:
        """Forget every intent's latency window and counts: a benchmark phase starts its own
        measurement, so the previous phase's tail does not stand for this one's."""
        with self._lock:
            books = [runtime.book for runtime in self._intents.values()]
        for book in books:
            book.reset()

    def book(self, intent_id: str) -> LatencyBook:
        with self._lock:
            return self._intents[intent_id].book

    def on_complete(self, intent_id: str, listener: Callable[[Completion], None]) -> None:
        """Also hand every completion of this intent to listener (raw samples for the benchmark)."""
        with self._lock:
            self._intents[intent_id].listeners.append(listener)

    @property
    def plan_generation(self) -> int:
        """Generation of the last plan applied."""
        with self._lock:
            return self._generation

    def pool_sizes(self) -> dict[str, int]:
        """Workers per intent right now (no telemetry side effects: nothing is drained)."""
        with self._lock:
            return {i: r.pool.size for i, r in self._intents.items()}

    # -- telemetry ----------------------------------------------------------------------------
    def telemetry(
        self, drain: bool = True, sampled_only: bool = False, changed_pools_only: bool = False
    ) -> telemetry_pb2.NodeTelemetry:
        sample = self._sampler.sample()
        tel = telemetry_pb2.NodeTelemetry(
            node=self.options.node_name,
            backend=self.name,
            cpu_percent_per_core=list(sample.cpu_percent_per_core),
            load1=sample.load1,
            memory_total_bytes=sample.memory_total_bytes,
            memory_used_bytes=sample.memory_used_bytes,
            arena_cpus=list(self.arena),
            cpu_pressure=_pressure(sample.cpu_pressure),
            memory_pressure=_pressure(sample.memory_pressure),
            io_pressure=_pressure(sample.io_pressure),
        )
        tel.observed_at.GetCurrentTime()
        now = time.monotonic()
        with self._lock:
            tel.plan_generation = self._generation
            runtimes = list(self._intents.values())
            if self._disturbance is not None and now < self._disturbance_until:
                tel.active_disturbance.CopyFrom(self._disturbance)
                tel.disturbance_remaining_s = self._disturbance_until - now
        for r in runtimes:
            if not sampled_only or r.book.has_samples:
                tel.latencies.append(r.book.summary(drain=drain))
            knobs = r.pool.knobs
            tel.pools.append(
                telemetry_pb2.PoolStatus(
                    intent_id=r.intent_id,
                    kind=r.spec.kind,
                    workers=r.pool.size,
                    pids=r.pool.pids(),
                    cpu_set=list(knobs.cpu_set or self.arena),
                    nice=knobs.nice,
                    queued=r.source.backlog(now),
                    items_per_s=r.book.items_per_s(now),
                    sched_policy=knobs.sched_policy,
                )
            )
        return tel

    def pool_ids(self) -> set[str]:
        with self._lock:
            return set(self._intents)

    # -- disturbance --------------------------------------------------------------------------
    def inject_disturbance(self, disturbance: telemetry_pb2.Disturbance) -> tuple[bool, float]:
        if not self.options.allow_real_stress:
            raise FailedPrecondition(
                "the real backend runs no synthetic stress unless nodeagent.allow_real_stress is true "
                "(use the modeled backend for what-if disturbances)"
            )
        d = disturbance
        for name in ("cpu_pressure", "gpu_pressure", "network_pressure"):
            if not 0.0 <= getattr(d, name) <= 1.0:
                raise InvalidArgument("must be in [0, 1]", field=f"disturbance.{name}")
        if not 0.0 < d.duration_s <= 600.0:
            raise InvalidArgument("must be in (0, 600]", field="disturbance.duration_s")
        with self._lock:
            used = sum(r.pool.size for r in self._intents.values())
            workers = min(
                math.ceil(d.cpu_pressure * len(self.arena)), max(0, self.options.max_workers - used)
            )
            if self._stress is not None:
                self._stress.stop()
            self._stress = WorkerPool(
                "disturbance",
                "batch",
                AmdahlJobSource(1.0),
                matrix_n=BATCH_N,
                reps=max(1, round(BATCH_ITEM_MS / self._rep_ms[BATCH_N])),
                on_complete=lambda c: None,
            )
            self._stress.set_knobs(OsKnobs(cpu_set=self.arena))
            self._stress.resize(workers)
            self._disturbance = telemetry_pb2.Disturbance()
            self._disturbance.CopyFrom(d)
            self._disturbance_until = time.monotonic() + d.duration_s
            stress = self._stress
        timer = threading.Timer(d.duration_s, self._end_stress, args=(stress,))
        timer.daemon = True
        timer.start()
        return True, d.duration_s

    def _end_stress(self, stress: WorkerPool) -> None:
        stress.stop()
        with self._lock:
            if self._stress is stress:
                self._stress = None

    # -- ownership and lifecycle --------------------------------------------------------------
    def owned_pids(self) -> set[int]:
        with self._lock:
            pools = [r.pool for r in [*self._intents.values(), *self._stopping]]
            if self._stress is not None:
                pools.append(self._stress)
        return set().union(*(p.all_pids() for p in pools)) if pools else set()

    def _retire(self, runtime: IntentRuntime) -> None:
        runtime.stop()
        with self._lock:
            if runtime in self._stopping:
                self._stopping.remove(runtime)

    def stop(self) -> None:
        self._running.clear()
        with self._lock:
            runtimes = [*self._intents.values(), *self._stopping]
            self._intents, self._stopping = {}, []
            stress, self._stress = self._stress, None
        threads = [threading.Thread(target=r.stop) for r in runtimes]
        if stress is not None:
            threads.append(threading.Thread(target=stress.stop))
        for t in threads:
            t.start()
        for t in threads:
            t.join(5.0)


def _pressure(p: procfs.PressureReading) -> telemetry_pb2.Pressure:
    return telemetry_pb2.Pressure(
        some_avg10=p.some_avg10, full_avg10=p.full_avg10, available=p.available
    )
