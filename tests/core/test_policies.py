"""Every policy on the same fixtures: the Policy contract, the registry, and what each one removes."""

from __future__ import annotations

import dataclasses
import random

import pytest

from services.common.errors import InvalidArgument
from services.core.formulas import LATENCY_CEILING_MS
from services.core.model import (
    Decision,
    Disturbance,
    IntentSpec,
    LaneCapacity,
    NodeState,
    PlanInput,
    ServiceStats,
)
from services.core.policies.registry import POLICIES, get_policy, list_policies
from services.core.reasons import _TEMPLATES

LANES = (
    LaneCapacity("infer", (0, 1), 200),
    LaneCapacity("train", (2,), 100),
    LaneCapacity("x", ()),
)


def node(units: int = 8, **kw) -> NodeState:
    return NodeState(name="n1", cpu_units=units, cpu_ids=tuple(range(units)), lanes=LANES, **kw)


def mixed() -> list[IntentSpec]:
    return [
        IntentSpec(id="web", name="web", workload_class="ONLINE", priority=800, deadline_ms=40,
                   max_units=4, base_service_ms=100, degradation=("NORMAL", "FP16", "INT8"),
                   gpu_lane="infer", gpu_share=0.5, arrival_rate_per_s=5, seq=1),
        IntentSpec(id="train", name="train", workload_class="BATCH", priority=300, max_units=8,
                   base_service_ms=200, preemptible=True, gpu_lane="train", gpu_share=1.0, seq=2),
        IntentSpec(id="etl", name="etl", workload_class="BATCH", priority=100, min_units=2,
                   max_units=6, base_service_ms=50, parallel_fraction=0.6, seq=3),
        IntentSpec(id="nav", name="nav", workload_class="ROBOT", priority=900, deadline_ms=60,
                   max_units=4, base_service_ms=100, seq=4),
        IntentSpec(id="estop", name="estop", workload_class="URGENT", priority=1000,
                   deadline_ms=30, max_units=4, base_service_ms=50, seq=5),
        IntentSpec(id="slow", name="slow", workload_class="ONLINE", priority=500, deadline_ms=10,
                   max_units=2, base_service_ms=100, degradation=("NORMAL", "INT8"), seq=6),
    ]  # fmt: skip


FIXTURES = {
    "plenty": PlanInput(intents=mixed(), node=node(32)),
    "tight": PlanInput(intents=mixed(), node=node(8)),
    "scarce": PlanInput(intents=mixed(), node=node(3)),
    "pressure": PlanInput(
        intents=mixed(),
        node=node(8, contention=0.4, disturbance=Disturbance(cpu=0.5, gpu=0.8, network=0.3)),
        stats={"web": ServiceStats(mean_ms=60, p95_ms=80, p99_ms=90, count=50, observed_units=2)},
    ),
    "empty": PlanInput(intents=[], node=node(4)),
    "no-cpus": PlanInput(intents=mixed(), node=NodeState(name="n0", cpu_units=0)),
}


def test_registry_order_and_kinds():
    names = [p.name for p in list_policies()]
    assert names == [
        "parfusion", "baseline", "fifo", "static", "loadbalance-only", "no-crosslayer",
        "edf-only", "no-gpuintent", "no-predictor", "no-elastic", "no-degrade", "no-preemption",
    ]  # fmt: skip
    assert names == list(POLICIES)
    kinds = {p.name: p.kind for p in list_policies()}
    assert kinds["parfusion"] == "parfusion"
    assert {kinds[n] for n in names[1:6]} == {"reference"}
    assert {kinds[n] for n in names[6:]} == {"ablation"}
    for p in list_policies():
        assert p.description and "\n" not in p.description
        assert get_policy(p.name).name == p.name


def test_unknown_policy_names_the_field():
    with pytest.raises(InvalidArgument) as err:
        get_policy("magic")
    assert err.value.field == "name"
    assert "unknown policy 'magic'" in str(err.value) and "parfusion" in str(err.value)


@pytest.mark.parametrize("fixture", sorted(FIXTURES))
@pytest.mark.parametrize("policy", [p.name for p in list_policies()])
def test_policy_contract(policy, fixture):
    state = FIXTURES[fixture]
    result = get_policy(policy).allocate(state)
    assert result.policy == policy
    assert [d.intent_id for d in result.decisions] == [s.id for s in state.intents]
    assert all(isinstance(d, Decision) for d in result.decisions)
    assert sum(d.units for d in result.decisions) <= state.node.cpu_units
    for spec, d in zip(state.intents, result.decisions, strict=True):
        cap = spec.max_units or state.node.cpu_units
        assert 0 <= d.units <= cap
        assert d.units == 0 or d.units >= min(spec.min_units, cap)
        assert d.state in ("ADMITTED", "THROTTLED", "DEGRADED", "PREEMPTED")
        assert d.reason
        assert d.nice >= 0 and 1 <= d.cpu_weight <= 10_000
        assert d.stream_priority in (-1, 0, 1)
        assert d.degradation in spec.degradation or d.degradation == "NORMAL"
        assert 0.0 <= d.deadline_risk <= 1.0
    lanes = {lane.name: lane for lane in state.node.lanes}
    for name, lane in lanes.items():
        used = sum(d.gpu_share_percent for d in result.decisions if d.gpu_lane == name)
        assert used <= lane.share_units + 1e-9
        if not lane.available:
            assert used == 0
    for d in result.decisions:
        if d.gpu_lane:
            assert d.gpu_indexes == lanes[d.gpu_lane].gpu_indexes
    # exclusive cores of deadline work are disjoint from each other and from batch cores (but
    # for batch under SCHED_IDLE, which only takes the cycles nobody else wants)
    by_id = result.by_id()
    specs = {s.id: s for s in state.intents}
    dl_sets = [set(d.cpu_set) for d in result.decisions if specs[d.intent_id].has_deadline]
    batch_cores = set().union(*[set(by_id[s.id].cpu_set) for s in state.intents
                                if not s.has_deadline and by_id[s.id].sched_policy != "idle"]
                              or [set()])  # fmt: skip
    for d in result.decisions:
        assert d.pool_size >= d.units
        if d.pool_size > d.units and not specs[d.intent_id].has_deadline:
            assert d.sched_policy == "idle" and d.nice == 19 and specs[d.intent_id].preemptible
    for i, a in enumerate(dl_sets):
        for b in dl_sets[i + 1 :]:
            assert not a & b or a == b  # identical = both on the shared set
        if a and batch_cores and a != batch_cores:
            assert not a & batch_cores
    # deterministic
    assert get_policy(policy).allocate(state) == result


def test_parfusion_meets_deadlines_when_units_are_plenty():
    result = get_policy("parfusion").allocate(FIXTURES["plenty"]).by_id()
    for name in ("web", "nav", "estop"):
        assert result[name].slack_ms >= 0, result[name]
        assert result[name].state == "ADMITTED"
        assert result[name].nice == 0 and result[name].sched_policy == "other"
    assert result["train"].sched_policy in ("batch", "idle") and result["train"].nice >= 10
    # 10 ms at 100 ms service and 2 units is out of reach even at INT8: at risk, degraded best effort
    assert result["slow"].state == "THROTTLED" and "unreachable" in result["slow"].reason
    assert result["slow"].degradation == "INT8"


def test_reference_and_ablation_knobs():
    state = FIXTURES["tight"]
    for name in ("no-crosslayer", "baseline", "fifo", "static", "loadbalance-only"):
        r = get_policy(name).allocate(state)
        assert not r.gpu_intent_enabled
        for d in r.decisions:
            assert d.nice == 0 and d.sched_policy == "other"
            assert d.cpu_set == () or name == "static"
            assert d.gpu_lane == "" and d.gpu_share_percent == 0 and d.stream_priority == 0
    # static partitioning: each admitted intent on as many cores of its own as it holds units
    pinned = [d for d in get_policy("static").allocate(state).decisions if d.units > 0]
    assert pinned and all(len(d.cpu_set) == d.units for d in pinned)
    cores = [c for d in pinned for c in d.cpu_set]
    assert len(cores) == len(set(cores))
    assert all(not d.cpu_set for d in get_policy("baseline").allocate(state).decisions)
    r = get_policy("no-gpuintent").allocate(state)
    assert not r.gpu_intent_enabled
    assert all(d.gpu_lane == "" and d.gpu_share_percent == 0 for d in r.decisions)
    assert any(d.cpu_set for d in r.decisions)
    full = get_policy("parfusion").allocate(state)
    assert full.gpu_intent_enabled
    assert full.by_id()["web"].gpu_lane == "infer" and full.by_id()["web"].stream_priority == 1
    assert full.by_id()["web"].gpu_share_percent == 50.0
    # pool sizes are D-MUG's in no-crosslayer
    pools = [d.units for d in get_policy("no-crosslayer").allocate(state).decisions]
    assert pools == [d.units for d in full.decisions]


def test_no_predictor_ignores_stats():
    base = PlanInput(intents=mixed(), node=node(8))
    slow_stats = {"web": ServiceStats(mean_ms=300, p95_ms=350, p99_ms=400, count=100)}
    with_stats = PlanInput(intents=mixed(), node=node(8), stats=slow_stats)
    a = get_policy("no-predictor").allocate(base)
    b = get_policy("no-predictor").allocate(with_stats)
    assert a == b
    c = get_policy("parfusion").allocate(with_stats)
    assert c.by_id()["web"].predicted_p99_ms != a.by_id()["web"].predicted_p99_ms


def test_no_degrade_and_no_preemption():
    for fixture in FIXTURES.values():
        r = get_policy("no-degrade").allocate(fixture)
        assert all(d.degradation == "NORMAL" for d in r.decisions) and r.degradations == 0
        r = get_policy("no-preemption").allocate(fixture)
        assert r.preemptions == 0 and all(d.preempted_units == 0 for d in r.decisions)


def test_static_and_no_elastic_keep_first_allocation():
    first = FIXTURES["tight"]
    for name in ("static", "no-elastic"):
        policy = get_policy(name)
        r1 = policy.allocate(first)
        grown = PlanInput(intents=mixed(), node=node(16), previous=r1.by_id(), tick=1)
        r2 = policy.allocate(grown)
        for d1, d2 in zip(r1.decisions, r2.decisions, strict=True):
            if d1.units > 0:
                assert d2.units == d1.units, (name, d1, d2)
    # elastic D-MUG grows into the bigger node
    r1 = get_policy("parfusion").allocate(first)
    r2 = get_policy("parfusion").allocate(
        PlanInput(intents=mixed(), node=node(16), previous=r1.by_id(), tick=1)
    )
    assert sum(d.units for d in r2.decisions) > sum(d.units for d in r1.decisions)


def test_fifo_serves_in_submission_order():
    intents = [
        IntentSpec(id=f"j{k}", name=f"j{k}", workload_class="BATCH", max_units=4, seq=10 - k)
        for k in range(4)
    ]
    r = get_policy("fifo").allocate(PlanInput(intents=intents, node=node(8))).by_id()
    assert r["j3"].units == 4 and r["j2"].units == 4 and r["j1"].units == 0 and r["j0"].units == 0


def test_loadbalance_spreads_evenly():
    intents = [
        IntentSpec(id=f"j{k}", name=f"j{k}", workload_class="BATCH", seq=k) for k in range(3)
    ]
    r = get_policy("loadbalance-only").allocate(PlanInput(intents=intents, node=node(8)))
    assert sorted(d.units for d in r.decisions) == [2, 3, 3]


def test_gpu_shares_per_lane():
    lanes = (LaneCapacity("infer", (0,), 100), LaneCapacity("gone", ()))
    n = NodeState(name="n", cpu_units=16, cpu_ids=tuple(range(16)), lanes=lanes)
    specs = [
        IntentSpec(id="a", name="a", workload_class="ONLINE", deadline_ms=500, gpu_lane="infer",
                   seq=1),
        IntentSpec(id="b", name="b", workload_class="ROBOT", deadline_ms=500, gpu_lane="infer",
                   seq=2),
        IntentSpec(id="t", name="t", workload_class="BATCH", gpu_lane="infer", gpu_share=0.3,
                   seq=3),
        IntentSpec(id="g", name="g", workload_class="BATCH", gpu_lane="gone", gpu_share=0.3,
                   seq=4),
    ]  # fmt: skip
    r = get_policy("parfusion").allocate(PlanInput(intents=specs, node=n)).by_id()
    # two deadline users and one batch user share the one GPU: a third each for deadline work
    assert r["a"].gpu_share_percent == pytest.approx(100 / 3)
    assert r["b"].gpu_share_percent == pytest.approx(100 / 3)
    assert r["t"].gpu_share_percent == 30  # capped at its request
    assert r["a"].stream_priority == 1 and r["t"].stream_priority == 0
    assert r["g"].gpu_lane == "" and r["g"].gpu_share_percent == 0
    assert "GPU lane gone unavailable" in r["g"].reason


def test_batch_yields_only_while_deadline_work_can_be_helped():
    batch = IntentSpec(id="t", name="t", workload_class="BATCH", priority=400, seq=1)
    hopeless = IntentSpec(id="h", name="h", workload_class="ONLINE", deadline_ms=1,
                          base_service_ms=100, max_units=2, seq=2)  # fmt: skip
    n = NodeState(name="n", cpu_units=4, cpu_ids=tuple(range(4)))
    r = get_policy("parfusion").allocate(PlanInput(intents=[batch, hopeless], node=n)).by_id()
    assert r["h"].state == "THROTTLED"
    assert r["t"].sched_policy == "batch" and 10 <= r["t"].nice < 19
    short = IntentSpec(id="s", name="s", workload_class="ONLINE", deadline_ms=30,
                       base_service_ms=100, max_units=8, seq=3)  # fmt: skip
    held = IntentSpec(id="t", name="t", workload_class="BATCH", priority=400, elastic=False, seq=1)
    prev = {"t": Decision("t", 3)}
    six = NodeState(name="n", cpu_units=6, cpu_ids=tuple(range(6)))
    state = PlanInput(intents=[held, short], node=six, previous=prev, tick=9)
    r = get_policy("parfusion").allocate(state).by_id()
    assert "needs" in r["s"].reason and r["s"].state == "THROTTLED"
    assert r["t"].sched_policy == "idle" and r["t"].nice == 19 and r["t"].cpu_weight == 1


@pytest.mark.parametrize("name", [p.name for p in list_policies()])
def test_an_overloaded_intent_reads_as_unbounded_not_as_the_sentinel(name: str) -> None:
    """Arrivals the intent cannot drain at any units: p99 is the sentinel, the reason says ∞."""
    flood = IntentSpec(id="f", name="flood", workload_class="ONLINE", deadline_ms=50,
                       base_service_ms=100, parallel_fraction=0.5, max_units=4,
                       arrival_rate_per_s=500.0)  # fmt: skip
    node = NodeState(name="n", cpu_units=4, cpu_ids=(0, 1, 2, 3))
    d = get_policy(name).allocate(PlanInput(intents=[flood], node=node)).by_id()["f"]
    assert d.units > 0 and d.predicted_p99_ms == LATENCY_CEILING_MS
    assert "pred p99 ∞ ms" in d.reason and "1000000000" not in d.reason, d.reason


def test_build_decisions_makes_real_frozen_decisions():
    from services.core.crosslayer import build_decisions

    fields = list(Decision.__struct_fields__)
    rows = [
        Decision(f"i{k}", k, degradation="FP16", reason=f"r{k}", cpu_set=(k,), since_tick=k)
        for k in range(5)
    ]
    built = build_decisions(5, **{name: [getattr(r, name) for r in rows] for name in fields})
    assert built == tuple(rows) and all(type(d) is Decision for d in built)
    assert [repr(d) for d in built] == [repr(r) for r in rows]
    assert hash(built[0]) == hash(rows[0])
    with pytest.raises(AttributeError):
        built[0].units = 9  # type: ignore[misc]


def test_every_reason_template_is_reached_and_formatted():
    """Random mixes over three chained ticks reach every reason the policies give (so every
    template's arguments resolve), and a tick that keeps texts equals a fresh computation."""
    prefixes = {
        "preempted:", "deadline phase:", "of the leftover units", "degraded to", "holding ",
        "at risk: needs", "unreachable even at", "not admitted:", "from its first allocation",
        "idle-time batch", "light: offered", "next-unit nmu", "units (pred p99",
        "nothing can yield",
    }  # fmt: skip
    assert len(prefixes) == len(_TEMPLATES) + 1  # every template, and the preemption text
    rng = random.Random(11)
    seen: set[str] = set()
    for _ in range(40):
        specs = []
        for i in range(rng.randint(2, 24)):
            cls = rng.choice(["ONLINE", "ONLINE", "ROBOT", "URGENT", "BATCH", "BATCH"])
            base = rng.uniform(5.0, 80.0)
            specs.append(
                IntentSpec(
                    id=f"i{i}", name=f"w{i}", workload_class=cls, priority=rng.randint(0, 1000),
                    deadline_ms=0.0 if cls == "BATCH" else base * rng.uniform(0.2, 1.3),
                    min_units=(mn := rng.randint(1, 3)), max_units=mn + rng.randint(0, 6),
                    parallel_fraction=rng.uniform(0.5, 0.98), base_service_ms=base,
                    arrival_rate_per_s=rng.choice([0.0, 0.001, 2.0]) if cls != "BATCH" else 0.0,
                    degradation=("NORMAL", "FP16", "INT8") if i % 2 else ("NORMAL",),
                    preemptible=cls == "BATCH" or i % 4 == 0, elastic=rng.random() > 0.2, seq=i,
                )
            )  # fmt: skip
        units = max(1, int(sum(s.min_units for s in specs) * rng.choice([0.4, 1.0, 2.5])))
        node = NodeState(name="n", cpu_units=units, cpu_ids=tuple(range(rng.choice([0, 8]))))
        for name in ("parfusion", "no-elastic", "no-crosslayer"):
            kept, previous = get_policy(name), None
            for tick in range(3):
                if tick == 2:  # the deadlines loosen: levels may step back (held for a while)
                    specs = [dataclasses.replace(s, deadline_ms=s.deadline_ms * 1.5) for s in specs]
                state = PlanInput(intents=specs, node=node, previous=previous, tick=tick)
                result = kept.allocate(state)
                assert result == get_policy(name).allocate(state)
                seen |= {p for d in result.decisions for p in prefixes if p in d.reason}
                previous = result.by_id()
    # the random mixes leave some work able to yield: an urgent intent on a node held whole
    # by non-elastic work is the one case nothing can
    held = IntentSpec(id="h", name="h", workload_class="ONLINE", deadline_ms=50, elastic=False)
    urgent = IntentSpec(id="u", name="u", workload_class="URGENT", deadline_ms=50, seq=1)
    node = NodeState(name="n", cpu_units=1, cpu_ids=(0,))
    state = PlanInput([held, urgent], node, previous={"h": Decision("h", 1)}, tick=1)
    seen |= {p for d in get_policy("parfusion").allocate(state).decisions for p in prefixes
             if p in d.reason}  # fmt: skip
    assert seen == prefixes, prefixes - seen
