"""Per-pod node decisions for /filter, /prioritize and /bind, from the node view and D-MUG.

Two layers. First the predicates only the extender can check: the node is in the view, it has
CPU units at all, and the GPU lane the intent asks for has its share free (kube-scheduler knows
nothing of lanes or shares). Then the allocator's placement core
(services/core/placement.py, D-MUG's own formulas evaluated across all candidates at once)
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

from services.core import placement
from services.core.model import DmugConfig, IntentSpec

from .columns import NodeColumns
from .nodeview import SHARE_UNITS_PER_GPU

OK, FAILED, UNRESOLVABLE = 0, 1, 2
UNRESOLVABLE_CODES = frozenset({placement.NO_LANE, placement.UNREACHABLE})
UNKNOWN_NODE = "node not in the extender's node view (no Node object or telemetry yet)"


DEFAULT_SHORTLIST = 32


@dataclass(frozen=True, slots=True)
class ScoringConfig:
    dmug: DmugConfig = field(default_factory=DmugConfig)
    # /filter keeps at most this many feasible nodes, the best for the intent (0: every one):
    # kube-scheduler then scores a shortlist instead of every feasible node (docs/kubernetes.md)
    shortlist: int = DEFAULT_SHORTLIST

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


@dataclass(frozen=True, slots=True)
class ClassScore:
    """The placement core's answer for one intent on one placement class of nodes."""

    fits: bool
    outcome: int
    score: int
    slack_ms: float
    deadline_risk: float
    units: int
    reason: str


ClassScores = dict[int, ClassScore]  # placement class id -> score, for one intent


def _score_classes(
    intent: IntentSpec, classes: list[int], columns: NodeColumns, config: ScoringConfig
) -> ClassScores:
    views = [columns.class_views[c] for c in classes]
    s = placement.score_nodes_arrays(intent, views, None, config.dmug)
    out: ClassScores = {}
    for j, c in enumerate(classes):
        fits = bool(s.fits[j])
        code = int(s.reason_code[j])
        out[c] = ClassScore(
            fits=fits,
            outcome=OK if fits else (UNRESOLVABLE if code in UNRESOLVABLE_CODES else FAILED),
            score=int(s.score[j]) if fits else 0,
            slack_ms=float(s.slack_ms[j]),
            deadline_risk=float(s.deadline_risk[j]),
            units=int(s.units[j]),
            reason=""
            if fits
            else placement.failure_reason(
                code, intent, views[j], int(s.units[j]), int(s.level[j]), s, j
            ),
        )
    return out


def decide(
    intent: IntentSpec,
    rows: np.ndarray,
    columns: NodeColumns,
    config: ScoringConfig,
    cache: ClassScores | None = None,
) -> Verdicts:
    """One verdict per candidate row (-1 = a node the view does not know), in order.

    ``cache``: this intent's scores per placement class from earlier calls. A class is defined by
    the D-MUG view's content, so its score for a given intent never goes stale; /filter,
    /prioritize and /bind for one pod (and its replicas) share one."""
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
        table = cache if cache is not None else {}
        class_list = classes.tolist()
        missing = [c for c in class_list if c not in table]
        if missing:
            table.update(_score_classes(intent, missing, columns, config))
        scored = [table[c] for c in class_list]
        fits = np.array([e.fits for e in scored], dtype=bool)[inverse]
        ok = where[fits]
        outcome[ok] = OK
        reason[ok] = -1
        score[ok] = np.array([e.score for e in scored], dtype=np.int64)[inverse][fits]
        slack[where] = np.array([e.slack_ms for e in scored])[inverse]
        risk[where] = np.array([e.deadline_risk for e in scored])[inverse]
        units[where] = np.array([e.units for e in scored], dtype=np.int64)[inverse]
        if not fits.all():
            class_outcome = np.empty(len(scored), dtype=np.int8)
            class_reason = np.full(len(scored), -1, dtype=np.int64)
            for j, e in enumerate(scored):
                class_outcome[j] = e.outcome
                if not e.fits:
                    class_reason[j] = len(reasons)
                    reasons.append(e.reason)
            bad = where[~fits]
            outcome[bad] = class_outcome[inverse][~fits]
            reason[bad] = class_reason[inverse][~fits]
    return Verdicts(outcome, score, reason, reasons, lane, lanes, slack, risk, units)
