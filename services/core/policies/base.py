"""The policy contract every plugin implements."""

from __future__ import annotations

from typing import Protocol

from services.core.model import PlanInput, PlanResult


class Policy(Protocol):
    """Turns the tick's intents, node state and predictor stats into one Decision per intent.

    Contract: pure and deterministic (same PlanInput -> same PlanResult); never hands out more
    than node.cpu_units units in total; every intent gets a Decision, with 0 <= units <= its cap
    (0 only when preempted or not admitted); GPU shares per lane never exceed the lane's units.

    `kind` says where the policy sits in the comparison: "parfusion" (D-MUG itself), "reference"
    (what a node does without it) or "ablation" (D-MUG with one part removed); `description` is
    one line saying what it does or removes. Factories live in registry.POLICIES.
    """

    name: str
    kind: str  # "parfusion", "reference" or "ablation"
    description: str

    def allocate(self, state: PlanInput) -> PlanResult: ...
