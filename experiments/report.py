"""Turns an experiment's JSON document into matplotlib figures and a Markdown report.

The report's words are generated from its own numbers: every comparison sentence is built by
``compare`` from the two values it cites, so a claim cannot drift from the table. Every report
opens with the statement that its latencies are modeled, not measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

REL_TOL = 0.02  # within 2 % (or the absolute tolerance) counts as "about the same"


@dataclass(frozen=True)
class Metric:
    key: str  # path in a result, e.g. "online.miss_pct"
    label: str
    unit: str
    lower_is_better: bool
    abs_tol: float


METRICS = {
    "online_p99": Metric("online.p99_ms", "online p99", "ms", True, 0.5),
    "online_miss": Metric("online.miss_pct", "online miss %", "pt", True, 0.05),
    "batch": Metric("batch.items_per_s", "batch throughput", "items/s", False, 1.0),
    "urgent": Metric("urgent.response_max_ms", "urgent response time", "ms", True, 1.0),
    "robot_miss": Metric("robot.miss_pct", "robot miss %", "pt", True, 0.05),
}


def value(result: dict[str, Any], key: str) -> float | None:
    node: Any = result
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return None if node is None else float(node)


def verdict(metric: Metric, candidate: float | None, reference: float | None) -> str:
    """'better', 'worse' or 'about the same' for candidate against reference on metric."""
    if candidate is None or reference is None:
        return "not comparable"
    tol = max(metric.abs_tol, REL_TOL * abs(reference))
    if abs(candidate - reference) <= tol:
        return "about the same"
    better = candidate < reference if metric.lower_is_better else candidate > reference
    return "better" if better else "worse"


def fmt(x: float | None, unit: str = "") -> str:
    if x is None:
        return "n/a"
    text = f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"
    if unit == "pt":
        return f"{text} %"
    return f"{text} {unit}" if unit else text


def compare(metric: Metric, name: str, result: dict, ref_name: str, ref: dict) -> str:
    a, b = value(result, metric.key), value(ref, metric.key)
    v = verdict(metric, a, b)
    shown = f"{fmt(a, metric.unit)} vs {fmt(b, metric.unit)}"
    if v == "about the same":
        return f"{name} is about the same as {ref_name} on {metric.label}: {shown}."
    if v == "not comparable":
        return f"{name} and {ref_name} cannot be compared on {metric.label}: {shown}."
    return f"{name} is {v} than {ref_name} on {metric.label}: {shown}."


# -- table ---------------------------------------------------------------------------------

COLUMNS = (
    ("policy", None),
    ("online p50 ms", "online.p50_ms"),
    ("online p95 ms", "online.p95_ms"),
    ("online p99 ms", "online.p99_ms"),
    ("online miss %", "online.miss_pct"),
    ("robot miss %", "robot.miss_pct"),
    ("batch items/s", "batch.items_per_s"),
    ("urgent response ms (max)", "urgent.response_max_ms"),
    ("urgent miss %", "urgent.miss_pct"),
    ("preemptions", "preemptions"),
    ("degradations", "degradations"),
)


def table(doc: dict[str, Any]) -> str:
    head = "| " + " | ".join(c for c, _ in COLUMNS) + " |"
    rule = "|" + "|".join("---" if k is None else "---:" for _, k in COLUMNS) + "|"
    rows = [head, rule]
    for policy in doc["policies"]:
        r = doc["results"][policy]
        cells = [f"`{policy}`"]
        for _, key in COLUMNS[1:]:
            v = value(r, key) if key else None
            if v is None:
                cells.append("n/a")
            elif key in ("preemptions", "degradations"):
                cells.append(f"{v:.0f}")
            else:
                cells.append(f"{v:.2f}")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def per_intent_table(doc: dict[str, Any]) -> str:
    """p99 and miss % of every deadline intent under every policy."""
    names = sorted({i for p in doc["policies"] for i in doc["results"][p]["per_intent"]})
    head = "| policy | " + " | ".join(f"{n} p99 ms / miss %" for n in names) + " |"
    rows = [head, "|---|" + "---:|" * len(names)]
    for policy in doc["policies"]:
        per = doc["results"][policy]["per_intent"]
        cells = [
            f"{per[n]['p99_ms']:.1f} / {per[n]['miss_pct']:.2f}" if n in per else "n/a"
            for n in names
        ]
        rows.append(f"| `{policy}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def prediction_error_table(doc: dict[str, Any]) -> str:
    """Median (90th percentile) |predicted / observed tail - 1| per deadline intent and policy,
    over steady ticks (all ticks where the run has none)."""
    results = doc["results"]
    names = sorted({i for p in doc["policies"] for i in results[p].get("prediction_error", {})})
    rows = ["| policy | " + " | ".join(f"{n} error %" for n in names) + " |"]
    rows.append("|---|" + "---:|" * len(names))
    for policy in doc["policies"]:
        per = results[policy].get("prediction_error", {})
        cells = []
        for n in names:
            e = per.get(n)
            if e is None or e["all_median_pct"] is None:
                cells.append("n/a")
            elif e["steady_median_pct"] is not None:
                cells.append(f"{e['steady_median_pct']:.1f} ({e['steady_p90_pct']:.1f})")
            else:
                cells.append(f"{e['all_median_pct']:.1f} ({e['all_p90_pct']:.1f}) all")
        rows.append(f"| `{policy}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)


# -- figures -------------------------------------------------------------------------------


def _shade_events(ax: Any, doc: dict[str, Any]) -> None:
    for e in doc["scenario"]["events"]:
        if e["kind"] == "disturbance":
            ax.axvspan(e["at_s"], e["at_s"] + e["duration_s"], color="tab:red", alpha=0.12)
        elif e["kind"] == "urgent_start":
            ax.axvline(e["at_s"], color="tab:purple", linestyle="--", linewidth=1)


def figure_bars(doc: dict[str, Any], out: Path) -> Path:
    policies = doc["policies"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, (key, label) in zip(
        axes,
        (
            ("online.p99_ms", "online p99 (ms)"),
            ("online.miss_pct", "online miss %"),
            ("batch.items_per_s", "batch items/s"),
        ),
        strict=True,
    ):
        vals = [value(doc["results"][p], key) or 0.0 for p in policies]
        colors = ["tab:green" if p == "parfusion" else "tab:gray" for p in policies]
        ax.bar(range(len(policies)), vals, color=colors)
        ax.set_xticks(range(len(policies)), policies, rotation=45, ha="right", fontsize=8)
        ax.set_title(label)
    fig.suptitle(f"{doc['experiment']}: modeled, not measured (seed {doc['seed']})")
    fig.tight_layout()
    path = out / f"experiment_{doc['experiment']}_summary.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def figure_timeline(doc: dict[str, Any], out: Path, policies: Sequence[str]) -> Path:
    fig, ax = plt.subplots(figsize=(11, 4))
    for p in policies:
        tl = doc["results"][p]["timeline"]
        p99 = [v if v > 0 else float("nan") for v in tl["online_p99_ms"]]  # no request: gap
        ax.plot(tl["second"], p99, label=p, linewidth=1.2)
    _shade_events(ax, doc)
    ax.set_yscale("log")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("online p99 per second (ms)")
    ax.set_title("online p99 over time (modeled); red: disturbance, dashed: urgent event")
    ax.legend(fontsize=7, ncol=min(5, len(policies)))
    fig.tight_layout()
    path = out / f"experiment_{doc['experiment']}_timeline.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def figure_units(doc: dict[str, Any], out: Path, policy: str) -> Path:
    tl = doc["results"][policy]["timeline"]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 6), sharex=True, height_ratios=(3, 1))
    names = list(tl["units"])
    ax.stackplot(tl["t_s"], *[tl["units"][n] for n in names], labels=names, step="post")
    _shade_events(ax, doc)
    ax.set_ylabel("worker units")
    ax.set_title(f"{policy}: units per intent and degradation level (modeled)")
    ax.legend(fontsize=7, loc="upper left", ncol=3)
    degraded = [n for n in names if any(tl["level"][n])]
    for k, n in enumerate(degraded):
        offset = 0.06 * (k - (len(degraded) - 1) / 2)  # keep overlapping steps visible
        ax2.step(tl["t_s"], [v + offset for v in tl["level"][n]], where="post", label=n)
    ax2.set_yticks([0, 1, 2], ["NORMAL", "FP16", "INT8"])
    ax2.set_xlabel("simulated time (s)")
    _shade_events(ax2, doc)
    if ax2.get_legend_handles_labels()[0]:
        ax2.legend(fontsize=7)
    fig.tight_layout()
    path = out / f"experiment_{doc['experiment']}_units_{policy}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# -- the report ----------------------------------------------------------------------------


def render(
    doc: dict[str, Any],
    results_dir: Path,
    *,
    title: str,
    findings: Sequence[str],
    sections: Sequence[str] = (),
    timeline_policies: Sequence[str] = (),
    units_policies: Sequence[str] = ("parfusion",),
    json_path: Path | None = None,
) -> Path:
    figures = results_dir / "figures"
    reports = results_dir / "reports"
    figures.mkdir(parents=True, exist_ok=True)
    reports.mkdir(parents=True, exist_ok=True)
    paths = [figure_bars(doc, figures)]
    paths.append(figure_timeline(doc, figures, timeline_policies or doc["policies"]))
    paths.extend(figure_units(doc, figures, p) for p in units_policies if p in doc["results"])
    events = "; ".join(
        f"{e['kind']} at {e['at_s']:.2f} s"
        + (
            f" (cpu {e['cpu_pressure']:.2f}, gpu {e['gpu_pressure']:.2f}, network "
            f"{e['network_pressure']:.2f} for {e['duration_s']:.1f} s)"
            if e["kind"] == "disturbance"
            else f" ({e['intent']} x{e['factor']:g})"
            if e["kind"] in ("load", "drift")
            else ""
        )
        for e in doc["scenario"]["events"]
    )
    lines = [
        f"# {title}",
        "",
        f"> **Modeled, not measured.** {doc['statement']}",
        "",
        "## Setup",
        "",
        f"- seed {doc['seed']}, {doc['seconds']:g} simulated seconds, tick {doc['tick_ms']:g} ms, "
        f"{doc['cpu_units']} worker units, model `{doc['model']['path']}` "
        f"(sha256 `{doc['model']['sha256'][:12]}`)",
        f"- intents: {', '.join(doc['scenario']['intents'])}; urgent event intent "
        f"`{doc['scenario']['urgent_intent']}`",
        f"- events: {events}",
        f"- results JSON: `{json_path.name if json_path else 'n/a'}`; every policy faced the "
        "same requests (same seed)",
        "",
        "## Results",
        "",
        table(doc),
        "",
        "Miss % counts requests over their deadline plus requests dropped after waiting "
        "too long; urgent response time is from the event to the first completed urgent "
        "request; preemptions count intents starting to lose units to urgent work; "
        "degradations count steps down the NORMAL -> FP16 -> INT8 ladder.",
        "",
        "Per deadline intent:",
        "",
        per_intent_table(doc),
        "",
        "Prediction error: median (90th percentile) of |predicted / observed p99 - 1| per tick, "
        "over steady ticks (10 s clear of every event), or over all ticks (`all`) where the "
        "run has none:",
        "",
        prediction_error_table(doc),
        "",
        "## Findings (generated from the numbers above)",
        "",
        *[f"- {f}" for f in findings],
        "",
        *sections,
        "## Figures",
        "",
        *[f"![{p.stem}](../figures/{p.name})" for p in paths],
        "",
    ]
    path = reports / f"experiment_{doc['experiment']}.md"
    path.write_text("\n".join(lines))
    return path
