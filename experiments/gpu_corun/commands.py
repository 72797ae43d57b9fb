"""`parfusion` subcommands of the GPU side: `parfusion bench gpu-corun --seconds N`."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from services.common.config import build_settings


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seconds", type=float, default=30.0, help="total run time, split over the three phases"
    )
    parser.add_argument(
        "--gpus",
        default="6,7",
        help="candidate GPU indexes (default 6,7; every present GPU when none of them exists)",
    )


def _run(ns: argparse.Namespace) -> int:
    from experiments.gpu_corun.run import run_gpu_corun

    try:
        candidates = tuple(int(i) for i in str(ns.gpus).split(",") if i.strip())
    except ValueError:
        sys.stderr.write(f"--gpus: expected comma-separated GPU indexes, got {ns.gpus!r}\n")
        return 2
    settings = build_settings("gpulane")
    code, message, paths = run_gpu_corun(ns.seconds, settings.results_dir, candidates=candidates)
    stream = sys.stdout if code == 0 else sys.stderr
    stream.write(("" if code == 0 else "refused: ") + message + "\n")
    for kind, path in paths.items():
        stream.write(f"{kind}: {path}\n")
    return code


def register(commands: Any) -> None:
    commands.command(
        ("bench", "gpu-corun"),
        "GPU co-run: online batch-1 (high-priority stream) vs batch GEMM (low priority, throttled) on an idle GPU",
        _configure,
        _run,
    )
