"""The real backend: NodePlans become PARFusion-owned worker pools on the arena cores.

Each allocation maps to one pool (ONLINE/ROBOT/URGENT: requests from an open-loop Poisson
generator at the intent's rate; BATCH: Amdahl GEMM jobs). Apply validates the whole plan
before touching anything, caps the synthetic load (nodeagent.max_workers,
max_load_fraction), resizes pools, enforces CPU set / nice / scheduling policy on the
workers, and records (dry-run) or writes (delegated) the cgroup v2 plan. A plan delta
(apply_changes) touches only the pools whose spec or cap changed and those with workers.
Urgent requests hold batch items back at the item boundary while they run.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from parfusion.v1 import intent_pb2, nodeagent_pb2, telemetry_pb2
from services.common.config import ConfigError
from services.common.errors import DomainError, FailedPrecondition, InvalidArgument
from services.nodeagent import cgroupfs, osctl, procfs
from services.nodeagent.allocation import check_unique
from services.nodeagent.backend import BackendOptions, next_generation
from services.nodeagent.latency import LatencyBook
from services.nodeagent.poolplan import (
    BATCH_ITEM_MS,
    PoolSpec,
    arrival_scale,
    batch_duty,
    cut,
    offered_load,
    pool_spec,
    scale_note,
    worker_cuts,
)
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
        self.rate_per_s = 0.0  # as the plan offers it; arrivals come at the backend's scale
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
        # the plan in force (uncapped specs, plan order), the cap's cuts, the intents whose pools
        # the plan gives workers, and the arrival scale: apply_changes looks again only at what
        # moves among these
        self._specs: dict[str, PoolSpec] = {}
        self._cuts: dict[str, int] = {}
        self._active: set[str] = set()
        self._scale = 1.0
        self._duty = 1.0  # batch pools' duty under the plan in force
        # pools that have or may have had workers since they were last seen empty and drained:
        # the only ones with samples, processes or a size that moves between plans
        self._live: set[str] = set()
        self._pools_changed: set[str] = set()  # since the loop's last telemetry
        self._groups: dict[str, cgroupfs.GroupPlan] = {}  # as last recorded, pids included
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
        # dry-run: the record of what would be written, rewritten at most once a second
        self._recorder = cgroupfs.PlanRecorder(self._plan_path)
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
        """The whole plan: a pool for every allocation in it, none for any other intent."""
        specs = self._specs_of(plan)
        with self._lock:
            return self._install({s.intent_id: s for s in specs}, specs, plan.generation)

    def apply_changes(
        self, plan: intent_pb2.NodePlan, removed: Sequence[str]
    ) -> list[nodeagent_pb2.AppliedAllocation]:
        """A plan delta: ``plan`` holds the allocations that changed, ``removed`` the intents that
        left; every other intent keeps its allocation. All or nothing, like apply. What it costs
        follows the change and the pools that have workers, not the intents that exist."""
        specs = self._specs_of(plan)
        with self._lock:
            held = dict(self._specs)
            for intent_id in removed:
                held.pop(intent_id, None)
            held.update((s.intent_id, s) for s in specs)
            return self._install(held, specs, plan.generation)

    def _specs_of(self, plan: intent_pb2.NodePlan) -> list[PoolSpec]:
        """Every allocation checked before anything is touched."""
        specs = [
            pool_spec(i, a, self.machine_cpus, self.arena, self.options.default_service_ms)
            for i, a in enumerate(plan.allocations)
        ]
        check_unique([s.intent_id for s in specs])
        return specs

    def _install(
        self, held: dict[str, PoolSpec], changed: list[PoolSpec], generation: int
    ) -> list[nodeagent_pb2.AppliedAllocation]:
        """Make the pools match ``held`` (the plan in force, uncapped), looking again only at the
        intents whose spec changed and at the pools that have or had workers."""
        cuts = worker_cuts(held.values(), self.options.max_workers)
        active = {i for i, spec in held.items() if cuts.get(i, spec.workers) > 0}
        online_load = sum(offered_load(held[i]) for i in active)
        scale = arrival_scale(online_load, self._cap_cores) if self._generate else 1.0
        # a cut only moves between plans for a pool whose spec changed or that has or had
        # workers; any other pool is its spec, read through planned() with the current cuts
        look = {s.intent_id for s in changed} | active | self._active
        left = [i for i in self._specs if i not in held]
        gone = [i for i in self._intents if i not in held]
        gone += [
            i
            for i in look
            if i in self._intents and i in held and self._intents[i].spec.kind != held[i].kind
        ]
        for intent_id in gone:
            self._retire(self._intents.pop(intent_id))
            self._live.discard(intent_id)
        for intent_id in left:
            self._groups.pop(intent_id, None)
        batch_workers = sum(cuts.get(i, held[i].workers) for i in active if held[i].kind == "batch")
        duty = (
            batch_duty(online_load * scale, batch_workers, self._cap_cores)
            if self._pace_batch
            else 1.0
        )
        self._specs, self._cuts, self._active, self._scale = held, cuts, active, scale
        self._duty = duty
        # a pool runs (has a runtime: workers, work source, latency book) once the plan gives it
        # workers; the others are only their spec until then
        first = [s.intent_id for s in changed]  # in plan order, then the others looked at
        for intent_id in [*first, *sorted(look.difference(first))]:
            if intent_id in active or intent_id in self._intents:
                self._update(self.planned(intent_id))
        self._live |= active
        self._pools_changed |= look
        self._generation = next_generation(generation, self._generation)
        self._cgroups(look, bool(left) or bool(gone))
        return [self._applied(s.intent_id) for s in changed]

    def planned(self, intent_id: str) -> PoolSpec:
        """The intent's pool as the plan in force has it, with the worker cap's cut."""
        spec = self._specs[intent_id]
        workers = self._cuts.get(intent_id)
        return spec if workers is None else cut(spec, workers)

    def _update(self, spec: PoolSpec) -> IntentRuntime:
        """One pool to its (capped) spec: kernel size, knobs, workers, arrival rate, duty."""
        n = BATCH_N if spec.kind == "batch" else ONLINE_N
        reps = max(1, round(spec.service_ms / self._rep_ms[n]))
        runtime = self._intents.get(spec.intent_id)
        if runtime is None:
            runtime = self._intents[spec.intent_id] = IntentRuntime(spec, n, reps, self)
        runtime.pool.reps = reps
        runtime.book.deadline_ms = spec.deadline_ms
        runtime.service_ms = spec.service_ms
        if runtime.rate_per_s == 0 and spec.rate_per_s > 0:
            runtime.next_arrival = time.monotonic()
        runtime.rate_per_s = spec.rate_per_s
        runtime.spec = spec
        if spec.kind == "batch":
            runtime.pool.duty = self._duty
        runtime.pool.set_knobs(spec.knobs)
        runtime.pool.resize(spec.workers)  # also replaces a worker that was lost
        return runtime

    def _runtime(self, intent_id: str) -> IntentRuntime:
        """The intent's running pool, started (with no workers) if the plan holds the intent
        but gave it none yet: a benchmark may queue work or read the book before it runs."""
        runtime = self._intents.get(intent_id)
        if runtime is None:
            if intent_id not in self._specs:
                raise KeyError(intent_id)
            runtime = self._update(self.planned(intent_id))
        return runtime

    def _applied(self, intent_id: str) -> nodeagent_pb2.AppliedAllocation:
        runtime = self._intents.get(intent_id)
        spec = self.planned(intent_id)
        scaled = scale_note(self._scale) if spec.kind == "online" and self._scale < 1 else ""
        error = runtime.pool.last_enforcement_error if runtime else ""
        return nodeagent_pb2.AppliedAllocation(
            intent_id=intent_id,
            workers=runtime.pool.size if runtime else 0,
            cpu_set=list(spec.knobs.cpu_set),
            nice=spec.knobs.nice,
            cgroup_mode=self._cgroup_mode(),
            note="; ".join(filter(None, [spec.note, scaled, error])),
        )

    def _cgroup_mode(self) -> str:
        if self._writer is not None:
            return "delegated"
        return "dry-run" if self.detection.unified else "unavailable"

    def _cgroups(self, look: set[str], removed: bool) -> None:
        """Record (dry-run) or write (delegated) the groups when one changed: its spec or pids."""
        changed: list[cgroupfs.GroupPlan] = []
        for intent_id in look:
            spec = self._specs.get(intent_id)
            if spec is None:
                continue
            runtime = self._intents.get(intent_id)
            pids = tuple(runtime.pool.pids()) if runtime else ()
            group = replace(spec.group, pids=pids) if pids else spec.group
            if self._groups.get(intent_id) != group:
                self._groups[intent_id] = group
                changed.append(group)
        if not changed and not removed:
            return  # same groups, same pids: nothing to record or write (plans arrive every tick)
        groups = [self._groups[i] for i in self._specs if i in self._groups]
        rec = cgroupfs.CgroupRecord(
            generation=self._generation,
            mode=self._cgroup_mode(),
            detection=self.detection,
            groups=groups,
        )
        if self._writer is None:
            self._recorder.record(rec)
            return
        owned = self.owned_pids()
        for g in changed:
            try:
                rec.written.extend(self._writer.apply(g, owned))
            except (DomainError, OSError) as exc:
                rec.errors.append(f"{g.path}: {exc}")
        cgroupfs.record(rec, self._plan_path)  # what this plan wrote, with it

    def cgroup_plan_path(self) -> str:
        return str(self._plan_path)

    # -- urgent preempts batch ----------------------------------------------------------------
    def preempt_batch(self, task: Task) -> None:
        if not self.urgent_preempts_batch:
            return
        with self._lock:
            held = [
                r.source for r in self._live_runtimes() if isinstance(r.source, AmdahlJobSource)
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
                    for r in self._live_runtimes()
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
                rate = self.arrival_rate(r)
                while r.next_arrival < horizon:
                    r.next_arrival += self._rng.expovariate(rate)
                    due.append(r.next_arrival)
                assert isinstance(r.source, RequestSource)
                r.source.schedule(due)
            time.sleep(ARRIVAL_HORIZON_S / 2)

    def arrival_rate(self, runtime: IntentRuntime) -> float:
        """Requests per second the generator sends to this pool: the plan's rate, scaled with
        every other online pool that has workers into nodeagent.max_load_fraction."""
        return runtime.rate_per_s * self._scale

    def source(self, intent_id: str) -> RequestSource | AmdahlJobSource:
        """The work source of one intent's pool (the co-run benchmark schedules into it)."""
        with self._lock:
            return self._runtime(intent_id).source

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
            return self._runtime(intent_id).book

    def on_complete(self, intent_id: str, listener: Callable[[Completion], None]) -> None:
        """Also hand every completion of this intent to listener (raw samples for the benchmark)."""
        with self._lock:
            self._runtime(intent_id).listeners.append(listener)

    @property
    def plan_generation(self) -> int:
        """Generation of the last plan applied."""
        with self._lock:
            return self._generation

    def pool_sizes(self) -> dict[str, int]:
        """Workers per intent right now (no telemetry side effects: nothing is drained)."""
        with self._lock:
            return {i: r.pool.size if (r := self._intents.get(i)) else 0 for i in self._specs}

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
            if changed_pools_only:
                # the pools a plan touched since the last such reply, and those with workers
                ids = sorted((self._pools_changed | self._live) & self._specs.keys())
                if drain:  # only the draining reader (the loop) moves what counts as reported
                    self._pools_changed = set()
            else:
                ids = list(self._specs)
            pools = [(self._specs[i], self._intents.get(i)) for i in ids]
            # samples come only from pools that had workers
            sampling = self._live_runtimes() if sampled_only else list(self._intents.values())
            if self._disturbance is not None and now < self._disturbance_until:
                tel.active_disturbance.CopyFrom(self._disturbance)
                tel.disturbance_remaining_s = self._disturbance_until - now
        for runtime in sampling:
            if not sampled_only or runtime.book.has_samples:
                tel.latencies.append(runtime.book.summary(drain=drain))
        for spec, r in pools:  # a pool the plan gave no workers yet has no runtime
            knobs = spec.knobs
            tel.pools.append(
                telemetry_pb2.PoolStatus(
                    intent_id=spec.intent_id,
                    kind=spec.kind,
                    workers=r.pool.size if r else 0,
                    pids=r.pool.pids() if r else [],
                    cpu_set=list(knobs.cpu_set or self.arena),
                    nice=knobs.nice,
                    queued=r.source.backlog(now) if r else 0,
                    items_per_s=r.book.items_per_s(now) if r else 0.0,
                    sched_policy=knobs.sched_policy,
                )
            )
        if drain:
            self._forget_idle()
        return tel

    def _forget_idle(self) -> None:
        """Pools the plan gives no workers, whose processes are gone and whose samples were
        read, leave the live set: nothing about them moves until a plan touches them."""
        with self._lock:
            for r in self._live_runtimes():
                if (
                    r.intent_id not in self._active
                    and not r.book.has_samples
                    and not r.pool.all_pids()
                ):
                    self._live.discard(r.intent_id)

    def pool_ids(self) -> set[str]:
        with self._lock:
            return set(self._specs)

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
            used = sum(r.pool.size for r in self._live_runtimes())
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
            pools = [r.pool for r in [*self._live_runtimes(), *self._stopping]]
            if self._stress is not None:
                pools.append(self._stress)
        return set().union(*(p.all_pids() for p in pools)) if pools else set()

    def _live_runtimes(self) -> list[IntentRuntime]:
        return [self._intents[i] for i in sorted(self._live) if i in self._intents]

    def _retire(self, runtime: IntentRuntime) -> None:
        """Stop a pool that left the plan: at once when it has no process, else in the
        background (its workers finish the task they hold first)."""
        if not runtime.pool.all_pids():
            runtime.stop()
            return
        self._stopping.append(runtime)
        threading.Thread(target=self._stop_retired, args=(runtime,), daemon=True).start()

    def _stop_retired(self, runtime: IntentRuntime) -> None:
        runtime.stop()
        with self._lock:
            if runtime in self._stopping:
                self._stopping.remove(runtime)

    def stop(self) -> None:
        self._running.clear()
        self._recorder.close()  # the last plan's record, if it was still waiting
        with self._lock:
            runtimes = [*self._intents.values(), *self._stopping]
            self._intents, self._stopping = {}, []
            stress, self._stress = self._stress, None
        busy = []
        for runtime in runtimes:  # pools with processes stop in parallel, the others at once
            if runtime.pool.all_pids():
                busy.append(runtime)
            else:
                runtime.stop()
        threads = [threading.Thread(target=r.stop) for r in busy]
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
