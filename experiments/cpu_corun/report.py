"""The co-run's outputs: JSON under results/, figures under results/figures/, a Markdown report.

The JSON holds everything (conditions, calibration, every phase's summary and raw latency
samples, aggregates, gate, targets); the Markdown report is generated from the same dict.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from experiments.cpu_corun.profiles import ALL_PHASES  # noqa: E402
from services.core.predictor import CORRECTION_MAX  # noqa: E402

PHASE_ORDER = [p.name for p in ALL_PHASES]


def write_json(doc: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=float))
    return path


def _fmt(stat: dict[str, Any] | None, digits: int = 1, ci: bool = False) -> str:
    if not stat or stat.get("median") is None:
        return "–"
    med = f"{stat['median']:.{digits}f}"
    if ci and stat.get("n", 0) > 1:
        return f"{med} [{stat['lo']:.{digits}f}, {stat['hi']:.{digits}f}]"
    return med


def figures(doc: dict[str, Any], figdir: Path, stem: str) -> list[Path]:
    figdir.mkdir(parents=True, exist_ok=True)
    agg = doc["aggregate"]
    loads = doc["profile"]["loads"]
    out = []
    for metric, label, name in (
        ("p99_ratio", "online p99 / online-alone", "p99"),
        ("batch_ratio", "batch items/s / batch-alone", "batch"),
    ):
        fig, ax = plt.subplots(figsize=(9, 4))
        phases = [
            p
            for p in PHASE_ORDER
            if any(a["phase"] == p and a[metric]["median"] is not None for a in agg)
        ]
        width = 0.8 / max(1, len(loads))
        for i, load in enumerate(loads):
            meds: list[float] = []
            errs: list[list[float]] = [[], []]
            for p in phases:
                a = next((a for a in agg if a["phase"] == p and a["load"] == load), None)
                s = a[metric] if a else {"median": None}
                m = s["median"] or 0.0
                meds.append(m)
                errs[0].append(max(0.0, m - (s.get("lo") or m)))
                errs[1].append(max(0.0, (s.get("hi") or m) - m))
            xs = [j + i * width for j in range(len(phases))]
            ax.bar(xs, meds, width, yerr=errs, capsize=3, label=f"{int(load * 100)} % load")
        ax.set_xticks(
            [j + width * (len(loads) - 1) / 2 for j in range(len(phases))], phases, rotation=20
        )
        ax.set_ylabel(label)
        if metric == "p99_ratio":
            ax.set_yscale("log")
            ax.axhline(1.0, color="grey", lw=0.8)
        ax.legend()
        ax.set_title(f"CPU co-run: {label} (median, bootstrap 95 % CI)")
        fig.tight_layout()
        path = figdir / f"{stem}-{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        out.append(path)
    top = max(loads)
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in doc["raw"]:
        if run["load"] == top and run["repetition"] == 0 and run["online_latency_ms"]:
            lat = sorted(run["online_latency_ms"])
            ax.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))], label=run["phase"])
    ax.set_xscale("log")
    ax.axvline(doc["calibration"]["deadline_ms"], color="red", lw=0.8, ls="--", label="deadline")
    ax.set_xlabel("online latency from scheduled arrival (ms)")
    ax.set_ylabel("CDF")
    ax.set_title(f"Online latency at {int(top * 100)} % load (repetition 0)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = figdir / f"{stem}-cdf.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    out.append(path)
    return out


def markdown(doc: dict[str, Any], figure_paths: list[Path], report_path: Path) -> str:
    cal, cond, prof, gate = (
        doc["calibration"],
        doc["conditions"],
        doc["profile"],
        doc["sanity_gate"],
    )
    gate_ratio = "–" if gate["baseline_p99_ratio"] is None else f"{gate['baseline_p99_ratio']:.2f}x"
    lines = [
        f"# CPU co-run benchmark — {doc['started_at']}",
        "",
        f"Command: `{doc['command']}`  ",
        f"Profile: **{prof['name']}** — loads {', '.join(f'{int(x * 100)} %' for x in prof['loads'])} of measured solo capacity, "
        f"{prof['repetitions']} repetitions, warm-up {prof['warmup_s']} s and drain {prof['drain_s']} s per phase, "
        f"measuring budget {doc['seconds']} s (wall time {doc['wall_s']:.0f} s).",
        "",
        "## Conditions",
        "",
        f"- Machine: {cond['cpu_model']}, {cond['cpu_count']} CPUs, kernel {cond['kernel']}, autogroup {cond['autogroup']}",
        f"- Arena (most idle cores at start): {cal['arena']}",
        f"- Host load average before / after: {cond['load_before']} / {cond['load_after']}; mean host CPU during phases {cond['mean_host_cpu_percent']:.0f} %; "
        f"CPU used by other processes during phases: mean {cond['mean_foreign_cores']:.2f} cores, max {cond['max_foreign_cores']:.2f} cores",
        f"- Online request: median service {cal['online_median_ms']:.2f} ms on one core (kernel base {cal['online_service_ms']:.2f} ms), "
        f"deadline {cal['deadline_ms']:.1f} ms (5x), measured solo capacity {cal['capacity_per_s']:.1f} req/s on {len(cal['arena'])} workers",
        f"- Batch: Amdahl f = 0.9 jobs of 10 items, median item {cal['batch_item_ms']:.2f} ms; urgent: Poisson 1/s, deadline 200 ms",
        "- Latency is measured from each request's scheduled arrival (open loop, no coordinated omission).",
        "",
        "## Sanity gate",
        "",
        f"Baseline online p99 / online-alone at {int(gate['load'] * 100)} % load: "
        f"{gate_ratio} (needs >= {gate['threshold']}x) — **{gate['verdict']}**.",
        "",
    ]
    disturbed = [r for r in doc["phases"] if r.get("disturbed")]
    rerun = [r for r in doc["phases"] if r.get("attempts", 1) > 1]
    lines.append(
        f"Disturbance check: {len(rerun)} phase run(s) re-run because other processes disturbed "
        f"them; {len(disturbed)} still disturbed after the re-runs" + (":" if disturbed else ".")
    )
    for r in disturbed:
        load = "" if r["load"] is None else f" at {int(r['load'] * 100)} %"
        lines.append(
            f"- {r['phase']}{load}, repetition {r['repetition']}, {r['attempts']} attempts: "
            f"{r['disturbed']}"
        )
    for s in gate.get("suspect_references", []):
        lines.append(
            f"- suspect reference: online-alone at {int(s['load'] * 100)} % (repetition "
            f"{s['repetition']}) has p99 {s['alone_p99_ms']:.1f} ms, worse than {s['phase']}'s "
            f"{s['phase_p99_ms']:.1f} ms in the same repetition; its ratios are not evidence"
        )
    lines += prediction_error_lines(doc["phases"])
    lines.append("")
    for load in prof["loads"]:
        lines += [
            f"## {int(load * 100)} % load ({load * cal['capacity_per_s']:.1f} req/s)",
            "",
            "| phase | samples | p50 ms | p95 ms | p99 ms | p99 / alone [95 % CI] | miss % | batch items/s | batch / alone [95 % CI] | batch / ideal leftover | urgent start p99 ms | urgent misses | other CPU (cores) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name in PHASE_ORDER:
            a = next(
                (
                    a
                    for a in doc["aggregate"]
                    if a["phase"] == name and a["load"] == (None if name == "batch-alone" else load)
                ),
                None,
            )
            if a is None or (name == "batch-alone" and load != prof["loads"][0]):
                continue
            lines.append(
                f"| {name} | {_fmt(a['samples'], 0)} | {_fmt(a['p50_ms'])} | {_fmt(a['p95_ms'])} | {_fmt(a['p99_ms'])} | "
                f"{_fmt(a['p99_ratio'], 2, True)} | {_fmt(a['miss_pct'], 2)} | {_fmt(a['batch_items_per_s'])} | "
                f"{_fmt(a['batch_ratio'], 2, True)} | {_fmt(a['batch_vs_ideal'], 2)} | {_fmt(a['urgent_start_p99_ms'])} | {_fmt(a['urgent_misses'], 0)} | {_fmt(a['foreign_cores'], 2)} |"
            )
        lines.append("")
    lines += [
        "## PARFusion targets (median over repetitions)",
        "",
        "| load | target | measured [95 % CI] | limit | met |",
        "|---|---|---|---|---|",
    ]
    for t in doc["targets"]:
        stat = {k: t[k] for k in ("median", "lo", "hi", "n")}
        met = "–" if t["met"] is None else ("yes" if t["met"] else "**no**")
        load = "all" if t["load"] is None else f"{int(t['load'] * 100)} %"
        lines.append(
            f"| {load} | {t['target']} | {_fmt(stat, 2, True)} | {t['bound']} {t['limit']:.2f} | {met} |"
        )
    errors = sorted({e for a in doc["aggregate"] for e in a["errors"]})
    if errors:
        lines += ["", "## Errors", ""] + [f"- {e}" for e in errors]
    lines += ["", "## Phase order", ""]
    for rep, order in enumerate(doc["order"]):
        lines.append(f"- repetition {rep}: " + ", ".join(order))
    lines += ["", "## Figures", ""]
    for p in figure_paths:
        rel = (
            Path("..") / p.relative_to(report_path.parent.parent)
            if p.is_relative_to(report_path.parent.parent)
            else p
        )
        lines.append(f"![{p.stem}]({rel.as_posix()})")
    lines.append("")
    return "\n".join(lines)


def prediction_error_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The policy phases' prediction error (median |predicted / observed online p99 - 1| per
    phase) over each whole phase and over its second half, once the correction has learnt; and
    parfusion's phase by phase."""
    lines = []
    for key, what in (
        ("prediction_error_pct", "whole phase"),
        ("prediction_error_late_pct", "second half of each phase"),
    ):
        errors = sorted(r[key] for r in rows if r.get(key) is not None)
        if errors:
            lines.append(
                f"Prediction error (policy phases, median |predicted / observed online p99 - 1| "
                f"per phase, {what}): median {errors[len(errors) // 2]:.1f} %, worst "
                f"{errors[-1]:.1f} %."
            )
    ours = [
        r for r in rows if r["phase"] == "parfusion" and r.get("prediction_error_pct") is not None
    ]
    if ours:
        cells = [
            f"{int(r['load'] * 100)} % rep {r['repetition']}: {r['prediction_error_pct']:.1f} / "
            + (
                "–"
                if r.get("prediction_error_late_pct") is None
                else f"{r['prediction_error_late_pct']:.1f}"
            )
            for r in sorted(ours, key=lambda r: (r["load"], r["repetition"]))
        ]
        lines.append(f"parfusion's, whole phase / second half (%): {'; '.join(cells)}.")
        signed = [r for r in ours if r.get("prediction_bias_late_pct") is not None]
        if signed:
            cells = []
            for r in sorted(signed, key=lambda r: (r["load"], r["repetition"])):
                k = r.get("latency_correction") or 1.0
                cells.append(
                    f"{int(r['load'] * 100)} % rep {r['repetition']}: "
                    f"{r['prediction_bias_late_pct']:+.1f} % at k = {k:.2f}"
                    + (" (its bound)" if k >= CORRECTION_MAX else "")
                )
            lines.append(
                "parfusion's signed error over the second half (median predicted / observed - 1; "
                f"below 0: predicted too low) and the correction k at the phase's end: "
                f"{'; '.join(cells)}."
            )
    return lines
