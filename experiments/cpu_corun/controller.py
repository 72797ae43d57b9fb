"""The policy phases' control loop: the allocator's own policy and predictor, ticked on the agent.

Every tick: read the agent's telemetry (service-time samples since the last read, pool sizes,
pressure), run the core's plan_tick with the registry policy and the allocator's Predictor
exactly as the allocator's loop does, turn the decisions into a NodePlan with the allocator's plan
builder and apply it through the real backend. The thread's CPU time is the controller cost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from google.protobuf.timestamp_pb2 import Timestamp

from experiments.cpu_corun.workload import Calibration, shape
from parfusion.v1 import intent_pb2
from services.allocator import plans
from services.core import convert, model
from services.core.policies.registry import get_policy
from services.core.predictor import Predictor
from services.core.tick import observations, plan_tick
from services.nodeagent.real import RealBackend

PROTO_CLASS = {
    "ONLINE": intent_pb2.WORKLOAD_CLASS_ONLINE,
    "BATCH": intent_pb2.WORKLOAD_CLASS_BATCH,
    "ROBOT": intent_pb2.WORKLOAD_CLASS_ROBOT,
    "URGENT": intent_pb2.WORKLOAD_CLASS_URGENT,
}


@dataclass
class TickLog:
    at_s: float
    workers: dict[str, int]
    nice: dict[str, int]
    sched: dict[str, str]
    predicted_p99_ms: dict[str, float]
    prediction_error: dict[str, float]  # the last plan's predicted / observed - 1, per intent
    correction: dict[str, float]  # the latency correction k the next plan carries, per intent


@dataclass
class PolicyController:
    policy_name: str
    backend: RealBackend
    intents: Sequence[model.IntentSpec]
    cal: Calibration
    rate_per_s: float
    tick_s: float = 0.25
    config: model.DmugConfig = field(default_factory=model.DmugConfig)
    cpu_seconds: float = 0.0
    ticks: int = 0
    errors: list[str] = field(default_factory=list)
    log: list[TickLog] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.policy = get_policy(self.policy_name)
        self.predictor = Predictor()
        self._previous: dict[str, model.Decision] = {}
        self._workers: dict[str, int] = {}  # the last plan's workers per intent
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"controller-{self.policy_name}", daemon=True
        )
        self._protos = {
            s.id: intent_pb2.ResourceIntent(
                id=s.id, name=s.name, workload_class=PROTO_CLASS[s.workload_class]
            )
            for s in self.intents
        }
        self._t0 = time.monotonic()

    def start(self) -> None:
        self.backend.telemetry()  # drain samples left from the previous phase
        self.tick()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def _run(self) -> None:
        next_at = time.monotonic() + self.tick_s
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            try:
                self.tick()
            except Exception as exc:  # recorded in the report, the phase goes on with the last plan
                self.errors.append(f"{type(exc).__name__}: {exc}")
            next_at = max(next_at + self.tick_s, time.monotonic())

    def tick(self) -> None:
        cpu0 = time.thread_time()
        tel = self.backend.telemetry()
        arena = tuple(tel.arena_cpus)
        node = model.NodeState(
            name="bench",
            cpu_units=len(arena),
            cpu_ids=arena,
            contention=convert.node_contention(tel),
        )
        self.ticks += 1
        started = time.perf_counter()
        result = plan_tick(
            self.policy, self.predictor, self.intents, node, previous=self._previous,
            tick=self.ticks, config=self.config, seen=observations(tel), allocated=self._workers,
        )  # fmt: skip
        decision_ms = (time.perf_counter() - started) * 1000.0
        self._previous = result.by_id()
        created = Timestamp()
        created.GetCurrentTime()
        plan = plans.node_plan(
            result,
            self._protos,
            node,
            generation=self.ticks,
            created_at=created,
            decision_ms=decision_ms,
        )
        self._workers = {a.intent_id: a.workers for a in plan.allocations}
        for alloc in plan.allocations:
            shape(alloc, self.cal, self.rate_per_s)
        for applied in self.backend.apply(plan):
            if "Error" in applied.note and len(self.errors) < 20:
                self.errors.append(f"{applied.intent_id}: {applied.note}")
        self.log.append(
            TickLog(
                at_s=time.monotonic() - self._t0,
                workers={a.intent_id: a.workers for a in plan.allocations},
                nice={a.intent_id: a.nice for a in plan.allocations},
                sched={a.intent_id: a.sched_policy or "other" for a in plan.allocations},
                predicted_p99_ms={a.intent_id: a.predicted_p99_ms for a in plan.allocations},
                prediction_error=self.predictor.errors_at(self.ticks),
                correction=self._corrections(),
            )
        )
        self.cpu_seconds += time.thread_time() - cpu0

    def _corrections(self) -> dict[str, float]:
        states = {s.id: self.predictor.calibration(s.id) for s in self.intents}
        return {i: st.correction for i, st in states.items() if st is not None}
