"""The CPU co-run harness: a short real run checks the report's structure (not its numbers),
and the statistics (ratios within a repetition, bootstrap, gate, budget split) are exact."""

from __future__ import annotations

import json
import random
from pathlib import Path

import psutil
import pytest

from experiments.cpu_corun import stats
from experiments.cpu_corun.cli import measure_seconds, plan_runs, run_undisturbed
from experiments.cpu_corun.profiles import CO_RUN, PROFILES
from experiments.cpu_corun.runner import PhaseRun
from experiments.cpu_corun.workload import Calibration, poisson


def _cal() -> Calibration:
    return Calibration((0, 1), 12.0, 12.0, 60, 160.0, 60.0, 8.0)


def test_poisson_schedule_is_seeded_and_has_the_rate() -> None:
    a = poisson(100.0, 20.0, random.Random(3))
    assert a == poisson(100.0, 20.0, random.Random(3))
    assert 1800 < len(a) < 2200 and a == sorted(a) and a[-1] < 20.0


def test_budget_gives_each_online_phase_about_the_same_samples() -> None:
    prof = PROFILES["full"]
    runs = plan_runs(prof, CO_RUN, random.Random(1))
    assert all(len(rep) == 1 + len(prof.loads) * (1 + len(CO_RUN)) for rep in runs)
    assert [r[0] for r in runs[0]] != [r[0] for r in runs[1]]  # order randomised per repetition
    windows = measure_seconds(prof, runs, prof.default_seconds)
    samples = {load: load * 160.0 * windows[load] for load in prof.loads}
    assert max(samples.values()) == pytest.approx(min(samples.values()))
    assert min(samples.values()) >= 2000  # the full profile's default budget reaches the p99 target


def test_ratios_are_within_a_repetition_and_the_gate_reads_the_top_load() -> None:
    cal = _cal()

    def row(
        phase: str, rep: int, load: float | None, p99: float | None, batch: float = 0.0
    ) -> dict:  # type: ignore[type-arg]
        return {
            "phase": phase,
            "repetition": rep,
            "load": load,
            "p99_ms": p99,
            "miss_pct": 1.0 if p99 else None,
            "batch_items_per_s": batch,
            "rate_per_s": (load or 0) * 160.0,
            "service_mean_ms": 12.0,
            "errors": [],
            "samples": 100,
            "p50_ms": p99,
            "p95_ms": p99,
            "urgent_start_p99_ms": None,
            "urgent_misses": 0,
            "controller_cpu_pct": None,
        }

    rows = [
        row("online-alone", 0, 0.7, 20.0),
        row("online-alone", 1, 0.7, 40.0),
        row("batch-alone", 0, None, None, 100.0),
        row("batch-alone", 1, None, None, 50.0),
        row("baseline", 0, 0.7, 60.0, 50.0),
        row("baseline", 1, 0.7, 80.0, 25.0),
    ]
    out = stats.with_ratios(rows, cal)
    base = [r for r in out if r["phase"] == "baseline"]
    assert [r["p99_ratio"] for r in base] == [3.0, 2.0]
    assert [r["batch_ratio"] for r in base] == [0.5, 0.5]
    c = 0.7 * 160.0 * 12.0 / 1000.0
    assert base[0]["ideal_leftover_ratio"] == pytest.approx(
        stats.amdahl(0.9, 2 - c) / stats.amdahl(0.9, 2)
    )
    agg = stats.aggregate(out)
    gate = stats.sanity_gate(agg, [0.7])
    assert gate["passed"] and gate["baseline_p99_ratio"] == 2.5
    rows[4]["p99_ms"] = 30.0
    rows[5]["p99_ms"] = 40.0
    weak = stats.sanity_gate(stats.aggregate(stats.with_ratios(rows, cal)), [0.7])
    assert not weak["passed"] and weak["verdict"].startswith("void")


def test_targets_hold_parfusion_against_the_best_static_knob_of_each_repetition() -> None:
    """The best knob is the static phase with the lower p99 in that repetition; at <= 50 % load
    parfusion may equal it, at 70 % it must beat it."""

    def row(phase: str, rep: int, load: float | None, p99: float, miss: float, batch: float):  # type: ignore[no-untyped-def]
        return {
            "phase": phase, "repetition": rep, "load": load, "p99_ms": p99, "miss_pct": miss,
            "batch_items_per_s": batch, "rate_per_s": (load or 0) * 160.0, "service_mean_ms": 12.0,
            "errors": [], "samples": 100, "p50_ms": p99, "p95_ms": p99,
            "urgent_start_p99_ms": 5.0, "urgent_misses": 0, "controller_cpu_pct": 1.0,
        }  # fmt: skip

    rows = []
    for rep in (0, 1):
        rows.append(row("batch-alone", rep, None, 0.0, 0.0, 200.0))
        for load in (0.5, 0.7):
            # sched-idle is the better knob in repetition 0, nice 19 in repetition 1
            idle, nice = (30.0, 40.0) if rep == 0 else (50.0, 35.0)
            rows += [
                row("online-alone", rep, load, 30.0, 1.0, 0.0),
                row("sched-idle", rep, load, idle, 1.0, 100.0 + rep),
                row("nice19", rep, load, nice, 2.0, 90.0),
                # parfusion equals the better knob's p99 and misses, with 0.9x its batch
                row("parfusion", rep, load, min(idle, nice), 1.0 if rep == 0 else 2.0, 90.0),
            ]
    assert stats.best_knob(rows, 0, 0.5)["phase"] == "sched-idle"
    assert stats.best_knob(rows, 1, 0.5)["phase"] == "nice19"
    got = {
        (t["load"], t["target"]): t
        for t in stats.targets(stats.with_ratios(rows, _cal()), _cal(), [0.5, 0.7])
    }
    assert got[(0.5, "p99 / best static knob's")]["median"] == 1.0
    assert got[(0.5, "p99 / best static knob's")]["met"] is True  # no worse is enough
    assert got[(0.5, "miss % - best static knob's (points)")]["met"] is True
    batch = got[(0.5, "batch / best static knob's")]
    assert batch["met"] is False and batch["median"] == pytest.approx((90 / 100 + 1.0) / 2)
    assert got[(0.7, "p99 / best static knob's")]["met"] is False  # must be lower at 70 %
    assert got[(0.7, "p99 / best static knob's")]["bound"] == "<"
    assert got[(0.7, "miss % - best static knob's (points)")]["met"] is False
    assert got[(0.7, "batch / nice-19 batch")]["met"] is True


def test_bootstrap_interval_contains_the_median() -> None:
    b = stats.bootstrap_median([1.0, 2.0, 3.0, 4.0, 100.0])
    assert b["median"] == 3.0 and b["lo"] <= 3.0 <= b["hi"] and b["n"] == 5
    assert stats.bootstrap_median([])["median"] is None


@pytest.mark.slow
@pytest.mark.integration
def test_short_co_run_writes_json_figures_and_report(home: Path) -> None:
    from parfusion.cli import main

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    rc = main(
        [
            "bench",
            "cpu-corun",
            "--seconds",
            "6",
            "--loads",
            "0.7",
            "--repetitions",
            "2",
            "--phases",
            "parfusion",
            "--warmup",
            "0.4",
            "--quiet",
        ]
    )
    assert rc == 0
    doc = json.loads(next((home / "results").glob("cpu-corun-*.json")).read_text())
    phases = {(a["phase"], a["load"]) for a in doc["aggregate"]}
    assert phases == {
        ("online-alone", 0.7),
        ("batch-alone", None),
        ("baseline", 0.7),
        ("nice19", 0.7),
        ("parfusion", 0.7),
    }
    assert len(doc["phases"]) == 10 and all(
        r["samples"] > 0 for r in doc["phases"] if r["phase"] != "batch-alone"
    )
    assert (
        10.0 <= doc["calibration"]["online_median_ms"] <= 20.0
        or len(doc["calibration"]["attempts"]) == 3
    )
    assert doc["calibration"]["capacity_per_s"] > 0
    assert doc["command"].startswith(
        "parfusion bench cpu-corun --seconds 6.0 --profile smoke --loads 0.7"
    )
    assert {"passed", "verdict", "baseline_p99_ratio"} <= set(doc["sanity_gate"])
    assert {t["target"] for t in doc["targets"]} >= {
        "p99 / online-alone",
        "urgent start p99 (ms)",
        "controller CPU (% of one core)",
    }
    assert any(
        r["plan_trace"] for r in doc["raw"] if r["phase"] == "parfusion"
    )  # the controller really ticked
    report = next((home / "results" / "reports").glob("cpu-corun-*.md")).read_text()
    for heading in (
        "## Conditions",
        "## Sanity gate",
        "## 70 % load",
        "## PARFusion targets",
        "## Phase order",
        "| parfusion |",
    ):
        assert heading in report
    figures = list((home / "results" / "figures").glob("cpu-corun-*.png"))
    assert len(figures) == 3 and all(f.stat().st_size > 1000 for f in figures)
    left = {
        p.pid
        for p in psutil.Process().children(recursive=True)
        if p.status() != psutil.STATUS_ZOMBIE
    } - before
    assert not left, f"benchmark left processes: {left}"


def test_a_disturbed_phase_is_run_again_and_a_reference_slower_than_a_co_run_is_flagged() -> None:
    cal = _cal()  # online median 12 ms on one core
    quiet = {"phase": "online-alone", "foreign_cores": 0.02, "service_mean_ms": 12.5}
    assert stats.disturbance(quiet, cal) is None
    busy = {**quiet, "foreign_cores": 0.27, "service_mean_ms": 18.9}
    why = stats.disturbance(busy, cal)
    assert why is not None and "0.27 cores" in why and "1.57x" in why
    # inside a co-run the online service time is the phase's own contention, not a disturbance
    assert stats.disturbance({**busy, "phase": "nice19", "foreign_cores": 0.0}, cal) is None

    class Attempts:
        """Phase runs whose foreign CPU falls attempt by attempt (another job ending)."""

        def __init__(self, foreign: list[float]) -> None:
            self.foreign = foreign

        def __call__(self) -> PhaseRun:
            run = PhaseRun("online-alone", 0.7, 0, 0, 10.0, 112.0)
            run.online_latency_ms = [10.0] * 100
            run.online_service_ms = [12.0] * 100
            run.foreign_cores = self.foreign.pop(0)
            return run

    _, row = run_undisturbed(Attempts([0.4, 0.05, 0.9]), cal)
    assert row["attempts"] == 2 and row["disturbed"] is None and row["foreign_cores"] == 0.05
    _, row = run_undisturbed(Attempts([0.5, 0.3, 0.6]), cal)  # bounded: the least disturbed
    assert row["attempts"] == 1 + stats.MAX_RERUNS and row["foreign_cores"] == 0.3
    assert row["disturbed"] is not None

    rows = [
        {"phase": "online-alone", "repetition": 0, "load": 0.7, "p99_ms": 68.0},
        {"phase": "nice19", "repetition": 0, "load": 0.7, "p99_ms": 45.0},
        {"phase": "baseline", "repetition": 0, "load": 0.7, "p99_ms": 140.0},
        {"phase": "online-alone", "repetition": 0, "load": 0.3, "p99_ms": 20.0},
        {"phase": "nice19", "repetition": 0, "load": 0.3, "p99_ms": 25.0},
    ]
    suspects = stats.suspect_references(rows)
    assert suspects == [
        {
            "repetition": 0,
            "load": 0.7,
            "alone_p99_ms": 68.0,
            "phase": "nice19",
            "phase_p99_ms": 45.0,
        }
    ]
    assert rows[0].get("reference_suspect") and not rows[3].get("reference_suspect")
    gate = stats.sanity_gate([], [0.7], rows + [{"disturbed": "x"}], suspects)
    assert not gate["passed"]
    assert "suspect reference" in gate["verdict"] and "still disturbed" in gate["verdict"]


def test_the_report_gives_the_prediction_error_over_whole_phases_and_their_second_halves() -> None:
    from experiments.cpu_corun.report import prediction_error_lines

    rows = [
        {"phase": "parfusion", "load": 0.7, "repetition": 1,
         "prediction_error_pct": 40.0, "prediction_error_late_pct": 12.5,
         "prediction_bias_late_pct": -12.5, "latency_correction": 4.0},
        {"phase": "parfusion", "load": 0.3, "repetition": 0,
         "prediction_error_pct": 5.0, "prediction_error_late_pct": None},
        {"phase": "fifo", "load": 0.3, "repetition": 0,
         "prediction_error_pct": 60.0, "prediction_error_late_pct": 30.0},
        {"phase": "nice19", "load": 0.3, "repetition": 0, "prediction_error_pct": None},
    ]  # fmt: skip
    whole, late, ours, signed = prediction_error_lines(rows)
    assert "whole phase): median 40.0 %, worst 60.0 %" in whole
    assert "second half of each phase): median 30.0 %, worst 30.0 %" in late
    assert ours.endswith("30 % rep 0: 5.0 / –; 70 % rep 1: 40.0 / 12.5.")
    assert signed.endswith("70 % rep 1: -12.5 % at k = 4.00 (its bound).")
    assert prediction_error_lines([rows[3]]) == []
