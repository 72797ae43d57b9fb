"""The D-MUG policy family: `parfusion` itself and the ablations that each switch one part off.

Each policy is D-MUG (services/core/dmug.py) with a DmugOptions and a set of cross-layer
knobs; comparing one against `parfusion` measures what that part is worth.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.core import dmug
from services.core.crosslayer import Knobs, decide
from services.core.memo import TickMemo
from services.core.model import PlanInput, PlanResult


@dataclass
class DmugPolicy:
    name: str
    kind: str
    description: str
    options: dmug.DmugOptions = field(default_factory=dmug.DmugOptions)
    knobs: Knobs = field(default_factory=Knobs)
    memo: TickMemo = field(default_factory=TickMemo, repr=False, compare=False)

    def allocate(self, state: PlanInput) -> PlanResult:
        table, plan = dmug.plan_units(state, self.options, self.memo)
        rank = dmug.tie_rank(table)
        return decide(state, table, plan, self.name, self.knobs, rank, self.memo)


def parfusion() -> DmugPolicy:
    return DmugPolicy(
        "parfusion",
        "parfusion",
        "D-MUG: deadline phase, preemption, degradation, marginal-utility greedy, cross-layer knobs",
    )


def no_crosslayer() -> DmugPolicy:
    return DmugPolicy(
        "no-crosslayer",
        "reference",
        "D-MUG pool sizes only: no CPU sets, nice, cgroup or GPU plans",
        # without the OS knobs batch cannot run in idle time: it holds units like anyone
        options=dmug.DmugOptions(idle_batch=False),
        knobs=Knobs(cross_layer=False, gpu_intent=False),
    )


def edf_only() -> DmugPolicy:
    return DmugPolicy(
        "edf-only",
        "ablation",
        "earliest deadline first, no marginal-utility phase (leftovers in deadline order)",
        options=dmug.DmugOptions(order="edf", marginal_phase=False),
    )


def no_gpuintent() -> DmugPolicy:
    return DmugPolicy(
        "no-gpuintent",
        "ablation",
        "D-MUG with GPU lane, share and stream priority left at their defaults",
        knobs=Knobs(cross_layer=True, gpu_intent=False),
    )


def no_predictor() -> DmugPolicy:
    return DmugPolicy(
        "no-predictor",
        "ablation",
        "D-MUG ignoring observed service times (base_service_ms only)",
        options=dmug.DmugOptions(use_predictor=False),
    )


def no_elastic() -> DmugPolicy:
    return DmugPolicy(
        "no-elastic",
        "ablation",
        "D-MUG with every intent non-elastic: units fixed at their first allocation",
        options=dmug.DmugOptions(elastic=False),
    )


def no_degrade() -> DmugPolicy:
    return DmugPolicy(
        "no-degrade",
        "ablation",
        "D-MUG that never walks the degradation ladder",
        options=dmug.DmugOptions(degrade=False),
    )


def no_preemption() -> DmugPolicy:
    return DmugPolicy(
        "no-preemption",
        "ablation",
        "D-MUG where urgent work never takes units from preemptible intents",
        options=dmug.DmugOptions(preempt=False),
    )
