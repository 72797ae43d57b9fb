"""D-MUG tick time of this checkout against another one, interleaved (a shared, noisy machine).

Each round runs, per size, one short process for the other checkout and one for this one, in
turn, so that a burst of background load hits both alike. A process times the `parfusion`
policy's allocate() on the synthetic intents of the measured checkout's bench/bench_dmug.py
(the generator has not changed since it was written), cold and steady, plenty and scarce. The
table gives, per cell, the median over rounds of each process's median, the best single tick
in brackets, and the ratio of the medians (this / other), then the same for the CPU time the
process spent in the tick (less disturbed by other processes than the wall clock).

    .venv/bin/python bench/compare_dmug.py OTHER_CHECKOUT [--rounds 5] [--sizes 10,100,1000,10000]

OTHER_CHECKOUT is a directory holding another version of the code, e.g. from
`git worktree add /tmp/before <commit>`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve()
THIS = HERE.parents[1]


def measure(checkout: str, n: int, ticks: int) -> dict[str, tuple[float, float, float]]:
    """In a child process: median and best allocate() wall ms and median CPU ms per (case, tick)
    for `checkout`'s code."""
    import gc
    import random
    import time

    # the measured checkout's bench_dmug.py puts that checkout first on sys.path as it imports
    sys.path.insert(0, str(Path(checkout) / "bench"))
    import importlib

    from bench_dmug import Ticks, make_intents, make_node

    # the core's package: services/core since the core became a package, services/allocator before
    core = (
        "services.core" if (Path(checkout) / "services" / "core").is_dir() else "services.allocator"
    )
    PlanInput = importlib.import_module(f"{core}.model").PlanInput
    get_policy = importlib.import_module(f"{core}.policies.registry").get_policy

    assert Path(sys.modules["services"].__file__ or "").is_relative_to(checkout), checkout

    intents = make_intents(n, random.Random(7))
    total_min = sum(s.min_units for s in intents)
    out = {}
    for case, units in (("plenty", 2 * total_min), ("scarce", max(total_min // 2, 1))):
        first = PlanInput(intents=intents, node=make_node(units))
        for tick in ("cold", "steady"):
            loop = Ticks(get_policy("parfusion"), first)
            times, cpu = [], []
            for _ in range(ticks + 2):  # the first two warm up
                # timed with the cyclic collector paused, as the allocator's loop runs a tick
                # (older checkouts pause it inside allocate(): then the two pauses nest)
                if tick == "cold":
                    gc.disable()
                    c0, t0 = time.process_time(), time.perf_counter()
                    get_policy("parfusion").allocate(first)
                else:
                    loop.prepare()
                    gc.disable()
                    c0, t0 = time.process_time(), time.perf_counter()
                    loop.run()
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
                gc.enable()
            times, cpu = times[2:], cpu[2:]
            out[f"{n} {case} {tick}"] = (
                statistics.median(times) * 1e3,
                min(times) * 1e3,
                statistics.median(cpu) * 1e3,
            )
    return out


def _fmt(ms: float) -> str:
    return f"{ms:.2f}" if ms < 10 else f"{ms:.1f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("other", help="the other checkout's root directory")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="10,100,1000,10000")
    ap.add_argument("--worker", nargs=3, metavar=("CHECKOUT", "N", "TICKS"), help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    if ns.worker:
        checkout, n, ticks = ns.worker
        print(json.dumps(measure(checkout, int(n), int(ticks))))
        return 0
    other = str(Path(ns.other).resolve())
    if not any(
        (Path(other) / "services" / pkg / "dmug.py").is_file() for pkg in ("core", "allocator")
    ):
        ap.error(f"{other} does not hold a PARFusion checkout (no services/core/dmug.py)")
    sizes = [int(x) for x in ns.sizes.split(",")]
    runs: dict[str, dict[str, list[tuple[float, ...]]]] = defaultdict(lambda: defaultdict(list))
    for r in range(ns.rounds):
        for n in sizes:
            ticks = 200 if n <= 100 else max(20_000 // n, 9)
            for who, checkout in (("other", other), ("this", str(THIS))):
                sys.stderr.write(f"\rround {r + 1}/{ns.rounds}: {n} intents, {who} checkout   ")
                done = subprocess.run(
                    [sys.executable, str(HERE), other, "--worker", checkout, str(n), str(ticks)],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                for cell, value in json.loads(done.stdout).items():
                    runs[cell][who].append(tuple(value))
    sys.stderr.write("\n")
    name = Path(other).name
    print(
        f"| intents | case | tick | {name}: ms (best) | this: ms (best) | this / other "
        f"| {name}: CPU ms | this: CPU ms | CPU this / other |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for cell, by in runs.items():
        n, case, tick = cell.split()
        med = {who: statistics.median(m[0] for m in by[who]) for who in ("other", "this")}
        best = {who: min(m[1] for m in by[who]) for who in ("other", "this")}
        cpu = {who: statistics.median(m[2] for m in by[who]) for who in ("other", "this")}
        print(
            f"| {int(n):,} | {case} | {tick} | {_fmt(med['other'])} ({_fmt(best['other'])}) | "
            f"{_fmt(med['this'])} ({_fmt(best['this'])}) | {med['this'] / med['other']:.2f}x | "
            f"{_fmt(cpu['other'])} | {_fmt(cpu['this'])} | {cpu['this'] / cpu['other']:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
