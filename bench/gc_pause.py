"""What pausing the cyclic garbage collector for a tick is worth: one process, ticks alternating.

Even ticks run as the allocator's loop runs them (services/allocator/gcpause.py: the collector
paused for the tick), odd ticks without the pause, so both halves see the same background load
and the same heap. Each tick is timed together with one container allocation right after it,
which is where a collection the pause deferred would run, so deferred work is counted. `--heap`
adds that many long-lived containers, standing in for what a long-running allocator holds (the
store mirror, gRPC, the predictor), which the older generations' passes walk.

    .venv/bin/python bench/gc_pause.py [--sizes 100,10000] [--ticks 40] [--heap 0,300000]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_dmug import make_intents, make_node  # noqa: E402

from services.allocator.gcpause import cyclic_gc_paused  # noqa: E402
from services.core.model import PlanInput  # noqa: E402
from services.core.policies.registry import get_policy  # noqa: E402


class _Probe:
    """Instances are allocated through the collector's hook (lists and dicts come from free
    lists, which skip it), so creating one runs any collection that is due."""


def alternate(state: PlanInput, tick: str, ticks: int) -> tuple[float, float]:
    """Median ms of (paused, not paused) ticks, alternating, `tick` "cold" or "steady"."""
    policy = get_policy("parfusion")
    result = policy.allocate(state)
    current = state
    times: dict[bool, list[float]] = {True: [], False: []}
    for k in range(ticks + 2):  # the first two warm up
        paused = k % 2 == 0
        pause = cyclic_gc_paused if paused else contextlib.nullcontext
        if tick == "steady":
            current = dataclasses.replace(state, previous=result.by_id(), tick=current.tick + 1)
        else:
            policy = get_policy("parfusion")
        t0 = time.perf_counter()
        with pause():
            result = policy.allocate(current)
        _Probe()  # a tracked allocation: a collection the pause deferred runs here
        if k >= 2:
            times[paused].append(time.perf_counter() - t0)
    return statistics.median(times[True]) * 1e3, statistics.median(times[False]) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,10000")
    ap.add_argument("--ticks", type=int, default=40)
    ap.add_argument("--heap", default="0,300000", help="long-lived containers held, per run")
    ns = ap.parse_args(argv)
    sys.stdout.write("| intents | case | tick | heap | paused ms | not paused ms | ratio |\n")
    sys.stdout.write("|---|---|---|---|---|---|---|\n")
    for heap in [int(x) for x in ns.heap.split(",")]:
        ballast = [[i] for i in range(heap)]
        for n in [int(x) for x in ns.sizes.split(",")]:
            intents = make_intents(n, random.Random(7))
            total_min = sum(s.min_units for s in intents)
            for case, units in (("plenty", 2 * total_min), ("scarce", max(total_min // 2, 1))):
                state = PlanInput(intents=intents, node=make_node(units))
                for tick in ("cold", "steady"):
                    on, off = alternate(state, tick, ns.ticks)
                    sys.stdout.write(
                        f"| {n:,} | {case} | {tick} | {heap:,} | {on:.3g} | {off:.3g} "
                        f"| {on / off:.2f}x |\n"
                    )
                    sys.stdout.flush()
        del ballast
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
