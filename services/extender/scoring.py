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

import numpy as np

from services.allocator import placement
from services.allocator.model import DmugConfig, IntentSpec

from .columns import NodeColumns
from .nodeview import SHARE_UNITS_PER_GPU

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


@dataclass
class Verdicts:
    """Decisions for one pod's candidates, as columns; reasons are shared strings by index (so
    kube-scheduler can group identical ones in its "0/N nodes are available" message)."""

    outcome: np.ndarray  # OK, FAILED, UNRESOLVABLE per candidate
    score: np.ndarray  # 0..10, 0 unless OK
    reason: np.ndarray  # index into reasons, -1 when OK
    reasons: list[str]
    lane: np.ndarray  # index into lanes, -1 when no GPU share
    lanes: list[str]
    slack_ms: np.ndarray
    deadline_risk: np.ndarray
    units: np.ndarray

    def __len__(self) -> int:
        return len(self.outcome)

    def at(self, i: int, name: str = "") -> NodeDecision:
        r = int(self.reason[i])
        lane = int(self.lane[i])
        return NodeDecision(
            name=name,
            outcome=int(self.outcome[i]),
            reason=self.reasons[r] if r >= 0 else "",
            score=int(self.score[i]),
            lane=self.lanes[lane] if lane >= 0 else "",
            slack_ms=float(self.slack_ms[i]),
            deadline_risk=float(self.deadline_risk[i]),
            units=int(self.units[i]),
        )

    def failures(self, names: Sequence[str], outcome: int) -> dict[str, str]:
        reasons = self.reasons
        picked = np.flatnonzero(self.outcome == outcome).tolist()
        codes = self.reason[picked].tolist()
        return {names[i]: reasons[c] for i, c in zip(picked, codes, strict=True)}


def decide(
    intent: IntentSpec, rows: np.ndarray, columns: NodeColumns, config: ScoringConfig
) -> Verdicts:
    """One verdict per candidate row (-1 = a node the view does not know), in order."""
    n = len(rows)
    reasons = [UNKNOWN_NODE]
    outcome = np.full(n, FAILED, dtype=np.int8)
    reason = np.zeros(n, dtype=np.int64)
    lane = np.full(n, -1, dtype=np.int64)
    score = np.zeros(n, dtype=np.int64)
    slack = np.zeros(n)
    risk = np.zeros(n)
    units = np.zeros(n, dtype=np.int64)
    lanes: list[str] = []
    r = np.where(rows >= 0, rows, 0)
    cpu = columns.cpu_units[r]
    klass = columns.klass[r]
    alive = (rows >= 0) & (cpu >= 0) & (klass >= 0)

    def refuse(mask: np.ndarray, code: int, text: str) -> None:
        nonlocal alive
        if mask.any():
            outcome[mask] = code
            reason[mask] = len(reasons)
            reasons.append(text)
            alive = alive & ~mask

    refuse(
        alive & (cpu < intent.min_units),
        UNRESOLVABLE,
        f"node has fewer than the intent's {intent.min_units} CPU units in all",
    )
    if intent.gpu_share > 0 and alive.any():
        need = intent.gpu_share * SHARE_UNITS_PER_GPU
        if intent.gpu_lane:
            lanes = [intent.gpu_lane]
            column = columns.lane_free.get(intent.gpu_lane)
            free = column[r] if column is not None else np.full(n, np.nan)
            best = np.zeros(n, dtype=np.int64)
            what = f"GPU lane {intent.gpu_lane}"
        else:
            lanes = sorted(columns.lane_free)
            if lanes:
                stacked = np.vstack([columns.lane_free[name][r] for name in lanes])
                filled = np.where(np.isnan(stacked), -np.inf, stacked)
                best = filled.argmax(axis=0)
                free = filled.max(axis=0)
                free = np.where(np.isinf(free), np.nan, free)
            else:
                free, best = np.full(n, np.nan), np.zeros(n, dtype=np.int64)
            what = "any GPU lane"
        absent = alive & np.isnan(free)
        refuse(absent, UNRESOLVABLE, f"{what} not present on node")
        refuse(
            alive & (free + 1e-9 < need),
            FAILED,
            f"{what} has fewer than the {need:.0f} share units the intent needs free",
        )
        lane = np.where(alive, best, -1)
    where = np.flatnonzero(alive)
    if len(where):
        classes, inverse = np.unique(klass[where], return_inverse=True)
        views = [columns.class_views[k] for k in classes.tolist()]
        s = placement.score_nodes_arrays(intent, views, None, config.dmug)
        fits = s.fits[inverse]
        ok = where[fits]
        outcome[ok] = OK
        reason[ok] = -1
        score[ok] = s.score[inverse][fits]
        slack[where] = s.slack_ms[inverse]
        risk[where] = s.deadline_risk[inverse]
        units[where] = s.units[inverse]
        if not fits.all():
            class_reason = np.full(len(classes), -1, dtype=np.int64)
            for j in np.flatnonzero(~s.fits).tolist():
                class_reason[j] = len(reasons)
                code = int(s.reason_code[j])
                reasons.append(
                    placement._reason(
                        code, intent, views[j], int(s.units[j]), int(s.level[j]), s, j
                    )
                )
            bad = where[~fits]
            bad_codes = s.reason_code[inverse][~fits]
            outcome[bad] = np.where(
                np.isin(bad_codes, list(UNRESOLVABLE_CODES)), UNRESOLVABLE, FAILED
            )
            reason[bad] = class_reason[inverse][~fits]
    return Verdicts(outcome, score, reason, reasons, lane, lanes, slack, risk, units)
