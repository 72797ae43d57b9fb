"""The dashboard's poll: every refresh it asks each service once, concurrently, and keeps the answers.

Panels render from the latest :class:`Snapshot` in memory, so a panel request never waits on a
service; a service that is down costs one short timeout per poll in a worker thread and its panel
says so while the rest keep updating. Each poll also becomes an Observation for the timeline
(latency samples and the events marked on the chart).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from parfusion.v1 import intent_pb2
from services.common.latency import is_unbounded
from services.dashboard import metrics
from services.dashboard.clients import Reading, ServiceClients
from services.dashboard.timeline import Observation, OnlinePoint, Timeline

log = logging.getLogger(__name__)

SERVICES = ("allocator", "nodeagent", "gpulane", "bridge", "extender")
LARGE_NODE_POOLS = 1000  # a node reporting more pools than this is read less often
LARGE_NODE_EVERY = 5  # polls per read of such a node's telemetry


def enum_name(enum: Any, value: int) -> str:
    """WORKLOAD_CLASS_ONLINE -> ONLINE (the prefix is the enum's own name in upper snake case)."""
    full = enum.Name(value)
    prefix = "".join("_" + c if c.isupper() else c for c in enum.DESCRIPTOR.name).lstrip("_")
    return full.removeprefix(prefix.upper() + "_")


@dataclass
class Snapshot:
    taken_at: float = 0.0
    readings: dict[str, Reading[Any]] = field(default_factory=dict)
    intents: Reading[Any] | None = None
    policies: Reading[Any] | None = None

    def reading(self, service: str) -> Reading[Any] | None:
        return self.readings.get(service)

    def up(self, service: str) -> bool | None:
        reading = self.readings.get(service)
        return None if reading is None else reading.ok


class Observer:
    def __init__(self, clients: ServiceClients, timeline: Timeline, *, refresh_s: float) -> None:
        self.clients = clients
        self.timeline = timeline
        self.refresh_s = refresh_s
        self.snapshot = Snapshot()
        self._wake = asyncio.Event()
        self._node_skipped = 0  # polls since the node's telemetry was last read

    async def poll(self) -> Snapshot:
        started = time.perf_counter()
        answers: list[Reading[Any]] = list(
            await asyncio.gather(
                self.clients.get_plan(),
                self.clients.list_intents(),
                self.clients.list_policies(),
                self._node_telemetry(),
                self.clients.gpu_telemetry(),
                self.clients.bridge_state(),
                self.clients.extender_health(),
            )
        )
        plan, intents, policies, node, gpu, bridge, extender = answers
        snapshot = Snapshot(
            taken_at=time.time(),
            readings={
                "allocator": plan,
                "nodeagent": node,
                "gpulane": gpu,
                "bridge": bridge,
                "extender": extender,
            },
            intents=intents,
            policies=policies,
        )
        self.snapshot = snapshot
        last = self.timeline.last()
        charted = {p.name for p in last.online} if last is not None else set()
        self.timeline.update(snapshot.taken_at, observe(snapshot, charted))
        metrics.POLL_SECONDS.observe(time.perf_counter() - started)
        for service in SERVICES:
            metrics.SERVICE_UP.labels(service=service).set(1 if snapshot.up(service) else 0)
        return snapshot

    async def _node_telemetry(self) -> Reading[Any]:
        """The node agent's telemetry; from a node with more than LARGE_NODE_POOLS pools, read
        again only every LARGE_NODE_EVERY polls (its whole telemetry then costs the agent about
        0.1 s under the lock its control loop's reads take too)."""
        last = self.snapshot.reading("nodeagent")
        value = last.value if last is not None and last.ok else None
        if last is not None and value is not None and len(value.telemetry.pools) > LARGE_NODE_POOLS:
            self._node_skipped += 1
            if self._node_skipped < LARGE_NODE_EVERY:
                return last
        self._node_skipped = 0
        return await self.clients.node_telemetry()

    def nudge(self) -> None:
        """Poll again now (after a button press) instead of at the next refresh."""
        self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                await self.poll()
            except Exception:
                log.exception("dashboard poll failed")
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.refresh_s)
            except TimeoutError:
                pass


def observe(snapshot: Snapshot, charted: Collection[str] = ()) -> Observation:
    """The plain facts of one poll the timeline tracks; ``charted`` are the online intents
    the last poll charted (see chart_points)."""
    plan_reading = snapshot.reading("allocator")
    node_reading = snapshot.reading("nodeagent")
    bridge_reading = snapshot.reading("bridge")
    plan = plan_reading.value if plan_reading and plan_reading.ok else None
    node = (
        node_reading.value.telemetry
        if node_reading and node_reading.ok and node_reading.value is not None
        else None
    )
    intents = (
        list(snapshot.intents.value.intents)
        if snapshot.intents and snapshot.intents.ok and snapshot.intents.value
        else []
    )
    latencies = {lat.intent_id: lat for lat in node.latencies} if node is not None else {}
    allocations = {a.intent_id: a for a in plan.node_plan.allocations} if plan is not None else {}

    online: list[OnlinePoint] = []
    for intent in intents:
        if intent.workload_class != intent_pb2.WORKLOAD_CLASS_ONLINE:
            continue
        alloc = allocations.get(intent.id)
        lat = latencies.get(intent.id)
        predicted = alloc.predicted_p99_ms if alloc is not None else 0.0
        observed = lat is not None and lat.count > 0
        if not observed and alloc is None:
            continue
        online.append(
            OnlinePoint(
                name=intent.name,
                p99_ms=lat.p99_ms if observed and lat is not None else predicted,
                predicted_p99_ms=predicted,
                deadline_ms=intent.slo.deadline_ms,
                completed=int(lat.count) if lat is not None else 0,
                misses=int(lat.deadline_misses) if lat is not None else 0,
                degradation=enum_name(intent_pb2.DegradationLevel, alloc.degradation)
                if alloc is not None and alloc.degradation
                else "NORMAL",
                observed=observed,
            )
        )
    disturbance = None
    if node is not None and node.disturbance_remaining_s > 0:
        d = node.active_disturbance
        disturbance = (d.cpu_pressure, d.gpu_pressure, d.network_pressure)
    robot_state = None
    transitions: list[tuple[float, str, str]] = []
    if bridge_reading and bridge_reading.ok and isinstance(bridge_reading.value, dict):
        state = bridge_reading.value.get("state")
        robot_state = str(state) if state else None
        for tr in bridge_reading.value.get("transitions") or []:
            if isinstance(tr, dict) and isinstance(tr.get("at"), (int, float)):
                transitions.append((float(tr["at"]), str(tr.get("from")), str(tr.get("to"))))
    return Observation(
        policy=(plan.policy or plan.node_plan.policy) if plan is not None else None,
        online=tuple(chart_points(online, charted)),
        levels={p.name: p.degradation for p in online},
        counts={p.name: (p.completed, p.misses) for p in online if p.observed},
        online_total=len(online),
        contention=plan.node_plan.contention if plan is not None else None,
        disturbance=disturbance,
        robot_state=robot_state,
        robot_transitions=tuple(transitions),
        services_up={s: bool(snapshot.up(s)) for s in SERVICES if snapshot.up(s) is not None},
        allocation_states={
            a.intent_name or a.intent_id: enum_name(intent_pb2.AllocationState, a.state)
            for a in allocations.values()
            if a.state
        },
    )


CHART_SERIES = 5  # online intents the latency chart draws (its legend holds five)


def _attention(p: OnlinePoint) -> tuple[int, float]:
    """How much an online intent asks to be charted: over its deadline (observed), then
    degraded or predicted over it, then the rest; nearer its deadline first within each."""
    deadline = p.deadline_ms if p.deadline_ms > 0 else 0.0
    ratio = p.p99_ms / deadline if deadline and not is_unbounded(p.p99_ms) else 0.0
    if p.observed and deadline and p.p99_ms > deadline:
        return 2, ratio
    if p.degradation != "NORMAL" or (deadline and p.predicted_p99_ms > deadline):
        return 1, ratio
    return 0, ratio


def chart_points(
    points: Sequence[OnlinePoint], charted: Collection[str] = (), limit: int = CHART_SERIES
) -> list[OnlinePoint]:
    """The online intents to chart, at most ``limit``, in their own order. An intent charted
    before stays (its line goes on) unless one that asks for attention at a higher level is
    left out; free places go to those that ask most."""
    if len(points) <= limit:
        return list(points)
    need = {p.name: _attention(p) for p in points}
    ranked = sorted(points, key=lambda p: (-need[p.name][0], -need[p.name][1], p.name))
    chosen = [p.name for p in points if p.name in charted][:limit]
    for p in ranked:
        if len(chosen) >= limit:
            break
        if p.name not in chosen:
            chosen.append(p.name)
    for p in ranked:  # a higher level takes the place of the weakest charted one
        if p.name in chosen:
            continue
        weakest = min(chosen, key=lambda name: need[name])
        if need[p.name][0] <= need[weakest][0]:
            break
        chosen[chosen.index(weakest)] = p.name
    keep = set(chosen)
    return [p for p in points if p.name in keep]
