"""`parfusion experiment compare|dynamic|ablation|stability --seconds N [--seed S]`: the headless
suite."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

EXPERIMENTS = {
    "compare": "baseline vs parfusion on the modeled node",
    "dynamic": "urgent robot event + CPU/GPU/network disturbance; how the controller reacted",
    "ablation": "baseline, static, edf-only, no-crosslayer, no-gpuintent, no-predictor, "
    "no-elastic, no-degrade, no-preemption and parfusion",
    "stability": "make run's intents under parfusion, steady and with the guided demo's "
    "disturbance: flaps, prediction error, deadlines held (default --seconds 300)",
}


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="simulated seconds (default 60)"
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    parser.add_argument(
        "--out", type=Path, help="results directory (default the project's results/)"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _runner(name: str) -> Any:
    def run(ns: argparse.Namespace) -> int:
        import importlib

        from experiments.suite import default_results_dir

        if not 1.0 <= ns.seconds <= 3600.0:
            print("--seconds: expected 1..3600", file=sys.stderr)
            return 2
        module = importlib.import_module(f"experiments.{name}")
        out = ns.out or default_results_dir()
        json_path, md = module.run(ns.seconds, ns.seed, out, progress=not ns.no_progress)
        print(f"results: {json_path}")
        print(f"report:  {md}")
        print("(latencies are modeled, not measured)")
        return 0

    return run


def register(commands: Any) -> None:
    for name, help_text in EXPERIMENTS.items():
        commands.command(("experiment", name), help_text, _configure, _runner(name))
