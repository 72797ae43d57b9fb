"""D-MUG properties: capacity, bounds, optimality on concave instances, determinism, preemption,
degradation, hysteresis, and the water-filling fast path against the reference heap greedy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.core.deadline import units_to_meet
from services.core.dmug import plan_units, tie_rank
from services.core.formulas import (
    LATENCY_CEILING_MS,
    amdahl_speedup,
    deadline_risk,
    latency_inflation,
    predicted_latency_ms,
    priority_weight,
    service_at_one_unit,
)
from services.core.marginal import MarginalPhase, marginal_phase_fast
from services.core.model import (
    Decision,
    Disturbance,
    DmugConfig,
    IntentSpec,
    NodeState,
    PlanInput,
    ServiceStats,
)
from services.core.policies.registry import get_policy
from services.core.table import build_table
from services.core.waterfill import iron_rows, select_increments
from tests.core.dmug_reference import marginal_phase_reference, select_increments_heap

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CLASSES = ("ONLINE", "BATCH", "ROBOT", "URGENT")
LADDERS = (("NORMAL",), ("NORMAL", "FP16"), ("NORMAL", "FP16", "INT8"), ("NORMAL", "INT8"))


@st.composite
def intents(draw, max_n: int = 8, classes=CLASSES):
    n = draw(st.integers(0, max_n))
    out = []
    for k in range(n):
        cls = draw(st.sampled_from(classes))
        mn = draw(st.integers(1, 4))
        out.append(
            IntentSpec(
                id=f"i{k}",
                name=f"w{k}",
                workload_class=cls,
                priority=draw(st.integers(0, 1000)),
                deadline_ms=0.0 if cls == "BATCH" else draw(st.floats(1.0, 200.0)),
                min_units=mn,
                max_units=draw(st.sampled_from([0, mn, mn + 1, mn + 3, mn + 8])),
                parallel_fraction=draw(st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0])),
                base_service_ms=draw(st.floats(1.0, 200.0)),
                arrival_rate_per_s=draw(st.sampled_from([0.0, 1.0, 20.0])),
                degradation=draw(st.sampled_from(LADDERS)),
                preemptible=draw(st.booleans()),
                elastic=draw(st.booleans()),
                seq=draw(st.integers(0, 5)),
            )
        )
    return out


@st.composite
def plan_inputs(draw, max_n: int = 8, classes=CLASSES):
    specs = draw(intents(max_n, classes))
    units = draw(st.integers(0, 40))
    node = NodeState(
        name="n",
        cpu_units=units,
        cpu_ids=tuple(range(draw(st.integers(0, 8)))),
        contention=draw(st.sampled_from([0.0, 0.3])),
        disturbance=Disturbance(cpu=draw(st.sampled_from([0.0, 0.5])), network=0.2),
    )
    previous = {}
    for s in specs:
        if draw(st.booleans()):
            previous[s.id] = Decision(
                intent_id=s.id,
                units=draw(st.integers(0, 10)),
                since_tick=draw(st.integers(0, 10)),
            )
    stats = {}
    for s in specs:
        if draw(st.booleans()):
            mean = draw(st.floats(1.0, 100.0))
            stats[s.id] = ServiceStats(
                mean_ms=mean, p95_ms=mean * 1.5, p99_ms=mean * 2.0, count=draw(st.integers(1, 500)),
                observed_units=draw(st.integers(1, 4)),
            )  # fmt: skip
    return PlanInput(
        intents=specs, node=node, stats=stats, previous=previous, tick=draw(st.integers(0, 12))
    )


def cap_of(spec: IntentSpec, units: int) -> int:
    return min(spec.max_units, units) if spec.max_units > 0 else units


@SETTINGS
@given(plan_inputs())
def test_capacity_bounds_and_determinism(state):
    result = get_policy("parfusion").allocate(state)
    units = state.node.cpu_units
    assert sum(d.units for d in result.decisions) <= units
    for spec, d in zip(state.intents, result.decisions, strict=True):
        cap = cap_of(spec, units)
        assert 0 <= d.units <= cap
        assert d.units == 0 or d.units >= min(spec.min_units, cap)
        assert d.nice >= 0
    assert get_policy("parfusion").allocate(state) == result


@SETTINGS
@given(plan_inputs(max_n=10))
def test_urgent_takes_units_only_from_work_that_may_yield(state):
    result = get_policy("parfusion").allocate(state)
    specs = {s.id: s for s in state.intents}
    by_id = result.by_id()
    assert result.preemptions == sum(1 for d in result.decisions if d.preempted_units > 0)
    for d in result.decisions:
        if d.preempted_units > 0:
            s = specs[d.intent_id]
            assert s.workload_class != "URGENT" and "urgent" in d.reason
            if s.preemptible:  # a preemptible victim loses every unit
                assert d.units == 0 and d.state == "PREEMPTED"
            else:  # elastic deadline work gives up only what it holds above its minimum
                assert s.elastic and s.workload_class in ("ONLINE", "ROBOT")
                assert d.units >= min(s.min_units, cap_of(s, state.node.cpu_units))
    if result.preemptions:
        assert any(specs[d.intent_id].workload_class == "URGENT" for d in result.decisions)

    # a non-preemptible incumbent keeps at least its minimum when the floors fit (an elastic
    # one floors at its minimum, a fixed-size one at what it held, raised to its minimum)
    def floor(s: IntentSpec, held: int) -> int:
        cap = cap_of(s, state.node.cpu_units)
        return (
            min(s.min_units, cap)
            if s.elastic
            else min(max(held, s.min_units), max(cap, s.min_units))
        )

    floors = sum(floor(specs[i], d.units) for i, d in state.previous.items() if d.units > 0)
    if floors <= state.node.cpu_units:
        for i, prev in state.previous.items():
            s = specs[i]
            if prev.units > 0 and not s.preemptible:
                # its pool keeps the minimum (light work runs it without holding units)
                assert by_id[i].pool_size >= min(s.min_units, cap_of(s, state.node.cpu_units))
    assert get_policy("no-preemption").allocate(state).preemptions == 0


@SETTINGS
@given(plan_inputs(max_n=8))
def test_degradation_only_when_unreachable_at_max_units(state):
    result = get_policy("parfusion").allocate(state)
    table = build_table(state)
    for i, (spec, d) in enumerate(zip(state.intents, result.decisions, strict=True)):
        if d.degradation != "NORMAL":
            assert spec.workload_class == "ONLINE" and d.degradation in spec.degradation
            cap = int(table.cap[i])
            assert float(table.latency(np.array([i]), np.array([cap]), 0)[0]) > spec.deadline_ms
    assert get_policy("no-degrade").allocate(state).degradations == 0


def batch_utility(spec: IntentSpec, units: int, cap: int) -> float:
    f = spec.parallel_fraction
    w = priority_weight(spec.priority)
    return w * amdahl_speedup(f, units) / amdahl_speedup(f, max(cap, 1))


@settings(max_examples=50, deadline=None)
@given(intents(max_n=3, classes=("BATCH",)), st.integers(1, 12))
def test_greedy_equals_brute_force_on_concave_instances(specs, units):
    if not specs or sum(s.min_units for s in specs) > units:
        return
    caps = [cap_of(s, units) for s in specs]
    mins = [min(s.min_units, c) for s, c in zip(specs, caps, strict=True)]
    state = PlanInput(intents=specs, node=NodeState(name="n", cpu_units=units))
    result = get_policy("parfusion").allocate(state)
    got = sum(
        batch_utility(s, d.units, c) for s, d, c in zip(specs, result.decisions, caps, strict=True)
    )
    best = max(
        sum(batch_utility(s, u, c) for s, u, c in zip(specs, alloc, caps, strict=True))
        for alloc in itertools.product(*[range(m, c + 1) for m, c in zip(mins, caps, strict=True)])
        if sum(alloc) <= units
    )
    assert got == pytest.approx(best, rel=1e-9, abs=1e-12)


@st.composite
def marginal_phases(draw):
    state = draw(plan_inputs(max_n=9))
    table = build_table(state)
    if table.n == 0:
        return table, None
    rows = np.arange(table.n)
    start = np.array([draw(st.integers(1, max(int(c), 1))) for c in table.cap], dtype=np.int64)
    start = np.minimum(start, table.cap)
    level = np.array([draw(st.integers(0, 2)) for _ in rows], dtype=np.int64)
    phase = MarginalPhase(
        rows=rows,
        start=start,
        level=level,
        rank=tie_rank(table),
        budget=draw(st.integers(0, 60)),
        hysteresis=draw(st.booleans()),
        tick=state.tick,
        config=DmugConfig(),
        late=draw(st.sampled_from([None, "random"]))
        and np.array([draw(st.booleans()) for _ in rows], dtype=bool),
    )
    return table, phase


@SETTINGS
@given(marginal_phases())
def test_water_filling_equals_heap_greedy(case):
    table, phase = case
    if phase is None:
        return
    fast = marginal_phase_fast(table, phase)
    reference = marginal_phase_reference(table, phase)
    assert fast.tolist() == reference.tolist()
    assert fast.sum() <= phase.budget
    assert np.all(phase.start + fast <= np.maximum(table.cap, phase.start))


@SETTINGS
@given(
    st.lists(
        st.lists(st.integers(0, 6), min_size=0, max_size=6).map(lambda r: sorted(r, reverse=True)),
        min_size=1,
        max_size=6,
    ),
    st.integers(0, 30),
)
def test_select_increments_equals_heap_with_ties(rows, budget):
    gains = np.concatenate([np.array(r, dtype=float) for r in rows] + [np.zeros(0)])
    row_of = np.concatenate([np.full(len(r), j) for j, r in enumerate(rows)] + [np.zeros(0, int)])
    k = np.concatenate([np.arange(len(r)) for r in rows] + [np.zeros(0, int)])
    rank = np.array(list(reversed(range(len(rows)))))
    chosen = select_increments(gains, rank[row_of.astype(int)], k, budget)
    fast = np.bincount(row_of[chosen].astype(int), minlength=len(rows)).tolist()
    assert fast == select_increments_heap(rows, rank.tolist(), budget)


@SETTINGS
@given(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=20))
def test_ironing_gives_the_least_concave_majorant(row):
    g = np.array(row)
    ironed = iron_rows(g[None, :])[0]
    assert np.all(np.diff(ironed) <= 1e-9)
    assert np.cumsum(ironed)[-1] == pytest.approx(g.sum())
    assert np.all(np.cumsum(ironed) >= np.cumsum(g) - 1e-9)
    if np.all(np.diff(g) <= 0):
        assert ironed == pytest.approx(g)


def test_formulas():
    assert amdahl_speedup(0.0, 8) == 1.0
    assert amdahl_speedup(1.0, 8) == 8.0
    assert amdahl_speedup(0.9, 4) == pytest.approx(1 / (0.1 + 0.9 / 4))
    # tail at one unit from samples observed at 4 units
    t1, m1, rel = service_at_one_unit(100, 10.0, 14.0, 20.0, 4, 99.0, 0.9, 99.0)
    assert t1 == pytest.approx(20 * amdahl_speedup(0.9, 4))
    assert m1 == pytest.approx(10 * amdahl_speedup(0.9, 4))
    assert 0.05 <= rel <= 1
    # one value per intent: no samples -> base service time; target p95 -> the p95
    rows = service_at_one_unit(
        np.array([100, 0, 8]), np.array([10.0, 0.0, 30.0]), np.array([14.0, 0.0, 35.0]),
        np.array([20.0, 0.0, 50.0]), np.array([4, 1, 2]), np.array([99.0, 42.0, 7.0]),
        np.array([0.9, 0.5, 0.7]), np.array([99.0, 99.0, 95.0]),
    )  # fmt: skip
    assert [float(x) for x in (rows[0][0], rows[1][0], rows[2][0])] == [t1, m1, rel]
    assert (float(rows[0][1]), float(rows[1][1]), float(rows[2][1])) == (42.0, 42.0, 0.25)
    assert float(rows[0][2]) == 35.0 * amdahl_speedup(0.7, 2)
    lat = predicted_latency_ms(100.0, 50.0, 0.9, 4, 0.0, 1.0)
    assert float(lat) == pytest.approx(100 / amdahl_speedup(0.9, 4))
    # queueing: utilisation at or above 1 never drains
    assert float(predicted_latency_ms(100.0, 100.0, 0.0, 1, 10.0, 1.0)) == LATENCY_CEILING_MS
    assert float(predicted_latency_ms(100.0, 100.0, 0.0, 1, 5.0, 1.0)) == pytest.approx(200.0)
    assert float(deadline_risk(0.0, 10.0, 0.2)) == 0.5
    assert float(deadline_risk(100.0, 10.0, 0.2)) < 0.05
    assert float(deadline_risk(-100.0, 10.0, 0.2)) > 0.95
    calm = NodeState(name="n", cpu_units=4)
    hot = NodeState(name="n", cpu_units=4, contention=0.5, disturbance=Disturbance(0.5, 0.5, 0.5))
    assert float(latency_inflation(calm, 1.0, 1.0, 1.0)) == 1.0
    assert float(latency_inflation(hot, 1.0, 1.0, 1.0)) == pytest.approx(1.75 * 1.5 * 1.5)
    assert float(latency_inflation(hot, 1.0, 0.0, 0.0)) == pytest.approx(1.75)


@SETTINGS
@given(plan_inputs(max_n=6))
def test_units_to_meet_is_the_fewest(state):
    table = build_table(state)
    idx = np.flatnonzero(table.has_deadline & (table.cap >= table.min_units))
    if idx.size == 0:
        return
    p, meets = units_to_meet(table, idx, 0)
    lat = table.latency(idx, p, 0)
    for j, i in enumerate(idx):
        if meets[j]:
            assert lat[j] <= table.deadline[i]
            if p[j] > table.min_units[i]:
                assert table.latency(np.array([i]), np.array([p[j] - 1]), 0)[0] > table.deadline[i]
        else:
            assert table.latency(np.array([i]), np.array([table.cap[i]]), 0)[0] > table.deadline[i]


def online(id_, deadline, base, **kw):
    return IntentSpec(id=id_, name=id_, workload_class="ONLINE", deadline_ms=deadline,
                      base_service_ms=base, **kw)  # fmt: skip


def test_online_walks_the_ladder_to_the_first_level_that_meets():
    spec = online("web", 30, 100, max_units=4, degradation=("NORMAL", "FP16", "INT8"))
    # at 4 units and f = 0.9: 100 / 3.08 = 32.5 ms > 30; FP16 (x0.6) meets at fewer units
    state = PlanInput(intents=[spec], node=NodeState(name="n", cpu_units=8))
    d = get_policy("parfusion").allocate(state).decisions[0]
    assert d.degradation == "FP16" and d.state == "DEGRADED" and d.slack_ms >= 0
    assert "degraded to FP16" in d.reason
    d2 = get_policy("no-degrade").allocate(state).decisions[0]
    assert d2.degradation == "NORMAL" and d2.state == "THROTTLED" and "unreachable" in d2.reason


def test_urgent_preempts_a_preemptible_batch_incumbent():
    batch = IntentSpec(id="train", name="train", workload_class="BATCH", min_units=4,
                       max_units=4, preemptible=True, seq=1)  # fmt: skip
    keeper = IntentSpec(id="keep", name="keep", workload_class="BATCH", min_units=4, max_units=4,
                        seq=2)  # fmt: skip
    urgent = IntentSpec(id="stop", name="estop", workload_class="URGENT", deadline_ms=30,
                        base_service_ms=50, max_units=4, seq=3)  # fmt: skip
    node = NodeState(name="n", cpu_units=8)
    prev = {"train": Decision("train", 4), "keep": Decision("keep", 4)}
    state = PlanInput(intents=[batch, keeper, urgent], node=node, previous=prev, tick=5)
    r = get_policy("parfusion").allocate(state).by_id()
    assert r["train"].state == "PREEMPTED" and r["train"].preempted_units == 4
    assert "estop" in r["train"].reason
    assert r["keep"].units == 4
    assert r["stop"].units >= 2 and r["stop"].slack_ms >= 0
    r2 = get_policy("no-preemption").allocate(state).by_id()
    assert r2["train"].units == 4 and r2["stop"].state == "THROTTLED"


def test_hysteresis_holds_a_plan_and_dwell_blocks_shrinking():
    specs = [
        IntentSpec(
            id=f"b{k}", name=f"b{k}", workload_class="BATCH", priority=500, max_units=8, seq=k
        )  # fmt: skip
        for k in range(3)
    ]
    node = NodeState(name="n", cpu_units=9)
    policy = get_policy("parfusion")
    r1 = policy.allocate(PlanInput(intents=specs, node=node, tick=0))
    assert [d.units for d in r1.decisions] == [3, 3, 3]
    # a slightly more valuable newcomer does not pull units off incumbents within the dwell window
    newcomer = IntentSpec(id="new", name="new", workload_class="BATCH", priority=520, max_units=8,
                          seq=9)  # fmt: skip
    state = PlanInput(intents=[*specs, newcomer], node=NodeState(name="n", cpu_units=10),
                      previous=r1.by_id(), tick=1)  # fmt: skip
    r2 = policy.allocate(state).by_id()
    assert [r2[f"b{k}"].units for k in range(3)] == [3, 3, 3]
    assert r2["new"].units == 1
    assert r2["b0"].since_tick == 0 and r2["new"].since_tick == 1
    # the same input again is a fixed point
    r3 = policy.allocate(PlanInput(intents=[*specs, newcomer], node=state.node,
                                   previous=r2, tick=2))  # fmt: skip
    assert [d.units for d in r3.decisions] == [r2[d.intent_id].units for d in r3.decisions]


def test_pressure_raises_predicted_latency_and_units():
    spec = online("web", 40, 100, max_units=8)
    calm = PlanInput(intents=[spec], node=NodeState(name="n", cpu_units=8))
    hot = PlanInput(
        intents=[spec],
        node=NodeState(name="n", cpu_units=8, contention=0.3, disturbance=Disturbance(cpu=0.3)),
    )
    t_calm, p_calm = plan_units(calm)
    t_hot, p_hot = plan_units(hot)
    assert p_hot.need[0] > p_calm.need[0]


def test_units_to_meet_without_a_parallel_part_is_the_minimum():
    # f = 0: the latency is the same at every p, exactly on the deadline here
    spec = IntentSpec(id="u", name="u", workload_class="URGENT", deadline_ms=1.0, min_units=1,
                      parallel_fraction=0.0, base_service_ms=1.0)  # fmt: skip
    table = build_table(PlanInput(intents=[spec], node=NodeState(name="n", cpu_units=12)))
    p, meets = units_to_meet(table, np.array([0]), 0)
    assert meets[0] and p[0] == 1
