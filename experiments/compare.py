"""`parfusion experiment compare`: the Kubernetes-default baseline against PARFusion (D-MUG).

Both face the same seeded scenario (configs/model.yaml, events.compare: two urgent robot events
and a moderate CPU/GPU/network disturbance). The findings compare parfusion with baseline on
every headline metric, in words generated from the table's numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments import report
from experiments.suite import ExperimentSpec, run_and_report

SPEC = ExperimentSpec(name="compare", scenario="compare", policies=("baseline", "parfusion"))


def findings(doc: dict[str, Any]) -> list[str]:
    res = doc["results"]
    out = [
        report.compare(m, "parfusion", res["parfusion"], "baseline", res["baseline"])
        for m in report.METRICS.values()
    ]
    for name in ("baseline", "parfusion"):
        c = res[name]["conservation"]
        out.append(
            f"{name}: {c['arrived']} deadline requests arrived, {c['completed']} completed, "
            f"{c['dropped']} dropped, {c['queued']} still queued at the end "
            f"(work conserved: {'yes' if c['holds'] else 'NO'})."
        )
    return out


def run(seconds: float, seed: int, results_dir: Path, progress: bool = True) -> tuple[Path, Path]:
    return run_and_report(
        SPEC,
        seconds,
        seed,
        results_dir,
        title="Baseline vs PARFusion on the modeled node",
        findings=findings,
        units_policies=("baseline", "parfusion"),
        progress=progress,
    )
