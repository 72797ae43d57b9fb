"""URGENT work is never starved: it takes its units from what can yield, in order."""

from __future__ import annotations

from services.core.model import Decision, IntentSpec, NodeState, PlanInput
from services.core.policies.registry import get_policy

ONLINE = IntentSpec(
    id="web",
    name="web",
    workload_class="ONLINE",
    priority=800,
    deadline_ms=30,
    base_service_ms=40,
    parallel_fraction=0.9,
    min_units=1,
    max_units=2,
    arrival_rate_per_s=2.0,
    seq=0,
)  # fmt: skip  (needs 2 units for 30 ms)
BATCH = IntentSpec(id="train", name="train", workload_class="BATCH", priority=300,
                   base_service_ms=5, min_units=1, max_units=2, preemptible=True, seq=1)  # fmt: skip
URGENT = IntentSpec(id="fall", name="fall", workload_class="URGENT", priority=1000,
                    deadline_ms=3000, base_service_ms=20, min_units=1, max_units=2,
                    elastic=False, seq=2)  # fmt: skip


def plan(specs, node, ticks=3, previous=None, start=1):
    """`ticks` ticks of parfusion from `previous` (Decisions by id), the first at `start`."""
    policy, previous = get_policy("parfusion"), previous or {}
    for tick in range(start, start + ticks):
        previous = policy.allocate(PlanInput(specs, node, previous=previous, tick=tick)).by_id()
    return previous


def test_urgent_takes_from_idle_time_batch_first_then_elastic_work_above_its_minimum() -> None:
    node = NodeState(name="n", cpu_units=2, cpu_ids=(0, 1))  # batch runs in idle time
    before = plan([ONLINE, BATCH], node)
    assert before["web"].units == 2 and before["train"].units == 0
    assert before["train"].sched_policy == "idle"
    # within one tick of its arrival
    after = plan([ONLINE, BATCH, URGENT], node, ticks=1, previous=before, start=4)
    assert after["fall"].units == 1 and after["fall"].state == "ADMITTED"
    assert after["web"].units == 1 and after["web"].state == "PREEMPTED"
    assert after["web"].reason.startswith("preempted: 1 units taken by urgent fall; running 1")
    assert after["train"].sched_policy == "idle"  # still soaks up the cycles nobody uses


def test_preemptible_batch_holding_units_yields_before_deadline_work() -> None:
    node = NodeState(name="n", cpu_units=3)  # no CPU ids: batch holds units
    before = plan([ONLINE, BATCH], node)
    assert before["web"].units == 2 and before["train"].units == 1
    after = plan([ONLINE, BATCH, URGENT], node, ticks=1, previous=before, start=4)
    assert after["fall"].units >= 1 and after["train"].state == "PREEMPTED"
    assert after["web"].units == 2  # the online work kept what it needs


def test_when_nothing_can_yield_the_urgent_intent_is_throttled_and_says_why() -> None:
    pinned = IntentSpec(id="web", name="web", workload_class="ONLINE", deadline_ms=30,
                        base_service_ms=40, min_units=2, max_units=2, seq=0)  # fmt: skip
    node = NodeState(name="n", cpu_units=2, cpu_ids=(0, 1))
    previous = {"web": Decision("web", 2)}
    r = (
        get_policy("parfusion")
        .allocate(PlanInput([pinned, BATCH, URGENT], node, previous=previous, tick=5))
        .by_id()
    )
    assert r["fall"].units == 0 and r["fall"].state == "THROTTLED"
    assert "nothing can yield" in r["fall"].reason
    assert r["web"].units == 2
    # the no-preemption ablation never takes units: the urgent work waits
    r = (
        get_policy("no-preemption")
        .allocate(
            PlanInput([ONLINE, BATCH, URGENT], node, previous=plan([ONLINE, BATCH], node), tick=4)
        )
        .by_id()
    )
    assert r["fall"].units == 0
