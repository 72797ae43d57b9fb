"""Light deadline work on shared cores and idle-time batch: what D-MUG's cross-layer step does
when a whole unit per intent would starve the work that needs it (a 2-core node with an urgent
event stream, an online service and a batch job)."""

from __future__ import annotations

import msgspec

from services.core.dmug import plan_units
from services.core.model import IntentSpec, NodeState, PlanInput
from services.core.policies.registry import get_policy

NODE = NodeState(name="n", cpu_units=2, cpu_ids=(0, 1))


def urgent(id_="urgent", rate=1.0, base=12.0, **kw):
    return IntentSpec(id=id_, name=id_, workload_class="URGENT", priority=1000, deadline_ms=200,
                      min_units=1, max_units=1, base_service_ms=base, parallel_fraction=1.0,
                      arrival_rate_per_s=rate, elastic=False, **kw)  # fmt: skip


def online(rate=130.0):
    return IntentSpec(id="online", name="online", workload_class="ONLINE", priority=800,
                      deadline_ms=59, min_units=1, max_units=2, base_service_ms=11.8,
                      parallel_fraction=1.0, arrival_rate_per_s=rate, seq=2)  # fmt: skip


def batch(preemptible=True, **kw):
    return IntentSpec(id="batch", name="batch", workload_class="BATCH", priority=200,
                      min_units=1, max_units=2, parallel_fraction=0.9, base_service_ms=8,
                      preemptible=preemptible, seq=3, **kw)  # fmt: skip


def plan(*intents, node=NODE, policy="parfusion"):
    return get_policy(policy).allocate(PlanInput(intents=intents, node=node)).by_id()


def test_a_rare_urgent_stream_shares_the_cores_and_online_keeps_both():
    d = plan(urgent(), online(), batch())
    assert d["urgent"].units == 0 and d["urgent"].pool_size == 1
    assert d["urgent"].nice == 0 and d["urgent"].sched_policy == "other"
    assert d["urgent"].cpu_set == (0, 1) and d["urgent"].state == "ADMITTED"
    assert "light: offered load 0.012 cores <= 0.1" in d["urgent"].reason
    assert d["online"].units == 2 and d["online"].pool_size == 2  # 70 % of two cores needs both
    # batch holds no units and fills both cores in idle time
    assert d["batch"].units == 0 and d["batch"].pool_size == 2
    assert d["batch"].sched_policy == "idle" and d["batch"].nice == 19
    assert d["batch"].cpu_set == (0, 1) and d["batch"].state == "ADMITTED"
    assert "+2 idle-time workers on cpus 0-1" in d["batch"].reason


def test_urgent_work_that_is_not_light_still_holds_its_unit():
    d = plan(urgent(rate=20.0), online(rate=50.0), batch())  # 20/s x 12 ms = 0.24 cores
    assert d["urgent"].units == 1 and d["urgent"].pool_size == 1
    assert "light" not in d["urgent"].reason
    assert d["urgent"].units + d["online"].units <= 2


def test_light_work_is_charged_by_its_summed_load():
    lights = [urgent(f"u{k}", rate=4.0, base=20.0, seq=10 + k) for k in range(20)]  # 0.08 each
    node = NodeState(name="n", cpu_units=4, cpu_ids=(0, 1, 2, 3))
    state = PlanInput(intents=[*lights, online(rate=300.0)], node=node)
    table, units = plan_units(state)
    assert units.shared[:20].all() and not units.shared[20]
    assert units.shared_reserve == 2  # 20 x 0.08 = 1.6 cores, rounded
    d = get_policy("parfusion").allocate(state).by_id()
    assert d["online"].units <= 4 - 2
    assert all(d[f"u{k}"].units == 0 and d[f"u{k}"].pool_size == 1 for k in range(20))


def test_a_light_intent_that_misses_at_its_minimum_is_not_light():
    slow = urgent(base=500.0, rate=0.1)  # 0.05 cores, but 500 ms > 200 ms deadline
    d = plan(slow, online(rate=20.0))
    assert "light" not in d["urgent"].reason and d["urgent"].units >= 1


def test_idle_time_batch_needs_preemptible_elastic_work_cpu_ids_and_the_os_knobs():
    # not preemptible: it holds units, at SCHED_BATCH, never idle-time workers
    d = plan(urgent(), online(rate=50.0), batch(preemptible=False))
    assert d["batch"].units >= 1 and d["batch"].pool_size == d["batch"].units
    assert d["batch"].sched_policy in ("batch", "idle")
    # no CPU ids (e.g. a node scored without its topology): batch holds units as before
    d = plan(urgent(), online(rate=50.0), batch(), node=NodeState(name="n", cpu_units=2))
    assert d["batch"].pool_size == d["batch"].units
    # no cross-layer knobs: no SCHED_IDLE, so batch competes for units like anyone
    d = plan(urgent(), online(rate=50.0), batch(), policy="no-crosslayer")
    assert d["batch"].pool_size == d["batch"].units and d["batch"].sched_policy == "other"


def test_idle_time_slots_are_the_cores_batch_units_do_not_fill():
    held = batch(preemptible=False)
    scavenger = IntentSpec(id="etl", name="etl", workload_class="BATCH", priority=100,
                           min_units=1, max_units=8, preemptible=True, seq=4)  # fmt: skip
    node = NodeState(name="n", cpu_units=4, cpu_ids=(0, 1, 2, 3))
    d = plan(online(rate=50.0), held, scavenger, node=node)
    assert d["etl"].units == 0
    assert d["etl"].pool_size == 4 - d["batch"].units
    assert sum(x.units for x in d.values()) <= 4


def test_light_work_keeps_its_since_tick_while_nothing_changes():
    policy = get_policy("parfusion")
    state = PlanInput(intents=[urgent(), online(), batch()], node=NODE, tick=3)
    first = policy.allocate(state).by_id()
    assert first["urgent"].units == 0 and first["urgent"].since_tick == 3
    for tick in (4, 5):
        later = policy.allocate(
            PlanInput(intents=state.intents, node=NODE, previous=first, tick=tick)
        )
        # units held stayed 0: the tick they last changed stays the first one (not "every tick")
        assert later.by_id()["urgent"].since_tick == 3
        assert later.by_id()["online"].since_tick == 3
        assert (
            later.decisions
            == policy.allocate(
                PlanInput(intents=state.intents, node=NODE, previous=first, tick=tick)
            ).decisions
        )


def _deadline(id_, rate, deadline=60, seq=0):
    return IntentSpec(id=id_, name=id_, workload_class="ONLINE", priority=800,
                      deadline_ms=deadline, min_units=1, max_units=4, base_service_ms=11.8,
                      parallel_fraction=1.0, arrival_rate_per_s=rate, seq=seq)  # fmt: skip


def test_a_holder_keeps_its_cores_when_another_arrives_ahead_of_it():
    """Blocks are handed out least slack first; a newcomer with less slack than the holders
    takes free cores instead of shifting every block after it (each move re-pins a pool)."""
    node = NodeState(name="n", cpu_units=8, cpu_ids=tuple(range(8)))
    big = IntentSpec(id="batch", name="batch", workload_class="BATCH", priority=200,
                     min_units=1, max_units=8, parallel_fraction=0.9, base_service_ms=8,
                     seq=99)  # fmt: skip
    policy = get_policy("parfusion")
    first = policy.allocate(
        PlanInput(intents=[_deadline("a", 100, seq=1), _deadline("b", 150, seq=2), big], node=node)
    ).by_id()
    assert first["a"].units == 2 and first["b"].units == 3
    grown = [_deadline("a", 100, seq=1), _deadline("b", 150, seq=2),
             _deadline("c", 100, deadline=30, seq=3), big]  # fmt: skip
    second = policy.allocate(PlanInput(intents=grown, node=node, previous=first)).by_id()
    assert second["a"].cpu_set == first["a"].cpu_set
    assert second["b"].cpu_set == first["b"].cpu_set
    held = [set(second[i].cpu_set) for i in ("a", "b", "c")]
    assert len(held[2]) == second["c"].units and not held[2] & (held[0] | held[1])
    assert set(second["batch"].cpu_set) == set(range(8)) - held[0] - held[1] - held[2]
    # without history the blocks are packed from the first core, least slack first
    fresh = get_policy("parfusion").allocate(PlanInput(intents=grown, node=node)).by_id()
    assert fresh["c"].cpu_set == (0, 1) and fresh["c"].units == 2
    # a holder whose last block was of another size gets a new one; the others stay put
    moved = {**second, "b": msgspec.structs.replace(second["b"], cpu_set=(6, 7))}
    third = policy.allocate(PlanInput(intents=grown, node=node, previous=moved)).by_id()
    assert third["a"].cpu_set == second["a"].cpu_set
    assert third["c"].cpu_set == second["c"].cpu_set
    assert len(third["b"].cpu_set) == third["b"].units == 3
    assert not set(third["b"].cpu_set) & set(third["a"].cpu_set + third["c"].cpu_set)


def test_blocks_in_a_fragmented_arena_take_a_run_else_the_first_free_cores():
    from services.core.crosslayer import _runs_for

    assert _runs_for([0, 1, 4, 5, 6, 9], [(0, 3), (1, 1), (2, 2)]) == [(4, 5, 6), (0,), (1, 9)]
    assert _runs_for([2, 3, 5], [(0, 2), (1, 1)]) == [(2, 3), (5,)]
    assert _runs_for([], []) == []
