"""SubmitIntent throughput and p99 beside an empty unary RPC, measured by the same harness.

The allocator runs in a child process (its own interpreter, so client and server do not share
a GIL) with two trivial methods registered on the same server, behind the same interceptor:
``parfusion.bench.Empty/Ping``, a coroutine like SubmitIntent (the least an RPC costs on this
server, and what the ratio is taken against), and ``Empty/PingInPool``, a plain method, which
the server runs in its thread pool as it runs most of the services' methods. The same client
(one channel, N threads of blocking calls) drives each method for the same time at the same
concurrency. SubmitIntent goes through validation and the durable, group-committed SQLite
store: a reply means the intent is committed.

    .venv/bin/python bench/bench_submit.py                  # 16 concurrent callers, 5 s each
    .venv/bin/python bench/bench_submit.py --synchronous full --concurrency 32 --seconds 10

The control loop is not started in the server (``--with-loop`` starts it): with tens of
thousands of intents piling up, its ticks would measure D-MUG rather than the submit path.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from parfusion.v1 import allocator_pb2, intent_pb2  # noqa: E402

EMPTY_METHOD = "/parfusion.bench.Empty/Ping"
EMPTY_IN_POOL_METHOD = "/parfusion.bench.Empty/PingInPool"


def serve(port: int, synchronous: str, with_loop: bool, max_intents: int) -> None:
    from services.allocator.server import build_allocator
    from services.common.config import build_settings
    from services.common.grpc_server import start_grpc_server

    settings = build_settings(
        "allocator",
        overrides={
            "port": port,
            "seed_intents": False,
            "nodeagent_address": "",
            "gpulane_address": "",
            "db_synchronous": synchronous,
            # room for every request the harness built: a submit refused at the store's limit
            # would be a fast error counted in the rate
            "max_intents": max_intents,
        },
    )
    registrations, hooks, handle = build_allocator(settings, start_loop=with_loop)

    async def ping(request: bytes, context: object) -> bytes:
        return b""

    def ping_in_pool(request: bytes, context: object) -> bytes:
        return b""

    def add_empty(_servicer: object, server: grpc.aio.Server) -> None:
        handlers = {
            "Ping": grpc.unary_unary_rpc_method_handler(ping),
            "PingInPool": grpc.unary_unary_rpc_method_handler(ping_in_pool),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("parfusion.bench.Empty", handlers),)
        )

    registrations.append((add_empty, None, "parfusion.bench.Empty"))
    running = start_grpc_server(registrations, port=port)
    for hook in hooks:
        running.on_stop(hook)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    sys.stdout.write(f"ready {running.port} {handle.store.path}\n")
    sys.stdout.flush()
    done.wait()
    sys.stderr.write(
        f"group commit: {handle.store.committed_ops} ops in {handle.store.commits} transactions\n"
    )
    running.stop(0.5)


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux), in seconds."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Round:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    elapsed_s: float = 0.0
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0

    def add(self, other: Round) -> None:
        self.latencies += other.latencies
        self.errors += other.errors
        self.elapsed_s += other.elapsed_s
        self.server_cpu_s += other.server_cpu_s
        self.client_cpu_s += other.client_cpu_s

    @property
    def rate_per_s(self) -> float:
        return len(self.latencies) / self.elapsed_s if self.elapsed_s else 0.0

    def summary(self) -> dict[str, float]:
        flat = sorted(self.latencies)
        n = len(flat)

        def pct(p: float) -> float:
            return flat[min(n - 1, int(p / 100 * n))] * 1000 if n else 0.0

        return {
            "calls": n,
            "errors": self.errors,
            "rate_per_s": self.rate_per_s,
            "p50_ms": pct(50),
            "p99_ms": pct(99),
            "server_cpu_us_per_call": self.server_cpu_s / n * 1e6 if n else 0.0,
            "client_cpu_us_per_call": self.client_cpu_s / n * 1e6 if n else 0.0,
        }


def drive(
    call: Any, make_request: Any, seconds: float, concurrency: int, server_pid: int = 0
) -> Round:
    """N threads call back to back for ``seconds``; latencies, errors and CPU of both sides."""
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors = [0] * concurrency
    start_gate = threading.Barrier(concurrency + 1)
    stop_at = [0.0]

    def worker(k: int) -> None:
        own = latencies[k]
        counter = 0
        start_gate.wait()
        while True:
            t0 = time.perf_counter()
            if t0 >= stop_at[0]:
                return
            try:
                call(make_request(k, counter), timeout=10)
            except grpc.RpcError:
                errors[k] += 1
            own.append(time.perf_counter() - t0)
            counter += 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    server_cpu0, client_cpu0 = cpu_seconds(server_pid), time.process_time()
    begin = time.perf_counter()
    stop_at[0] = begin + seconds
    start_gate.wait()
    for t in threads:
        t.join()
    return Round(
        latencies=[x for own in latencies for x in own],
        errors=sum(errors),
        elapsed_s=time.perf_counter() - begin,
        server_cpu_s=cpu_seconds(server_pid) - server_cpu0,
        client_cpu_s=time.process_time() - client_cpu0,
    )


def submit_requests(run: str, concurrency: int, per_worker: int) -> object:
    """Requests built before the clock starts, so the client's own proto building is not timed
    (the empty RPC has nothing to build either); every one carries a fresh client-chosen id."""
    prebuilt = [
        [
            allocator_pb2.SubmitIntentRequest(
                intent=intent_pb2.ResourceIntent(
                    id=f"bench-{run}-{k}-{i}",
                    name=f"bench-{k}-{i}",
                    workload_class=intent_pb2.WORKLOAD_CLASS_ONLINE,
                    slo=intent_pb2.Slo(deadline_ms=50),
                    parallelism=intent_pb2.Parallelism(min=1, max=4),
                    speedup=intent_pb2.Speedup(parallel_fraction=0.9, base_service_ms=10),
                    demand=intent_pb2.Demand(arrival_rate_per_s=20),
                )
            )
            for i in range(per_worker)
        ]
        for k in range(concurrency)
    ]

    used = [0] * concurrency  # per caller, across rounds: every id is submitted once

    def make(k: int, _i: int) -> allocator_pb2.SubmitIntentRequest:
        if used[k] >= per_worker:
            raise RuntimeError("prebuilt requests exhausted: raise --max-rate")
        used[k] += 1
        return prebuilt[k][used[k] - 1]

    return make


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seconds", type=float, default=5.0, help="measured seconds per method (default 5)"
    )
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="unmeasured seconds per method first (default 1)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=16, help="concurrent callers (default 16)"
    )
    parser.add_argument(
        "--synchronous",
        choices=("normal", "full"),
        default="normal",
        help="SQLite synchronous level",
    )
    parser.add_argument(
        "--with-loop", action="store_true", help="also run the control loop in the server"
    )
    parser.add_argument(
        "--max-rate", type=float, default=20000.0, help="requests/s to prebuild for (default 20000)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--max-intents", type=int, default=0, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.serve is not None:
        from services.common.malloc import reexec_with_jemalloc

        reexec_with_jemalloc()  # the allocator's own malloc (its __main__ does the same)
        serve(ns.serve, ns.synchronous, ns.with_loop, ns.max_intents)
        return 0
    with tempfile.TemporaryDirectory(prefix="parfusion-bench-") as home:
        (Path(home) / "configs").symlink_to(ROOT / "configs")
        env = {
            **os.environ,
            "PARFUSION_HOME": home,
            "PARFUSION_LOG_LEVEL": "WARNING",
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
        }
        env.pop("PARFUSION_API_TOKEN", None)
        per_worker = int(ns.max_rate * (ns.seconds + ns.warmup) / ns.concurrency) + 1
        cmd = [
            sys.executable, __file__, "--serve", "0", "--synchronous", ns.synchronous,
            "--max-intents", str(per_worker * ns.concurrency),
        ] + (["--with-loop"] if ns.with_loop else [])  # fmt: skip
        server = subprocess.Popen(cmd, cwd=home, env=env, stdout=subprocess.PIPE, text=True)
        try:
            line = server.stdout.readline().split() if server.stdout else []
            if not line or line[0] != "ready":
                sys.stderr.write("server did not start\n")
                return 1
            address = f"127.0.0.1:{line[1]}"
            with grpc.insecure_channel(address) as ch:
                empty = ch.unary_unary(
                    EMPTY_METHOD, request_serializer=None, response_deserializer=None
                )
                empty_in_pool = ch.unary_unary(
                    EMPTY_IN_POOL_METHOD, request_serializer=None, response_deserializer=None
                )
                submit = ch.unary_unary(
                    "/parfusion.v1.AllocatorService/SubmitIntent",
                    request_serializer=allocator_pb2.SubmitIntentRequest.SerializeToString,
                    response_deserializer=allocator_pb2.SubmitIntentResponse.FromString,
                )
                # Interleaved rounds: the machine's background load drifts, so each method
                # is measured in alternating slices rather than one long block each.
                slice_s = ns.seconds / ns.rounds
                make_submit = submit_requests("run", ns.concurrency, per_worker)
                drive(empty, lambda k, i: b"", ns.warmup, ns.concurrency)
                drive(empty_in_pool, lambda k, i: b"", ns.warmup, ns.concurrency)
                drive(submit, make_submit, ns.warmup, ns.concurrency)
                empty_total, pool_total, submit_total, ratios = Round(), Round(), Round(), []
                for _ in range(ns.rounds):
                    e = drive(empty, lambda k, i: b"", slice_s, ns.concurrency, server.pid)
                    p = drive(empty_in_pool, lambda k, i: b"", slice_s, ns.concurrency, server.pid)
                    t = drive(submit, make_submit, slice_s, ns.concurrency, server.pid)
                    empty_total.add(e)
                    pool_total.add(p)
                    submit_total.add(t)
                    ratios.append(t.rate_per_s / e.rate_per_s if e.rate_per_s else 0.0)
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
    empty_result, submit_result = empty_total.summary(), submit_total.summary()
    pool_result = pool_total.summary()
    ratio = statistics.median(ratios)
    sys.stdout.write(
        f"concurrency {ns.concurrency}, {ns.rounds} interleaved rounds, {ns.seconds:g} s per method, "
        f"synchronous={ns.synchronous}, cpus={os.cpu_count()}\n"
        f"{'method':<32}{'calls':>8}{'errors':>8}{'rate/s':>10}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'server us':>11}{'client us':>11}\n"
    )
    for name, r in (
        ("empty unary RPC (coroutine)", empty_result),
        ("empty unary RPC (thread pool)", pool_result),
        ("SubmitIntent (durable)", submit_result),
    ):
        sys.stdout.write(
            f"{name:<32}{r['calls']:>8.0f}{r['errors']:>8.0f}{r['rate_per_s']:>10.0f}{r['p50_ms']:>9.2f}{r['p99_ms']:>9.2f}"
            f"{r['server_cpu_us_per_call']:>11.0f}{r['client_cpu_us_per_call']:>11.0f}\n"
        )
    sys.stdout.write(
        f"SubmitIntent / empty RPC (coroutine) rate, median of rounds: {ratio:.0%} "
        f"(rounds: {', '.join(f'{r:.0%}' for r in ratios)}; target >= 50%)\n"
    )
    if ns.json:
        ns.json.write_text(
            json.dumps(
                {
                    "concurrency": ns.concurrency,
                    "seconds": ns.seconds,
                    "synchronous": ns.synchronous,
                    "empty": empty_result,
                    "empty_in_pool": pool_result,
                    "submit": submit_result,
                    "ratio": ratio,
                },
                indent=2,
            )
        )
    return 0 if submit_result["errors"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
