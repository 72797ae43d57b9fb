"""Benchmark profiles and the phase catalogue (what runs, in which variants, how long)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    name: str
    loads: tuple[float, ...]  # online load as a fraction of the measured solo capacity
    repetitions: int
    warmup_s: float  # per phase, not measured (pool resize, numpy import, queues settle)
    drain_s: float  # after the window: time granted to finish requests that arrived in it
    default_seconds: float  # measuring budget when --seconds is not given
    sample_target: int  # online samples wanted per phase (a p99 needs ~2,000)


PROFILES: dict[str, Profile] = {
    "smoke": Profile("smoke", (0.5, 0.7), 2, 1.0, 1.0, 150.0, 300),
    "full": Profile("full", (0.3, 0.5, 0.7), 3, 2.0, 3.0, 2400.0, 2000),
}


@dataclass(frozen=True)
class PhaseSpec:
    """One phase: how the node is driven while the shared workload runs."""

    name: str
    kind: str  # "online-alone", "batch-alone", "static" (fixed plan) or "policy" (ticked)
    policy: str = ""  # allocator policy registry name for kind == "policy"
    batch_nice: int = 0
    batch_sched: str = "other"
    urgent_preempts_batch: bool = False  # the agent's urgent-over-batch gate (cross-layer)
    description: str = ""

    @property
    def co_run(self) -> bool:
        return self.kind in ("static", "policy")


ONLINE_ALONE = PhaseSpec(
    "online-alone", "online-alone", description="online pool alone on the arena"
)
BATCH_ALONE = PhaseSpec("batch-alone", "batch-alone", description="batch pool alone on the arena")
CO_RUN: tuple[PhaseSpec, ...] = (
    # Kubernetes default as the node sees it: both pods' pools run one worker per core, equal
    # nice, no affinity. (The allocator's `baseline` policy on a 2-unit node gives batch no
    # worker at all, which would not be a co-run.)
    PhaseSpec(
        "baseline",
        "static",
        description="Kubernetes default: static pools, equal nice, no affinity",
    ),
    PhaseSpec("fifo", "policy", policy="fifo", description="first come, first served units"),
    PhaseSpec("static", "policy", policy="static", description="preferred/min units, never adapts"),
    PhaseSpec(
        "no-crosslayer",
        "policy",
        policy="no-crosslayer",
        description="D-MUG pool sizes only, no OS knobs",
    ),
    PhaseSpec("nice19", "static", batch_nice=19, description="static pools, batch at nice 19"),
    PhaseSpec(
        "sched-idle",
        "static",
        batch_sched="idle",
        description="static pools, batch under SCHED_IDLE",
    ),
    PhaseSpec(
        "parfusion",
        "policy",
        policy="parfusion",
        urgent_preempts_batch=True,
        description="D-MUG on measured latency every tick: pool sizes, cpu sets, nice / scheduler class, urgent preempts batch",
    ),
)
STATIC_KNOBS = ("nice19", "sched-idle")
ALL_PHASES: tuple[PhaseSpec, ...] = (ONLINE_ALONE, BATCH_ALONE, *CO_RUN)
BY_NAME = {p.name: p for p in ALL_PHASES}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--seconds", type=float, help="measuring budget for the whole run (default: the profile's)"
    )
    parser.add_argument("--profile", choices=sorted(PROFILES), default="smoke")
    parser.add_argument(
        "--loads", help="comma-separated online loads, e.g. 0.5,0.7 (default: the profile's)"
    )
    parser.add_argument(
        "--repetitions", type=int, help="repetitions (default: the profile's; >= 2 for intervals)"
    )
    parser.add_argument("--phases", help="comma-separated co-run phases to run (default: all)")
    parser.add_argument(
        "--warmup",
        type=float,
        help="unmeasured seconds at the start of each phase (default: the profile's)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--arena-cores", type=int, help="k most idle cores (default nodeagent.arena_cores; 0 = all)"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
