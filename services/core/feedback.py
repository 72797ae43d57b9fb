"""Telemetry into the predictor: the one path by which what the node observed reaches D-MUG.

Every caller that plans from a node's telemetry (the allocator's loop, the modeled experiments,
the CPU co-run controller) feeds the predictor here, so they learn the same way: service-time
samples at the parallelism and latency factor they ran under (formulas.observation_factor), and
the observed tail latency against the tail the last plan predicted (Predictor.calibrate).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from parfusion.v1 import telemetry_pb2
from services.core.formulas import observation_factor
from services.core.model import Decision, DmugConfig, IntentSpec, NodeState
from services.core.predictor import Predictor


def observed_tail_ms(summary: telemetry_pb2.LatencySummary, spec: IntentSpec) -> float:
    """The observed latency percentile the plan's prediction stands for (p95 for a target
    percentile <= 95, else p99: see formulas.service_at_one_unit)."""
    return summary.p95_ms if spec.target_percentile <= 95.0 else summary.p99_ms


def feed_predictor(
    predictor: Predictor,
    latencies: Iterable[telemetry_pb2.LatencySummary],
    specs: Mapping[str, IntentSpec],
    previous: Mapping[str, Decision],
    units: Mapping[str, int],
    node: NodeState,
    config: DmugConfig,
    tick: int,
) -> dict[str, float]:
    """Feed one telemetry report to `predictor`; returns, per deadline intent with enough
    observations, the last plan's prediction error (predicted / observed - 1).

    `units`: the parallelism each intent ran with (the pool's workers, else the last plan's);
    `tick`: the tick about to be planned. Intents not in `specs` are ignored."""
    errors: dict[str, float] = {}
    for summary in latencies:
        spec = specs.get(summary.intent_id)
        if spec is None:
            continue
        last = previous.get(summary.intent_id)
        samples = [x for x in summary.recent_service_ms if math.isfinite(x) and x >= 0]
        if samples:
            level = last.degradation if last is not None else "NORMAL"
            factor = observation_factor(spec, node, config, level)
            ran_with = units.get(summary.intent_id) or 1
            predictor.observe_many(summary.intent_id, samples, units=ran_with, factor=factor)
        if last is not None and spec.has_deadline:
            error = predictor.calibrate(
                summary.intent_id, observed_tail_ms(summary, spec), summary.count, last, tick
            )
            if error is not None:
                errors[summary.intent_id] = error
    return errors
