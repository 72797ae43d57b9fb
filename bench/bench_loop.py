"""The allocator's control-loop tick, whole: store, conversion, policy, plans, metrics.

A real ControlLoop over a real IntentStore (SQLite in a temporary directory, removed after) with
N intents submitted through the store (40 % ONLINE, 10 % ROBOT, 5 % URGENT, 45 % BATCH, as in
bench_dmug.py), no peers (telemetry and pushes are the node agent's and gpulane's part). Timed:

- `steady`: ticks while the store is unchanged (what the loop does every 250 ms);
- `samples`: the same, with 3 new service-time samples for every intent before each tick
  (fed to the loop's predictor directly, untimed: the node agent's telemetry would bring them);
- `sampled, idle`: ticks after that, with the statistics in place but no new samples;
- `submit`: the tick right after one more intent is submitted;
- `25 submits`: the tick right after 25 more (what `bench_system.py`'s 100 SubmitIntent/s
  bring in one 250 ms period);
- `delete`: the tick right after one intent is deleted.

Each row gives the median and best tick (wall ms), the policy's own part (NodePlan.decision_ms),
the process's CPU time per tick (median; on a shared machine the fairer figure) and how many full (oldest-generation) garbage collections ran during those ticks.

    .venv/bin/python bench/bench_loop.py [--sizes 1000,10000] [--ticks 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from parfusion.v1 import intent_pb2  # noqa: E402
from services.allocator.loop import ControlLoop, LoopConfig  # noqa: E402
from services.allocator.store import IntentStore  # noqa: E402
from services.core.validation import normalize_intent  # noqa: E402

CLASSES = (
    (intent_pb2.WORKLOAD_CLASS_ONLINE,) * 8
    + (intent_pb2.WORKLOAD_CLASS_ROBOT,) * 2
    + (intent_pb2.WORKLOAD_CLASS_URGENT,)
    + (intent_pb2.WORKLOAD_CLASS_BATCH,) * 9
)


def make_intent(k: int, rng: random.Random) -> intent_pb2.ResourceIntent:
    cls = CLASSES[k % len(CLASSES)]
    low = rng.randint(1, 4)
    base = rng.uniform(5.0, 80.0)
    online = cls != intent_pb2.WORKLOAD_CLASS_BATCH
    intent = intent_pb2.ResourceIntent(
        id=f"loop-{k:05d}",
        name=f"w{k}",
        workload_class=cls,
        priority=rng.randint(0, 1000),
        parallelism=intent_pb2.Parallelism(min=low, max=low + rng.randint(0, 8)),
        speedup=intent_pb2.Speedup(parallel_fraction=rng.uniform(0.5, 0.98), base_service_ms=base),
        preemptible=not online or (k % 5 == 0 and cls != intent_pb2.WORKLOAD_CLASS_URGENT),
    )
    if online:
        intent.slo.deadline_ms = base * rng.uniform(0.25, 1.2)
        if cls == intent_pb2.WORKLOAD_CLASS_ONLINE:
            intent.demand.arrival_rate_per_s = rng.uniform(0.0, 5.0)
    else:
        intent.demand.work_units = 100
    return normalize_intent(intent)


BURST = 25  # intents submitted before the `25 submits` tick


class FullCollections:
    """Counts oldest-generation collections while installed."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 2:
            self.count += 1


def timed_tick(loop: ControlLoop) -> tuple[float, float, float]:
    """(tick wall ms, the policy's ms, the process's CPU ms) of one tick."""
    c0, t0 = time.process_time(), time.perf_counter()
    snapshot = loop.tick()
    wall = (time.perf_counter() - t0) * 1e3
    cpu = (time.process_time() - c0) * 1e3
    assert snapshot is not None, "the policy failed"
    return wall, snapshot.node_plan.decision_ms, cpu


def row(n: int, case: str, ticks: list[tuple[float, float, float]], full: int) -> str:
    walls = [w for w, _, _ in ticks]
    policy = statistics.median(p for _, p, _ in ticks)
    cpu = statistics.median(c for _, _, c in ticks)
    return (
        f"| {n:,} | {case} | {statistics.median(walls):.1f} ({min(walls):.1f}) | "
        f"{policy:.1f} | {cpu:.1f} | {len(ticks)} | {full} |\n"
    )


def measure(n: int, ticks: int, rounds: int, counter: FullCollections) -> None:
    """Every case for n intents, one table row each (a store in a temporary directory)."""
    rng = random.Random(7)
    extra = rounds * (1 + BURST)  # the submits timed after the n stored
    intents = [make_intent(k, rng) for k in range(n + extra)]
    with tempfile.TemporaryDirectory(prefix="parfusion-bench-loop-") as tmp:
        # room for the submits after the n stored: the store refuses past its limit
        store = IntentStore(Path(tmp) / "allocator.db", max_intents=max(n + extra, 1))
        try:
            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                list(pool.map(store.submit, intents[:n]))  # group-committed
            loop = ControlLoop(store, LoopConfig(cpu_units=max(64, n // 4)))
            for _ in range(3):  # the first tick builds everything; two more settle
                loop.tick()

            def case(name, count, before=None, settle=False):
                """Time `count` ticks, each after before(k) and, with settle, followed by an
                untimed tick (the change's own tick is timed, then back to steady)."""
                counter.count = 0
                timed = []
                for k in range(count):
                    if before is not None:
                        before(k)
                    timed.append(timed_tick(loop))
                    if settle:
                        loop.tick()
                sys.stdout.write(row(n, name, timed, counter.count))
                sys.stdout.flush()

            def samples(_k: int) -> None:
                for intent in intents[:n]:
                    base = intent.speedup.base_service_ms
                    times = [base * rng.uniform(0.8, 1.3) for _ in range(3)]
                    loop.predictor.observe_many(intent.id, times, units=2)

            case("steady", ticks)
            case("samples", ticks, samples)
            case("sampled, idle", ticks)
            case("submit", rounds, lambda k: store.submit(intents[n + k]), True)

            def burst(k: int) -> None:
                start = n + rounds + k * BURST
                for intent in intents[start : start + BURST]:
                    store.submit(intent)

            case(f"{BURST} submits", rounds, burst, True)
            case("delete", rounds, lambda k: store.delete(intents[k].id), True)
            loop.stop()
        finally:
            store.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000")
    ap.add_argument("--ticks", type=int, default=20, help="steady ticks timed per size")
    ap.add_argument("--rounds", type=int, default=5, help="submits (and deletes) timed per size")
    ns = ap.parse_args(argv)
    sys.stdout.write(
        "| intents | tick | wall ms, median (best) | policy ms, median | CPU ms, median | ticks | full GCs |\n"
        "|---|---|---|---|---|---|---|\n"
    )
    counter = FullCollections()
    gc.callbacks.append(counter)
    try:
        for n in [int(x) for x in ns.sizes.split(",")]:
            measure(n, ns.ticks, ns.rounds, counter)
    finally:
        gc.callbacks.remove(counter)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
