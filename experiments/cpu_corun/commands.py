"""Node agent commands: `parfusion bench cpu-corun` (the real CPU co-run benchmark)."""

from __future__ import annotations

import argparse
from typing import Any


def _configure(parser: argparse.ArgumentParser) -> None:
    from experiments.cpu_corun.profiles import configure  # light: no numpy/matplotlib at parse time

    configure(parser)


def _run(ns: argparse.Namespace) -> int:
    from experiments.cpu_corun import cli

    return cli.run(ns)


def register(commands: Any) -> None:
    commands.command(
        ("bench", "cpu-corun"),
        "real CPU co-run: online, batch and urgent pools on the arena cores under each policy",
        _configure,
        _run,
    )
