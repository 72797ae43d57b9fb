"""`parfusion experiment ablation`: PARFusion with one mechanism removed at a time.

Ten policies face the same seeded scenario (configs/model.yaml's intents with events.ablation:
a service-time drift, a load step, a disturbance, an urgent event: the conditions the
mechanisms exist for). Each ablation exists to show what one mechanism buys; the report checks
each on the metric(s) it exists for and says so plainly when removing the mechanism is not worse
in this model run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments import report
from experiments.suite import ExperimentSpec, run_and_report

# policy -> (what it removes from parfusion, the metrics that removal should hurt)
ABLATIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "baseline": (
        "all of it: Kubernetes-default static requests by priority, equal shares, no knobs",
        ("online_miss", "batch"),
    ),
    "static": (
        "feedback: fixed preferred units from the first plan, each pinned to its own cores",
        ("online_miss",),
    ),
    "edf-only": (
        "the marginal-utility phase: leftover units go in deadline order, not by NMU",
        ("batch", "online_p99"),
    ),
    "no-crosslayer": (
        "the OS and GPU layers: no cpu sets, nice, SCHED_BATCH/IDLE, cgroup weights, lanes, "
        "shares or stream priorities (pool sizes only)",
        ("online_p99",),
    ),
    "no-gpuintent": (
        "the GPU layer: lanes, shares and stream priorities left at their defaults",
        ("online_p99",),
    ),
    "no-predictor": (
        "the predictor: declared base service times instead of observed ones",
        ("online_miss",),
    ),
    "no-elastic": (
        "elasticity: every intent keeps the units of its first allocation",
        ("online_miss", "batch"),
    ),
    "no-degrade": ("the NORMAL -> FP16 -> INT8 degradation ladder", ("online_miss",)),
    "no-preemption": ("URGENT preemption of preemptible units", ("urgent",)),
}
POLICIES = (*ABLATIONS, "parfusion")
SPEC = ExperimentSpec(name="ablation", scenario="ablation", policies=POLICIES)


def findings(doc: dict[str, Any]) -> list[str]:
    res = doc["results"]
    ref = res["parfusion"]
    out = []
    for name, (_, metrics) in ABLATIONS.items():
        for key in metrics:
            metric = report.METRICS[key]
            sentence = report.compare(metric, name, res[name], "parfusion", ref)
            v = report.verdict(
                metric, report.value(res[name], metric.key), report.value(ref, metric.key)
            )
            if v in ("better", "about the same"):
                sentence += (
                    f" Removing this mechanism is not worse on {metric.label} in this model run."
                )
            out.append(sentence)
    return out


def matrix() -> str:
    rows = ["| policy | removes from parfusion | judged on |", "|---|---|---|"]
    for name, (removes, metrics) in ABLATIONS.items():
        judged = ", ".join(report.METRICS[m].label for m in metrics)
        rows.append(f"| `{name}` | {removes} | {judged} |")
    rows.append("| `parfusion` | nothing (D-MUG with every mechanism) | reference |")
    return "\n".join(rows)


def run(seconds: float, seed: int, results_dir: Path, progress: bool = True) -> tuple[Path, Path]:
    return run_and_report(
        SPEC,
        seconds,
        seed,
        results_dir,
        title="Ablation matrix on the modeled node",
        findings=findings,
        sections=lambda _doc: ["## The matrix", "", matrix(), ""],
        units_policies=("parfusion",),
        progress=progress,
    )
