"""`parfusion sim k8s`: the cluster-scale scheduler simulation, written as JSON and Markdown."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=int, default=500, help="cluster size (default 500)")
    p.add_argument("--pods", type=int, default=1000, help="pods in the trace (default 1000)")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", help="output folder (default results/k8s-sim under the project)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _run(ns: argparse.Namespace) -> int:
    from services.common.config import build_settings

    from .simulator import markdown, simulate

    if ns.nodes < 1 or ns.pods < 1:
        sys.stderr.write("--nodes and --pods must be at least 1\n")
        return 2
    out = Path(ns.out) if ns.out else build_settings("extender").results_dir / "k8s-sim"
    out.mkdir(parents=True, exist_ok=True)
    report = simulate(ns.nodes, ns.pods, ns.seed, progress=not ns.no_progress)
    stem = out / f"sim_k8s_{ns.nodes}n_{ns.pods}p_seed{ns.seed}"
    stem.with_suffix(".json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    text = markdown(report)
    stem.with_suffix(".md").write_text(text)
    sys.stdout.write(text + f"\nwrote {stem}.json and {stem}.md\n")
    return 0


def register(commands: Any) -> None:
    commands.command(
        ("sim", "k8s"),
        "replay a seeded pod trace onto N nodes: kube-scheduler default vs default + the extender (modeled)",
        _configure,
        _run,
    )
