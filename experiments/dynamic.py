"""`parfusion experiment dynamic`: an urgent robot event and a CPU/GPU/network disturbance.

The disturbance is a parfusion.v1.Disturbance handed to the node's InjectDisturbance path (the
one the dashboard's guided demo and grpcurl use). The report records how the controller
changed each intent's units and every NORMAL/FP16/INT8 degradation decision, tick by tick, and
how fast it reacted to each event; baseline runs beside it for contrast.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from experiments import report
from experiments.suite import ExperimentSpec, run_and_report

SPEC = ExperimentSpec(name="dynamic", scenario="dynamic", policies=("baseline", "parfusion"))
MAX_CHANGE_ROWS = 60
MAX_LISTED = 6


def _units(n: int) -> str:
    return f"{n} unit" if n == 1 else f"{n} units"


def level_changes(result: dict[str, Any]) -> str:
    """How often each intent's degradation level changed: many changes in a short window mean
    the controller flapped between levels."""
    counts: dict[str, int] = {}
    for d in result["degradation_decisions"]:
        counts[d["intent"]] = counts.get(d["intent"], 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def _window_p99(result: dict[str, Any], start: float, end: float) -> float:
    """Worst per-second online p99 over the whole seconds [s, s + 1) inside [start, end)."""
    tl = result["timeline"]
    pairs = zip(tl["second"], tl["online_p99_ms"], strict=True)
    vals = [v for s, v in pairs if s >= start - 1e-9 and s + 1 <= end + 1e-9]
    return max(vals) if vals else 0.0


def reactions(doc: dict[str, Any], policy: str) -> list[str]:
    res = doc["results"][policy]
    tl = res["timeline"]
    urgent = doc["scenario"]["urgent_intent"]
    out = []
    units = tl["units"].get(urgent, [0] * len(tl["t_s"]))
    for e in doc["scenario"]["events"]:
        if e["kind"] == "urgent_start":
            first = next(
                (i for i, t in enumerate(tl["t_s"]) if t >= e["at_s"] and units[i] > 0), None
            )
            if first is None:
                out.append(f"{policy}: the urgent event at {e['at_s']:.2f} s never got units.")
                continue
            held = {n: u[first - 1] for n, u in tl["units"].items()} if first else {}
            given = {n: u[first] for n, u in tl["units"].items()}
            lost = [
                f"{n} {held.get(n, 0)}->{given[n]}"
                for n in given
                if n != urgent and given[n] < held.get(n, 0)
            ]
            out.append(
                f"{policy}: the urgent event at {e['at_s']:.2f} s got {_units(units[first])} at the "
                f"tick of {tl['t_s'][first]:.2f} s ({(tl['t_s'][first] - e['at_s']) * 1000:.0f} ms "
                f"later); intents that shrank at that tick: {', '.join(lost) if lost else 'none'}."
            )
        elif e["kind"] == "disturbance":
            start, end = e["at_s"], e["at_s"] + e["duration_s"]
            during = _window_p99(res, math.ceil(start), end)
            before = _window_p99(res, max(0.0, start - e["duration_s"]), start)
            decisions = [d for d in res["degradation_decisions"] if start <= d["t_s"] <= end + 1]
            steps = ", ".join(
                f"{d['intent']} {d['from']}->{d['to']} at {d['t_s']:.2f} s"
                for d in decisions[:MAX_LISTED]
            )
            if len(decisions) > MAX_LISTED:
                steps += f" and {len(decisions) - MAX_LISTED} more (table below)"
            out.append(
                f"{policy}: worst online p99 per second was {before:.1f} ms before the disturbance "
                f"and {during:.1f} ms during it; {len(decisions)} degradation decisions in the "
                f"window{': ' + steps if steps else ''}."
            )
    return out


def findings(doc: dict[str, Any]) -> list[str]:
    res = doc["results"]
    out = [
        report.compare(m, "parfusion", res["parfusion"], "baseline", res["baseline"])
        for m in report.METRICS.values()
    ]
    for policy in doc["policies"]:
        out.extend(reactions(doc, policy))
        out.append(
            f"{policy}: degradation level changes per intent over the run: "
            f"{level_changes(res[policy])}."
        )
    return out


def sections(doc: dict[str, Any]) -> list[str]:
    res = doc["results"]["parfusion"]
    lines = ["## Degradation decisions (parfusion)", ""]
    if res["degradation_decisions"]:
        lines += [
            "| t (s) | intent | from | to | predicted p99 ms | reason |",
            "|---:|---|---|---|---:|---|",
        ]
        lines += [
            f"| {d['t_s']:.2f} | {d['intent']} | {d['from']} | {d['to']} | "
            f"{d['predicted_p99_ms']:.1f} | {d['reason']} |"
            for d in res["degradation_decisions"][:MAX_CHANGE_ROWS]
        ]
        extra = len(res["degradation_decisions"]) - MAX_CHANGE_ROWS
        if extra > 0:
            lines.append(f"\n{extra} more degradation decisions are in the JSON.")
    else:
        lines.append("parfusion made no degradation decision in this run.")
    changes = res["decision_changes"]
    lines += ["", "## How the controller changed the intents (parfusion)", ""]
    lines += ["| t (s) | intent | units | state | reason |", "|---:|---|---|---|---|"]
    lines += [
        f"| {c['t_s']:.2f} | {c['intent']} | {c['from']} -> {c['to']} | {c['state']} | {c['reason']} |"
        for c in changes[:MAX_CHANGE_ROWS]
    ]
    if len(changes) > MAX_CHANGE_ROWS:
        lines.append(f"\n{len(changes) - MAX_CHANGE_ROWS} more changes are in the JSON.")
    return [*lines, ""]


def run(seconds: float, seed: int, results_dir: Path, progress: bool = True) -> tuple[Path, Path]:
    return run_and_report(
        SPEC,
        seconds,
        seed,
        results_dir,
        title="Dynamic run: urgent robot event and CPU/GPU/network disturbance (modeled)",
        findings=findings,
        sections=sections,
        units_policies=("parfusion",),
        progress=progress,
    )
