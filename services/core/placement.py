"""Node placement scoring for the kube-scheduler extender (/filter, /prioritize).

For one pod's intent and each candidate node: would it fit, with how many units, at what
predicted slack, deadline risk and NMU, and a 0..10 score (kube-scheduler's MaxExtenderPriority).
The answer comes from D-MUG's own formulas (units_to_meet, IntentTable.latency/risk,
marginal_gains), evaluated once across all nodes with numpy, so thousands of nodes cost about
as much as a handful. ``score_placement`` is the single-node form: it first asks D-MUG how many units the
node's resident intents are committed to, then scores the remaining view exactly as the batch form.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np

from services.core.deadline import units_to_meet
from services.core.dmug import DmugOptions, plan_units
from services.core.formulas import (
    amdahl_speedup,
    combined_cpu_pressure,
    pressure_inflation,
    slack_ms,
)
from services.core.marginal import marginal_gains
from services.core.model import (
    DEGRADATION_ORDER,
    Disturbance,
    DmugConfig,
    IntentSpec,
    NodeState,
    PlacementScore,
    PlanInput,
    ServiceStats,
)
from services.core.table import IntentTable, build_table

MAX_SCORE = 10
HEADROOM_WEIGHT = 0.4  # score = 10 * ((1 - w) * quality + w * headroom)


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the extender knows about a node: free and total units, usable GPU lanes, pressure."""

    name: str
    free_units: int
    total_units: int
    lanes_available: frozenset[str] = frozenset()
    contention: float = 0.0
    disturbance: Disturbance = field(default_factory=Disturbance)


@dataclass
class NodeScores:
    """score_nodes' answer as columns (for callers that only need arrays)."""

    fits: np.ndarray
    reason_code: np.ndarray
    units: np.ndarray  # units the intent asks for on that node (deadline: the fewest that meet it)
    running_units: np.ndarray  # units it could run with there: min(cap, free), at least its min
    level: np.ndarray
    slack_ms: np.ndarray
    deadline_risk: np.ndarray
    nmu: np.ndarray
    score: np.ndarray


FITS, NO_LANE, NO_UNITS, UNREACHABLE, SHORT_FOR_DEADLINE, RISKY = range(6)


def committed_units(
    node: NodeState,
    resident: Sequence[IntentSpec],
    stats: Mapping[str, ServiceStats] | None,
    config: DmugConfig,
) -> int:
    """Units the node's resident intents hold after D-MUG's deadline and admission phases (what
    the marginal-utility phase hands out on top can be reclaimed, so it does not count)."""
    if not resident:
        return 0
    state = PlanInput(intents=tuple(resident), node=node, stats=stats or {}, config=config)
    table, plan = plan_units(state, DmugOptions(hysteresis=False))
    base = np.where(table.has_deadline, np.maximum(plan.need, table.min_units), table.min_units)
    return int(np.minimum(base, plan.units)[plan.units > 0].sum())


def view_of(
    node: NodeState,
    resident: Sequence[IntentSpec],
    stats: Mapping[str, ServiceStats] | None = None,
    config: DmugConfig | None = None,
) -> NodeView:
    config = config or DmugConfig()
    used = committed_units(node, resident, stats, config)
    return NodeView(
        name=node.name,
        free_units=max(int(node.cpu_units) - used, 0),
        total_units=int(node.cpu_units),
        lanes_available=frozenset(lane.name for lane in node.lanes if lane.available),
        contention=node.contention,
        disturbance=node.disturbance,
    )


_VIEW_COLUMNS = {
    name: attrgetter(name)
    for name in ("total_units", "free_units", "contention", "disturbance.cpu", "disturbance.gpu",
                 "disturbance.network")
}  # fmt: skip


def _view_columns(views: Sequence[NodeView]) -> dict[str, np.ndarray]:
    """The views as numpy columns, one C-level pass each."""
    n = len(views)
    return {
        name: np.fromiter(map(get, views), np.float64, n) for name, get in _VIEW_COLUMNS.items()
    }


def _table_for(
    intent: IntentSpec,
    views: Sequence[NodeView],
    cols: dict[str, np.ndarray],
    stats: ServiceStats | None,
    config: DmugConfig,
) -> IntentTable:
    """The intent replicated once per node, with that node's pressure and capacity."""
    n = len(views)
    total = cols["total_units"].astype(np.int64)
    probe = NodeState(name="", cpu_units=int(total.max()) if n else 0)
    one = build_table(
        PlanInput(intents=(intent,), node=probe, stats={intent.id: stats} if stats else {},
                  config=config)
    )  # fmt: skip
    contention = cols["contention"]
    d_cpu, d_gpu = cols["disturbance.cpu"], cols["disturbance.gpu"]
    d_net = cols["disturbance.network"]
    network_bound = float(intent.workload_class in ("ONLINE", "ROBOT"))
    inflation = pressure_inflation(
        combined_cpu_pressure(contention, d_cpu),
        d_gpu,
        d_net,
        config.contention_gain,
        float(one.uses_gpu[0]),
        network_bound,
    )
    cap = np.where(intent.max_units > 0, np.minimum(intent.max_units, total), total)
    values = {}
    for name in IntentTable.__dataclass_fields__:
        value = getattr(one, name)
        if name in ("specs", "level_factor"):
            values[name] = value
        elif isinstance(value, np.ndarray):
            values[name] = np.repeat(value, n, axis=0)
    values["specs"] = [intent] * n
    values["ids"] = [intent.id] * n
    values["inflation"] = np.asarray(inflation, dtype=np.float64) * np.ones(n)
    values["cap"] = cap.astype(np.int64)
    values["min_units"] = np.minimum(values["min_units"], np.maximum(cap, 1))
    values["prev_units"] = np.zeros(n, dtype=np.int64)
    values["prev_since"] = np.zeros(n, dtype=np.int64)
    values["has_prev"] = np.zeros(n, dtype=bool)
    return IntentTable(**values)


def score_nodes_arrays(
    intent: IntentSpec,
    views: Sequence[NodeView],
    stats: ServiceStats | None = None,
    config: DmugConfig | None = None,
) -> NodeScores:
    config = config or DmugConfig()
    n = len(views)
    cols = _view_columns(views)
    table = _table_for(intent, views, cols, stats, config)
    rows = np.arange(n)
    free = cols["free_units"].astype(np.int64)
    total = np.maximum(table.cap, 1)
    level = np.zeros(n, dtype=np.int64)
    code = np.full(n, FITS, dtype=np.int64)
    wants_gpu = bool(table.uses_gpu[0]) if n else False
    if wants_gpu:
        if intent.gpu_lane:
            lane = intent.gpu_lane
            lane_ok = np.fromiter((lane in v.lanes_available for v in views), bool, n)
        else:
            lane_ok = np.fromiter((bool(v.lanes_available) for v in views), bool, n)
    else:
        lane_ok = np.ones(n, dtype=bool)
    if intent.has_deadline and n:
        units, meets = units_to_meet(table, rows, 0)
        if intent.workload_class == "ONLINE":
            for lv in (1, 2):
                walk = ~meets & table.ladder[:, lv]
                if walk.any():
                    p2, m2 = units_to_meet(table, rows[walk], lv)
                    units[walk] = np.where(m2, p2, units[walk])
                    level[walk] = lv
                    meets[walk] = m2
        code = np.where(~meets, UNREACHABLE, code)
        code = np.where(meets & (units > free), SHORT_FOR_DEADLINE, code)
    else:
        units = np.minimum(table.cap, free)
    asked = np.maximum(units, table.min_units)
    code = np.where(free < table.min_units, NO_UNITS, code)
    code = np.where(~lane_ok, NO_LANE, code)
    # evaluated at what the node could give it (D-MUG's marginal phase hands free units on)
    running = np.maximum(np.minimum(table.cap, free), table.min_units)
    lat = table.latency(rows, running, level)
    slack = np.where(table.has_deadline, slack_ms(table.deadline, lat), 0.0)
    risk = table.risk(rows, running, level)
    code = np.where((code == FITS) & (risk > config.risk_threshold), RISKY, code)
    fits = code == FITS
    nmu = np.zeros(n)
    if n:
        kk = np.zeros(1, np.int64)
        last = np.maximum(running - 1, 0)  # the last unit the node would give it
        nmu = marginal_gains(table, rows, last, level, kk)[:, 0]
        nmu = np.where(np.isfinite(nmu), nmu, 0.0)
    if intent.has_deadline:
        quality = np.clip(1.0 - 2.0 * risk, 0.0, 1.0)
    else:
        quality = np.asarray(
            amdahl_speedup(table.f, np.maximum(running, 1)) / amdahl_speedup(table.f, total)
        )
    headroom = np.clip((free - running) / np.maximum(cols["total_units"], 1), 0.0, 1.0)
    raw = MAX_SCORE * ((1.0 - HEADROOM_WEIGHT) * quality + HEADROOM_WEIGHT * headroom)
    score = np.where(fits, np.clip(np.rint(raw), 1, MAX_SCORE), 0).astype(np.int64)
    return NodeScores(fits, code, asked, running, level, slack, risk, nmu, score)


def failure_reason(
    code: int, intent: IntentSpec, view: NodeView, units: int, level: int, s: NodeScores, i: int
) -> str:
    """Why node `view` (row i of `s`) does or does not fit `intent`, from its reason code."""
    if code == NO_LANE:
        lane = intent.gpu_lane or "any"
        return f"GPU lane {lane} unavailable on {view.name}"
    if code == NO_UNITS:
        return f"insufficient units: needs {intent.min_units}, {view.free_units} free"
    if code == UNREACHABLE:
        ladder = "/".join(intent.degradation)
        return (
            f"deadline {intent.deadline_ms:g} ms unreachable at max units even degraded ({ladder})"
        )
    if code == SHORT_FOR_DEADLINE:
        return (
            f"insufficient units: {units} needed for {intent.deadline_ms:g} ms, "
            f"{view.free_units} free"
        )
    if code == RISKY:
        return f"deadline risk {s.deadline_risk[i]:.2f} over threshold"
    lvl = DEGRADATION_ORDER[level]
    if intent.has_deadline:
        return (
            f"fits: {units} units meet {intent.deadline_ms:g} ms at {lvl} "
            f"(slack {s.slack_ms[i]:.1f} ms, risk {s.deadline_risk[i]:.2f})"
        )
    return f"fits: {units} units of {view.free_units} free"


def score_nodes(
    intent: IntentSpec,
    views: Sequence[NodeView],
    stats: ServiceStats | None = None,
    config: DmugConfig | None = None,
) -> list[PlacementScore]:
    """One PlacementScore per view, in order."""
    s = score_nodes_arrays(intent, views, stats, config)
    out = []
    for i, (fits, code, units, level, score) in enumerate(
        zip(
            s.fits.tolist(),
            s.reason_code.tolist(),
            s.units.tolist(),
            s.level.tolist(),
            s.score.tolist(),
            strict=True,
        )
    ):
        out.append(
            PlacementScore(
                fits=fits,
                reason=failure_reason(code, intent, views[i], units, level, s, i),
                nmu=float(s.nmu[i]),
                slack_ms=float(s.slack_ms[i]),
                deadline_risk=float(s.deadline_risk[i]),
                units=int(units),
                score=int(score),
            )
        )
    return out


def score_placement(
    intent: IntentSpec,
    node: NodeState,
    resident: Sequence[IntentSpec] = (),
    stats: Mapping[str, ServiceStats] | ServiceStats | None = None,
    config: DmugConfig | None = None,
) -> PlacementScore:
    """Would `intent` fit on `node` next to `resident`? The single-node form of score_nodes."""
    config = config or DmugConfig()
    table_stats = stats if isinstance(stats, Mapping) else {}
    own = stats if isinstance(stats, ServiceStats) else table_stats.get(intent.id)
    view = view_of(node, resident, table_stats, config)
    return score_nodes(intent, [view], own, config)[0]
