"""The headless driver: the allocator's tick loop against the modeled node, on a simulated clock.

Each tick does what services/allocator/loop.py does, with the same pieces: pull the node's
telemetry (the modeled backend's NodeTelemetry), build the NodeState (contention and the
active disturbance through services.core.convert), run the core's ``plan_tick`` (the recent
service times into the Predictor, then ``get_policy(name)``'s plan), turn the result into the NodePlan (services.allocator.plans) and apply it to the node. Intents come
and go (the urgent event) and disturbances arrive through InjectDisturbance, between ticks. No
thread sleeps: one simulated minute takes well under a second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from experiments.scenario import Event, Scenario
from parfusion.v1 import intent_pb2
from services.allocator import plans
from services.core import convert, model
from services.core.policies.registry import get_policy
from services.core.predictor import Predictor
from services.core.stability import PlanChanges, plan_changes, window_ticks
from services.core.tick import observations, plan_tick
from services.nodeagent.backend import BackendOptions
from services.nodeagent.modeled import ModeledBackend
from services.sim.params import ModelParams


class SimClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class TickRecord:
    t_s: float
    units: dict[str, int]
    degradation: dict[str, str]
    state: dict[str, str]
    predicted_p99_ms: dict[str, float]
    # per deadline intent with enough observations: the last plan's predicted / observed - 1
    prediction_error: dict[str, float]
    reason: dict[str, str]
    changes: PlanChanges  # units / level changes and flaps against the previous tick's plan
    preempted_units: dict[str, int]
    preemptions: int
    degradations: int
    contention: float
    disturbance: tuple[float, float, float]


@dataclass
class PolicyRun:
    policy: str
    scenario: Scenario
    backend: ModeledBackend
    ticks: list[TickRecord] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    decision_ms: list[float] = field(default_factory=list)


def modeled_lanes(params: ModelParams) -> tuple[model.LaneCapacity, ...]:
    """The modeled node's lanes: the reference profile's GPUs, all present in the model."""
    return tuple(
        model.LaneCapacity(name=name, gpu_indexes=indexes, share_units=100 * len(indexes))
        for name, indexes in params.lanes.items()
        if indexes
    )


def run_policy(
    policy_name: str,
    scenario: Scenario,
    params: ModelParams,
    seed: int,
    on_tick: Callable[[], None] | None = None,
    dmug_config: model.DmugConfig | None = None,
) -> PolicyRun:
    clock = SimClock()
    backend = ModeledBackend(
        BackendOptions(node_name=params.node_name),
        params=params,
        clock=clock,
        seed=seed,
        keep_history=True,
    )
    policy = get_policy(policy_name)
    predictor = Predictor()
    lanes = modeled_lanes(params)
    dmug_config = dmug_config or model.DmugConfig()
    tick_s = params.tick_ms / 1000.0
    n_ticks = max(1, round(scenario.seconds / tick_s))
    window = window_ticks(tick_s)
    intents: dict[str, intent_pb2.ResourceIntent] = {i.id: i for i in scenario.intents}
    seq = {i.id: n for n, i in enumerate(scenario.intents)}
    specs = [convert.intent_to_spec(i, seq=seq[i.id]) for i in intents.values()]
    allocated: dict[str, int] = {}
    previous: dict[str, model.Decision] = {}
    run = PolicyRun(policy=policy_name, scenario=scenario, backend=backend)
    pending = list(scenario.events)
    created = Timestamp()
    for tick in range(1, n_ticks + 1):
        t = tick * tick_s
        changed = False
        while pending and pending[0].at_s <= t:
            event = pending.pop(0)
            clock.now = event.at_s
            changed |= _fire(event, scenario, intents, seq, predictor, backend, run)
        clock.now = t
        if changed:
            specs = [convert.intent_to_spec(i, seq=seq[i.id]) for i in intents.values()]
        tel = backend.telemetry()
        node = model.NodeState(
            name=params.node_name,
            cpu_units=len(tel.arena_cpus),
            cpu_ids=tuple(tel.arena_cpus),
            lanes=lanes,
            contention=convert.node_contention(tel),
            disturbance=convert.active_disturbance(tel),
        )
        started = time.perf_counter()
        result = plan_tick(
            policy, predictor, specs, node, previous=previous, tick=tick, config=dmug_config,
            seen=observations(tel), allocated=allocated,
        )  # fmt: skip
        run.decision_ms.append((time.perf_counter() - started) * 1000.0)
        changes = plan_changes(previous, result.decisions, tick, window)
        previous = result.by_id()
        plan = plans.node_plan(
            result, intents, node, generation=tick, created_at=created, decision_ms=0.0
        )
        backend.apply(plan)
        allocated = {a.intent_id: a.workers for a in plan.allocations}
        run.ticks.append(_record(t, result, node, predictor.errors_at(tick), changes))
        if on_tick is not None:
            on_tick()
    return run


def fleet_ids(event: Event) -> list[str]:
    """The ids of a fleet event's copies: the copied intent's id with -2, -3, ..."""
    return [f"{event.intent_id}-{k}" for k in range(2, event.count + 2)]


def _fire(
    event: Event,
    scenario: Scenario,
    intents: dict[str, intent_pb2.ResourceIntent],
    seq: dict[str, int],
    predictor: Predictor,
    backend: ModeledBackend,
    run: PolicyRun,
) -> bool:
    """Apply one scenario event; True when the set of intents changed."""
    run.events.append(event.describe())
    urgent = scenario.urgent
    if event.kind == "urgent_start":
        intents[urgent.id] = urgent
        seq[urgent.id] = len(seq)
        return True
    if event.kind == "urgent_end":
        intents.pop(urgent.id, None)
        predictor.forget(urgent.id)
        return True
    if event.kind == "fleet_start":  # copies of an intent join, as more robots would
        for copy_id in fleet_ids(event):
            joined = intent_pb2.ResourceIntent()
            joined.CopyFrom(intents[event.intent_id])
            joined.id = joined.name = copy_id
            intents[copy_id] = joined
            seq[copy_id] = len(seq)
        return True
    if event.kind == "fleet_end":
        for copy_id in fleet_ids(event):
            intents.pop(copy_id, None)
            predictor.forget(copy_id)
        return True
    if event.kind == "load":  # the intent is updated with its new arrival rate, as a user would
        stepped = intent_pb2.ResourceIntent()
        stepped.CopyFrom(intents[event.intent_id])
        stepped.demand.arrival_rate_per_s *= event.factor
        intents[event.intent_id] = stepped
        return True
    if event.kind == "drift":  # the node's real cost moves; the intent still declares the old one
        backend.set_service_drift(event.intent_id, event.factor)
        return False
    assert event.disturbance is not None
    backend.inject_disturbance(event.disturbance)
    return False


def _record(
    t: float,
    result: model.PlanResult,
    node: model.NodeState,
    errors: dict[str, float],
    changes: PlanChanges,
) -> TickRecord:
    ds = result.decisions
    return TickRecord(
        t_s=t,
        units={d.intent_id: d.units for d in ds},
        degradation={d.intent_id: d.degradation for d in ds},
        state={d.intent_id: d.state for d in ds},
        predicted_p99_ms={d.intent_id: d.predicted_p99_ms for d in ds},
        prediction_error=errors,
        reason={d.intent_id: d.reason for d in ds},
        changes=changes,
        preempted_units={d.intent_id: d.preempted_units for d in ds},
        preemptions=result.preemptions,
        degradations=result.degradations,
        contention=node.contention,
        disturbance=(node.disturbance.cpu, node.disturbance.gpu, node.disturbance.network),
    )
