"""The D-MUG formulas: Amdahl speedup, predicted tail latency, slack, deadline risk, marginal utility.

Arguments are floats or numpy arrays and results broadcast. Only + - * /, min/max and
comparisons are used, so a value computed for one intent alone and the same value computed in a
10,000-row matrix are bit-identical (the water-filling fast path relies on it to equal the heap
greedy exactly; tests/core/test_formulas.py checks it). docs/algorithm.md derives each one.
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np

from services.common.latency import UNBOUNDED_MS
from services.core.model import DmugConfig, IntentSpec, NodeState

LATENCY_CEILING_MS = UNBOUNDED_MS  # "never": an overloaded queue or a missing unit
MAX_UTILISATION = 0.999  # queueing model cut-off: above it the queue does not drain
DEFAULT_REL_SPREAD = 0.25  # spread of the p99 estimate with no observations (relative)
MIN_REL_SPREAD = 0.05

Values: TypeAlias = "float | np.ndarray"  # one value, or one per row (results broadcast)


def amdahl_speedup(f: Values, p: Values) -> Values:
    """S(p) = 1 / ((1 - f) + f / p), p >= 1."""
    return 1.0 / ((1.0 - f) + f / p)


def predicted_latency_ms(
    tail1_ms: Values, mean1_ms: Values, f: Values, p: Values, arrival_per_s: Values, factor: Values
) -> np.ndarray:
    """Predicted tail latency at p units: L(p) = T1*m / S(p) / (1 - rho), rho = lambda*M1*m/S(p).

    T1/M1 are the tail and mean service time at one unit, m the latency factor (degradation level
    times pressure inflation); the 1/(1-rho) term is the M/M/1 waiting inflation for an online
    arrival rate (rho = 0 for batch). p < 1 or rho >= MAX_UTILISATION gives LATENCY_CEILING_MS.
    """
    p_safe = np.maximum(p, 1)
    speedup = amdahl_speedup(f, p_safe)
    service = tail1_ms * factor / speedup
    rho = arrival_per_s * (mean1_ms * factor / speedup) / 1000.0
    ok = (rho < MAX_UTILISATION) & (p_safe == p)
    return np.where(ok, service / (1.0 - np.minimum(rho, MAX_UTILISATION)), LATENCY_CEILING_MS)


def slack_ms(deadline_ms: Values, latency_ms: Values) -> Values:
    """Slack D - L(p): positive when the predicted tail meets the deadline."""
    return deadline_ms - latency_ms


def deadline_risk(slack: Values, latency_ms: Values, rel_spread: Values) -> np.ndarray:
    """Probability-like risk that the target percentile misses the deadline.

    z = slack / (rel_spread * L) measures the slack in units of the predictor's spread;
    risk = (1 - z / (1 + |z|)) / 2 is 0.5 when the predicted p99 sits on the deadline, tends to 0
    with growing slack and to 1 with growing lateness (a rational sigmoid: exact in vector form).
    """
    spread = np.maximum(rel_spread * latency_ms, 1e-9)
    z = slack / spread
    return 0.5 * (1.0 - z / (1.0 + np.abs(z)))


def priority_weight(priority: Values) -> Values:
    """w = (priority + 1) / 1001 in (0, 1]: even priority 0 values its units a little."""
    return (priority + 1.0) / 1001.0


def batch_gain(
    weight: Values, speedup_p: Values, speedup_next: Values, speedup_cap: Values
) -> Values:
    """Batch NMU of unit p+1: w * (S(p+1) - S(p)) / S(cap), weighted normalised throughput."""
    return weight * (speedup_next - speedup_p) / speedup_cap


def combined_cpu_pressure(contention: Values, cpu_disturbance: Values) -> np.ndarray:
    """Combined CPU pressure: 1 - (1 - contention)(1 - disturbance.cpu), each clipped to [0, 1]."""
    c = np.minimum(np.maximum(contention, 0.0), 1.0)
    d = np.minimum(np.maximum(cpu_disturbance, 0.0), 1.0)
    return 1.0 - (1.0 - c) * (1.0 - d)


def pressure_inflation(
    cpu: Values, gpu: Values, network: Values, gain: float, uses_gpu: Values, network_bound: Values
) -> np.ndarray:
    """Pressure inflation m = (1 + g*cpu) (1 + g*gpu*[uses GPU]) (1 + g*net*[ONLINE/ROBOT])."""
    gpu = np.minimum(np.maximum(gpu, 0.0), 1.0)
    network = np.minimum(np.maximum(network, 0.0), 1.0)
    return (
        (1.0 + gain * cpu) * (1.0 + gain * gpu * uses_gpu) * (1.0 + gain * network * network_bound)
    )


def cpu_pressure(node: NodeState) -> float:
    return float(combined_cpu_pressure(node.contention, node.disturbance.cpu))


def latency_inflation(
    node: NodeState, gain: float, uses_gpu: Values, network_bound: Values
) -> np.ndarray:
    """pressure_inflation for one node's measured contention and disturbance."""
    d = node.disturbance
    return pressure_inflation(cpu_pressure(node), d.gpu, d.network, gain, uses_gpu, network_bound)


def observation_factor(
    spec: IntentSpec, node: NodeState, config: DmugConfig, degradation: str = "NORMAL"
) -> float:
    """Latency factor m a service time was observed under: level speed x pressure inflation.

    The predictor divides observed samples by it, so its statistics describe the intent at
    NORMAL and without pressure (what T1/M1 mean in ``predicted_latency_ms``); otherwise a time
    measured at FP16 makes NORMAL look fast enough the next tick, and a time measured under a
    disturbance is inflated twice.
    """
    uses_gpu = float(bool(spec.gpu_lane) or spec.gpu_share > 0)
    network_bound = float(spec.workload_class in ("ONLINE", "ROBOT"))
    level = float(config.degradation_speedup.get(degradation, 1.0))
    inflation = float(latency_inflation(node, config.contention_gain, uses_gpu, network_bound))
    return max(level * inflation, 1e-9)


def service_at_one_unit(
    count: Values,
    mean_ms: Values,
    p95_ms: Values,
    p99_ms: Values,
    observed_units: Values,
    base_service_ms: Values,
    f: Values,
    target_percentile: Values,
    correction: Values = 1.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tail T1, mean M1, relative spread) at one unit, from the predictor's statistics (one
    value or one per intent: count, mean, p95, p99, observed units, latency correction) or
    base_service_ms where count is 0.

    Observed times are rescaled by S(observed_units): T1 = p99 * S(p_obs) (p95 for a target
    percentile <= 95), times the learnt latency correction k (predicted_latency_ms is linear in
    T1, so k scales the predicted tail and nothing else: the utilisation uses M1). The spread is
    (p99 - mean) / p99, widened by 1/sqrt(count) while few samples back it.
    """
    scale = amdahl_speedup(f, np.maximum(observed_units, 1))
    tail = np.where(np.asarray(target_percentile) <= 95.0, p95_ms, p99_ms)
    tail = np.maximum(np.maximum(tail, mean_ms), 1e-6)
    with np.errstate(divide="ignore"):
        widen = 1.0 + 1.0 / np.asarray(count, dtype=np.float64) ** 0.5
    rel = np.maximum((tail - mean_ms) / tail, MIN_REL_SPREAD) * widen
    seen = np.asarray(count) > 0
    return (
        np.where(seen, tail * scale * correction, base_service_ms),
        np.where(seen, np.maximum(mean_ms, 1e-6) * scale, base_service_ms),
        np.where(seen, np.minimum(rel, 1.0), DEFAULT_REL_SPREAD),
    )
