"""The whole system under load: real services, N stored intents, RPC load beside the loop.

Starts the allocator, node agent and gpulane as the launcher starts them (`parfusion up
--detach`, every port moved to a free one, a temporary PARFUSION_HOME removed after), stores N
intents of mixed classes through SubmitIntent, lets the loop settle, then for a fixed time
drives SubmitIntent (each call a new intent: the store grows by rate x seconds) and GetPlan at
a fixed rate each (open loop: calls start on schedule whatever the replies do) with W
WatchPlans streams open, all over loopback. Each driver and each stream is a client in a
process of its own, as submitters, pollers, the dashboard and the extender are (`--clients
thread`: all in the harness's process, where they share one interpreter lock and delay each
other's replies). Then it deletes every intent and reads the
services' memory again. Reported, per size:

- tick: the loop's own tick duration (parfusion_allocator_tick_duration_seconds over the load
  window, quantiles interpolated in the histogram's buckets like PromQL's histogram_quantile)
  and the period between plans as the WatchPlans streams saw them (created_at), p50 / p99;
  the ticks over the 250 ms period and the allocator's full (oldest-generation) garbage
  collections in the window;
- stale: plans of the window that said node_stale;
- RPC latency p50 / p99 of SubmitIntent and GetPlan (its reply taken as bytes, unparsed),
  calls made / failed, and the allocator's own handling time of each (p99 from its
  parfusion_grpc_request_duration_seconds histogram: what the client sees less the transport and
  this harness's own process); with `--get-plan conditional` every GetPlan names the generation of the
  last reply (`known_generation`), as a poller would, and gets the plans only when they changed;
  with `--get-plan delta` it asks for deltas as well (`deltas`), and a plan that follows the one
  it holds comes as what changed;
- the store's group commits, p50 / p99 (parfusion_store_commit_duration_seconds; in the JSON
  rows only): the allocator's event loop runs them for its callers;
- the event-loop lag of the allocator and the node agent, p50 / p99
  (parfusion_event_loop_lag_seconds: how late each one's loop ran a timer that was due; a call
  served on it waits about that long to start);
- WatchPlans: plans received per stream against ticks made, generations skipped, bytes per
  message; the streams ask for deltas and keep the plan from them (`--watch whole`: every
  message is the whole plan);
- bytes per tick on each link (allocator <-> nodeagent, allocator <-> gpulane, from
  parfusion_allocator_peer_bytes_total; WatchPlans from the messages received);
- CPU (% of one core over the window) and RSS per service; RSS again after every intent is
  deleted (memory should return to within 10 % of the start), with its anonymous part beside
  it (RSS counts the libraries' file pages too, more of them touched as more calls come).
  The start is read after a warm-up (`--warmup`, 3 s: the same load on the empty store, its
  intents deleted after), so that what the first calls of each kind take once (library pages,
  connections, worker threads, caches) is not counted as left by the N intents; the cold
  start, 2 s after the services came up, is reported beside it.

`--intents 0` is the reference: the same harness and load on a store that starts empty.

    .venv/bin/python bench/bench_system.py --intents 0,1000,10000 --seconds 20
    .venv/bin/python bench/bench_system.py --intents 1000 --backend real --json results/sys.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import psutil  # noqa: E402

from bench.bench_loop import make_intent  # noqa: E402
from parfusion.v1 import allocator_pb2, allocator_pb2_grpc  # noqa: E402
from services.allocator.watch import PlanMirror  # noqa: E402
from tests.stack import start_stack  # noqa: E402

SERVICES = ("allocator", "nodeagent", "gpulane")
PEERS = ("nodeagent", "gpulane")


@dataclass
class Calls:
    """Latencies of one RPC kind under the open-loop driver."""

    latencies_ms: list[float] = field(default_factory=list)
    failed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def done(self, started: float, future: Any) -> None:
        elapsed = (time.perf_counter() - started) * 1000.0
        with self.lock:
            if future.exception() is None:
                self.latencies_ms.append(elapsed)
            else:
                self.failed += 1


@dataclass
class Watch:
    """One WatchPlans stream's view: (generation, created_at s, node_stale, bytes) per plan."""

    plans: list[tuple[int, float, bool, int]] = field(default_factory=list)


def _generation_only() -> Any:
    """A message class with only GetPlanResponse.generation: parsing a reply into it skips the
    plans (kept as unknown bytes) instead of building 10,000 allocations in this client."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    file = descriptor_pb2.FileDescriptorProto(name="bench_generation.proto", package="bench")
    message = file.message_type.add(name="Generation")
    number = allocator_pb2.GetPlanResponse.DESCRIPTOR.fields_by_name["generation"].number
    message.field.add(
        name="generation",
        number=number,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.Generation"))


_GENERATION = _generation_only()


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def scrape(url: str) -> dict[str, float]:
    """Prometheus text exposition as {series with labels: value} (no comments)."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    series: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            series[name] = float(value)
    return series


TICK_HISTOGRAM = "parfusion_allocator_tick_duration_seconds"
RPC_HISTOGRAM = "parfusion_grpc_request_duration_seconds"
LAG_HISTOGRAM = "parfusion_event_loop_lag_seconds"
COMMIT_HISTOGRAM = "parfusion_store_commit_duration_seconds"
# the allocator's oldest-generation collections (prometheus_client's default GC collector): a
# full collection at 10,000 intents is a long pause, which a tick's tail can hold
_FULL_GC = 'python_gc_collections_total{generation="2"}'


def _bucket(le: float) -> str:
    return f'{TICK_HISTOGRAM}_bucket{{le="{le}"}}'


ALLOCATOR_SERVICE = "AllocatorService"


def histogram_quantile(
    before: dict[str, float],
    after: dict[str, float],
    q: float,
    name: str = TICK_HISTOGRAM,
    labels: str = "",
) -> float:
    """q-quantile of histogram `name` (the series whose other labels are `labels`, as the
    exposition writes them after le: 'method="X",service="Y"') between two scrapes."""
    tail = f",{labels}}}" if labels else "}"
    prefix = f'{name}_bucket{{le="'
    buckets = []
    total = 0.0
    for key, value in after.items():
        if not (key.startswith(prefix) and key.endswith(tail)):
            continue
        le = key[len(prefix) : -len(tail) - 1]
        count = value - before.get(key, 0.0)
        if le == "+Inf":
            total = count
        else:
            buckets.append((float(le), count))
    if total <= 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for upper, count in sorted(buckets):
        if count >= rank:
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = upper, count
    return float("inf")  # beyond the last finite bucket


def handling_ms(before: dict[str, float], after: dict[str, float], method: str) -> dict[str, float]:
    """The allocator's own handling time of `method` (its RPC histogram), p50 / p99 in ms: what
    the server spent, against the client's latency that adds the transport and this harness."""
    labels = f'method="{method}",service="{ALLOCATOR_SERVICE}"'
    return quantiles_ms(before, after, RPC_HISTOGRAM, labels)


def loop_lag_ms(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """A service's event-loop lag p50 / p99 in ms between two scrapes of its metrics."""
    return quantiles_ms(before, after, LAG_HISTOGRAM)


def quantiles_ms(
    before: dict[str, float], after: dict[str, float], name: str, labels: str = ""
) -> dict[str, float]:
    """p50 / p99 in ms of a seconds histogram between two scrapes (``histogram_quantile``)."""
    return {
        f"p{round(q * 100)}_ms": histogram_quantile(before, after, q, name, labels) * 1e3
        for q in (0.5, 0.99)
    }


def drive(rate: float, seconds: float, start_call: Callable[[int], tuple[float, Any]]) -> int:
    """Start calls at `rate` per second for `seconds` (open loop); returns how many started."""
    count = int(rate * seconds)
    begin = time.perf_counter()
    for k in range(count):
        delay = begin + k / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        start_call(k)
    return count


def watch(stub: Any, into: Watch, stop: Any, deltas: bool) -> None:
    """Read one WatchPlans stream; with deltas, keep the plan as a client would (PlanMirror)."""
    call = stub.WatchPlans(allocator_pb2.WatchPlansRequest(include_current=False, deltas=deltas))
    stop_watch = threading.Thread(target=lambda: (stop.wait(), call.cancel()), daemon=True)
    stop_watch.start()
    mirror = PlanMirror()
    try:
        for reply in call:
            plan = reply.node_plan
            if deltas:
                mirror.apply(reply)
            created = plan.created_at.seconds + plan.created_at.nanos / 1e9
            into.plans.append((plan.generation, created, plan.node_stale, reply.ByteSize()))
    except grpc.RpcError:
        pass  # cancelled at the end


def get_plan_driver(channel: Any, calls: Calls, rate: float, seconds: float, mode: str) -> None:
    """GetPlan at `rate` per second for `seconds`, its reply taken as bytes, not parsed: at
    10,000 intents parsing 1.8 MB a hundred times a second would take this client's share of
    the machine, not the server's latency. `conditional`: each call names the generation of the
    last reply (known_generation), as a poller would; `delta`: and asks for deltas."""
    conditional = mode in ("conditional", "delta")
    get_plan_raw = channel.unary_unary(
        "/parfusion.v1.AllocatorService/GetPlan",
        request_serializer=allocator_pb2.GetPlanRequest.SerializeToString,
        response_deserializer=None,
    )
    held = [0]

    def get_plan(_: int) -> tuple[float, Any]:
        t0 = time.perf_counter()
        request = allocator_pb2.GetPlanRequest()
        if conditional:
            request.known_generation = held[0]
            request.deltas = mode == "delta"
        future = get_plan_raw.future(request, timeout=10)

        def done(f: Any, t0: float = t0) -> None:
            calls.done(t0, f)
            if conditional and f.exception() is None:
                held[0] = max(held[0], _GENERATION.FromString(f.result()).generation)

        future.add_done_callback(done)
        return t0, future

    drive(rate, seconds, get_plan)


def submit_driver(stub: Any, calls: Calls, rate: float, seconds: float, first: int) -> None:
    """SubmitIntent at `rate` per second for `seconds`, each call a new intent (ids from
    `first` on: they never repeat), built before its clock starts."""

    def submit(k: int) -> tuple[float, Any]:
        fresh = make_intent(first + k, random.Random(first + k))
        t0 = time.perf_counter()
        future = stub.SubmitIntent.future(
            allocator_pb2.SubmitIntentRequest(intent=fresh), timeout=10
        )
        future.add_done_callback(lambda f, t0=t0: calls.done(t0, f))
        return t0, future

    drive(rate, seconds, submit)


def client_process(
    role: str, address: str, options: dict[str, Any], ready: Any, go: Any, stop: Any, results: Any
) -> None:
    """One client in a process of its own (``--clients process``): a WatchPlans stream
    (``watch``), the GetPlan driver (``get_plan``) or the SubmitIntent driver (``submit``).
    Says it is ready, starts its load when ``go`` is set and puts what it measured on
    ``results``."""
    channel = grpc.insecure_channel(address)
    grpc.channel_ready_future(channel).result(timeout=30)
    stub = allocator_pb2_grpc.AllocatorServiceStub(channel)
    if role == "watch":
        seen = Watch()
        stream = threading.Thread(target=watch, args=(stub, seen, stop, options["deltas"]))
        stream.start()
        ready.put(role)
        stream.join()
        results.put((role, seen.plans))
    else:
        calls = Calls()
        ready.put(role)
        go.wait()
        if role == "submit":
            submit_driver(stub, calls, options["rate"], options["seconds"], options["first"])
        else:
            get_plan_driver(
                channel, calls, options["rate"], options["seconds"], options["get_plan"]
            )
        time.sleep(1.0)  # the last replies
        results.put((role, (calls.latencies_ms, calls.failed)))
    channel.close()


def processes(home: Path) -> dict[str, psutil.Process]:
    state = json.loads((home / "run" / "launcher.json").read_text())
    return {name: psutil.Process(int(pid)) for name, pid in state["pids"].items()}


def rss_mb(procs: dict[str, psutil.Process]) -> dict[str, float]:
    return {name: p.memory_info().rss / 2**20 for name, p in procs.items()}


def anon_mb(procs: dict[str, psutil.Process]) -> dict[str, float]:
    """The anonymous part of each RSS (RSS less its shared, file-backed pages: the libraries'
    code and data, first touched as calls come): what the process itself holds."""
    return {
        name: (info.rss - info.shared) / 2**20
        for name, info in ((name, p.memory_info()) for name, p in procs.items())
    }


def malloc_of(procs: dict[str, psutil.Process]) -> dict[str, str]:
    """Which malloc each service runs on (services/common/malloc.py): jemalloc where mapped."""
    return {
        name: "jemalloc" if any("libjemalloc" in m.path for m in p.memory_maps()) else "pymalloc"
        for name, p in procs.items()
    }


def wait_for_plan(stub: Any, size: int, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # a whole plan of 10,000 allocations, on a busy machine: a generous call timeout
        reply = stub.GetPlan(allocator_pb2.GetPlanRequest(), timeout=30)
        if len(reply.node_plan.allocations) == size:
            return
        time.sleep(0.5)
    raise TimeoutError(f"the plan never held {size} allocations")


def submit_all(stub: Any, intents: list[Any]) -> None:
    """SubmitIntent for every intent, eight calls at a time."""
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda i: stub.SubmitIntent(
                    allocator_pb2.SubmitIntentRequest(intent=i), timeout=30
                ),
                intents,
            )
        )


def run_sizes(
    args: argparse.Namespace,
    run_case: Callable[[int, argparse.Namespace], dict[str, Any]],
    table: Callable[[list[dict[str, Any]]], str],
) -> None:
    """One run per size in ``args.intents``: its row as JSON as it ends, then the table (and
    the rows to ``args.json`` when given)."""
    rows = []
    for n in (int(x) for x in args.intents.split(",")):
        row = run_case(n, args)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(table(rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))


@contextlib.contextmanager
def bench_stack(
    names: Sequence[str], max_intents: int, backend: str = "modeled"
) -> Iterator[tuple[Any, Path]]:
    """The services ``names`` as the launcher starts them, every port moved to a free one, in
    a temporary PARFUSION_HOME (removed after), no demo intents, room for ``max_intents``."""
    with tempfile.TemporaryDirectory(prefix="parfusion-bench-") as tmp:
        home = Path(tmp)
        (home / "configs").symlink_to(ROOT / "configs")
        extra = {
            "PARFUSION_ALLOCATOR_SEED_INTENTS": "false",
            "PARFUSION_NODEAGENT_BACKEND": backend,
            "PARFUSION_LOG_LEVEL": "WARNING",
            # beyond its limit the store answers RESOURCE_EXHAUSTED
            "PARFUSION_ALLOCATOR_MAX_INTENTS": str(max_intents),
        }
        stack = start_stack(home, names, extra)
        try:
            yield stack, home
        finally:
            stack.close()


def size_arguments(
    parser: argparse.ArgumentParser, seconds: float, settle: float, window: str
) -> None:
    """The options every whole-stack benchmark takes: sizes, window, settle time, JSON."""
    parser.add_argument("--intents", default="0,1000,10000", help="stored intents, per run")
    parser.add_argument("--seconds", type=float, default=seconds, help=f"{window} per run")
    parser.add_argument("--settle", type=float, default=settle, help="seconds after loading")
    parser.add_argument("--json", type=Path, help="write the rows here too")


def run_case(n: int, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(7)
    intents = [make_intent(k, rng) for k in range(n)]
    # room for the intents the load adds (the warm-up's are deleted before the n come)
    room = n + int(args.rate * max(args.seconds, args.warmup)) + 100
    with bench_stack(SERVICES, room, args.backend) as (stack, home):
        return measure(stack, home, intents, args)


# ids of the warm-up's submits: apart from every measured window's (n on, n below this)
WARMUP_FIRST = 900_000


@dataclass
class Window:
    """One load window: its calls, each stream's plans, the allocator's and the node agent's
    metrics and every service's CPU times at its start and its end, and its length."""

    submits: Calls
    plans: Calls
    watches: list[Watch]
    before: dict[str, float]
    after: dict[str, float]
    agent_before: dict[str, float]
    agent_after: dict[str, float]
    cpu_before: dict[str, Any]
    cpu_after: dict[str, Any]
    seconds: float


def load_window(
    stack: Any,
    procs: dict[str, psutil.Process],
    channel: Any,
    args: argparse.Namespace,
    seconds: float,
    first: int,
    peak: dict[str, float],
) -> Window:
    """SubmitIntent (new ids from ``first`` on) and GetPlan at ``args.rate`` each for
    ``seconds``, with the WatchPlans streams open; each service's highest RSS into ``peak``."""
    stub = allocator_pb2_grpc.AllocatorServiceStub(channel)
    metrics_url = f"http://127.0.0.1:{stack.env['PARFUSION_ALLOCATOR_METRICS_PORT']}/metrics"
    agent_url = f"http://127.0.0.1:{stack.env['PARFUSION_NODEAGENT_METRICS_PORT']}/metrics"
    submits, plans = Calls(), Calls()
    watches = [Watch() for _ in range(args.watchers)]
    deltas = args.watch == "deltas"
    if args.clients == "process":
        # each WatchPlans stream and each driver a client process of its own, as the dashboard,
        # the extender, pollers and submitters are: they share the cores, not this interpreter
        context = multiprocessing.get_context("spawn")
        ready, results = context.Queue(), context.Queue()
        go, stop = context.Event(), context.Event()
        options = {
            "deltas": deltas,
            "rate": args.rate,
            "seconds": seconds,
            "get_plan": args.get_plan,
            "first": first,
        }
        roles = ["watch"] * args.watchers + ["get_plan", "submit"]
        clients = [
            context.Process(
                target=client_process,
                args=(role, stack.address("allocator"), options, ready, go, stop, results),
                daemon=True,
            )
            for role in roles
        ]
        for c in clients:
            c.start()
        for _ in roles:
            ready.get(timeout=60)
        watchers: list[threading.Thread] = []
    else:
        stop = threading.Event()
        watchers = [
            threading.Thread(target=watch, args=(stub, w, stop, deltas), daemon=True)
            for w in watches
        ]
        for t in watchers:
            t.start()
    time.sleep(0.5)
    before, agent_before = scrape(metrics_url), scrape(agent_url)
    cpu_before = {name: p.cpu_times() for name, p in procs.items()}
    window_start = time.perf_counter()

    drivers: list[threading.Thread] = []
    if args.clients == "process":
        go.set()
    else:
        drivers = [
            threading.Thread(target=submit_driver, args=(stub, submits, args.rate, seconds, first)),
            threading.Thread(
                target=get_plan_driver, args=(channel, plans, args.rate, seconds, args.get_plan)
            ),
        ]
    for t in drivers:
        t.start()
    # until the drivers are done (threads), or their window has passed (processes)
    ends = window_start + seconds
    while any(t.is_alive() for t in drivers) or (not drivers and time.perf_counter() < ends):
        for name, mb in rss_mb(procs).items():
            peak[name] = max(peak.get(name, 0.0), mb)
        time.sleep(0.5)
    for t in drivers:
        t.join()
    window_s = time.perf_counter() - window_start
    cpu_after = {name: p.cpu_times() for name, p in procs.items()}
    after, agent_after = scrape(metrics_url), scrape(agent_url)
    time.sleep(1.0)  # the last replies
    stop.set()
    if args.clients == "process":
        streams = iter(watches)
        for _ in roles:
            role, measured = results.get(timeout=60)
            if role == "watch":
                next(streams).plans.extend(measured)
            else:
                calls = submits if role == "submit" else plans
                calls.latencies_ms.extend(measured[0])
                calls.failed += measured[1]
        for c in clients:
            c.join(10)
    for t in watchers:
        t.join(5)
    return Window(
        submits, plans, watches, before, after, agent_before, agent_after, cpu_before, cpu_after,
        window_s,
    )  # fmt: skip


def delete_all(stub: Any, settle: float) -> None:
    """DeleteIntent for every stored intent, eight calls at a time; back when the plan is empty
    and ``settle`` seconds more have passed."""
    stored = stub.ListIntents(allocator_pb2.ListIntentsRequest(), timeout=60).intents
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda i: stub.DeleteIntent(allocator_pb2.DeleteIntentRequest(id=i.id), timeout=30),
                stored,
            )
        )
    wait_for_plan(stub, 0)
    time.sleep(settle)


def measure(stack: Any, home: Path, intents: list[Any], args: argparse.Namespace) -> dict[str, Any]:
    n = len(intents)
    procs = processes(home)
    channel = grpc.insecure_channel(stack.address("allocator"))
    stub = allocator_pb2_grpc.AllocatorServiceStub(channel)
    time.sleep(2.0)
    rss_cold, anon_cold = rss_mb(procs), anon_mb(procs)
    if args.warmup > 0:
        # the same load on the empty store first, its intents deleted after: every kind of
        # call, connection and worker thread has been served once before memory is read, so
        # what stays after the deletes below is what the intents left, not the first calls'
        load_window(stack, procs, channel, args, args.warmup, WARMUP_FIRST, {})
        delete_all(stub, args.settle)
    rss_start, anon_start = rss_mb(procs), anon_mb(procs)
    started = time.perf_counter()
    submit_all(stub, intents)
    load_s = time.perf_counter() - started
    wait_for_plan(stub, n)
    time.sleep(args.settle)

    peak = dict(rss_start)
    window = load_window(stack, procs, channel, args, args.seconds, n, peak)
    before, after, watches = window.before, window.after, window.watches
    delete_all(stub, args.settle)
    rss_end, anon_end = rss_mb(procs), anon_mb(procs)
    channel.close()

    # from the tick histogram itself, like its buckets: the ticks counter moves mid-tick and the
    # histogram at its end, so a scrape between the two would count a tick in one and not the
    # other (ticks over 250 ms came out as -1 then)
    count = f"{TICK_HISTOGRAM}_count"
    ticks = after[count] - before[count]

    def per_tick(peer: str, direction: str) -> float:
        key = f'parfusion_allocator_peer_bytes_total{{direction="{direction}",peer="{peer}"}}'
        return (after.get(key, 0.0) - before.get(key, 0.0)) / max(ticks, 1.0)

    window_plans = [p for w in watches for p in w.plans]
    periods = [
        (b[1] - a[1]) * 1000.0
        for w in watches
        for a, b in zip(w.plans, w.plans[1:], strict=False)
        if b[0] > a[0]
    ]
    skipped = sum(
        b[0] - a[0] - 1 for w in watches for a, b in zip(w.plans, w.plans[1:], strict=False)
    )
    return {
        "intents": n,
        "backend": args.backend,
        "load_s": round(load_s, 1),
        "window_s": round(window.seconds, 1),
        "ticks": int(ticks),
        "tick_ms": {
            "p50": histogram_quantile(before, after, 0.5) * 1000.0,
            "p99": histogram_quantile(before, after, 0.99) * 1000.0,
        },
        "period_ms": {"p50": quantile(periods, 0.5), "p99": quantile(periods, 0.99)},
        "ticks_over_250_ms": int(ticks - (after[_bucket(0.25)] - before[_bucket(0.25)])),
        "full_collections": int(after[_FULL_GC] - before[_FULL_GC]),
        "stale_plans": sum(1 for p in window_plans if p[2]),
        "failed_peer_calls": failed_calls(before, after),
        "watched_plans": len(window_plans),
        "watchers": len(watches),
        "watch_skipped_generations": skipped,
        "watch_bytes_per_plan": statistics.fmean(p[3] for p in window_plans) if window_plans else 0,
        "submit": latency_row(window.submits),
        "get_plan": latency_row(window.plans),
        "server_ms": {
            "submit": handling_ms(before, after, "SubmitIntent"),
            "get_plan": handling_ms(before, after, "GetPlan"),
        },
        # how late each service's event loop ran what was due: a call waits that long to start
        "loop_lag_ms": loop_lag_ms(before, after),
        # the store's group commits, which the allocator's event loop runs for its callers
        "commit_ms": quantiles_ms(before, after, COMMIT_HISTOGRAM),
        "agent_loop_lag_ms": loop_lag_ms(window.agent_before, window.agent_after),
        "get_plan_mode": args.get_plan,
        "watch_mode": args.watch,
        "clients": args.clients,
        "bytes_per_tick": {
            f"{peer}_{direction}": per_tick(peer, direction)
            for peer in PEERS
            for direction in ("sent", "received")
        },
        "cpu_percent": {
            name: 100.0
            * (
                (window.cpu_after[name].user + window.cpu_after[name].system)
                - (window.cpu_before[name].user + window.cpu_before[name].system)
            )
            / window.seconds
            for name in procs
        },
        "rss_mb": {
            name: {
                "cold": rss_cold[name],
                "start": rss_start[name],
                "peak": peak[name],
                "after_delete": rss_end[name],
            }
            for name in procs
        },
        "rss_anon_mb": {
            name: {
                "cold": anon_cold[name],
                "start": anon_start[name],
                "after_delete": anon_end[name],
            }
            for name in procs
        },
        "malloc": malloc_of(procs),
    }


def failed_calls(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    """Pulls and pushes to the node agent and gpulane that failed or missed their deadline in
    the window, per series of parfusion_allocator_peer_call_failures_total (its labels)."""
    prefix = "parfusion_allocator_peer_call_failures_total{"
    counts = {
        k[len(prefix) : -1]: int(v - before.get(k, 0.0))
        for k, v in after.items()
        if k.startswith(prefix)
    }
    return {k: n for k, n in counts.items() if n}


def latency_row(calls: Calls) -> dict[str, float]:
    return {
        "p50_ms": quantile(calls.latencies_ms, 0.5),
        "p99_ms": quantile(calls.latencies_ms, 0.99),
        "ok": len(calls.latencies_ms),
        "failed": calls.failed,
    }


def memory(mb: dict[str, dict[str, float]], name: str, peak: bool = False) -> str:
    """One service's memory cells: start (cold start), [peak,] after the deletes (+% of the
    start)."""
    m = mb[name]
    grown = 100.0 * (m["after_delete"] / m["start"] - 1.0) if m["start"] else 0.0
    middle = f"{m['peak']:.0f}, " if peak else ""
    return f"{m['start']:.0f} ({m['cold']:.0f}), {middle}{m['after_delete']:.0f} ({grown:+.0f} %)"


def table(rows: list[dict[str, Any]]) -> str:
    idle = next((r for r in rows if r["intents"] == 0), None)

    def ratio(row: dict[str, Any], get: Callable[[dict[str, Any]], float]) -> str:
        if idle is None or row is idle or not get(idle):
            return ""
        return f" ({get(row) / get(idle):.1f}x)"

    lines = [
        "| intents | tick p50 / p99 ms | period p99 ms | ticks > 250 ms, full GCs "
        "| stale plans, failed peer calls | Submit p50 / p99 ms (server p99) "
        "| GetPlan p50 / p99 ms (server p99) | loop lag p99 ms alloc / agent "
        "| watch plans / ticks, bytes per plan "
        "| bytes/tick agent out / in "
        "| bytes/tick gpulane out / in | CPU % alloc / agent / gpulane "
        "| RSS MB alloc / agent: start (cold), peak, after delete "
        "| of it anonymous MB alloc / agent: start (cold), after delete |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        b, cpu, rss, server = r["bytes_per_tick"], r["cpu_percent"], r["rss_mb"], r["server_ms"]
        anon = r["rss_anon_mb"]
        lines.append(
            f"| {r['intents']:,} | {r['tick_ms']['p50']:.0f} / {r['tick_ms']['p99']:.0f}"
            f"{ratio(r, lambda x: x['tick_ms']['p99'])} | {r['period_ms']['p99']:.0f} "
            f"| {r['ticks_over_250_ms']} of {r['ticks']}, {r['full_collections']} "
            f"| {r['stale_plans']}, {sum(r['failed_peer_calls'].values())} "
            f"| {r['submit']['p50_ms']:.1f} / {r['submit']['p99_ms']:.1f}"
            f"{ratio(r, lambda x: x['submit']['p99_ms'])} ({server['submit']['p99_ms']:.1f}) "
            f"| {r['get_plan']['p50_ms']:.1f} / {r['get_plan']['p99_ms']:.1f}"
            f"{ratio(r, lambda x: x['get_plan']['p99_ms'])} ({server['get_plan']['p99_ms']:.1f}) "
            f"| {r['loop_lag_ms']['p99_ms']:.1f} / {r['agent_loop_lag_ms']['p99_ms']:.1f} "
            f"| {r['watched_plans'] / max(r['watchers'], 1):.0f} / {r['ticks']}, "
            f"{r['watch_bytes_per_plan']:,.0f} "
            f"| {b['nodeagent_sent']:,.0f} / {b['nodeagent_received']:,.0f} "
            f"| {b['gpulane_sent']:,.0f} / {b['gpulane_received']:,.0f} "
            f"| {cpu['allocator']:.0f} / {cpu['nodeagent']:.0f} / {cpu['gpulane']:.0f} "
            f"| {memory(rss, 'allocator', peak=True)} / {memory(rss, 'nodeagent', peak=True)} "
            f"| {memory(anon, 'allocator')} / {memory(anon, 'nodeagent')} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    size_arguments(parser, seconds=15.0, settle=3.0, window="load window")
    parser.add_argument("--rate", type=float, default=100.0, help="SubmitIntent and GetPlan /s")
    parser.add_argument("--watchers", type=int, default=2, help="WatchPlans streams")
    parser.add_argument(
        "--warmup",
        type=float,
        default=3.0,
        help="seconds of the same load on the empty store before the start's memory is read "
        "(its intents deleted first); 0: the start is the cold one",
    )
    parser.add_argument("--backend", default="modeled", choices=("modeled", "real"))
    parser.add_argument(
        "--get-plan",
        default="full",
        choices=("full", "conditional", "delta"),
        help="full: every GetPlan fetches the plans; conditional: each names the generation "
        "of the last reply (known_generation) and gets the plans only when they changed; "
        "delta: and asks for deltas (deltas), a plan that follows the one held coming as what "
        "changed",
    )
    parser.add_argument(
        "--watch",
        default="deltas",
        choices=("deltas", "whole"),
        help="deltas: the streams ask for WatchPlans deltas and merge them (PlanMirror); "
        "whole: every message is the whole plan",
    )
    parser.add_argument(
        "--clients",
        default="process",
        choices=("process", "thread"),
        help="process: the SubmitIntent and GetPlan drivers and each WatchPlans stream run in a "
        "process of their own; thread: all in this process, sharing its interpreter lock",
    )
    run_sizes(parser.parse_args(), run_case, table)


if __name__ == "__main__":
    main()
