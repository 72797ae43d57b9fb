"""SHA-256 over the reprs of every policy's PlanResults on random chained ticks.

Run it in two checkouts with the same seed: equal digests mean the two codes give the very
same PlanResults (every field, floats by their repr) on every instance. Each instance is a
random mix of bench_dmug.py's synthetic intents (some non-elastic, light online streams, GPU
lanes that exist, one without GPUs, requests without a lane) on a node with random units, CPU
ids and pressure; every policy runs 6 chained ticks on one instance of the policy (so its memo
is used), with observed service times from tick 3, a changed spec at tick 4 and a halved node
at tick 5.

    .venv/bin/python bench/plan_digest.py [--seed 1] [--instances 60]
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import random
import sys
from pathlib import Path

# digest the checkout this script is in, not whichever copy the environment has installed
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parent))

from bench_dmug import make_intents  # noqa: E402

from services.core.model import (  # noqa: E402
    DmugConfig,
    LaneCapacity,
    NodeState,
    PlanInput,
    ServiceStats,
)
from services.core.policies.registry import POLICIES  # noqa: E402

LANES = (
    LaneCapacity("infer", (0, 1), 200),
    LaneCapacity("train", (2,), 100),
    LaneCapacity("gone", (), 100),  # a lane without GPUs
)
DEADLINE_CLASSES = ("ONLINE", "ROBOT", "URGENT")


def instance(rng: random.Random) -> tuple[tuple, NodeState, DmugConfig]:
    n = rng.choice([1, 2, 3, 5, 8, 13, 30, 60, 120])
    intents = []
    for s in make_intents(n, random.Random(rng.randrange(10**6))):
        rate = rng.choice([0.0, 0.001, 0.5, 30.0]) if s.workload_class in DEADLINE_CLASSES else 0.0
        lane = rng.choice(["", "infer", "train", "gone"]) if rng.random() < 0.2 else s.gpu_lane
        share = rng.choice([0.0, 0.1, 0.5]) if rng.random() < 0.2 else s.gpu_share
        intents.append(
            dataclasses.replace(
                s, elastic=rng.random() > 0.15, arrival_rate_per_s=rate, gpu_lane=lane,
                gpu_share=share,
            )
        )  # fmt: skip
    units = max(1, int(sum(s.min_units for s in intents) * rng.choice([0.3, 0.5, 1, 1.5, 2, 3])))
    node = NodeState(
        name="digest", cpu_units=units, cpu_ids=tuple(range(rng.choice([0, 4, 16, 64]))),
        lanes=LANES, contention=rng.choice([0.0, 0.3, 0.9]),
    )  # fmt: skip
    config = DmugConfig()
    if rng.random() < 0.3:
        config = DmugConfig(light_load_cores=0.5, hysteresis_dwell_ticks=2)
    return tuple(intents), node, config


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--instances", type=int, default=60)
    ns = ap.parse_args(argv)
    rng = random.Random(ns.seed)
    digest = hashlib.sha256()
    results = 0
    for k in range(ns.instances):
        specs, node, config = instance(rng)
        for factory in POLICIES.values():
            policy, previous, stats, current = factory(), None, {}, specs
            for tick in range(6):
                if tick == 3:
                    stats = {
                        s.id: ServiceStats(
                            mean_ms=s.base_service_ms * rng.uniform(0.5, 2.0),
                            p95_ms=s.base_service_ms * 2.5, p99_ms=s.base_service_ms * 3.0,
                            count=rng.choice([3, 50]), observed_units=rng.randint(1, 4),
                        )
                        for s in current
                        if rng.random() < 0.5
                    }  # fmt: skip
                if tick == 4 and len(current) > 1:
                    current = (*current[:-1], dataclasses.replace(current[-1], priority=999))
                at = (
                    node
                    if tick < 5
                    else dataclasses.replace(node, cpu_units=max(1, node.cpu_units // 2))
                )
                state = PlanInput(
                    intents=current, node=at, stats=stats, previous=previous, tick=tick,
                    config=config,
                )  # fmt: skip
                result = policy.allocate(state)
                digest.update(repr(result).encode())
                results += 1
                previous = result.by_id()
        sys.stderr.write(f"\rinstance {k + 1}/{ns.instances}")
    sys.stderr.write("\n")
    print(f"{results} PlanResults, seed {ns.seed}: sha256 {digest.hexdigest()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
