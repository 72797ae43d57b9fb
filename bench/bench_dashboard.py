"""The dashboard with N stored intents: what a browser gets and what the dashboard keeps.

Starts the allocator, node agent, gpulane and dashboard as the launcher starts them (every port
moved to a free one, a temporary PARFUSION_HOME removed after), stores N intents of mixed
classes (bench_loop's mix) through SubmitIntent, waits for them in the plan, then for a fixed
time reads, every few seconds, the page and each panel the page polls as a browser would
(`/` and `/partials/<panel>`): bytes and response time per request, and the dashboard's CPU and
RSS. Reported per size: median and worst response time and the largest body per URL, the CPU
(% of one core) of the dashboard, the allocator and the node agent over the window, and the
dashboard's RSS at the start, the peak and the end.

    .venv/bin/python bench/bench_dashboard.py --intents 0,1000,10000 --seconds 60
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from bench.bench_loop import make_intent  # noqa: E402
from bench.bench_system import (  # noqa: E402
    bench_stack,
    processes,
    run_sizes,
    size_arguments,
    submit_all,
    wait_for_plan,
)
from parfusion.v1 import allocator_pb2_grpc  # noqa: E402

SERVICES = ("allocator", "nodeagent", "gpulane", "dashboard")
PATHS = (
    "/",
    "/partials/cockpit",
    "/partials/latency",
    "/partials/allocator",
    "/partials/intents",
    "/partials/gpu",
    "/partials/node",
    "/partials/events",
)


def fetch(url: str) -> tuple[float, int]:
    """(seconds, bytes) of one GET, read to the end."""
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as reply:
        size = len(reply.read())
    return time.perf_counter() - started, size


def run_case(n: int, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(7)
    intents = [make_intent(k, rng) for k in range(n)]
    with bench_stack(SERVICES, n + 100) as (stack, home):
        return measure(stack, home, intents, args)


def measure(stack: Any, home: Path, intents: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    procs = processes(home)
    dashboard = procs["dashboard"]
    base = stack.address("dashboard")
    with grpc.insecure_channel(stack.address("allocator")) as channel:
        stub = allocator_pb2_grpc.AllocatorServiceStub(channel)
        submit_all(stub, intents)
        wait_for_plan(stub, len(intents))
    time.sleep(args.settle)  # a few dashboard polls of the full store
    rss_start = dashboard.memory_info().rss / 2**20
    peak = rss_start
    cpu0 = {name: p.cpu_times() for name, p in procs.items()}
    timings: dict[str, list[float]] = {p: [] for p in PATHS}
    sizes: dict[str, int] = {p: 0 for p in PATHS}
    started = time.perf_counter()
    while time.perf_counter() - started < args.seconds:
        for path in PATHS:
            seconds, size = fetch(base + path)
            timings[path].append(seconds * 1000.0)
            sizes[path] = max(sizes[path], size)
        peak = max(peak, dashboard.memory_info().rss / 2**20)
        time.sleep(args.every)
    window = time.perf_counter() - started
    cpu1 = {name: p.cpu_times() for name, p in procs.items()}
    rss_end = dashboard.memory_info().rss / 2**20
    return {
        "intents": len(intents),
        "window_s": round(window, 1),
        "requests": {
            p: {
                "median_ms": statistics.median(timings[p]),
                "max_ms": max(timings[p]),
                "max_bytes": sizes[p],
            }
            for p in PATHS
        },
        "cpu_percent": {
            name: 100.0
            * ((cpu1[name].user + cpu1[name].system) - (cpu0[name].user + cpu0[name].system))
            / window
            for name in procs
        },
        "rss_mb": {"start": rss_start, "peak": peak, "end": rss_end},
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| intents | URL | median / worst ms | largest body |",
        "|---|---|---|---|",
    ]
    for r in rows:
        for path, q in r["requests"].items():
            lines.append(
                f"| {r['intents']:,} | `{path}` | {q['median_ms']:.0f} / {q['max_ms']:.0f} "
                f"| {q['max_bytes']:,} |"
            )
    lines += [
        "",
        "| intents | CPU % dashboard / allocator / node agent | dashboard RSS MB: start, peak, end |",
        "|---|---|---|",
    ]
    for r in rows:
        rss, cpu = r["rss_mb"], r["cpu_percent"]
        lines.append(
            f"| {r['intents']:,} | {cpu['dashboard']:.0f} / {cpu['allocator']:.0f} "
            f"/ {cpu['nodeagent']:.0f} | {rss['start']:.0f}, {rss['peak']:.0f}, {rss['end']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    size_arguments(parser, seconds=60.0, settle=5.0, window="reading window")
    parser.add_argument("--every", type=float, default=2.0, help="seconds between page reads")
    run_sizes(parser.parse_args(), run_case, table)


if __name__ == "__main__":
    main()
