"""`parfusion experiment stability`: `make run`'s intents under parfusion, steady and disturbed.

Two runs on the modeled node with the same seed: the intents `make run` seeds (configs/intents)
with no event, and the same with the guided demo's disturbance (cpu 60 %, gpu 50 %, network 40 %
for 14 s, configs/demo.yaml) in the middle. The report gives, per run, how stable the plans
were (units and level changes, flaps: a change within 5 s of the intent's previous one), how
far each deadline intent's predicted p99 was from the observed one, and whether deadlines held:
per deadline intent and 2-second window, the p99 of the requests that arrived in it against the
deadline, while the plan said the intent was admitted (ADMITTED or DEGRADED); windows where the
plan said it was not (THROTTLED, PREEMPTED) are counted apart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from experiments.metrics import prediction_errors, stability, steady_ticks
from experiments.runner import PolicyRun, run_policy
from experiments.scenario import Event, Scenario, load_scenario
from experiments.suite import MODELED_STATEMENT, default_results_dir
from parfusion.v1 import telemetry_pb2
from services.core import convert, validation
from services.sim.params import ModelParams, load_model_params
from services.sim.stats import percentiles

INTENTS_DIR = Path(__file__).resolve().parents[1] / "configs" / "intents"
WINDOW_S = 2.0  # the samples "deadline held" is judged on
HELD_TARGET_PCT = 95.0
DEMO_DISTURBANCE = {"cpu": 0.6, "gpu": 0.5, "network": 0.4, "duration_s": 14.0}  # demo.yaml
ADMITTED_STATES = ("ADMITTED", "DEGRADED")


def demo_scenario(params: ModelParams, seconds: float, disturbed: bool) -> Scenario:
    """`make run`'s intents; with `disturbed`, the guided demo's disturbance at half time."""
    lanes = tuple(params.lanes)
    intents = tuple(
        validation.normalize_intent(i, known_lanes=lanes)
        for path in sorted(INTENTS_DIR.glob("*.yaml"))
        for i in convert.intents_in_file(path)
    )
    urgent = load_scenario(params, "compare", seconds).urgent  # never fires here
    events: tuple[Event, ...] = ()
    if disturbed:
        d = DEMO_DISTURBANCE
        events = (
            Event(
                seconds / 2,
                "disturbance",
                telemetry_pb2.Disturbance(
                    cpu_pressure=d["cpu"],
                    gpu_pressure=d["gpu"],
                    network_pressure=d["network"],
                    duration_s=min(d["duration_s"], seconds / 4),
                    source="experiment:stability",
                ),
            ),
        )
    name = "demo-disturbed" if disturbed else "demo-steady"
    return Scenario(name, seconds, intents, urgent, events)


def deadlines_held(run: PolicyRun) -> dict[str, dict[str, Any]]:
    """Per deadline intent, over WINDOW_S windows wholly inside the run's steady ticks: how many
    had requests, how many of those the plan said were admitted, and the share of those whose
    p99 met the deadline; plus the same over every window."""
    steady = steady_ticks(run)
    tick_s = run.ticks[1].t_s - run.ticks[0].t_s if len(run.ticks) > 1 else 0.25
    out: dict[str, dict[str, Any]] = {}
    node = run.backend.node
    for intent_run in list(node.runs.values()) + node.retired:
        profile = intent_run.profile
        if profile.deadline_ms <= 0 or intent_run.queue is None:
            continue
        lat, arr = intent_run.stats.all_latencies(), intent_run.stats.all_arrivals()
        block: dict[str, Any] = {"deadline_ms": profile.deadline_ms}
        for name, only_steady in (("steady", True), ("all", False)):
            windows = admitted = held = 0
            start = 0.0
            while start + WINDOW_S <= run.scenario.seconds + 1e-9:
                first = int(round(start / tick_s))
                last = min(int(round((start + WINDOW_S) / tick_s)), len(run.ticks)) - 1
                inside = (arr >= start) & (arr < start + WINDOW_S)
                start += WINDOW_S
                if last < first or not np.count_nonzero(inside):
                    continue
                if only_steady and not all(steady[first : last + 1]):
                    continue
                windows += 1
                if run.ticks[last].state.get(profile.intent_id) not in ADMITTED_STATES:
                    continue
                admitted += 1
                (p99,) = percentiles(lat[inside], (99,))
                held += p99 <= profile.deadline_ms
            block[name] = {
                "windows": windows,
                "admitted_windows": admitted,
                "held_pct": round(100.0 * held / admitted, 2) if admitted else None,
            }
        out[profile.intent_id] = block
    return out


def run_once(params: ModelParams, seconds: float, seed: int, disturbed: bool) -> dict[str, Any]:
    run = run_policy("parfusion", demo_scenario(params, seconds, disturbed), params, seed)
    return {
        "events": run.events,
        "stability": stability(run),
        "prediction_error": prediction_errors(run),
        "deadlines_held": deadlines_held(run),
    }


def measure(seconds: float, seed: int, params: ModelParams | None = None) -> dict[str, Any]:
    params = params or load_model_params()
    return {
        "experiment": "stability",
        "statement": MODELED_STATEMENT,
        "policy": "parfusion",
        "seconds": seconds,
        "seed": seed,
        "window_s": WINDOW_S,
        "runs": {
            "steady": run_once(params, seconds, seed, disturbed=False),
            "disturbed": run_once(params, seconds, seed, disturbed=True),
        },
    }


def render(doc: dict[str, Any]) -> str:
    lines = [
        "# Plan stability, prediction error and deadlines held (`make run`'s intents)",
        "",
        f"> **Modeled, not measured.** {doc['statement']}",
        "",
        f"parfusion, seed {doc['seed']}, {doc['seconds']:g} simulated seconds per run; steady "
        "= at least 10 s clear of the start and of every event; a flap is a change of an "
        f"intent's units or level within 5 s of its previous change; deadlines held = share of "
        f"{doc['window_s']:g}-second windows, while the plan said admitted, whose p99 met the "
        f"deadline (target {HELD_TARGET_PCT:g} %).",
        "",
        "| run | changes (units / level) | flaps | flaps in steady ticks | flapping intents |",
        "|---|---:|---:|---:|---|",
    ]
    for name, r in doc["runs"].items():
        s_all, s_steady = r["stability"]["all"], r["stability"]["steady"]
        lines.append(
            f"| {name} | {s_all['units_changes']} / {s_all['level_changes']} | {s_all['flaps']} "
            f"| {s_steady['flaps']} | {', '.join(s_all['flapping']) or '-'} |"
        )
    lines += [
        "",
        "| run | intent | prediction error % median (p90), steady | deadline held % (admitted "
        "windows), steady | held % (admitted windows), all |",
        "|---|---|---:|---:|---:|",
    ]
    for name, r in doc["runs"].items():
        for intent_id, held in sorted(r["deadlines_held"].items()):
            e = r["prediction_error"].get(intent_id) or {}
            err = (
                f"{e['steady_median_pct']:.1f} ({e['steady_p90_pct']:.1f})"
                if e.get("steady_median_pct") is not None
                else "n/a"
            )
            cells = []
            for part in ("steady", "all"):
                h = held[part]
                pct = "n/a" if h["held_pct"] is None else f"{h['held_pct']:.1f}"
                cells.append(f"{pct} ({h['admitted_windows']}/{h['windows']})")
            lines.append(f"| {name} | {intent_id} | {err} | {cells[0]} | {cells[1]} |")
    lines.append("")
    return "\n".join(lines)


def run(seconds: float, seed: int, results_dir: Path, progress: bool = True) -> tuple[Path, Path]:
    doc = measure(seconds, seed)
    results_dir = results_dir or default_results_dir()
    (results_dir / "reports").mkdir(parents=True, exist_ok=True)
    json_path = results_dir / "experiment_stability.json"
    json_path.write_text(json.dumps(doc, indent=1) + "\n")
    md = results_dir / "reports" / "experiment_stability.md"
    md.write_text(render(doc))
    return json_path, md
