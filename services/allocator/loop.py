"""The node control loop: every tick, intents + telemetry -> active policy -> NodePlan/GpuPlan.

One tick: take the store's intents (re-converted only when the store's version moved), pull
node and GPU telemetry (concurrently, each with a deadline), feed the predictor
with the service times the node agent observed, build the NodeState (capacity, lanes,
contention, disturbance, staleness), run the active policy, publish the plans to GetPlan and
WatchPlans subscribers, and push them to the node agent and gpulane. The loop's own ticks
overlap the peers' work with the sleep between ticks: the pushes and the next pulls start as a
tick ends and the next tick finishes them first (``tick(overlap=True)``). A peer that is down
makes the node stale and the loop keeps planning on the last known capacity; it resumes by
itself when the peer comes back. PreviewPlan runs the same steps on a copy and applies nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from parfusion.v1 import intent_pb2, telemetry_pb2
from services.allocator import metrics, plans
from services.allocator.gcpause import cyclic_gc_paused
from services.allocator.nodestate import Telemetry, is_stale, node_state
from services.allocator.peers import GpuLaneClient, NodeAgentClient
from services.allocator.store import IntentStore
from services.allocator.store_batch import StoredIntent
from services.allocator.watch import PlanChanges, PlanFeed, PlanSnapshot
from services.common.malloc import FlushPoint
from services.common.memory import ShrinkWatch, release_freed_memory
from services.core import convert, model
from services.core.policies.base import Policy
from services.core.policies.registry import get_policy
from services.core.predictor import CalibrationState, Predictor
from services.core.stability import window_ticks
from services.core.tick import observations, observe, plan_tick

log = logging.getLogger(__name__)

_SEQ = operator.attrgetter("seq")
_ID = operator.attrgetter("id")
_NAME = operator.attrgetter("name")


@dataclass(frozen=True)
class LoopConfig:
    node_name: str = "node-0"
    tick_s: float = 0.25
    nodeagent_address: str = ""  # empty: no pull/push (telemetry only through ReportTelemetry)
    gpulane_address: str = ""
    cpu_units: int = 0  # 0: the agent's arena size, else os.cpu_count()
    stale_after_s: float = 1.5
    dmug: model.DmugConfig = field(default_factory=model.DmugConfig)
    configured_lanes: Mapping[str, Sequence[int]] = field(default_factory=dict)
    api_token: str | None = None

    @property
    def rpc_timeout_s(self) -> float:
        return max(0.05, self.tick_s / 2)


class _LockedPredictor:
    """The loop's predictor behind a lock: telemetry threads feed it while ticks and previews
    read it (the predictor itself is plain data, not thread-safe)."""

    def __init__(self, predictor: Predictor) -> None:
        self.predictor = predictor
        self.lock = threading.Lock()

    def observe_many(
        self, intent_id: str, samples: Iterable[float], units: int = 1, factor: float = 1.0
    ) -> None:
        with self.lock:
            self.predictor.observe_many(intent_id, samples, units=units, factor=factor)

    def calibrate(
        self, intent_id: str, observed_ms: float, count: int, decision: model.Decision, tick: int
    ) -> float | None:
        with self.lock:
            return self.predictor.calibrate(intent_id, observed_ms, count, decision, tick)

    def calibration(self, intent_id: str) -> CalibrationState | None:
        with self.lock:
            return self.predictor.calibration(intent_id)

    def snapshot(self) -> dict[str, model.ServiceStats]:
        with self.lock:
            return self.predictor.snapshot()

    def forget(self, intent_ids: Iterable[str]) -> None:
        with self.lock:
            for intent_id in intent_ids:
                self.predictor.forget(intent_id)

    def compact(self) -> None:
        with self.lock:
            self.predictor.compact()


# node and GPU telemetry calls, and when the node's reply came (see _start_pulls)
_Pulls = tuple[Any, Any, list[tuple[float, Timestamp]]]


@dataclass(frozen=True)
class _InFlight:
    """Calls an overlapped tick left running: its pushes, and the pulls the next tick reads."""

    pushes: tuple[Any, Any]
    pulls: _Pulls


class ControlLoop:
    """Owns the plan state; ``tick()`` is one iteration (the thread calls it every tick_s)."""

    def __init__(
        self,
        store: IntentStore,
        config: LoopConfig,
        *,
        policy: str = "parfusion",
        predictor: Predictor | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.config = config
        self._policy = get_policy(policy)
        self.predictor = predictor or Predictor()
        self._stats = _LockedPredictor(self.predictor)
        self._clock = clock
        self._lock = threading.RLock()
        self._telemetry = Telemetry()
        self._tick = 0
        self._generation = 0
        self._previous: Mapping[str, model.Decision] = {}
        self._intents_version = -1
        self._intents: dict[str, intent_pb2.ResourceIntent] = {}
        self._specs: tuple[model.IntentSpec, ...] = ()
        # every stored intent (any node) by id, in seq order: it and its spec; and this node's
        # specs and messages, in seq order (see _current_intents)
        self._rows: dict[str, tuple[StoredIntent, model.IntentSpec]] = {}
        self._mine_specs: dict[str, model.IntentSpec] = {}
        self._mine_intents: dict[str, intent_pb2.ResourceIntent] = {}
        self._class_counts: dict[str, int] = {}
        self._allocation_cache = plans.AllocationCache()  # the ticks' own (not previews')
        self._cached_generation = 0  # the generation of the plan the cache last made
        self._preview_policies: dict[str, Policy] = {}  # per policy name, previews' own
        self._names: dict[str, str] = {}  # the ticks' own: intent id -> name, for the gauges
        self._names_of: tuple[model.IntentSpec, ...] | None = None
        # the last NodePlan's entries (a NodePlan holding one Allocation, serialized) and
        # workers per intent id (plain ints and bytes: no message wrappers for the garbage
        # collector to walk)
        self._plan_entries: dict[str, bytes] = {}
        self._workers: dict[str, int] = {}
        self._policy_error: str | None = None
        self._shrink = ShrinkWatch()
        self._release_pending = False  # the store shrank a lot: trim after the next tick
        self.feed = PlanFeed()
        self.metrics = metrics.DecisionMetrics()
        self._stability_window = window_ticks(config.tick_s)
        self.nodeagent = (
            NodeAgentClient(config.nodeagent_address, config.api_token)
            if config.nodeagent_address
            else None
        )
        self.gpulane = (
            GpuLaneClient(config.gpulane_address, config.api_token)
            if config.gpulane_address
            else None
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # an overlapped tick's pushes and the next tick's pulls, in flight while the loop
        # sleeps; the loop thread's own (see tick)
        self._in_flight: _InFlight | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="allocator-loop", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop ticking and end every WatchPlans stream cleanly."""
        self._stop.set()
        self.feed.close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        flight, self._in_flight = self._in_flight, None
        if flight is not None:  # the last plan's acknowledgement; the pulls are dropped
            self._finish_pushes(flight.pushes)
        for peer in (self.nodeagent, self.gpulane):
            if peer is not None:
                peer.close()
        self.metrics.close()

    def _run(self) -> None:
        next_at = self._clock()
        flush = FlushPoint()  # this thread's malloc cache, emptied after a large shrink
        while not self._stop.is_set():
            try:
                self.tick(overlap=True)
            except Exception:  # the loop must outlive any single bad tick
                log.exception("tick failed")
            flush()
            next_at += self.config.tick_s
            now = self._clock()
            if next_at < now:  # overran: start the next tick now rather than bursting to catch up
                next_at = now
            self._stop.wait(next_at - now)

    # --- one tick ----------------------------------------------------------------------------

    def tick(self, overlap: bool = False) -> PlanSnapshot | None:
        """One tick. By default it pulls telemetry and plans on it, and returns once the node
        agent and gpulane acknowledged the plans. With ``overlap`` (the loop's own ticks) the
        pushes and the next tick's pulls stay in flight while the loop sleeps, and the next
        tick finishes them first: the peers' work is off the tick's critical path, and the
        telemetry a tick plans on was read at the end of the tick before."""
        started = time.perf_counter()
        snapshot = self._tick_once(overlap)
        if snapshot is not None:
            metrics.TICK_SECONDS.observe(time.perf_counter() - started)
        return snapshot

    def _tick_once(self, overlap: bool = False) -> PlanSnapshot | None:
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            pulls = self._start_pulls(self.config.rpc_timeout_s)
        else:
            pulls = flight.pulls
            # acknowledged (or failed) before the next delta is taken against what it holds
            self._finish_pushes(flight.pushes)
        specs, intents = self._current_intents()
        self._finish_pulls(pulls)
        with self._lock:
            node = self._node_state()
            policy = self._policy
            previous = self._previous
            tick = self._tick + 1
        started = time.perf_counter()
        try:
            # the cyclic collector paused for the tick: it builds many short-lived containers,
            # none in a cycle (docs/performance.md)
            with cyclic_gc_paused():
                result = plan_tick(
                    policy, self._stats, specs, node, previous=previous, tick=tick,
                    config=self.config.dmug,
                )  # fmt: skip
        except Exception as exc:
            self._note_policy_error(policy.name, exc)
            return None
        seconds = time.perf_counter() - started
        self._note_policy_error(policy.name, None)
        created = Timestamp()
        created.GetCurrentTime()
        with self._lock:
            self._tick = tick
            self._generation += 1
            generation = self._generation
            self._previous = result.by_id()
        header = plans.node_plan_header(
            result, node, generation=generation, created_at=created, decision_ms=seconds * 1000
        )
        # the NodePlan as its serialized header and entries, never built (PlanSnapshot joins
        # and parses them on demand)
        cache = self._allocation_cache
        header_wire = header.SerializeToString()
        node_entries = cache.entries(result.decisions, intents)
        # WatchPlans' and the node agent's deltas: what changed against the plan the cache's
        # last call made
        changes = PlanChanges(
            self._cached_generation, header_wire, cache.changed_entries(), cache.removed,
            cache.changed,
        )  # fmt: skip
        self._cached_generation = generation
        gpu_plan = plans.gpu_plan(result, intents, node, generation=generation, created_at=created)
        snapshot = PlanSnapshot(header_wire, node_entries, gpu_plan, generation, changes)
        entries = self._allocation_cache.by_intent()
        metrics.PLAN_SIZE.labels("node").set(len(header_wire) + cache.size)
        metrics.PLAN_SIZE.labels("gpu").set(gpu_plan.ByteSize())
        workers = self._allocation_cache.workers
        with self._lock:
            self._plan_entries, self._workers = entries, workers
        self.feed.publish(snapshot)
        if specs is not self._names_of:  # the intents' names, once per spec tuple
            self._names = dict(zip(map(_ID, specs), map(_NAME, specs), strict=True))
            self._names_of = specs
        self.metrics.record(result, self._names, seconds, tick, self._stability_window)
        metrics.set_node_stale(node.stale)
        # overlapped calls have until the next tick to answer (they run while the loop sleeps,
        # the pushes and the pulls at the same time), the others half a tick
        timeout = self.config.tick_s if overlap else self.config.rpc_timeout_s
        pushes = self._start_pushes(snapshot, header, entries, timeout)
        if overlap:
            self._in_flight = _InFlight(pushes, self._start_pulls(timeout))
        else:
            self._finish_pushes(pushes)
        with self._lock:
            release, self._release_pending = self._release_pending, False
        if release:  # thousands of intents left: give their memory back, once this tick's
            self.store.release_memory()  # caches and gauges dropped theirs
            release_freed_memory()
        return snapshot

    def _current_intents(
        self,
    ) -> tuple[tuple[model.IntentSpec, ...], dict[str, intent_pb2.ResourceIntent]]:
        """The store's intents for this node, converted once per store version: only intents
        the store changed since the last version seen (``IntentStore.changes_since``; a
        StoredIntent is replaced, never changed in place, on every submit or update) are
        converted and moved, with dict operations, to the end of the seq-ordered rows; the
        others keep their IntentSpec object, which lets the policy's memo see them as
        unchanged. When the store's journal no longer reaches back, every intent is read."""
        with self._lock:
            if self.store.version == self._intents_version:
                return self._specs, self._intents
            seen = self._intents_version
        changes = self.store.changes_since(seen) if seen >= 0 else None
        here = ("", self.config.node_name)
        with self._lock:
            if self._intents_version != seen:  # another caller (ReportTelemetry) moved first
                changes = (
                    None if changes is None else self.store.changes_since(self._intents_version)
                )
            if changes is None:
                left = self._read_all(here)
            else:
                self._intents_version, changed = changes
                left = self._apply_changes(changed, here)
            specs = tuple(self._mine_specs.values())
            intents = dict(self._mine_intents)
            gone = left - intents.keys()
            self._intents, self._specs = intents, specs
            if gone:  # replaced, not changed: the allocation cache hands out these dicts
                entries, workers = dict(self._plan_entries), dict(self._workers)
                for intent_id in gone:
                    entries.pop(intent_id, None)
                    workers.pop(intent_id, None)
                self._plan_entries, self._workers = entries, workers
            counts = dict(self._class_counts)
            shrunk = self._shrink.shrunk(len(self._rows))
            if shrunk:  # the rows' tables are sized for the peak (services/common/memory.py)
                self._rows = dict(self._rows)
                self._mine_specs = dict(self._mine_specs)
                self._mine_intents = dict(self._mine_intents)
                self._release_pending = True
        self._stats.forget(gone)
        if shrunk:
            self._stats.compact()
        self.metrics.forget(gone)
        metrics.set_intent_counts(counts)
        return specs, intents

    def _read_all(self, here: tuple[str, str]) -> set[str]:
        """Rebuild the rows from a whole store snapshot (the lock held); the ids of this
        node's intents before. An unchanged StoredIntent keeps its spec."""
        version, stored = self.store.snapshot()
        rows: dict[str, tuple[StoredIntent, model.IntentSpec]] = {}
        for s in stored:
            kept = self._rows.get(s.intent.id)
            if kept is None or kept[0] is not s:
                kept = (s, convert.intent_to_spec(s.intent, seq=s.seq))
            rows[s.intent.id] = kept
        before = set(self._mine_specs)
        self._rows = rows
        self._mine_specs = {i: spec for i, (_, spec) in rows.items() if spec.node in here}
        self._mine_intents = {i: rows[i][0].intent for i in self._mine_specs}
        counts: dict[str, int] = {}
        for _, spec in rows.values():
            counts[spec.workload_class] = counts.get(spec.workload_class, 0) + 1
        self._class_counts = counts
        self._intents_version = version
        return before

    def _apply_changes(
        self, changed: Mapping[str, StoredIntent | None], here: tuple[str, str]
    ) -> set[str]:
        """Apply the store's changes to the rows (the lock held); the ids of this node's
        intents that changed (removed here, some added back at the end)."""
        rows, counts = self._rows, self._class_counts
        left: set[str] = set()
        for intent_id in changed:
            kept = rows.pop(intent_id, None)
            if kept is not None:
                counts[kept[1].workload_class] -= 1
                if self._mine_specs.pop(intent_id, None) is not None:
                    del self._mine_intents[intent_id]
                    left.add(intent_id)
        # every changed intent's seq is above every kept one's: appending keeps seq order
        added = sorted((s for s in changed.values() if s is not None), key=_SEQ)
        for s in added:
            spec = convert.intent_to_spec(s.intent, seq=s.seq)
            rows[spec.id] = (s, spec)
            counts[spec.workload_class] = counts.get(spec.workload_class, 0) + 1
            if spec.node in here:
                self._mine_specs[spec.id] = spec
                self._mine_intents[spec.id] = s.intent
        return left

    def _start_pulls(self, timeout: float) -> _Pulls:
        """The telemetry calls, and when the node's reply came: an overlapped tick's pull is
        read at the next tick, and the node is as old as the reply, not as its reading."""
        node = self.nodeagent.start_pull(timeout) if self.nodeagent else None
        gpu = self.gpulane.start_pull(timeout) if self.gpulane else None
        arrived: list[tuple[float, Timestamp]] = []
        if node is not None:
            node.add_done_callback(lambda _call: arrived.append(self._receipt()))
        return node, gpu, arrived

    def _finish_pulls(self, pulls: _Pulls) -> None:
        node_future, gpu_future, arrived = pulls
        node = self.nodeagent.finish_pull(node_future) if self.nodeagent and node_future else None
        gpu = self.gpulane.finish_pull(gpu_future) if self.gpulane and gpu_future else None
        # the call's callbacks may run just after its result is ready: then it came just now
        self._accept(node, gpu, arrived[0] if arrived else None)

    def _start_pushes(
        self,
        snapshot: PlanSnapshot,
        header: intent_pb2.NodePlan,
        entries: dict[str, bytes],
        timeout: float,
    ) -> tuple[Any, Any]:
        node = (
            self.nodeagent.start_push(header, entries, timeout, snapshot.changes)
            if self.nodeagent
            else None
        )
        gpu = self.gpulane.start_push(snapshot.gpu_plan, timeout) if self.gpulane else None
        return node, gpu

    def _finish_pushes(self, pushes: tuple[Any, Any]) -> None:
        node, gpu = pushes
        if self.nodeagent and node is not None:
            self.nodeagent.finish_push(node)
        if self.gpulane and gpu is not None:
            self.gpulane.finish_push(gpu)

    def _note_policy_error(self, policy: str, exc: Exception | None) -> None:
        message = None if exc is None else f"{type(exc).__name__}: {exc}"
        if message != self._policy_error:
            if message is None:
                log.info("policy deciding again", extra={"policy": policy})
            else:
                log.error(
                    "policy failed; keeping the last plan",
                    extra={"policy": policy, "error": message},
                )
            self._policy_error = message

    # --- telemetry (pull and push paths meet here) -------------------------------------------

    def report(
        self, node: telemetry_pb2.NodeTelemetry | None, gpu: telemetry_pb2.GpuTelemetry | None
    ) -> int:
        """ReportTelemetry: the push path into the same state the pull path feeds."""
        self._current_intents()  # the service times are taken for the intents planned now
        self._accept(node, gpu)
        with self._lock:
            return self._generation

    def _receipt(self) -> tuple[float, Timestamp]:
        """(monotonic, wall) time now: when a piece of telemetry is received."""
        wall = Timestamp()
        wall.GetCurrentTime()
        return self._clock(), wall

    def _accept(
        self,
        node: telemetry_pb2.NodeTelemetry | None,
        gpu: telemetry_pb2.GpuTelemetry | None,
        received: tuple[float, Timestamp] | None = None,
    ) -> None:
        if node is not None:
            seen = received or self._receipt()
            with self._lock:
                self._telemetry.node = node
                self._telemetry.node_seen = seen
                self._telemetry.contention = convert.node_contention(node)
            self._observe(node)
        if gpu is not None:
            with self._lock:
                self._telemetry.gpu = gpu

    def _observe(self, node: telemetry_pb2.NodeTelemetry) -> None:
        """The node's service times and observed tails go to the predictor as a tick feeds
        them (services/core/tick.py: observe), as soon as they arrive (pulled or pushed); the
        last plan's prediction error per intent goes to a gauge."""
        with self._lock:
            allocated = self._workers
            previous = self._previous
            # by id: _current_intents, which the tick and report() call first, keeps it current
            specs = self._mine_specs
            node_state = self._node_state()
            tick = self._tick + 1
        errors = observe(
            self._stats, observations(node), specs, node_state, previous, allocated,
            self.config.dmug, tick,
        )  # fmt: skip
        corrections = {i: self._stats.calibration(i) for i in errors}
        self.metrics.record_prediction_errors(errors, corrections)

    def service_stats(self) -> dict[str, model.ServiceStats]:
        """The predictor's per-intent statistics, as the policies read them."""
        return self._stats.snapshot()

    def _node_state(self) -> model.NodeState:
        """Capacity, lanes, contention and disturbance from the last known telemetry."""
        c = self.config
        return node_state(
            self._telemetry, self._clock(), node_name=c.node_name, cpu_units=c.cpu_units,
            stale_after_s=c.stale_after_s, configured_lanes=c.configured_lanes,
        )  # fmt: skip

    # --- queries and what-if -----------------------------------------------------------------

    def current(self) -> PlanSnapshot | None:
        return self.feed.current()

    def allocation(self, intent_id: str) -> intent_pb2.Allocation | None:
        with self._lock:
            entry = self._plan_entries.get(intent_id)
        return None if entry is None else intent_pb2.NodePlan.FromString(entry).allocations[0]

    def node_state(self) -> model.NodeState:
        """The NodeState the next tick would plan on."""
        with self._lock:
            return self._node_state()

    def node_status(self) -> tuple[bool, Timestamp | None]:
        """(node_stale, wall time of the last node telemetry), as node_state says them, without
        the lock: GetPlan asks from the server's event loop, which must not wait for a tick
        that holds it (a whole store read at 10,000 intents takes a tenth of a second)."""
        seen = self._telemetry.node_seen  # one attribute, replaced whole
        stale = is_stale(seen, self._clock(), self.config.stale_after_s)
        return stale, None if seen is None else seen[1]

    @property
    def policy_name(self) -> str:
        return str(self._policy.name)  # one attribute, replaced whole by set_policy

    def set_policy(self, name: str) -> tuple[str, str]:
        policy = get_policy(name)  # InvalidArgument(field="name") for an unknown name
        with self._lock:
            previous, self._policy = self._policy.name, policy
        log.info("policy switched", extra={"previous": previous, "active": policy.name})
        return str(previous), str(policy.name)

    def preview(
        self,
        disturbance: model.Disturbance | None = None,
        arrival_rate_scale: float = 0.0,
        policy_name: str = "",
    ) -> PlanSnapshot:
        """The plan the policy would make now under the given what-if; changes nothing.

        Runs on a policy instance of its own per policy name (kept, so repeated previews find
        its memo warm), never the loop's: the loop's memo of its last tick stays its own."""
        name = policy_name or self.policy_name
        with self._lock:
            policy = self._preview_policies.get(name)
        if policy is None:
            fresh = get_policy(name)  # InvalidArgument(field="name") for an unknown name
            with self._lock:
                policy = self._preview_policies.setdefault(name, fresh)
        specs, intents = self._current_intents()
        with self._lock:
            node = self._node_state()
            previous = self._previous
            tick = self._tick + 1
            generation = self._generation
        if disturbance is not None:
            node = dataclasses.replace(node, disturbance=disturbance)
        if arrival_rate_scale:
            specs = tuple(
                dataclasses.replace(s, arrival_rate_per_s=s.arrival_rate_per_s * arrival_rate_scale)
                for s in specs
            )
        started = time.perf_counter()
        with cyclic_gc_paused():
            result = plan_tick(
                policy, self._stats, specs, node, previous=previous, tick=tick,
                config=self.config.dmug,
            )  # fmt: skip
        seconds = time.perf_counter() - started
        created = Timestamp()
        created.GetCurrentTime()
        return PlanSnapshot.of(
            node_plan=plans.node_plan(
                result,
                intents,
                node,
                generation=generation,
                created_at=created,
                decision_ms=seconds * 1000,
            ),
            gpu_plan=plans.gpu_plan(
                result, intents, node, generation=generation, created_at=created
            ),
            generation=generation,
        )
