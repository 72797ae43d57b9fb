"""D-MUG decision time: one tick of the `parfusion` policy for 10 .. 10,000 intents.

Each size runs with units = 2 x the sum of the intents' minimums (plenty: the marginal-utility
phase at work) and 1/2 of it (scarce: admission, preemption and degradation at work), cold (no
previous plan, a fresh policy instance each repeat: nothing kept from an earlier tick) and
steady (the allocator loop's case: one policy instance, the same spec objects, each repeat one
more tick whose previous plan is the tick before's result, so hysteresis is on and the policy's
memo of its last tick is used). The table shows medians over repeats of the whole allocate()
call and of the unit allocation alone (plan_units, without materialising Decision
objects), wall-clock and CPU time, and the best (least disturbed) wall time of the repeats;
every call is timed with the cyclic collector paused, as the allocator's loop runs a tick.

    .venv/bin/python bench/bench_dmug.py [--sizes 10,100,1000,10000] [--repeats 15] [--seed 7]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

# measure the checkout this script is in, not whichever copy the environment has installed
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.allocator.gcpause import cyclic_gc_paused
from services.core.dmug import plan_units, tie_rank
from services.core.marginal import MarginalPhase, marginal_phase_fast
from services.core.model import IntentSpec, LaneCapacity, NodeState, PlanInput
from services.core.policies.registry import get_policy
from tests.core.dmug_reference import marginal_phase_reference

CLASSES = ("ONLINE",) * 8 + ("ROBOT",) * 2 + ("URGENT",) + ("BATCH",) * 9


def make_intents(n: int, rng: random.Random) -> list[IntentSpec]:
    out = []
    for k in range(n):
        cls = CLASSES[k % len(CLASSES)]
        mn = rng.randint(1, 4)
        base = rng.uniform(5.0, 80.0)
        f = rng.uniform(0.5, 0.98)
        deadline = 0.0
        if cls != "BATCH":
            # reachable at a few units for most intents, out of reach for some
            deadline = base * rng.uniform(0.25, 1.2)
        out.append(
            IntentSpec(
                id=f"i{k:05d}",
                name=f"w{k}",
                workload_class=cls,  # type: ignore[arg-type]
                priority=rng.randint(0, 1000),
                deadline_ms=deadline,
                min_units=mn,
                max_units=mn + rng.randint(0, 8),
                parallel_fraction=f,
                base_service_ms=base,
                arrival_rate_per_s=rng.uniform(0.0, 5.0) if cls == "ONLINE" else 0.0,
                gpu_lane="infer" if k % 8 == 0 else "",
                gpu_share=0.25 if k % 8 == 0 else 0.0,
                degradation=("NORMAL", "FP16", "INT8") if k % 3 == 0 else ("NORMAL",),
                preemptible=cls == "BATCH" or k % 5 == 0,
                seq=k,
            )
        )
    return out


def make_node(units: int) -> NodeState:
    lanes = (LaneCapacity("infer", (0, 1), 200), LaneCapacity("train", (2,), 100))
    return NodeState(name="bench", cpu_units=units, cpu_ids=tuple(range(16)), lanes=lanes)


class Ticks:
    """The allocator loop's steady state: one policy instance, the same specs and node, each
    tick fed the previous tick's plan (its by_id built outside the timed call, as in
    services/allocator/loop.py)."""

    def __init__(self, policy, first: PlanInput) -> None:
        self.policy, self.first = policy, first
        self.result = policy.allocate(first)
        self.upcoming = first

    def prepare(self) -> None:
        self.upcoming = dataclasses.replace(
            self.first, previous=self.result.by_id(), tick=self.upcoming.tick + 1
        )

    def run(self) -> None:
        self.result = self.policy.allocate(self.upcoming)


def median_ms(fn, repeats: int, prepare=None) -> tuple[float, float, float]:
    """Median wall and CPU milliseconds of fn over repeats, and the best (least disturbed) wall."""
    wall, cpu = [], []
    for _ in range(repeats):
        if prepare is not None:
            prepare()
        with cyclic_gc_paused():  # as the allocator's loop runs a tick
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - w0)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3, min(wall) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10,100,1000,10000")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--seed", type=int, default=7)
    ns = ap.parse_args(argv)
    policy = get_policy("parfusion")
    header = (
        f"{'intents':>8} {'case':>7} {'tick':>6} {'units':>7} "
        f"{'allocate ms':>12} {'best':>7} {'(cpu)':>7} {'plan_units ms':>14} {'best':>7} {'(cpu)':>7} "
        f"{'granted':>8} {'at risk':>8} {'degr':>5} {'preempt':>8}"
    )
    sys.stdout.write(header + "\n")
    for n in [int(x) for x in ns.sizes.split(",")]:
        intents = make_intents(n, random.Random(ns.seed))
        total_min = sum(s.min_units for s in intents)
        for case, units in (("plenty", 2 * total_min), ("scarce", max(total_min // 2, 1))):
            cold = PlanInput(intents=intents, node=make_node(units))
            repeats = ns.repeats if n <= 1000 else max(ns.repeats // 2, 5)
            for tick in ("cold", "steady"):
                if tick == "cold":
                    a_wall, a_cpu, a_best = median_ms(
                        lambda s=cold: get_policy("parfusion").allocate(s), repeats
                    )
                    p_wall, p_cpu, p_best = median_ms(lambda s=cold: plan_units(s), repeats)
                    r = policy.allocate(cold)
                else:
                    loop = Ticks(get_policy("parfusion"), cold)
                    a_wall, a_cpu, a_best = median_ms(loop.run, repeats, loop.prepare)
                    r = loop.result
                    loop.prepare()
                    state = loop.upcoming
                    # the next tick's decision, with the memo as that tick finds it (code from
                    # before the memo has none: then plain plan_units)
                    kept = getattr(loop.policy, "memo", None)
                    memo = {"memo": dataclasses.replace(kept)} if kept is not None else {}
                    p_wall, p_cpu, p_best = median_ms(
                        lambda s=state, m=memo: plan_units(s, **m), repeats
                    )
                granted = sum(d.units for d in r.decisions)
                risky = sum(1 for d in r.decisions if d.deadline_risk > 0.5)
                sys.stdout.write(
                    f"{n:>8} {case:>7} {tick:>6} {units:>7} {a_wall:>12.3f} {a_best:>7.3f} "
                    f"{a_cpu:>7.3f} {p_wall:>14.3f} {p_best:>7.3f} {p_cpu:>7.3f} {granted:>8} {risky:>8} "
                    f"{r.degradations:>5} {r.preemptions:>8}\n"
                )
                sys.stdout.flush()
    sys.stdout.write(
        "\nmarginal-utility phase alone (plenty, cold): water-filling vs the reference heap greedy\n"
        f"{'intents':>8} {'budget':>7} {'water-fill ms':>14} {'heap ms':>9} {'equal':>6}\n"
    )
    for n in [int(x) for x in ns.sizes.split(",")]:
        intents = make_intents(n, random.Random(ns.seed))
        total_min = sum(s.min_units for s in intents)
        state = PlanInput(intents=intents, node=make_node(2 * total_min))
        table, plan = plan_units(state)
        # the tick's phase 3: running intents from what phases 1-2 gave them
        rows = np.flatnonzero((plan.units > 0) & (plan.preempted_units == 0))
        dl = table.has_deadline[rows]
        start = np.where(
            dl, np.maximum(plan.need[rows], table.min_units[rows]), table.min_units[rows]
        )
        phase = MarginalPhase(
            rows=rows,
            start=start,
            level=plan.level[rows],
            rank=tie_rank(table),
            budget=int(state.node.cpu_units - start.sum()),
        )
        f_wall, _, _ = median_ms(lambda t=table, p=phase: marginal_phase_fast(t, p), ns.repeats)
        h_wall, _, _ = median_ms(
            lambda t=table, p=phase: marginal_phase_reference(t, p), 3 if n >= 1000 else 7
        )
        same = bool(
            (marginal_phase_fast(table, phase) == marginal_phase_reference(table, phase)).all()
        )
        sys.stdout.write(f"{n:>8} {phase.budget:>7} {f_wall:>14.3f} {h_wall:>9.3f} {same!s:>6}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
