"""What an empty gRPC call costs beside the control loop: in the ticking interpreter or beside it.

The same tick work runs in both cases: a real ControlLoop over a real IntentStore holding N
intents (bench_loop.py's mix), ticking every 250 ms, each tick after 25 submits, 25 deletes (the
store stays at N) and new service-time samples for 200 intents. A client in a process of its own
calls grpc.health's Check at a fixed rate and times every call:

- `idle`: a health-only server, nothing ticking (the harness's own floor);
- `inside`: the health service served by the ticking process, on a grpc.aio server in a thread
  of its own, as the allocator serves beside its loop thread (one interpreter lock);
- `beside`: a health-only server process next to the ticking process (the same CPU work on
  the same cores, another interpreter).

The difference between `inside` and `beside` is what sharing the interpreter with the tick
costs a call; between `beside` and `idle`, what the tick's CPU costs it. Variants alternate, a
round each. Each row also gives the ticking process's CPU (% of one core) over the window.

    .venv/bin/python bench/bench_interpreter.py [--intents 10000] [--seconds 30] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import psutil  # noqa: E402
from grpc_health.v1 import health, health_pb2, health_pb2_grpc  # noqa: E402

from bench.bench_system import quantile  # noqa: E402

CHURN = 25  # submits and deletes before each tick: bench_system's 100 SubmitIntent/s
SAMPLED = 200  # intents with a new service-time sample before each tick
TICK_S = 0.25
VARIANTS = ("idle", "inside", "beside")


def serve_health() -> int:
    """grpc.health on a grpc.aio server in a thread of its own; returns the bound port."""
    bound: list[int] = []
    ready = threading.Event()

    async def run() -> None:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        bound.append(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        ready.set()
        await server.wait_for_termination()

    threading.Thread(target=lambda: asyncio.run(run()), name="health", daemon=True).start()
    ready.wait(10)
    return bound[0]


def tick_forever(n: int, serve: bool) -> None:
    """The ticking process: prints `ready PORT` (0 when it serves nothing), then ticks."""
    from bench.bench_loop import make_intent
    from services.allocator.loop import ControlLoop, LoopConfig
    from services.allocator.server import tune_interpreter
    from services.allocator.store import IntentStore

    tune_interpreter()  # as the allocator's main() does
    rng = random.Random(7)
    with tempfile.TemporaryDirectory(prefix="parfusion-bench-interpreter-") as tmp:
        store = IntentStore(Path(tmp) / "allocator.db", max_intents=n + CHURN)
        intents = [make_intent(k, rng) for k in range(n)]
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            list(pool.map(store.submit, intents))
        loop = ControlLoop(store, LoopConfig(cpu_units=max(64, n // 4)))
        loop.tick()
        port = serve_health() if serve else 0
        print(f"ready {port}", flush=True)
        made, due = n, time.monotonic()
        while True:
            fresh = [make_intent(made + k, rng) for k in range(CHURN)]
            made += CHURN
            for intent in fresh:
                store.submit(intent)
            for intent in intents[:CHURN]:
                store.delete(intent.id)
            intents = intents[CHURN:] + fresh
            for intent in rng.sample(intents, min(SAMPLED, len(intents))):
                base = intent.speedup.base_service_ms
                loop.predictor.observe_many(intent.id, [base * rng.uniform(0.8, 1.3)], units=2)
            loop.tick()
            due += TICK_S
            time.sleep(max(0.0, due - time.monotonic()))


def call_forever(port: int, rate: float, seconds: float) -> None:
    """The client: Check at `rate` per second for `seconds`; prints the latencies as JSON."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
        latencies: list[float] = []
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            time.sleep(max(0.0, start + len(latencies) / rate - time.monotonic()))
            began = time.perf_counter()
            stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
            latencies.append((time.perf_counter() - began) * 1e3)
    print(json.dumps(latencies))


def spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, *args], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )


def ready_port(process: subprocess.Popen[str]) -> int:
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("ready "):
        raise RuntimeError(f"{process.args}: exited {process.wait()} before it was ready")
    return int(line.split()[1])


def run_variant(variant: str, args: argparse.Namespace) -> str:
    started: list[subprocess.Popen[str]] = []
    try:
        ticker = None
        if variant != "idle":
            serve = ("--serve",) if variant == "inside" else ()
            ticker = spawn("--role", "ticker", "--intents", str(args.intents), *serve)
            started.append(ticker)
            port = ready_port(ticker)
        if variant != "inside":
            server = spawn("--role", "server")
            started.append(server)
            port = ready_port(server)
        time.sleep(args.settle)
        load = os.getloadavg()[0]
        watched = psutil.Process(ticker.pid) if ticker is not None else None
        cpu_before = sum(watched.cpu_times()[:2]) if watched else 0.0
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, __file__, "--role", "client", "--port", str(port),
             "--rate", str(args.rate), "--seconds", str(args.seconds)],
            cwd=ROOT, capture_output=True, text=True, check=True,
        )  # fmt: skip
        window = time.monotonic() - began
        cpu = (sum(watched.cpu_times()[:2]) - cpu_before) / window * 100 if watched else 0.0
    finally:
        for process in started:
            process.kill()
            process.wait()
    latencies = sorted(json.loads(done.stdout))
    return (
        f"| {variant} | {args.intents if ticker else 0:,} | {len(latencies)} | "
        f"{quantile(latencies, 0.5):.2f} | {quantile(latencies, 0.99):.2f} | "
        f"{latencies[-1]:.2f} | {cpu:.0f} | {load:.2f} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intents", type=int, default=10000)
    parser.add_argument("--seconds", type=float, default=30.0, help="calls timed per variant")
    parser.add_argument("--rate", type=float, default=100.0, help="calls per second")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds ticking before")
    parser.add_argument("--role", choices=("ticker", "server", "client"), help=argparse.SUPPRESS)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "ticker":
        tick_forever(args.intents, args.serve)
    elif args.role == "server":
        print(f"ready {serve_health()}", flush=True)
        threading.Event().wait()
    elif args.role == "client":
        call_forever(args.port, args.rate, args.seconds)
    else:
        print("| variant | intents | calls | p50 ms | p99 ms | max ms | ticker CPU % | load |")
        print("|---|---|---|---|---|---|---|---|")
        for _ in range(args.rounds):
            for variant in VARIANTS:
                print(run_variant(variant, args), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
