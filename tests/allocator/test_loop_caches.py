"""The loop's own caches (kept IntentSpecs, kept Allocation entries, gauges set only from new
Decisions) give, after every tick of a random sequence of store changes and samples, the specs,
the plan and the gauges that building everything afresh gives (the policy's memo underneath is
checked against a fresh policy in test_memo.py); each tick's WatchPlans delta, applied to the
tick before, gives the tick's whole plan."""

from __future__ import annotations

import gc
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parfusion.v1 import allocator_pb2, intent_pb2
from services.allocator import plans
from services.allocator.loop import ControlLoop, LoopConfig
from services.allocator.metrics import PER_INTENT
from services.allocator.store import IntentStore
from services.allocator.watch import PlanMirror, PlanSnapshot, ReplyCache
from services.core import convert
from services.core.validation import normalize_intent
from tests.allocator.conftest import batch_intent, online_intent

STEPS = st.lists(
    st.sampled_from(["tick", "tick", "submit", "delete", "samples", "resubmit", "burst"]),
    min_size=4,
    max_size=14,
)


def _intent(k: int, deadline: float = 40.0):
    if k % 3 == 2:
        return normalize_intent(batch_intent(f"job-{k}", f"lc-{k}"))
    return normalize_intent(online_intent(f"web-{k}", f"lc-{k}", deadline_ms=deadline))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS, seed=st.integers(0, 1000))
def test_cached_ticks_equal_a_plan_built_afresh(steps: list[str], seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = IntentStore(Path(tmp) / "allocator.db")
        loop = ControlLoop(store, LoopConfig(tick_s=0.1, cpu_units=6))
        try:
            live = [store.submit(_intent(k)).intent.id for k in range(4)]
            made = 4
            mirror = PlanMirror()  # a WatchPlans client's plan, kept from the ticks' deltas
            for n, step in enumerate(steps):
                if step == "submit":
                    live.append(store.submit(_intent(made)).intent.id)
                    made += 1
                elif step == "delete" and live:
                    store.delete(live.pop((seed + n) % len(live)))
                elif step == "resubmit" and live:  # the same id with other content
                    k = int(live[(seed + n) % len(live)].split("-")[1])
                    store.delete(f"lc-{k}")
                    store.submit(_intent(k, deadline=25.0 + n))
                elif step == "burst" and live:  # several changes between two ticks
                    live.append(store.submit(_intent(made)).intent.id)
                    made += 1
                    store.delete(live.pop((seed + n) % len(live)))
                    live.append(store.submit(_intent(made)).intent.id)
                    made += 1
                    if seed % 2:  # the journal no longer reaching back: everything read
                        store._journal.clear()
                        store._journal_ids = 0
                elif step == "samples":
                    for intent_id in live:
                        loop.predictor.observe_many(intent_id, [20.0 + n, 22.0 + seed % 7], units=2)
                snapshot = loop.tick()
                assert snapshot is not None
                _check(loop, snapshot.node_plan, store)
                _check_delta(mirror, snapshot)
        finally:
            loop.stop()
            store.close()


def _check_delta(mirror: PlanMirror, snapshot: PlanSnapshot) -> None:
    """Each tick's delta against the tick before, applied to the plan of that tick, gives
    this tick's whole plan."""
    assert snapshot.changes is not None
    first = not mirror.generation
    assert snapshot.changes.base == mirror.generation
    wire = snapshot.wire if first else snapshot.delta_wire
    assert wire is not None
    reply = allocator_pb2.WatchPlansResponse.FromString(wire)
    assert reply.base_generation == (0 if first else mirror.generation)
    if not first:  # a poller's delta (GetPlan with deltas) holds the same
        assert snapshot.get_plan_delta_wire is not None
        polled = allocator_pb2.GetPlanResponse.FromString(snapshot.get_plan_delta_wire)
        assert polled.base_generation == reply.base_generation
        assert polled.removed_intent_ids == reply.removed_intent_ids
        assert polled.node_plan == reply.node_plan and polled.gpu_plan == reply.gpu_plan
    mirror.apply(reply)
    whole = snapshot.node_plan
    assert {a.intent_id: a for a in mirror.node_plan().allocations} == {
        a.intent_id: a for a in whole.allocations
    }
    header = intent_pb2.NodePlan()
    header.CopyFrom(whole)
    del header.allocations[:]
    assert mirror.header == header and mirror.gpu_plan == snapshot.gpu_plan


def _check(loop: ControlLoop, plan, store: IntentStore) -> None:
    _, stored = store.snapshot()
    intents = {s.intent.id: s.intent for s in stored}
    decisions = list(loop._previous.values())
    assert [a.intent_id for a in plan.allocations] == [d.intent_id for d in decisions]
    assert [a.intent_id for a in plan.allocations] == [s.intent.id for s in stored]
    for spec, s in zip(loop._specs, stored, strict=True):
        assert spec == convert.intent_to_spec(s.intent, seq=s.seq)
    # the plan: what building every Allocation afresh gives
    assert list(plan.allocations) == [
        plans.allocation(d, intents.get(d.intent_id)) for d in decisions
    ]
    # the gauges: one series per planned intent, holding its Decision's values
    for d in decisions:
        labels = {"intent": intents[d.intent_id].name, "intent_id": d.intent_id}
        assert PER_INTENT.get_sample_value("parfusion_dmug_units", labels) == d.units
        assert PER_INTENT.get_sample_value("parfusion_dmug_nmu", labels) == d.nmu
    for k, d in enumerate(decisions):
        assert loop.allocation(d.intent_id) == plan.allocations[k]


def test_a_reply_cache_shares_a_reply_and_drops_it_with_its_snapshot() -> None:
    """Calls of one tick with the same own fields share one reply; once the loop's snapshot
    is gone the cache holds no reply (a poller that stopped asking kept a 10,000-intent
    plan's reply and the plan with it)."""
    cache = ReplyCache()
    plan = intent_pb2.NodePlan(generation=7)
    plan.allocations.add(intent_id="web-0", units=2)
    snapshot = PlanSnapshot.of(plan, intent_pb2.GpuPlan(generation=7), 7)
    first = cache.reply(snapshot, b"own")
    assert first == snapshot.wire + b"own" and cache.reply(snapshot, b"own") is first
    assert cache.reply(snapshot, b"other") == snapshot.wire + b"other"
    assert cache.held() == len(snapshot.wire + b"other")
    del snapshot
    gc.collect()
    assert cache.held() == 0
