"""Reading what bench_kube_scheduler.py measured: CPU time from /proc, quantiles from
Prometheus histograms scraped before and after a phase, and the report (table, A/B ratios)."""

from __future__ import annotations

import os
import re
import statistics
from pathlib import Path
from typing import Any


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def histogram(text: str, name: str, match: str = "") -> dict[float, float]:
    """Cumulative bucket counts (le -> count) of one histogram, summed over matching series."""
    out: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket{{") and match in line:
            le = re.search(r'[{,]le="([^"]+)"', line).group(1)  # type: ignore[union-attr]
            bound = float("inf") if le == "+Inf" else float(le)
            out[bound] = out.get(bound, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def counter(text: str, name: str, match: str = "") -> float:
    """A counter's value summed over matching series (0 when absent)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and match in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The q-quantile (seconds) of what a histogram observed between two scrapes, linearly
    interpolated within the bucket (Prometheus' histogram_quantile)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if bound == float("inf"):
                return lower
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, count
    return lower


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| mode | qps | phase | round | pods/s | nodes used | sched algorithm p50 / p99 ms "
        "| filter calls | binds refused | filter p50 / p99 ms | prioritize p50 / p99 ms "
        "| CPU ms/pod sched / apiserver / etcd / extender |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ext = r.get("extender_ms") or {}
        cpu = r["cpu_ms_per_pod"]

        def pair(d: dict[str, Any] | None) -> str:
            return f"{d['p50']} / {d['p99']}" if d else "–"

        lines.append(
            f"| {r['mode']} | {r['qps']} | {r['phase']} | {r['round']} | {r['pods_per_s']} "
            f"| {r['nodes_used']} | {pair(r['scheduler_algorithm_ms'])} "
            f"| {ext.get('filter', {}).get('calls', '–')} | {r.get('binds_refused', '–')} "
            f"| {pair(ext.get('filter'))} "
            f"| {pair(ext.get('prioritize'))} | {cpu.get('kube-scheduler')} / "
            f"{cpu.get('kube-apiserver')} / {cpu.get('etcd')} / {cpu.get('extender', '–')} |"
        )
    return "\n".join(lines)


def ratios(rows: list[dict[str, Any]], arms: tuple[str, ...] = ("A", "B", "C")) -> dict[str, float]:
    """Median pods/s of each extender arm over A's, per mode and qps."""
    out = {}
    for mode in sorted({(r["mode"], r["qps"]) for r in rows}):

        def rates(arm: str, mode: tuple[str, str] = mode) -> list[float]:
            return [
                r["pods_per_s"] for r in rows if (r["mode"], r["qps"]) == mode and r["phase"] == arm
            ]

        a = rates("A")
        for arm in arms[1:]:
            if a and rates(arm):
                key = f"{mode[0]}/{mode[1]}/{arm}"
                out[key] = round(statistics.median(rates(arm)) / statistics.median(a), 2)
    return out
