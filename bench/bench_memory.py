"""Where the served allocator's memory stays after every intent is deleted.

The allocator runs in this process, served as `main()` serves it (start_allocator: a real gRPC
server and loop, switch interval set, a temporary PARFUSION_HOME removed after); the node agent
(modeled backend; `--backend real` for the real one) and gpulane run as `parfusion up
--detach` starts them. With `--serve nodeagent` the node agent (start_nodeagent) is the one
served here and the
allocator runs as launched. A client in a
separate process (this script with `--client`) submits N intents of bench_loop's mix through
SubmitIntent, waits until the plan holds them, deletes every one and waits for the empty
plan. Then, after a settle time, this process reports against its state before the submits:

- RSS, glibc's heap (mallinfo2: bytes in use and free in the arenas, mmapped bytes) and
  CPython's object allocator (sys._debugmallocstats: arenas, bytes in used and free blocks);
- objects per type (gc.get_objects(), the types that grew);
- the size of the loop's and the servicer's long-lived containers and of every Prometheus
  metric's children;
- with `--trace`, what is still allocated since the submits, by line (tracemalloc: Python
  objects only, not protobuf's upb arenas nor gRPC's core);
- with `--arenas`, per CPython arena: its used blocks, the reachable objects in it by type and
  the containers that refer to them (what keeps an otherwise empty arena mapped).

The served process runs on jemalloc where it is installed, as the services do
(services/common/malloc.py; PARFUSION_MALLOC=system for CPython's allocator): its statistics
(live, active, resident MB) and SQLite's own are read beside glibc's and CPython's.

What it is that stays is told apart by serving less: with `--loop off` the allocator serves
without its control loop (the store and the RPCs alone: nothing is planned, the client waits
for no plan); with `--reject` as well, every submit carries a name the validator refuses and
every delete an id that is not stored (as many calls, nothing stored). `--cycles N` repeats
the client's submits and deletes N times with a reading after each: whether what stays grows
from round to round or is held once.

Retention (objects still referenced) shows as types and containers that grew and traced
blocks still alive; fragmentation (freed but not returned) shows as free bytes in glibc's
arenas or free blocks in CPython's arenas with nothing alive behind them.

    .venv/bin/python bench/bench_memory.py --intents 10000 [--trace] [--arenas] [--settle 5]
    .venv/bin/python bench/bench_memory.py --serve nodeagent   # the node agent instead
    .venv/bin/python bench/bench_memory.py --loop off [--reject] [--cycles 3]
"""

from __future__ import annotations

import argparse
import array
import bisect
import contextlib
import ctypes
import ctypes.util
import gc
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
import psutil  # noqa: E402

from bench.bench_loop import make_intent  # noqa: E402
from bench.bench_system import PEERS, bench_stack, submit_all, wait_for_plan  # noqa: E402
from parfusion.v1 import allocator_pb2, allocator_pb2_grpc  # noqa: E402

# --- the client (its own process) ------------------------------------------------------------


def client(address: str, n: int, settle: float, *, plan: bool = True, reject: bool = False) -> None:
    """Submit n intents, wait for them in the plan, delete them all, wait for the empty plan.

    Without ``plan`` (the allocator served with no loop) nothing waits for a plan. With
    ``reject`` every submit carries a name the validator refuses and every delete names an id
    that is not stored: as many calls, each answered with an error, and nothing stored."""
    rng = random.Random(7)
    intents = [make_intent(k, rng) for k in range(n)]
    with grpc.insecure_channel(address) as channel:
        stub = allocator_pb2_grpc.AllocatorServiceStub(channel)
        started = time.perf_counter()
        if reject:
            for intent in intents:
                intent.name = "not a valid name!"
            codes = each_call(stub, intents)
            print(f"client: {n} submits refused ({codes}) in {time.perf_counter() - started:.1f} s")
            codes = each_call(stub, intents, delete=True)
            print(f"client: {n} deletes refused ({codes})")
            return
        submit_all(stub, intents)
        if plan:
            wait_for_plan(stub, n)
        print(f"client: {n} submitted in {time.perf_counter() - started:.1f} s")
        time.sleep(settle)
        stored = stub.ListIntents(allocator_pb2.ListIntentsRequest(), timeout=60).intents
        started = time.perf_counter()
        codes = each_call(stub, list(stored), delete=True)
        if codes != {"OK": len(stored)}:
            raise RuntimeError(f"deleting {len(stored)} stored intents answered {codes}")
        if plan:
            wait_for_plan(stub, 0)
        print(f"client: {len(stored)} deleted in {time.perf_counter() - started:.1f} s")


def each_call(stub: Any, intents: list[Any], delete: bool = False) -> dict[str, int]:
    """Each intent submitted (or deleted by id), eight calls at a time; the status codes seen."""

    def call(intent: Any) -> str:
        try:
            if delete:
                stub.DeleteIntent(allocator_pb2.DeleteIntentRequest(id=intent.id), timeout=30)
            else:
                stub.SubmitIntent(allocator_pb2.SubmitIntentRequest(intent=intent), timeout=30)
        except grpc.RpcError as exc:
            return str(exc.code().name)
        return "OK"

    with ThreadPoolExecutor(8) as pool:
        return dict(Counter(pool.map(call, intents)))


# --- what this process holds -----------------------------------------------------------------


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def glibc_heap() -> dict[str, float]:
    """MB: in use and free in malloc's arenas, mmapped (large) blocks."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is None or not hasattr(libc, "mallinfo2"):
        return {}
    libc.mallinfo2.restype = _Mallinfo2
    info = libc.mallinfo2()
    mb = 2**20
    return {
        "arena_mb": info.arena / mb,
        "in_use_mb": info.uordblks / mb,
        "free_mb": info.fordblks / mb,
        "mmapped_mb": info.hblkhd / mb,
    }


def sqlite_mb() -> float:
    """MB that SQLite's own allocator holds in this process (page caches, statements)."""
    name = ctypes.util.find_library("sqlite3")
    if not name:
        return float("nan")
    lib = ctypes.CDLL(name)
    lib.sqlite3_memory_used.restype = ctypes.c_int64
    return float(lib.sqlite3_memory_used() / 2**20)


def pymalloc_stats() -> dict[str, float]:
    """CPython's object allocator, from sys._debugmallocstats (written to the C stderr)."""
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        sys.stderr.flush()
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")

    def number(label: str) -> float:
        match = re.search(re.escape(label) + r"\s*=\s*([\d,]+)", text)
        return float(match.group(1).replace(",", "")) if match else float("nan")

    mb = 2**20
    return {
        "arenas": number("# arenas allocated current"),
        "arenas_mb": number("# bytes in allocated blocks") / mb
        + number("# bytes in available blocks") / mb
        + number("# bytes lost to pool headers") / mb
        + number("# bytes lost to quantization") / mb
        + number("# bytes lost to arena alignment") / mb,
        "used_blocks_mb": number("# bytes in allocated blocks") / mb,
        "free_blocks_mb": number("# bytes in available blocks") / mb,
        "free_pools": number("# unused pools"),
    }


def type_counts() -> Counter[str]:
    return Counter(type(o).__qualname__ for o in gc.get_objects())


def sized(obj: Any, prefix: str, depth: int = 1) -> dict[str, int]:
    """len() of every container attribute of obj (and of its attributes' attributes)."""
    found: dict[str, int] = {}
    for name, value in sorted(vars(obj).items()):
        key = f"{prefix}.{name}"
        if isinstance(value, (dict, list, set, tuple, frozenset)) or hasattr(value, "maxlen"):
            found[key] = len(value)
        elif depth > 0 and hasattr(value, "__dict__") and not isinstance(value, type):
            with contextlib.suppress(TypeError):
                found.update(sized(value, key, depth - 1))
    return found


def metric_children() -> dict[str, int]:
    from prometheus_client import REGISTRY
    from prometheus_client.metrics import MetricWrapperBase

    counts: dict[str, int] = {}
    for collector in list(REGISTRY._collector_to_names):  # noqa: SLF001
        if isinstance(collector, MetricWrapperBase) and collector._labelnames:  # noqa: SLF001
            counts[collector._name] = len(collector._metrics)  # noqa: SLF001
    return counts


def large_containers(least_bytes: int = 32 * 1024) -> dict[str, int]:
    """Containers of at least `least_bytes` (sys.getsizeof: a dict's or list's own table, which
    does not shrink when entries are removed), by the first path found from the modules."""
    found: dict[str, int] = {}
    seen: set[int] = set()
    queue = [(f"sys.modules[{name!r}]", m) for name, m in list(sys.modules.items())]
    while queue:
        path, obj = queue.pop()
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, type(None))):
            continue
        seen.add(id(obj))
        if isinstance(obj, (dict, list, set, frozenset, tuple, bytearray)):
            size = sys.getsizeof(obj)
            if size >= least_bytes:
                found[f"{path} ({type(obj).__name__}, len {len(obj)})"] = size
        if len(path) < 240:
            queue.extend((f"{path}>{type(r).__name__}", r) for r in gc.get_referents(obj))
    return found


def survivors(top: int) -> list[str]:
    """Objects allocated since tracing began and still reachable (tracked containers and what
    they refer to), by allocation line: how many, and how many 1 MiB address ranges they
    sit in (a CPython arena stays mapped while one object in it lives). Dicts the collector
    does not track (only strings and numbers in them) are not reached: the traced lines below
    still count what they hold."""
    seen: set[int] = set()
    sites: dict[str, tuple[int, set[int]]] = {}
    for container in gc.get_objects():
        for obj in (container, *gc.get_referents(container)):
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            trace = tracemalloc.get_object_traceback(obj)
            if trace is None:
                continue
            site = f"{type(obj).__name__} {trace[-1].filename}:{trace[-1].lineno}"
            count, ranges = sites.get(site, (0, set()))
            ranges.add(id(obj) >> 20)
            sites[site] = (count + 1, ranges)
    every = set().union(*(r for _, r in sites.values())) if sites else set()
    lines = [f"reachable objects allocated since the submits in {len(every)} 1 MiB ranges:"]
    for site, (count, ranges) in sorted(sites.items(), key=lambda kv: -len(kv[1][1]))[:top]:
        lines.append(f"  {count:6d} objects in {len(ranges):3d} ranges  {site}")
    return lines


# CPython 3.11's object allocator on 64-bit: 16 KiB pools in 1 MiB arenas, blocks up to 512
# bytes; a pool's header starts with its count of used blocks, and its arena's index at 32.
POOL_BITS = 14
SMALL_REQUEST = 512
FEW_BLOCKS = 1000  # an arena with fewer used blocks is listed with examples and holders


def mappings() -> tuple[list[int], list[int]]:
    """This process's mapped address ranges, sorted: their starts and their ends."""
    starts: list[int] = []
    ends: list[int] = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        low, high = line.split(maxsplit=1)[0].split("-")
        starts.append(int(low, 16))
        ends.append(int(high, 16))
    return starts, ends


def pinned_arenas() -> list[str]:
    """Which of CPython's arenas hold few live blocks, what sits in them and what holds it.
    Every object reachable from the collector's (tracked containers, then everything they
    refer to) is mapped to its pool by address; the pool's header gives the arena index and
    the pool's used blocks. An arena that holds a handful of blocks stays mapped for them:
    those objects, and the containers that refer to them, are what pins it. The walk's own
    ints (an address per object seen) land in the same pools: they are not counted, and
    their blocks are taken off the pools' counts. With tracemalloc on, objects made since
    tracing began are counted apart ("new")."""
    seen: set[int] = set()
    pools: dict[int, list[int]] = {}  # pool address -> [arena index, used blocks]
    found: dict[int, Counter[str]] = {}
    holders: dict[int, Counter[str]] = {}
    new: Counter[int] = Counter()
    examples: dict[int, list[str]] = {}
    shown: dict[str, str] = {}  # a holder that is a dict: its first keys
    tracing = tracemalloc.is_tracing()
    # the objects still to visit and who referred to each, as two lists: a tuple per entry
    # would fill the free blocks of the very pools being counted
    objects: list[Any] = []
    parents: list[Any] = []
    for own in (seen, pools, found, holders, new, examples, shown, objects, parents):
        seen.add(id(own))
    objects += gc.get_objects()
    parents += [None] * len(objects)

    # a block from another allocator, rounded down to a pool, can fall outside any mapping:
    # read a header only where the memory is mapped (bisect.bisect of the mappings' starts)
    starts, ends = mappings()

    def pool_of(address: int, size: int) -> list[int] | None:
        pool = address & ~((1 << POOL_BITS) - 1)
        entry = pools.get(pool)
        if entry is None:
            at = bisect.bisect(starts, pool) - 1
            if at < 0 or pool + 40 > ends[at]:
                return None
            index = ctypes.c_uint.from_address(pool + 32).value
            size_index = ctypes.c_uint.from_address(pool + 36).value
            # statically allocated objects (3.11's deep-frozen modules) and glibc's blocks
            # have no pool header: a size class that does not fit the object says so
            if index > 4096 or size_index != (size - 1) >> 4:
                return None
            entry = pools[pool] = [index, ctypes.c_uint.from_address(pool).value]
        return entry

    while objects:
        obj, parent = objects.pop(), parents.pop()
        address = id(obj)
        if address in seen:
            continue
        seen.add(address)
        children = gc.get_referents(obj)
        objects += children
        parents += [obj] * len(children)
        kind = type(obj)
        # the object's own block: a dict's or list's table is another allocation
        size = sys.getsizeof(obj) if kind.__itemsize__ else kind.__basicsize__
        size += 16 if gc.is_tracked(obj) and not kind.__itemsize__ else 0
        if size > SMALL_REQUEST or isinstance(obj, type):
            continue
        entry = pool_of(address - (16 if gc.is_tracked(obj) else 0), size)
        if entry is None:
            continue
        index = entry[0]
        found.setdefault(index, Counter())[kind.__qualname__] += 1
        if parent is not None:
            try:
                length = str(len(parent))
            except TypeError:
                length = "-"
            label = f"{type(parent).__qualname__}[{length}] at {id(parent):x}"
            holders.setdefault(index, Counter())[label] += 1
            if label not in shown and isinstance(parent, dict):
                shown[label] = ", ".join(repr(k)[:30] for k in list(parent)[:4])
        if tracing and tracemalloc.get_object_traceback(obj) is not None:
            new[index] += 1
        if len(examples.setdefault(index, [])) < 3:
            examples[index].append(f"{kind.__qualname__}: {repr(obj)[:80]}")
    # the walk's own ints: the addresses in `seen` and the pools' keys
    for value in [*seen, *pools]:
        entry = pools.get(id(value) & ~((1 << POOL_BITS) - 1))
        if entry is not None:
            entry[1] -= 1
    blocks: Counter[int] = Counter()
    pool_count: Counter[int] = Counter()
    for index, used in pools.values():
        blocks[index] += used
        pool_count[index] += 1
    lines = [
        f"{len(seen)} objects reachable, in {len(found)} arenas; by arena index: used blocks in "
        "the pools seen (the walk's own taken off), objects found (new since tracing), their "
        "types and the containers that refer to them:"
    ]
    for index in sorted(blocks):
        kinds = ", ".join(f"{n} {k}" for k, n in found[index].most_common(5))
        lines.append(
            f"  arena {index:4d}: {blocks[index]:6d} blocks in {pool_count[index]:3d} pools; "
            f"{sum(found[index].values())} objects ({new[index]} new): {kinds}"
        )
        if blocks[index] < FEW_BLOCKS:
            lines += [f"      {e}" for e in examples[index]]
            for holder, count in holders[index].most_common(4):
                keys = f" (keys {shown[holder]})" if holder in shown else ""
                lines.append(f"      held by {holder}: {count}{keys}")
    return lines


class Collections:
    """Garbage collections while installed (gc.callbacks): per generation, how many, and the
    total and longest pause in ms (the collector holds the interpreter lock throughout).

    Recorded into buffers made up front: a Python float or list entry made per collection
    would be a long-lived object allocated during the churn, one of the very objects that
    keep CPython's arenas of the peak from being returned, and the reading would measure the
    harness."""

    LIMIT = 65536  # collections recorded per generation; later ones are counted, not timed

    def __init__(self) -> None:
        self._clock = array.array("d", [0.0, 0.0])  # installed, started
        self._clock[0] = time.perf_counter()
        self._count = array.array("q", [0, 0, 0])
        # pause ms per generation; the oldest generation's start offsets beside its pauses
        self._pauses = [array.array("d", bytes(8 * self.LIMIT)) for _ in range(3)]
        self._full_start = array.array("d", bytes(8 * self.LIMIT))

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._clock[1] = time.perf_counter()
            return
        generation = info["generation"]
        n = self._count[generation]
        self._count[generation] = n + 1
        if n < self.LIMIT:
            self._pauses[generation][n] = (time.perf_counter() - self._clock[1]) * 1e3
            if generation == 2:
                self._full_start[n] = self._clock[1] - self._clock[0]

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for g in range(3):
            p = self._pauses[g][: min(self._count[g], self.LIMIT)]
            if p:
                out[f"gen{g}"] = (
                    f"{self._count[g]} collections, {sum(p):.0f} ms in all, longest {max(p):.1f} ms"
                )
        out["gen2_at"] = [
            f"{self._full_start[i]:.1f} s: {self._pauses[2][i]:.0f} ms"
            for i in range(min(self._count[2], self.LIMIT))
        ]
        return out


def rss_by_mapping() -> dict[str, float]:
    """MB resident per kind of mapping (/proc/self/smaps): the brk heap (glibc's main arena),
    anonymous mappings (CPython's 1 MiB arenas, glibc's other arenas, thread stacks, large
    blocks), files (code and libraries)."""
    kinds: dict[str, float] = {"heap": 0.0, "anonymous": 0.0, "files": 0.0}
    kind = "files"
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if not head[0].endswith(":"):  # a mapping's first line: range, perms, ..., path
                path = head[5] if len(head) > 5 else ""
                kind = "heap" if path == "[heap]" else "anonymous" if not path else "files"
            elif head[0] == "Rss:":
                kinds[kind] += int(head[1]) / 1024
    return kinds


def rss_mb() -> float:
    return float(psutil.Process().memory_info().rss / 2**20)


def state(held: dict[str, Any], walk: bool) -> dict[str, Any]:
    from services.common.malloc import jemalloc_stats

    gc.collect()
    containers: dict[str, int] = {}
    for name, obj in held.items():
        containers.update(sized(obj, name, depth=2))
    return {
        "rss_mb": rss_mb(),
        "rss_by_mapping": rss_by_mapping(),
        "glibc": glibc_heap(),
        "jemalloc": jemalloc_stats(),
        "sqlite_mb": sqlite_mb(),
        "pymalloc": pymalloc_stats(),
        "objects": len(gc.get_objects()),
        "threads": threading.active_count(),
        "containers": containers,
        "metric_children": metric_children(),
        # the walk itself allocates (a path per object): only on request
        "large": large_containers() if walk else {},
    }


def grown(before: dict[str, int], after: dict[str, int], least: int = 1) -> dict[str, str]:
    return {
        k: f"{before.get(k, 0)} -> {v}"
        for k, v in sorted(after.items())
        if v - before.get(k, 0) >= least
    }


def serve_and_measure(args: argparse.Namespace) -> dict[str, Any]:
    from services.allocator.server import start_allocator, tune_interpreter
    from services.common.config import parse_service_args

    others = ("allocator", "gpulane") if args.serve == "nodeagent" else PEERS
    with bench_stack(others, args.intents + 100, args.backend) as (stack, home):
        os.environ.update(stack.env)
        launched = json.loads((home / "run" / "launcher.json").read_text())["pids"]
        if args.serve == "nodeagent":  # the allocator (another process) finds it on its port
            from services.nodeagent.server import start_nodeagent

            settings, _ = parse_service_args("nodeagent", [])
            agent = start_nodeagent(settings, port=settings.port)
            held = {"servicer": agent.servicer, "backend": agent.backend}
            other = psutil.Process(int(launched["allocator"]))
            try:
                return measure(held, stack.address("allocator"), other, args)
            finally:
                agent.stop(grace=1.0)
        settings, _ = parse_service_args("allocator", [])
        tune_interpreter()
        running = start_allocator(settings, metrics_port=0, start_loop=args.loop == "on")
        held = {"loop": running.handle.loop, "servicer": running.handle.servicer}
        other = psutil.Process(int(launched["nodeagent"]))
        try:
            return measure(held, running.address, other, args)
        finally:
            running.stop(grace=1.0)


def measure(
    held: dict[str, Any], address: str, other: psutil.Process, args: argparse.Namespace
) -> dict[str, Any]:
    """The reading before the client's submits and deletes and after them; `held`: the served
    objects whose containers are sized, `other`: the other service's process (its RSS)."""
    from services.common.malloc import jemalloc_stats
    from services.common.memory import release_freed_memory

    collections = Collections()  # its buffers before the first reading: not counted as grown
    time.sleep(args.settle)
    before = state(held, args.walk)
    types_before = type_counts()
    other_before = other.memory_info().rss / 2**20
    if args.trace:
        tracemalloc.start(args.trace_frames)
    gc.callbacks.append(collections)
    command = [sys.executable, __file__, "--client", address, "--intents", str(args.intents)]
    command += ["--loop", args.loop] + (["--reject"] if args.reject else [])
    cycles: list[dict[str, Any]] = []
    said: list[str] = []  # what the client printed, every round
    for _ in range(args.cycles):
        done = subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True)
        print(done.stdout, end="", file=sys.stderr)
        said += done.stdout.splitlines()
        time.sleep(args.settle)
        if args.cycles > 1:
            gc.collect()
            cycles.append(
                {
                    "rss_mb": rss_mb(),
                    "pymalloc": pymalloc_stats(),
                    "glibc": glibc_heap(),
                    "jemalloc": jemalloc_stats(),
                }
            )
    gc.callbacks.remove(collections)
    after = state(held, args.walk)
    types_after = type_counts()
    other_after = other.memory_info().rss / 2**20
    traced: list[str] = pinned_arenas() if args.arenas else []
    if args.trace:
        traced += survivors(args.top)
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)]
        )
        tracemalloc.stop()
        stats = snapshot.statistics("traceback")
        traced.append(
            f"traced since the submits, still allocated: {sum(s.size for s in stats) / 2**20:.1f} "
            f"MB in {sum(s.count for s in stats)} blocks"
        )
        for stat in stats[: args.top]:
            lines = [f"{stat.size / 1024:.0f} KiB in {stat.count} blocks"]
            lines += [f"    {line}" for line in stat.traceback.format()[-2 * args.trace_frames :]]
            traced.append("\n".join(lines))
        del snapshot
    trimmed = {
        "released": release_freed_memory(),
        "rss_mb": rss_mb(),
        "rss_by_mapping": rss_by_mapping(),
        "glibc": glibc_heap(),
        "threads": threading.active_count(),
    }
    return {
        "intents": args.intents,
        "rss_mb": {"before": before["rss_mb"], "after": after["rss_mb"]},
        "rss_by_mapping": {"before": before["rss_by_mapping"], "after": after["rss_by_mapping"]},
        "other_rss_mb": {"before": other_before, "after": other_after},
        "glibc": {"before": before["glibc"], "after": after["glibc"]},
        "jemalloc": {"before": before["jemalloc"], "after": after["jemalloc"]},
        "sqlite_mb": {"before": before["sqlite_mb"], "after": after["sqlite_mb"]},
        "pymalloc": {"before": before["pymalloc"], "after": after["pymalloc"]},
        "objects": {"before": before["objects"], "after": after["objects"]},
        "collections_during_client": collections.summary(),
        "threads": {"before": before["threads"], "after": after["threads"]},
        "types_grown": grown(types_before, types_after, least=50),
        "containers_grown": grown(before["containers"], after["containers"]),
        "metric_children_grown": grown(before["metric_children"], after["metric_children"]),
        "large_after": {k: v for k, v in after["large"].items() if k not in before["large"]},
        "after_another_trim": trimmed,
        "cycles": cycles,
        "client": said,
        "stored_after": len(held["loop"].store) if "loop" in held else None,
        "traced": traced,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--intents", type=int, default=10000)
    parser.add_argument(
        "--serve", default="allocator", choices=("allocator", "nodeagent"), help="served here"
    )
    parser.add_argument(
        "--backend", default="modeled", choices=("modeled", "real"), help="the node agent's"
    )
    parser.add_argument("--settle", type=float, default=5.0, help="seconds before each reading")
    parser.add_argument("--trace", action="store_true", help="tracemalloc from the submits on")
    parser.add_argument("--arenas", action="store_true", help="what sits in the emptiest arenas")
    parser.add_argument("--walk", action="store_true", help="find large containers by path")
    parser.add_argument("--trace-frames", type=int, default=6)
    parser.add_argument("--top", type=int, default=25, help="traced lines reported")
    parser.add_argument(
        "--loop",
        default="on",
        choices=("on", "off"),
        help="off: the allocator served without its control loop (the store and the RPCs alone)",
    )
    parser.add_argument(
        "--reject",
        action="store_true",
        help="every submit and delete refused: the same calls, nothing stored",
    )
    parser.add_argument(
        "--cycles", type=int, default=1, help="submit-and-delete rounds, a reading after each"
    )
    parser.add_argument("--client", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cycles < 1:
        parser.error("--cycles must be at least 1")
    if args.loop == "off" and args.serve != "allocator":
        parser.error("--loop off serves the allocator")
    if args.client:
        client(args.client, args.intents, args.settle, plan=args.loop == "on", reject=args.reject)
        return
    from services.common.malloc import reexec_with_jemalloc

    reexec_with_jemalloc()  # as the served services start (PARFUSION_MALLOC=system: without)
    report = serve_and_measure(args)
    traced = report.pop("traced")
    print(json.dumps(report, indent=2))
    for block in traced:
        print(block)


if __name__ == "__main__":
    main()
