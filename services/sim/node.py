"""The modeled node: intents' pools under the plan in force, contention between them, disturbances.

Each step the node draws arrivals, turns the plan (units, degradation, CPU placement and nice,
GPU lane, share and stream priority) and the interference around each intent into a service
time, and serves its queue. How contention works (configs/model.yaml documents each number):

* A request's median service time is ``base / S(p) x (cpu x d_cpu x I_cpu + gpu x d_gpu x I_gpu
  + net x I_net)``: the intent's declared Amdahl speedup S(p) over its units, split into the
  CPU, GPU and network parts of its workload class, each slowed by its own inflation.
* ``I_cpu = (1 + gain x sum_j units_j busy_j leak_ij / cpu_units) / (1 - cpu_pressure)``: other
  busy pools leak into this one fully on shared cores at equal nice, less when the other pool
  is deprioritised (nice >= 10, SCHED_BATCH/IDLE), least on disjoint cpu sets.
* ``I_gpu``: other intents' GPU load on the GPUs this one shares (all GPUs when the plan gives
  no lane), less for a higher stream priority; a
  GPU disturbance inflates it (half as much for a high-priority stream). MPS shares are not
  modeled as slowing the GPU part (batch-1 inference kernels rarely fill an H200's SMs).
* ``I_net = 1 / (1 - network_pressure)``.
* A pool under SCHED_IDLE runs only on cycles nobody else wants: its workers count as
  ``min(workers, cores - sum_j units_j busy_j)`` over the normal-priority pools on its cores,
  and only other idle-class pools slow it further.

Pure apart from its seeded random generators: the same seed, plan sequence and disturbances
give the same requests and the same latencies.
"""

from __future__ import annotations

import collections
import math
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from services.common.memory import ShrinkWatch
from services.sim.disturbance import ActiveDisturbance, DisturbanceSpec
from services.sim.params import ModelParams
from services.sim.queue import RequestQueue, StepOutcome
from services.sim.stats import IntentStats
from services.sim.workload import Assignment, WorkloadProfile

MAX_STEP_S = 0.25
LEFT_IDS_KEPT = 4096  # ids that left whose next run still gets a stream of its own
PAUSE_EVERY = 64
BATCH_SAMPLES_PER_STEP = 8  # item service-time samples a batch pool reports per step


@dataclass
class IntentRun:
    profile: WorkloadProfile
    stats: IntentStats
    queue: RequestQueue | None
    rng: np.random.Generator
    assignment: Assignment = field(default_factory=Assignment)
    busy: float = 0.0  # utilisation of the pool in the last step, [0, 1]
    mean_service_ms: float = 0.0  # median service time under the last step's conditions
    gpu_set: tuple[int, ...] = ()
    started_s: float = 0.0  # model time the node started running the intent
    incarnation: int = 0  # how many earlier runs of the same id the node remembers


class ModeledNode:
    def __init__(self, params: ModelParams, seed: int = 0, keep_history: bool = False) -> None:
        self.params = params
        self.seed = seed
        self.keep_history = keep_history
        self.now_s = 0.0
        self.runs: dict[str, IntentRun] = {}
        self.gpu_intent_enabled = True
        self.disturbance: ActiveDisturbance | None = None
        self.removed_arrived = 0  # requests of deleted intents, for the conservation check
        self.removed_completed = 0
        self.removed_dropped = 0
        self.retired: list[IntentRun] = []  # deleted intents' runs, kept when keep_history
        # the incarnation of the last run of ids that left, the last LEFT_IDS_KEPT of them: a
        # node serving for days sees ids come and go by the million
        self._left: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._shrink = ShrinkWatch()  # `runs` is rebuilt after a large shrink
        self._all_gpus = tuple(range(params.gpu_count))

    # -- what runs -------------------------------------------------------------------------

    def set_profiles(self, profiles: Iterable[WorkloadProfile]) -> None:
        """Make the node run exactly these intents; a deleted intent's waiting requests drop."""
        wanted = {p.intent_id: p for p in profiles}
        for intent_id in [i for i in self.runs if i not in wanted]:
            self._remove(intent_id)
        for profile in wanted.values():
            self._set_profile(profile)
        self._compact_if_shrunk()

    def _set_profile(self, profile: WorkloadProfile) -> None:
        run = self.runs.get(profile.intent_id)
        if run is None:
            self.runs[profile.intent_id] = self._new_run(profile)
        elif run.profile != profile:
            run.profile = profile
            run.stats.deadline_ms = profile.deadline_ms

    def change(
        self,
        entries: Iterable[tuple[WorkloadProfile, Assignment]],
        removed: Iterable[str],
        gpu_intent_enabled: bool,
    ) -> None:
        """A plan delta: the removed intents leave, the given ones start or change; the rest
        run on as they are (set_profiles + apply with the whole plan give the same node)."""
        self.gpu_intent_enabled = gpu_intent_enabled
        for intent_id in removed:
            if intent_id in self.runs:
                self._remove(intent_id)
        for profile, assignment in entries:
            self._set_profile(profile)
            self.runs[profile.intent_id].assignment = assignment
        self._compact_if_shrunk()

    def _compact_if_shrunk(self) -> None:
        """A dict keeps the table of its largest size after its entries are removed: after
        thousands of intents left, `runs` is rebuilt (services/common/memory.py)."""
        if self._shrink.shrunk(len(self.runs)):
            self.runs = dict(self.runs)

    def _new_run(self, profile: WorkloadProfile) -> IntentRun:
        # One stream per intent (and per re-submission of the same id): adding or removing an
        # intent never shifts another intent's requests, so policies see the same arrivals.
        key = zlib.crc32(profile.intent_id.encode())
        incarnation = self._left.pop(profile.intent_id, -1) + 1
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, key, incarnation]))
        queue = None if profile.is_batch else RequestQueue(rng, self.params.sigma)
        stats = IntentStats(
            deadline_ms=profile.deadline_ms,
            window_s=self.params.window_s,
            recent_max=self.params.recent_samples_max,
            keep_history=self.keep_history,
        )
        return IntentRun(
            profile=profile,
            stats=stats,
            queue=queue,
            rng=rng,
            started_s=self.now_s,
            incarnation=incarnation,
        )

    def _remove(self, intent_id: str) -> None:
        run = self.runs.pop(intent_id)
        self._left[intent_id] = run.incarnation
        if len(self._left) > LEFT_IDS_KEPT:
            self._left.popitem(last=False)  # forgotten: back in a while, it starts over
        if run.queue is not None:
            run.stats.dropped += run.queue.drop_all()
            self.removed_arrived += run.queue.arrived
            self.removed_completed += run.queue.completed
            self.removed_dropped += run.queue.dropped
        if self.keep_history:
            self.retired.append(run)

    def apply(self, assignments: Mapping[str, Assignment], gpu_intent_enabled: bool) -> None:
        """Enforce a plan: intents it does not mention get no units."""
        self.gpu_intent_enabled = gpu_intent_enabled
        for intent_id, run in self.runs.items():
            run.assignment = assignments.get(intent_id, Assignment())

    def inject(self, spec: DisturbanceSpec) -> ActiveDisturbance:
        """Start a disturbance now; it replaces one still active."""
        self.disturbance = ActiveDisturbance(spec=spec, started_s=self.now_s)
        return self.disturbance

    def active_disturbance(self) -> ActiveDisturbance | None:
        d = self.disturbance
        return d if d is not None and d.expires_s > self.now_s else None

    # -- time ------------------------------------------------------------------------------

    def advance(self, seconds: float, pause: Callable[[], None] | None = None) -> None:
        """Move the node forward, in steps no longer than a tick, split where a disturbance ends.

        ``pause``, when given, is called every PAUSE_EVERY intents within a step: the served
        modeled node lets its RPCs in there (a step of 10,000 intents takes longer than a
        tick). Runs changed or removed meanwhile are seen from the next step; a removed run is
        not stepped further."""
        end = self.now_s + seconds
        while self.now_s < end - 1e-12:
            step_end = min(end, self.now_s + MAX_STEP_S)
            d = self.active_disturbance()
            if d is not None and self.now_s < d.expires_s < step_end:
                step_end = d.expires_s
            self._step(step_end, pause)

    def pressures(self) -> tuple[float, float, float]:
        d = self.active_disturbance()
        if d is None:
            return 0.0, 0.0, 0.0
        cap = self.params.interference.max_pressure
        return min(cap, d.spec.cpu), min(cap, d.spec.gpu), min(cap, d.spec.network)

    def _step(self, t1: float, pause: Callable[[], None] | None = None) -> None:
        t0 = self.now_s
        dt = t1 - t0
        cpu_p, gpu_p, net_p = self.pressures()
        runs = list(self.runs.values())
        for run in runs:
            a = run.assignment
            use_lane = self.gpu_intent_enabled and bool(a.gpu_indexes)
            run.gpu_set = (
                (a.gpu_indexes if use_lane else self._all_gpus)
                if run.profile.mix.gpu_fraction > 0
                else ()
            )
        groups = _load_groups(runs)
        services = [self._mean_service_s(run, groups, cpu_p, gpu_p, net_p) for run in runs]
        lognormal_mean = math.exp(self.params.sigma**2 / 2)
        for k, (run, service_s) in enumerate(zip(runs, services, strict=True)):
            if pause is not None:
                if k % PAUSE_EVERY == PAUSE_EVERY - 1:
                    pause()
                if self.runs.get(run.profile.intent_id) is not run:
                    continue  # removed during a pause
            run.mean_service_ms = service_s * 1000.0 if math.isfinite(service_s) else 0.0
            p = run.profile
            if run.queue is None:
                remaining = max(0.0, p.work_units - run.stats.items_done)
                if math.isfinite(service_s) and remaining > 0:
                    items = min(remaining, dt / service_s)
                    samples = min(BATCH_SAMPLES_PER_STEP, math.ceil(items))
                    noise = run.rng.lognormal(0.0, self.params.sigma, samples)
                    run.stats.record_batch(t1, items, noise * service_s * 1000.0)
                    run.busy = 1.0
                else:
                    run.busy = 0.0
                continue
            run.queue.arrive(t0, t1, p.arrival_rate_per_s, periodic=p.arrivals == "periodic")
            timeout = (
                self.params.drop_after_deadlines * p.deadline_ms / 1000.0
                if (p.deadline_ms > 0)
                else math.inf
            )
            outcome: StepOutcome = run.queue.serve(t1, service_s, timeout)
            run.stats.record(t1, outcome)
            run.busy = (
                min(1.0, p.arrival_rate_per_s * service_s * lognormal_mean)
                if math.isfinite(service_s)
                else 0.0
            )
        self.now_s = t1

    def _mean_service_s(
        self,
        run: IntentRun,
        groups: dict[_GroupKey, _LoadGroup],
        cpu_p: float,
        gpu_p: float,
        net_p: float,
    ) -> float:
        a, p = run.assignment, run.profile
        if a.units <= 0:
            return math.inf
        inter = self.params.interference
        cpu_load = 0.0
        gpu_load = 0.0
        mine = set(run.gpu_set)
        idle_class = a.sched_policy == "idle"
        units: float = a.units
        own = _group_key(run)
        if idle_class:
            cores = len(a.cpu_set) if a.cpu_set else self.params.cpu_units
            taken = sum(
                g.cpu_busy
                for g in groups.values()
                if not g.idle
                and (not a.cpu_set or not g.cpu_set or not g.cpu_set.isdisjoint(a.cpu_set))
            )
            units = min(float(a.units), max(cores - taken, 0.0))
            if units <= 1e-3:
                return math.inf
        for key, g in groups.items():
            if idle_class and not g.idle:
                continue  # already charged: the idle-class pool only gets what they leave
            cpu_busy, gpu_busy = g.cpu_busy, g.gpu_busy
            if key == own:  # the others in this pool's own group, not the pool itself
                if g.count == 1:
                    continue
                cpu_busy = max(0.0, cpu_busy - a.units * run.busy)
                if run.gpu_set:
                    gpu_busy = max(0.0, gpu_busy - p.mix.gpu_fraction * run.busy)
            if a.cpu_set and g.cpu_set and g.cpu_set.isdisjoint(a.cpu_set):
                leak = inter.leak_separate_cpus
            elif g.deprioritised and not a.deprioritised:
                leak = inter.leak_deprioritised
            else:
                leak = inter.leak_shared
            cpu_load += cpu_busy * leak
            if mine and g.gpu_set:
                overlap = len(mine.intersection(g.gpu_set)) / len(mine)
                prio = inter.gpu_leak_priority if a.stream_priority > g.stream_priority else 1.0
                gpu_load += overlap * gpu_busy * prio
        i_cpu = (1.0 + inter.cpu_gain * cpu_load / self.params.cpu_units) / (1.0 - cpu_p)
        shield = inter.gpu_priority_shield if a.stream_priority > 0 else 1.0
        i_gpu = (1.0 + inter.gpu_gain * gpu_load) / (1.0 - gpu_p * shield)
        i_net = 1.0 / (1.0 - net_p)
        mix = p.mix
        d_cpu = self.params.degradation_cpu.get(a.degradation, 1.0)
        d_gpu = self.params.degradation_gpu.get(a.degradation, 1.0)
        bracket = (
            mix.cpu_fraction * d_cpu * i_cpu
            + mix.gpu_fraction * d_gpu * i_gpu
            + mix.network_fraction * i_net
        )
        return p.base_service_ms / 1000.0 / p.speedup(units) * bracket

    # -- accounting ------------------------------------------------------------------------

    def conservation(self) -> tuple[int, int, int, int]:
        """(arrived, completed, dropped, queued) over every intent the node ever ran."""
        arrived, completed, dropped, queued = (
            self.removed_arrived,
            self.removed_completed,
            self.removed_dropped,
            0,
        )
        for run in self.runs.values():
            if run.queue is not None:
                arrived += run.queue.arrived
                completed += run.queue.completed
                dropped += run.queue.dropped
                queued += run.queue.queued
        return arrived, completed, dropped, queued

    def gpu_utilisation(self) -> dict[int, float]:
        """Modeled busy fraction of each GPU: its intents' GPU load plus the disturbance."""
        _, gpu_p, _ = self.pressures()
        load = dict.fromkeys(self._all_gpus, gpu_p)
        for run in self.runs.values():
            if run.assignment.units <= 0:
                continue
            share = run.profile.mix.gpu_fraction * run.busy
            for index in run.gpu_set:
                load[index] = load.get(index, 0.0) + share
        return {i: min(1.0, v) for i, v in load.items()}

    def cpu_pressure(self) -> float:
        """A PSI-like 'some' figure: the share of deadline work's CPU time lost to waiting."""
        cpu_p, _, _ = self.pressures()
        total = 0.0
        weight = 0.0
        for run in self.runs.values():
            if run.queue is None or run.assignment.units <= 0:
                continue
            w = run.busy * run.assignment.units
            ideal = run.profile.base_service_ms / max(
                run.profile.speedup(run.assignment.units), 1e-9
            )
            lost = 1.0 - min(1.0, ideal / run.mean_service_ms) if run.mean_service_ms else 0.0
            total += w * lost
            weight += w
        mean_lost = total / weight if weight else 0.0
        return min(1.0, max(cpu_p, mean_lost))


# Pools that interfere with others the same way: the same cores, niceness class, idle class,
# GPUs and stream priority. Summing each group's busy load once per step makes a step cost
# O(pools x groups) instead of O(pools^2): 10,000 intents with ~1,400 busy pools took seconds
# per step pairwise; the groups are few (cpu sets and lanes, not intents).
_GroupKey = tuple[frozenset[int], bool, bool, frozenset[int], int]


@dataclass
class _LoadGroup:
    cpu_set: frozenset[int]
    deprioritised: bool
    idle: bool  # SCHED_IDLE
    gpu_set: frozenset[int]
    stream_priority: int
    cpu_busy: float = 0.0  # sum of units x busy
    gpu_busy: float = 0.0  # sum of gpu_fraction x busy, for pools on GPUs
    count: int = 0


def _group_key(run: IntentRun) -> _GroupKey:
    a = run.assignment
    return (
        frozenset(a.cpu_set),
        a.deprioritised,
        a.sched_policy == "idle",
        frozenset(run.gpu_set),
        a.stream_priority,
    )


def _load_groups(runs: Iterable[IntentRun]) -> dict[_GroupKey, _LoadGroup]:
    """The busy pools' load per interference group (``busy`` is the last step's)."""
    groups: dict[_GroupKey, _LoadGroup] = {}
    for run in runs:
        if run.assignment.units <= 0:
            continue
        key = _group_key(run)
        g = groups.get(key)
        if g is None:
            g = groups[key] = _LoadGroup(*key)
        g.cpu_busy += run.assignment.units * run.busy
        if run.gpu_set:
            g.gpu_busy += run.profile.mix.gpu_fraction * run.busy
        g.count += 1
    return groups
