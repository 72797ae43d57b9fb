"""`parfusion bench cpu-corun`: measure the arena, calibrate, run every phase, write the report.

The measuring budget (--seconds) is split so every online phase collects about the same
number of samples whatever its load; phases run in a seeded random order per repetition.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import platform
import random
import shlex
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from tqdm import tqdm

from experiments.cpu_corun import report, stats
from experiments.cpu_corun.profiles import (
    BATCH_ALONE,
    CO_RUN,
    ONLINE_ALONE,
    PROFILES,
    PhaseSpec,
    Profile,
)
from experiments.cpu_corun.runner import PhaseRun, PhaseRunner
from experiments.cpu_corun.workload import Calibration, Router, calibrate, draft
from services.common.config import build_settings
from services.nodeagent import procfs
from services.nodeagent.backend import BackendOptions
from services.nodeagent.real import RealBackend

SETUP_S_PER_PHASE = 0.4  # apply, schedule and bookkeeping around each phase


def plan_runs(
    profile: Profile, co_run: tuple[PhaseSpec, ...], rng: random.Random
) -> list[list[tuple[PhaseSpec, float | None]]]:
    runs: list[list[tuple[PhaseSpec, float | None]]] = []
    for _ in range(profile.repetitions):
        rep: list[tuple[PhaseSpec, float | None]] = [(BATCH_ALONE, None)]
        rep += [(p, load) for load in profile.loads for p in (ONLINE_ALONE, *co_run)]
        rng.shuffle(rep)
        runs.append(rep)
    return runs


def measure_seconds(
    profile: Profile, runs: list[list[tuple[PhaseSpec, float | None]]], budget: float
) -> dict[float | None, float]:
    """Window per load so each online phase gets ~the same samples: seconds proportional to 1/load."""
    n_runs = sum(len(r) for r in runs)
    usable = max(budget - n_runs * (profile.warmup_s + SETUP_S_PER_PHASE), 0.4 * n_runs)
    mean_inv = sum(1 / x for x in profile.loads) / len(profile.loads)
    weight = sum(1 / load if load else mean_inv for rep in runs for _, load in rep)
    k = usable / weight
    out: dict[float | None, float] = {load: max(0.4, k / load) for load in profile.loads}
    out[None] = max(0.4, k * mean_inv)
    return out


def command_line(ns: argparse.Namespace) -> str:
    """The invocation, rebuilt from the parsed options (whoever called it: CLI, script, test)."""
    args = ["parfusion", "bench", "cpu-corun"]
    for name in (
        "seconds",
        "profile",
        "loads",
        "repetitions",
        "phases",
        "warmup",
        "seed",
        "arena_cores",
    ):
        value = getattr(ns, name, None)
        if value is not None:
            args += [f"--{name.replace('_', '-')}", str(value)]
    if getattr(ns, "quiet", False):
        args.append("--quiet")
    return shlex.join(args)


def conditions() -> dict[str, Any]:
    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
    except OSError:
        autogroup = "n/a"
    return {
        "cpu_model": model,
        "cpu_count": psutil.cpu_count(),
        "kernel": platform.release(),
        "autogroup": autogroup,
        "load_before": [round(x, 2) for x in os.getloadavg()],
    }


def run_undisturbed(
    run: Callable[[], PhaseRun], cal: Calibration
) -> tuple[PhaseRun, dict[str, Any]]:
    """Run a phase; while other processes disturbed it (stats.disturbance), run it again, at most
    stats.MAX_RERUNS times, and keep the least disturbed attempt. Its row says how many attempts
    it took and, if every attempt was disturbed, why (``disturbed``)."""
    best: tuple[PhaseRun, dict[str, Any]] | None = None
    for attempt in range(1 + stats.MAX_RERUNS):
        result = run()
        row = stats.summarize(result, cal)
        row["disturbed"] = stats.disturbance(row, cal)
        row["attempts"] = attempt + 1
        if row["disturbed"] is None:
            return result, row
        if best is None or row["foreign_cores"] < best[1]["foreign_cores"]:
            best = (result, row)
        best[1]["attempts"] = attempt + 1
    assert best is not None
    return best


def run(ns: argparse.Namespace) -> int:
    profile = PROFILES[ns.profile]
    if ns.loads:
        profile = dataclasses.replace(profile, loads=tuple(float(x) for x in ns.loads.split(",")))
    if ns.warmup is not None:
        profile = dataclasses.replace(profile, warmup_s=max(0.0, ns.warmup))
    if ns.repetitions:
        profile = dataclasses.replace(profile, repetitions=max(1, ns.repetitions))
    co_run = CO_RUN
    if ns.phases:
        wanted = {x.strip() for x in ns.phases.split(",")}
        unknown = wanted - {p.name for p in CO_RUN}
        if unknown:
            print(f"unknown phases: {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        co_run = tuple(p for p in CO_RUN if p.name in wanted | {"baseline", "nice19"})
    budget = float(ns.seconds) if ns.seconds else profile.default_seconds
    settings = build_settings("nodeagent")
    allocator = build_settings("allocator")
    settings.ensure_dirs()
    options = BackendOptions.from_settings(settings)
    k = options.arena_cores if ns.arena_cores is None else ns.arena_cores
    cond = conditions()
    started = datetime.now(UTC)
    wall0 = time.monotonic()
    arena = procfs.most_idle_cores(k, sample_s=1.0)
    needed = 2 * len(arena) + 1
    if options.max_workers < needed:
        print(
            f"nodeagent.max_workers = {options.max_workers} < {needed} (online + batch pools on {len(arena)} cores + urgent)",
            file=sys.stderr,
        )
        return 2
    backend = RealBackend(
        options, arena=arena, generate_arrivals=False, pace_batch=False, urgent_preempts_batch=False
    )
    try:
        router = Router.attach(backend, draft(arena))
        print(f"calibrating on arena {list(arena)} ...", file=sys.stderr)
        cal = calibrate(backend, arena, router)
        rng = random.Random(ns.seed)
        runs = plan_runs(profile, co_run, rng)
        windows = measure_seconds(profile, runs, budget)
        runner = PhaseRunner(
            backend, router, cal, profile, tick_s=allocator.get_int("tick_ms", 250) / 1000.0
        )
        results = []
        total = sum(len(r) for r in runs)
        bar = tqdm(total=total, desc="cpu-corun", unit="phase", disable=ns.quiet, file=sys.stderr)
        for rep, order in enumerate(runs):
            for i, (phase, load) in enumerate(order):
                bar.set_postfix_str(
                    f"rep {rep} {phase.name} {'' if load is None else f'{int(load * 100)}%'}"
                )
                seed = ns.seed * 1000 + rep * 10 + int((load or 0) * 100)
                phase_run = functools.partial(runner.run, phase, load, rep, i, windows[load], seed)
                results.append(run_undisturbed(phase_run, cal))
                bar.update(1)
        bar.close()
    finally:
        backend.stop()
    cond["load_after"] = [round(x, 2) for x in os.getloadavg()]
    rows = stats.with_ratios([row for _, row in results], cal)
    suspects = stats.suspect_references(rows)
    cond["mean_host_cpu_percent"] = sum(r["host_cpu_percent"] for r in rows) / max(1, len(rows))
    cond["mean_foreign_cores"] = sum(r["foreign_cores"] for r in rows) / max(1, len(rows))
    cond["max_foreign_cores"] = max((r["foreign_cores"] for r in rows), default=0.0)
    agg = stats.aggregate(rows)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    doc: dict[str, Any] = {
        "benchmark": "cpu-corun",
        "started_at": started.isoformat(timespec="seconds"),
        "command": command_line(ns),
        "seconds": budget,
        "wall_s": time.monotonic() - wall0,
        "profile": dataclasses.asdict(profile),
        "windows_s": {str(k): v for k, v in windows.items()},
        "conditions": cond,
        "calibration": dataclasses.asdict(cal),
        "order": [
            [f"{p.name}{'' if load is None else f'@{int(load * 100)}%'}" for p, load in rep]
            for rep in runs
        ],
        "phases": rows,
        "aggregate": agg,
        "sanity_gate": stats.sanity_gate(agg, profile.loads, rows, suspects),
        "targets": stats.targets(rows, cal, profile.loads),
        "raw": [
            {
                "phase": r.phase,
                "load": r.load,
                "repetition": r.repetition,
                "online_latency_ms": [round(x, 3) for x in r.online_latency_ms],
                "urgent_start_ms": [round(x, 3) for x in r.urgent_start_ms],
                "plan_trace": r.plan_trace,
            }
            for r, _ in results
        ],
    }
    results_dir = settings.results_dir
    json_path = report.write_json(doc, results_dir / f"cpu-corun-{stamp}.json")
    figs = report.figures(doc, results_dir / "figures", f"cpu-corun-{stamp}")
    md_path = results_dir / "reports" / f"cpu-corun-{stamp}.md"
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(report.markdown(doc, figs, md_path))
    gate = doc["sanity_gate"]
    print(f"report: {md_path}\njson:   {json_path}\nsanity gate: {gate['verdict']}")
    return 0
