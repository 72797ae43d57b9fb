"""One control-loop tick: observations into the predictor, then the policy's plan.

``plan_tick`` is the one path from intents, node state, observations and the previous plan to
the next plan; the allocator's loop and what-if preview, the modeled experiments, the co-run
controller and the extender's simulator all call it. The predictor and the policy (with its
memo) are the caller's state, handed in; nothing here reads a clock, does I/O or keeps state.
Observations carry service times (the predictor's statistics) and the tail latency the node
observed, which the predictor compares with what the last plan predicted to calibrate its
latency correction (Predictor.calibrate), so every caller learns the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from parfusion.v1 import telemetry_pb2
from services.core.formulas import observation_factor
from services.core.model import (
    Decision,
    DmugConfig,
    IntentSpec,
    NodeState,
    PlanInput,
    PlanResult,
    ServiceStats,
)
from services.core.policies.base import Policy


class ServiceTimes(Protocol):
    """What a tick needs of the predictor (services/core/predictor.py's Predictor)."""

    def observe_many(
        self, intent_id: str, samples: Iterable[float], units: int = 1, factor: float = 1.0
    ) -> None: ...

    def calibrate(
        self, intent_id: str, observed_ms: float, count: int, decision: Decision, tick: int
    ) -> float | None: ...

    def snapshot(self) -> dict[str, ServiceStats]: ...


@dataclass(frozen=True)
class Observation:
    """Service times (ms) one intent's pool reported, and the parallelism they ran at; the
    latency tail (p95, p99 ms) the node observed over its window, from `count` requests."""

    intent_id: str
    samples: Sequence[float]
    parallelism: int = 0  # the units one sample ran at; 0: unknown (the last allocation's)
    p95_ms: float = 0.0
    p99_ms: float = 0.0
    count: int = 0

    def tail_ms(self, spec: IntentSpec) -> float:
        """The observed percentile a prediction for `spec` stands for (p95 for a target
        percentile <= 95, else p99: formulas.service_at_one_unit)."""
        return self.p95_ms if spec.target_percentile <= 95.0 else self.p99_ms


def observations(telemetry: telemetry_pb2.NodeTelemetry) -> list[Observation]:
    """The node agent's recent service times and window tails, per intent, with the parallelism
    they ran at: the summary's ``sample_parallelism`` where the node states it (1 for the real
    pools, whose workers each serve one request), else its pool's workers."""
    workers = {p.intent_id: p.workers for p in telemetry.pools}
    return [
        Observation(
            s.intent_id,
            tuple(s.recent_service_ms),
            s.sample_parallelism or workers.get(s.intent_id, 0),
            p95_ms=s.p95_ms,
            p99_ms=s.p99_ms,
            count=s.count,
        )
        for s in telemetry.latencies
        if s.recent_service_ms or s.count
    ]


def observe(
    predictor: ServiceTimes,
    seen: Iterable[Observation],
    intents: Mapping[str, IntentSpec],
    node: NodeState,
    previous: Mapping[str, Decision],
    allocated: Mapping[str, int],
    config: DmugConfig,
    tick: int = 0,
) -> dict[str, float]:
    """Feed `seen` to the predictor: only intents being planned, only finite non-negative
    samples, at the parallelism they ran with (the observation's, else the last allocation's
    units, else 1) and the latency factor they ran under (the previous decision's degradation
    level, the node's pressure), so the predictor can rescale them to NORMAL. Then, per deadline
    intent, the observed tail against the previous decision's prediction (`tick`: the tick
    about to be planned); returns those prediction errors (predicted / observed - 1).
    `intents` are the planned intents by id (the loop keeps them so: no 10,000-entry dict per
    telemetry reply for the few hundred intents it reports on)."""
    errors: dict[str, float] = {}
    for obs in seen:
        spec = intents.get(obs.intent_id)
        if spec is None:
            continue
        last = previous.get(obs.intent_id)
        samples = [x for x in obs.samples if math.isfinite(x) and x >= 0]
        if samples:
            units = obs.parallelism or allocated.get(obs.intent_id) or 1
            level = last.degradation if last is not None else "NORMAL"
            factor = observation_factor(spec, node, config, level)
            predictor.observe_many(obs.intent_id, samples, units=units, factor=factor)
        if last is not None and spec.has_deadline:
            error = predictor.calibrate(obs.intent_id, obs.tail_ms(spec), obs.count, last, tick)
            if error is not None:
                errors[obs.intent_id] = error
    return errors


def plan_tick(
    policy: Policy,
    predictor: ServiceTimes | None,
    intents: Sequence[IntentSpec],
    node: NodeState,
    *,
    previous: Mapping[str, Decision] | None = None,
    tick: int = 0,
    config: DmugConfig | None = None,
    seen: Iterable[Observation] = (),
    allocated: Mapping[str, int] | None = None,
) -> PlanResult:
    """The next plan: `seen` goes to the predictor (``observe``), then `policy` plans the
    intents on `node` with the predictor's statistics (none without a predictor), the previous
    plan (Decisions by intent id) and the tick number (hysteresis counts ticks)."""
    config = config if config is not None else DmugConfig()
    previous = previous if previous is not None else {}
    if predictor is not None and seen:  # the loop observes as telemetry arrives: ()
        by_id = {s.id: s for s in intents}
        observe(predictor, seen, by_id, node, previous, allocated or {}, config, tick)
    state = PlanInput(
        intents=intents,
        node=node,
        stats=predictor.snapshot() if predictor is not None else {},
        previous=previous,
        tick=tick,
        config=config,
    )
    return policy.allocate(state)
