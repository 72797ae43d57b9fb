"""Reports: files exist, the table is there, the modeled statement is there, words follow numbers."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from experiments import ablation, compare, report
from experiments.suite import ExperimentSpec, run_experiment, write_json

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def doc():
    spec = ExperimentSpec("ablation", "compare", ablation.POLICIES)
    return run_experiment(spec, 6.0, 1, model_path=ROOT / "configs" / "model.yaml", progress=False)


def test_report_renders_table_statement_and_figures(doc, tmp_path: Path) -> None:
    json_path = write_json(doc, tmp_path)
    md = report.render(
        doc,
        tmp_path,
        title="t",
        findings=ablation.findings(doc),
        sections=["## The matrix", "", ablation.matrix(), ""],
        json_path=json_path,
    )
    text = md.read_text()
    assert "modeled, not measured" in text.lower()
    assert "| policy | online p50 ms | online p95 ms | online p99 ms | online miss % |" in text
    for policy in ablation.POLICIES:
        assert f"| `{policy}` |" in text
    for column in ("batch items/s", "urgent response ms", "preemptions", "degradations"):
        assert column in text
    figures = sorted(p.name for p in (tmp_path / "figures").iterdir())
    assert figures == [
        "experiment_ablation_summary.png",
        "experiment_ablation_timeline.png",
        "experiment_ablation_units_parfusion.png",
    ]
    for name in figures:
        assert f"../figures/{name}" in text
        assert (tmp_path / "figures" / name).stat().st_size > 5000


def test_every_ablation_is_judged_on_its_metric(doc) -> None:
    lines = ablation.findings(doc)
    for name, (_, metrics) in ablation.ABLATIONS.items():
        mine = [s for s in lines if s.startswith(f"{name} ")]
        assert len(mine) == len(metrics)


def test_sentences_follow_the_numbers(doc) -> None:
    res = copy.deepcopy(doc["results"])
    res["no-degrade"]["online"]["miss_pct"] = 0.0
    res["parfusion"]["online"]["miss_pct"] = 5.0
    words = report.compare(
        report.METRICS["online_miss"],
        "no-degrade",
        res["no-degrade"],
        "parfusion",
        res["parfusion"],
    )
    assert words == "no-degrade is better than parfusion on online miss %: 0.00 % vs 5.00 %."
    flipped = dict(doc, results=res)
    assert any(
        s.startswith("no-degrade is better") and "not worse on online miss %" in s
        for s in ablation.findings(flipped)
    )
    res["no-degrade"]["online"]["miss_pct"] = 9.0
    assert "is worse than" in report.compare(
        report.METRICS["online_miss"],
        "no-degrade",
        res["no-degrade"],
        "parfusion",
        res["parfusion"],
    )


def test_verdict_tolerance_and_direction() -> None:
    batch = report.METRICS["batch"]
    assert report.verdict(batch, 100.0, 100.5) == "about the same"
    assert report.verdict(batch, 120.0, 100.0) == "better"
    assert report.verdict(report.METRICS["online_p99"], 120.0, 100.0) == "worse"
    assert report.verdict(batch, None, 1.0) == "not comparable"


def test_compare_findings_cover_every_metric_and_conservation(doc) -> None:
    lines = compare.findings(doc)
    assert len(lines) == len(report.METRICS) + 2
    assert all("work conserved: yes" in s for s in lines[-2:])
