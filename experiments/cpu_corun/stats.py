"""Per-phase metrics, within-repetition ratios, bootstrap intervals, the sanity gate, targets.

Ratios are taken inside one repetition (a co-run against the solo runs of the same
repetition and load) so slow drifts of the host cancel; across repetitions they are
aggregated as the median with a bootstrap 95 % interval of the median.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from experiments.cpu_corun.profiles import STATIC_KNOBS
from experiments.cpu_corun.runner import PhaseRun
from experiments.cpu_corun.workload import BATCH_PARALLEL_FRACTION, URGENT_DEADLINE_MS, Calibration
from services.nodeagent.latency import percentile

GATE_RATIO = 2.0  # the baseline must inflate online p99 at least this much at the top load
# a phase was disturbed when other processes took this many cores during it, or (online alone,
# where nothing of the benchmark competes) the online service time inflated this much over the
# calibration: on these shared 2-core hosts another process once took 0.27 cores and inflated
# the online-alone service mean from 12.3 to 18.9 ms, and the report still called it valid
FOREIGN_CORES_LIMIT = 0.15
SERVICE_INFLATION_LIMIT = 1.25
MAX_RERUNS = 2  # attempts beyond the first for a disturbed phase (the least disturbed is kept)


def amdahl(f: float, p: float) -> float:
    return 0.0 if p <= 0 else 1.0 / ((1.0 - f) + f / p)


def bootstrap_median(
    values: Sequence[float], iters: int = 2000, seed: int = 7
) -> dict[str, float | None]:
    """Median with a percentile-bootstrap 95 % interval (None where there is nothing to resample)."""
    vals = [v for v in values if v is not None]
    if not vals:
        return {"median": None, "lo": None, "hi": None, "n": 0}
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(vals, k=len(vals))) for _ in range(iters))
    return {
        "median": statistics.median(vals),
        "lo": meds[int(0.025 * iters)],
        "hi": meds[int(0.975 * iters) - 1],
        "n": len(vals),
    }


def summarize(run: PhaseRun, cal: Calibration) -> dict[str, Any]:
    lat = sorted(run.online_latency_ms)
    urgent = sorted(run.urgent_start_ms)
    n = len(lat)
    return {
        "phase": run.phase,
        "load": run.load,
        "repetition": run.repetition,
        "order": run.order,
        "measure_s": run.measure_s,
        "rate_per_s": run.rate_per_s,
        "samples": n,
        "scheduled": run.online_scheduled,
        "censored": run.online_censored,
        "p50_ms": percentile(lat, 50) if n else None,
        "p95_ms": percentile(lat, 95) if n else None,
        "p99_ms": percentile(lat, 99) if n else None,
        "miss_pct": 100.0 * sum(1 for x in lat if x > cal.deadline_ms) / n if n else None,
        "service_mean_ms": statistics.fmean(run.online_service_ms)
        if run.online_service_ms
        else None,
        "batch_items_per_s": run.batch_items_per_s,
        "urgent_samples": len(urgent),
        "urgent_start_p99_ms": percentile(urgent, 99) if urgent else None,
        "urgent_misses": sum(1 for x in run.urgent_latency_ms if x > URGENT_DEADLINE_MS),
        "controller_cpu_pct": None
        if run.controller_cpu_fraction is None
        else 100.0 * run.controller_cpu_fraction,
        "ticks": run.ticks,
        "errors": run.errors,
        "host_load1": run.host_load1,
        "host_cpu_percent": run.host_cpu_percent,
        "foreign_cores": run.foreign_cores,
        "prediction_error_pct": run.prediction_error_pct,
        "prediction_error_late_pct": run.prediction_error_late_pct,
        "prediction_bias_late_pct": run.prediction_bias_late_pct,
        "latency_correction": run.latency_correction,
    }


def disturbance(row: dict[str, Any], cal: Calibration) -> str | None:
    """Why a phase's row looks disturbed by work outside the benchmark, or None."""
    why = []
    if row["foreign_cores"] > FOREIGN_CORES_LIMIT:
        why.append(
            f"other processes took {row['foreign_cores']:.2f} cores (> {FOREIGN_CORES_LIMIT})"
        )
    service = row.get("service_mean_ms")
    if row["phase"] == "online-alone" and service and cal.online_median_ms > 0:
        inflation = service / cal.online_median_ms
        if inflation > SERVICE_INFLATION_LIMIT:
            why.append(
                f"online service mean {service:.1f} ms is {inflation:.2f}x the calibrated "
                f"{cal.online_median_ms:.1f} ms (> {SERVICE_INFLATION_LIMIT}x)"
            )
    return "; ".join(why) or None


def suspect_references(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Online-alone runs whose p99 is worse than a co-run phase's at the same repetition and
    load: a reference that cannot be right (co-running batch does not make online faster).
    Every row of that repetition and load is marked ``reference_suspect``; the ratios are still
    computed, and the report says they rest on a suspect reference."""
    out = []
    for alone in (r for r in rows if r["phase"] == "online-alone" and r["p99_ms"] is not None):
        same = [
            r
            for r in rows
            if r["repetition"] == alone["repetition"]
            and r["load"] == alone["load"]
            and r["phase"] not in ("online-alone", "batch-alone")
            and r["p99_ms"] is not None
        ]
        better = [r for r in same if r["p99_ms"] < alone["p99_ms"]]
        if better:
            best = min(better, key=lambda r: r["p99_ms"])
            out.append(
                {
                    "repetition": alone["repetition"],
                    "load": alone["load"],
                    "alone_p99_ms": alone["p99_ms"],
                    "phase": best["phase"],
                    "phase_p99_ms": best["p99_ms"],
                }
            )
            for r in same + [alone]:
                r["reference_suspect"] = True
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def with_ratios(rows: list[dict[str, Any]], cal: Calibration) -> list[dict[str, Any]]:
    """Add co-run / solo ratios of the same repetition (and load) to every row."""
    solo = {(r["repetition"], r["load"]): r for r in rows if r["phase"] == "online-alone"}
    batch = {r["repetition"]: r for r in rows if r["phase"] == "batch-alone"}
    w = cal.workers
    for r in rows:
        alone = solo.get((r["repetition"], r["load"]))
        b_alone = batch.get(r["repetition"])
        r["p99_ratio"] = (
            _ratio(r["p99_ms"], alone["p99_ms"]) if alone and r["phase"] != "batch-alone" else None
        )
        r["miss_delta_pt"] = (
            r["miss_pct"] - alone["miss_pct"]
            if alone and r["miss_pct"] is not None and alone["miss_pct"] is not None
            else None
        )
        r["batch_ratio"] = (
            _ratio(r["batch_items_per_s"], b_alone["batch_items_per_s"]) if b_alone else None
        )
        service = (alone or {}).get("service_mean_ms") or cal.online_median_ms
        c_online = r["rate_per_s"] * service / 1000.0
        ideal = amdahl(BATCH_PARALLEL_FRACTION, max(0.0, w - c_online)) / amdahl(
            BATCH_PARALLEL_FRACTION, w
        )
        r["ideal_leftover_ratio"] = ideal
        r["batch_vs_ideal"] = _ratio(r["batch_ratio"], ideal)
    return rows


METRICS = (
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "miss_pct",
    "p99_ratio",
    "miss_delta_pt",
    "batch_items_per_s",
    "batch_ratio",
    "batch_vs_ideal",
    "urgent_start_p99_ms",
    "urgent_misses",
    "controller_cpu_pct",
    "samples",
    "foreign_cores",
)


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (phase, load): the median and bootstrap interval of each metric over repetitions."""
    keys: list[tuple[str, float | None]] = []
    for r in rows:
        if (r["phase"], r["load"]) not in keys:
            keys.append((r["phase"], r["load"]))
    out = []
    for phase, load in keys:
        group = [r for r in rows if r["phase"] == phase and r["load"] == load]
        agg: dict[str, Any] = {"phase": phase, "load": load, "repetitions": len(group)}
        for m in METRICS:
            agg[m] = bootstrap_median([r[m] for r in group if r.get(m) is not None])
        agg["errors"] = sorted({e for r in group for e in r["errors"]})
        out.append(agg)
    return out


def _med(agg: list[dict[str, Any]], phase: str, load: float | None, metric: str) -> float | None:
    for a in agg:
        if a["phase"] == phase and a["load"] == load:
            value: float | None = a[metric]["median"]
            return value
    return None


def sanity_gate(
    agg: list[dict[str, Any]],
    loads: Iterable[float],
    rows: Sequence[dict[str, Any]] = (),
    suspects: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """Valid only when the baseline co-run inflates online p99 enough, no phase stayed disturbed
    after its re-runs, and no online-alone reference is worse than a co-run phase."""
    top = max(loads)
    ratio = _med(agg, "baseline", top, "p99_ratio")
    ok = ratio is not None and ratio >= GATE_RATIO
    disturbed = [r for r in rows if r.get("disturbed")]
    problems = []
    if not ok:
        problems.append(
            "void: the baseline co-run does not inflate online p99 by >= 2x, "
            "the batch load is too weak"
        )
    if disturbed:
        problems.append(
            f"disturbed: {len(disturbed)} phase run(s) still disturbed by other processes after "
            f"{MAX_RERUNS} re-runs"
        )
    if suspects:
        problems.append(
            f"suspect reference: {len(suspects)} online-alone run(s) slower than a co-run phase; "
            "ratios to online-alone at those loads are not evidence"
        )
    return {
        "load": top,
        "baseline_p99_ratio": ratio,
        "threshold": GATE_RATIO,
        "passed": ok and not disturbed and not suspects,
        "disturbed_runs": len(disturbed),
        "suspect_references": list(suspects),
        "verdict": "valid" if not problems else "; ".join(problems),
    }


def best_knob(rows: Sequence[dict[str, Any]], rep: int, load: float) -> dict[str, Any] | None:
    """The best static knob of one repetition at one load: of nice 19 and SCHED_IDLE, the one
    with the lower online p99 (then fewer misses). PARFusion's p99, misses and batch are held
    against this one phase."""
    knobs = [
        r
        for r in rows
        if r["phase"] in STATIC_KNOBS
        and r["repetition"] == rep
        and r["load"] == load
        and r["p99_ms"] is not None
    ]
    return min(knobs, key=lambda r: (r["p99_ms"], r["miss_pct"]), default=None)


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def targets(
    rows: list[dict[str, Any]], cal: Calibration, loads: Iterable[float]
) -> list[dict[str, Any]]:
    """The parfusion targets, evaluated per repetition, reported as the median over repetitions."""
    out: list[dict[str, Any]] = []

    def add(
        load: float | None,
        name: str,
        values: list[float | None],
        limit: float,
        upper: bool,
        strict: bool = False,
    ) -> None:
        stat = bootstrap_median([v for v in values if v is not None])
        med = stat["median"]
        if med is None:
            met = None
        elif strict:
            met = med < limit if upper else med > limit
        else:
            met = med <= limit if upper else med >= limit
        out.append(
            {
                "load": load,
                "target": name,
                "limit": limit,
                "bound": ("<" if upper else ">") + ("" if strict else "="),
                **stat,
                "met": met,
            }
        )

    def against_knob(load: float, here: list[dict[str, Any]], lower: bool) -> None:
        """p99 and misses no worse (<= 50 % load) or lower (70 %) than the best static knob's,
        and (<= 50 %) batch at least that knob's."""
        pairs = [(r, best_knob(rows, r["repetition"], load) or {}) for r in here]
        checks = [
            ("p99 / best static knob's", "p99_ms", _ratio, 1.0, True),
            ("miss % - best static knob's (points)", "miss_pct", _diff, 0.0, True),
        ]
        if not lower:
            checks.append(("batch / best static knob's", "batch_items_per_s", _ratio, 1.0, False))
        for name, key, compare, limit, upper in checks:
            values = [compare(r[key], k.get(key)) for r, k in pairs]
            add(load, name, values, limit, upper, strict=lower and upper)

    pf = [r for r in rows if r["phase"] == "parfusion"]
    for load in sorted(loads):
        here = [r for r in pf if r["load"] == load]
        if load <= 0.5:
            add(load, "p99 / online-alone", [r["p99_ratio"] for r in here], 1.2, True)
            add(load, "miss % - alone's (points)", [r["miss_delta_pt"] for r in here], 0.5, True)
            add(
                load,
                "batch / ideal leftover S(W-c)/S(W)",
                [r["batch_vs_ideal"] for r in here],
                0.85,
                False,
            )
            against_knob(load, here, lower=False)
        else:
            add(load, "p99 / online-alone", [r["p99_ratio"] for r in here], 1.5, True)
            add(load, "miss % - alone's (points)", [r["miss_delta_pt"] for r in here], 1.0, True)
            against_knob(load, here, lower=True)
            nice = {
                r["repetition"]: r for r in rows if r["phase"] == "nice19" and r["load"] == load
            }
            add(
                load,
                "batch / nice-19 batch",
                [
                    _ratio(
                        r["batch_items_per_s"],
                        (nice.get(r["repetition"]) or {}).get("batch_items_per_s"),
                    )
                    for r in here
                ],
                0.9,
                False,
            )
    add(
        None,
        "urgent start p99 (ms)",
        [r["urgent_start_p99_ms"] for r in pf],
        cal.batch_item_ms + 10.0,
        True,
    )
    add(None, "urgent misses", [float(r["urgent_misses"]) for r in pf], 0.0, True)
    add(None, "controller CPU (% of one core)", [r["controller_cpu_pct"] for r in pf], 2.0, True)
    return out
