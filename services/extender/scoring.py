"""Per-pod node decisions for /filter, /prioritize and /bind, from the node view and D-MUG.

Two layers. First the predicates only the extender can check: the node is in the view, it has
CPU units at all, and the GPU lane the intent asks for has its share free (kube-scheduler knows
nothing of lanes or shares). Then the allocator's placement core
(services/allocator/placement.py, D-MUG's own formulas evaluated across all candidates at once)
says whether the intent fits next to the node's resident intents: free units after what the
residents are committed to, the fewest units that meet the deadline (walking the degradation
ladder for ONLINE), the predicted deadline risk against the threshold; and its 0..10 score is
what /prioritize answers.

Failures are split the way kube-scheduler uses them: *unresolvable* when preempting pods on the
node could not help (the lane is not there, the deadline is out of reach even with the whole
node), *failed* otherwise (short of free units or share right now).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from services.allocator import placement
from services.allocator.model import DmugConfig, IntentSpec

from .nodeview import SHARE_UNITS_PER_GPU, NodeRecord

OK, FAILED, UNRESOLVABLE = 0, 1, 2
UNRESOLVABLE_CODES = frozenset({placement.NO_LANE, placement.UNREACHABLE})
UNKNOWN_NODE = "node not in the extender's node view (no Node object or telemetry yet)"


@dataclass(frozen=True, slots=True)
class ScoringConfig:
    dmug: DmugConfig = field(default_factory=DmugConfig)

    @property
    def risk_threshold(self) -> float:
        return self.dmug.risk_threshold


@dataclass(frozen=True, slots=True)
class NodeDecision:
    name: str
    outcome: int  # OK, FAILED, UNRESOLVABLE
    reason: str
    score: int  # 0..10; 0 for nodes that do not fit
    lane: str = ""  # the lane the intent's GPU share would use there
    slack_ms: float = 0.0
    deadline_risk: float = 0.0
    units: int = 0


def _lane_check(intent: IntentSpec, rec: NodeRecord) -> tuple[int, str, str]:
    """(outcome, lane, reason) for the intent's GPU share on this node."""
    need = intent.gpu_share * SHARE_UNITS_PER_GPU
    free_by_lane = rec.free_lane_units
    if intent.gpu_lane:
        free = free_by_lane.get(intent.gpu_lane)
        if free is None:
            return UNRESOLVABLE, "", f"GPU lane {intent.gpu_lane} not present on {rec.name}"
        if free + 1e-9 < need:
            return (
                FAILED,
                "",
                f"GPU lane {intent.gpu_lane} has {max(free, 0):.0f} share units free, needs {need:.0f}",
            )
        return OK, intent.gpu_lane, ""
    if not free_by_lane:
        return UNRESOLVABLE, "", f"no GPU lane with GPUs present on {rec.name}"
    lane, free = max(free_by_lane.items(), key=lambda kv: (kv[1], kv[0]))
    if free + 1e-9 < need:
        return FAILED, "", f"no GPU lane has {need:.0f} share units free (best {max(free, 0):.0f})"
    return OK, lane, ""


def decide(
    intent: IntentSpec, records: Sequence[NodeRecord | None], config: ScoringConfig
) -> list[NodeDecision]:
    """One decision per candidate, in order."""
    out: list[NodeDecision | None] = [None] * len(records)
    where: list[int] = []
    views: list[placement.NodeView] = []
    lanes: list[str] = []
    wants_gpu = intent.gpu_share > 0
    min_units = intent.min_units
    for i, rec in enumerate(records):
        if rec is None or rec.placement is None:
            out[i] = NodeDecision("", FAILED, UNKNOWN_NODE, 0)
            continue
        if rec.cpu_units < min_units:
            out[i] = NodeDecision(
                rec.name,
                UNRESOLVABLE,
                f"needs {min_units} CPU units, {rec.name} has {rec.cpu_units} in all",
                0,
            )
            continue
        lane = ""
        if wants_gpu:
            outcome, lane, reason = _lane_check(intent, rec)
            if outcome != OK:
                out[i] = NodeDecision(rec.name, outcome, reason, 0)
                continue
        where.append(i)
        views.append(rec.placement)
        lanes.append(lane)
    if views:
        s = placement.score_nodes_arrays(intent, views, None, config.dmug)
        fits = s.fits.tolist()
        codes = s.reason_code.tolist()
        scores = s.score.tolist()
        units = s.units.tolist()
        slack = s.slack_ms.tolist()
        risk = s.deadline_risk.tolist()
        for j, i in enumerate(where):
            name = views[j].name
            if fits[j]:
                out[i] = NodeDecision(
                    name, OK, "", scores[j], lanes[j], slack[j], risk[j], units[j]
                )
            else:
                reason = placement._reason(
                    codes[j], intent, views[j], units[j], int(s.level[j]), s, j
                )
                outcome = UNRESOLVABLE if codes[j] in UNRESOLVABLE_CODES else FAILED
                out[i] = NodeDecision(name, outcome, reason, 0, lanes[j], slack[j], risk[j])
    return [d for d in out if d is not None]
