"""GPU co-run outputs: the result JSON (results/), a figure (results/figures/) and a Markdown
report (results/reports/). A result marked ``synthetic`` (tests, examples) says so in every
output, so it can never pass for a measurement."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PHASES = ("alone", "baseline", "parfusion")
SYNTHETIC_BANNER = (
    "> **SYNTHETIC RESULT** - made-up numbers for testing the report, not a measurement."
)


def render_markdown(result: dict[str, Any], figure_name: str | None = None) -> str:
    phases = result["phases"]
    rng = result.get("priority_range", {})
    device = result.get("device", {})
    lines = [f"# GPU co-run: online batch-1 vs batch GEMM on GPU {device.get('index', '?')}", ""]
    if result.get("synthetic"):
        lines += [SYNTHETIC_BANNER, ""]
    lines += [
        f"- device: {device.get('name', '?')} (driver {device.get('driver_version', '?')})",
        f"- runtime: {result.get('runtime', '?')}",
        f"- stream priority range: greatest {rng.get('greatest', '?')}, least {rng.get('least', '?')}",
        f"- seconds per phase: {result.get('config', {}).get('phase_seconds', '?')}",
        f"- command: `{result.get('command', '?')}`",
        "",
        "| phase | online p50 ms | p95 ms | p99 ms | requests | online prio | batch TFLOP/s | batch block rows | in flight | batch prio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in PHASES:
        phase = phases[name]
        on = phase["online"]
        batch = phase.get("batch")
        batch_cols = (
            f"{batch['tflops']:.1f} | {batch['block_rows']} | {batch['inflight']} | {batch['stream_priority']}"
            if batch
            else "- | - | - | -"
        )
        lines.append(
            f"| {name} | {on['p50_ms']:.3f} | {on['p95_ms']:.3f} | {on['p99_ms']:.3f} | {on['count']} | "
            f"{on['stream_priority']} | {batch_cols} |"
        )
    r = result["ratios"]
    lines += [
        "",
        f"- online p99, baseline / alone: **{r['p99_baseline_over_alone']:.2f}x**",
        f"- online p99, parfusion / alone: **{r['p99_parfusion_over_alone']:.2f}x**",
        f"- online p99, parfusion / baseline: **{r['p99_parfusion_over_baseline']:.2f}x**",
        f"- batch TFLOP/s, parfusion / baseline: **{r['batch_tflops_parfusion_over_baseline']:.2f}x**",
        "",
        "Stream priority orders pending work only and never preempts a running kernel: the "
        "parfusion phase keeps batch kernels short (row blocks) and throttles how many are in flight.",
    ]
    if figure_name:
        lines += ["", f"![GPU co-run](../figures/{figure_name})"]
    return "\n".join(lines) + "\n"


def render_figure(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = result["phases"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.25
    for k, pct in enumerate(("p50_ms", "p95_ms", "p99_ms")):
        left.bar(
            [i + (k - 1) * width for i in range(len(PHASES))],
            [phases[p]["online"][pct] for p in PHASES],
            width,
            label=pct.replace("_ms", ""),
        )
    left.set_xticks(range(len(PHASES)), PHASES)
    left.set_ylabel("online latency (ms)")
    left.legend()
    with_batch = [p for p in PHASES if phases[p].get("batch")]
    right.bar(with_batch, [phases[p]["batch"]["tflops"] for p in with_batch], color="tab:gray")
    right.set_ylabel("batch GEMM TFLOP/s")
    title = "GPU co-run" + (" (SYNTHETIC)" if result.get("synthetic") else "")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(result: dict[str, Any], results_dir: Path, stamp: str) -> dict[str, Path]:
    base = f"gpu-corun-{stamp}" + ("-synthetic" if result.get("synthetic") else "")
    json_path = results_dir / f"{base}.json"
    figure_path = results_dir / "figures" / f"{base}.png"
    report_path = results_dir / "reports" / f"{base}.md"
    results_dir.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    render_figure(result, figure_path)
    report_path.parent.mkdir(parents=True, exist_ok=True)
    report_path.write_text(render_markdown(result, figure_path.name))
    return {"json": json_path, "figure": figure_path, "report": report_path}
