"""Per-pod node decisions for /filter, /prioritize and /bind, from the node view and D-MUG.

Two layers. The predicates that must hold are checked here on every candidate: the node is
known, it has CPU units left for the intent's guaranteed minimum, and the GPU lane the intent
asks for exists on it with the GPUs present and the share free. A node missing the lane (or
any GPU) is *unresolvable* (preempting pods would not help); a node short of free capacity
only *failed* (it might fit after preemption or once a pod leaves). Then the same D-MUG core
the allocator runs (services/allocator/placement.py) predicts the intent's slack and deadline
risk on each remaining node: a risk over ``risk_threshold`` fails the node, and the core's
0..10 placement score is what /prioritize answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from services.allocator.model import DmugConfig, IntentSpec, PlacementScore

from .nodeview import SHARE_UNITS_PER_GPU, NodeRecord

OK, FAILED, UNRESOLVABLE = 0, 1, 2


@dataclass(frozen=True, slots=True)
class ScoringConfig:
    risk_threshold: float = 0.5
    dmug: DmugConfig = field(default_factory=DmugConfig)


@dataclass(frozen=True, slots=True)
class NodeDecision:
    name: str
    outcome: int  # OK, FAILED, UNRESOLVABLE
    reason: str
    score: int  # 0..10; 0 for nodes that do not fit
    lane: str = ""  # the lane the intent's GPU share would use there
    slack_ms: float = 0.0
    deadline_risk: float = 0.0


def pick_lane(intent: IntentSpec, rec: NodeRecord) -> tuple[int, str, str]:
    """(outcome, lane, reason) for the intent's GPU share on this node."""
    if intent.gpu_share <= 0:
        return OK, "", ""
    need = intent.gpu_share * SHARE_UNITS_PER_GPU
    if intent.gpu_lane:
        lane = rec.lane(intent.gpu_lane)
        if lane is None or not lane.available:
            return UNRESOLVABLE, "", f"GPU lane {intent.gpu_lane!r} not present on node"
        free = rec.lane_free(intent.gpu_lane)
        if free + 1e-9 < need:
            return (
                FAILED,
                "",
                f"GPU lane {intent.gpu_lane!r} has {free:.0f} share units free, intent needs {need:.0f}",
            )
        return OK, intent.gpu_lane, ""
    present = [lane for lane in rec.lanes if lane.available]
    if not present:
        return UNRESOLVABLE, "", "no GPU lane with GPUs present on node"
    best = max(present, key=lambda lane: (rec.lane_free(lane.name), lane.name))
    free = rec.lane_free(best.name)
    if free + 1e-9 < need:
        return FAILED, "", f"no GPU lane has {need:.0f} share units free (best {free:.0f})"
    return OK, best.name, ""


def precheck(intent: IntentSpec, rec: NodeRecord | None) -> tuple[int, str, str]:
    if rec is None:
        return FAILED, "", "node not in the extender's node view (no Node object or telemetry yet)"
    if rec.cpu_units <= 0:
        return UNRESOLVABLE, "", "node reports no allocatable CPU units"
    if intent.min_units > rec.cpu_units:
        return (
            UNRESOLVABLE,
            "",
            f"intent needs {intent.min_units} CPU units, node has {rec.cpu_units} in all",
        )
    if intent.min_units > rec.free_units:
        return (
            FAILED,
            "",
            f"intent needs {intent.min_units} CPU units, {max(rec.free_units, 0)} free",
        )
    return pick_lane(intent, rec)


def decide(
    intent: IntentSpec, records: Sequence[NodeRecord | None], config: ScoringConfig
) -> list[NodeDecision]:
    """One decision per candidate, in order."""
    out: list[NodeDecision | None] = [None] * len(records)
    survivors: list[NodeRecord] = []
    where: list[int] = []
    lanes: list[str] = []
    for i, rec in enumerate(records):
        outcome, lane, reason = precheck(intent, rec)
        if outcome != OK or rec is None:
            out[i] = NodeDecision(rec.name if rec is not None else "", outcome, reason, 0)
        else:
            survivors.append(rec)
            where.append(i)
            lanes.append(lane)
    if survivors:
        scores = placement_scores(intent, survivors, lanes, config)
        for i, rec, lane, score in zip(where, survivors, lanes, scores, strict=True):
            out[i] = _from_score(rec.name, score, lane, config)
    return [d for d in out if d is not None]


def placement_scores(
    intent: IntentSpec, records: Sequence[NodeRecord], lanes: Sequence[str], config: ScoringConfig
) -> list[PlacementScore]:
    """D-MUG's verdict for the intent on each node (the allocator's placement core)."""
    try:
        from services.allocator import placement
    except ImportError:  # the placement core has not landed in this build: predicates only
        return [PlacementScore(True, "predicates only", 0.0, 0.0, 0.0, intent.min_units, 0)] * len(
            records
        )
    return [
        placement.score_placement(
            _with_lane(intent, lane), rec.state, rec.residents, {}, config.dmug
        )
        for rec, lane in zip(records, lanes, strict=True)
    ]


def _with_lane(intent: IntentSpec, lane: str) -> IntentSpec:
    return intent if not lane or lane == intent.gpu_lane else replace(intent, gpu_lane=lane)


def _from_score(name: str, score: PlacementScore, lane: str, config: ScoringConfig) -> NodeDecision:
    if not score.fits:
        return NodeDecision(
            name,
            FAILED,
            score.reason or "does not fit",
            0,
            lane,
            score.slack_ms,
            score.deadline_risk,
        )
    if score.deadline_risk > config.risk_threshold:
        return NodeDecision(
            name,
            FAILED,
            f"predicted deadline risk {score.deadline_risk:.2f} over {config.risk_threshold:.2f}"
            f" (slack {score.slack_ms:.1f} ms)",
            0,
            lane,
            score.slack_ms,
            score.deadline_risk,
        )
    return NodeDecision(
        name,
        OK,
        score.reason,
        max(0, min(10, int(score.score))),
        lane,
        score.slack_ms,
        score.deadline_risk,
    )
