"""NodeIntentState objects as the extender reads them (the watches run in tests/kube)."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from services.core.convert import intent_from_document, intent_to_spec
from services.core.model import NodeState
from services.core.placement import view_of
from services.core.validation import normalize_intent
from services.extender.nodestates import NodeIntentStateObject, heartbeat_age_s, telemetry_of
from services.extender.nodeview import MEMO_RESIDENTS, ClusterView, NodeTelemetry

ONLINE = {"id": "u1", "name": "web", "workloadClass": "WORKLOAD_CLASS_ONLINE",
          "slo": {"deadlineMs": 40}, "parallelism": {"min": 1, "max": 4}}  # fmt: skip


def _state(status: Any) -> NodeIntentStateObject:
    return msgspec.convert({"metadata": {"name": "n1"}, "status": status}, NodeIntentStateObject)


def test_a_state_becomes_the_nodes_telemetry() -> None:
    report = telemetry_of(
        _state(
            {
                "capacityUnits": 16,
                "contention": 0.25,
                "lanes": [{"name": "online", "gpus": 2, "shareUnits": 200}, {"name": "batch"}],
                "residents": [{"id": "u1", "intent": ONLINE}, {"id": "no-intent"}],
            }
        ),
        123.0,
    )
    assert report is not None
    assert (report.node, report.cpu_units, report.contention) == ("n1", 16, 0.25)
    assert [lane.name for lane in report.lanes or ()] == ["online"]  # lanes with GPUs only
    assert [r.id for r in report.residents] == ["u1"] and report.observed_at == 123.0
    assert telemetry_of(_state({"capacityUnits": 4}), 0).lanes is None  # Node labels stand
    assert telemetry_of(_state(None), 0) is None


def test_heartbeat_age() -> None:
    now = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - 5))
    assert 4 <= heartbeat_age_s(stamp, now) <= 6
    assert heartbeat_age_s("", now) == float("inf")
    assert heartbeat_age_s("yesterday", now) == float("inf")


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(["workloadClass", "slo", "parallelism", "gpu", "degradation", "id"]),
            st.one_of(st.integers(-5, 10**12), st.text(max_size=30), st.floats(), st.none(),
                      st.dictionaries(st.text(max_size=10), st.integers())),
        ),
        max_size=4,
    )
)  # fmt: skip
def test_hand_edited_residents_are_skipped_not_fatal(intents: list[dict[str, Any]]) -> None:
    report = telemetry_of(
        _state({"capacityUnits": 8, "residents": [{"id": "x", "intent": i} for i in intents]}), 0
    )
    assert report is not None and len(report.residents) <= len(intents)


def _batch(intent_id: str, units: int) -> dict[str, Any]:
    return {"id": intent_id, "name": intent_id, "workloadClass": "WORKLOAD_CLASS_BATCH",
            "parallelism": {"min": units, "max": units}, "demand": {"workUnits": 10}}  # fmt: skip


def test_a_cut_state_places_with_the_allocators_free_units() -> None:
    """A state listing only some residents: its free units stand for all of them; a bound pod
    the allocator already counts (listed or omitted) is not counted again, one it has not
    adopted yet is taken off."""
    state = telemetry_of(
        _state(
            {
                "capacityUnits": 16,
                "freeUnits": 10,
                "residents": [{"id": "new", "intent": _batch("new", 2)}],
                "omittedResidents": ["old-1", "old-2"],
            }
        ),
        1.0,
    )
    assert state is not None and state.omitted == {"old-1", "old-2"} and state.free_units == 10
    view = ClusterView()
    view.set_telemetry([state])
    assert view.get("n1").placement.free_units == 10
    for pod_id in ("new", "old-1"):  # already counted by the allocator
        view.place("n1", intent_to_spec(normalize_intent(intent_from_document(_batch(pod_id, 3)))))
    assert view.get("n1").placement.free_units == 10
    view.place("n1", intent_to_spec(normalize_intent(intent_from_document(_batch("pod", 3)))))
    assert view.get("n1").placement.free_units == 7
    # a hand-edited state cannot claim more free units than the node has
    edited = telemetry_of(
        _state(
            {
                "capacityUnits": 16,
                "freeUnits": 10**9,
                "residents": [{"id": "new", "intent": _batch("new", 2)}],
                "omittedResidents": ["old-1"],
            }
        ),
        2.0,
    )
    assert edited is not None
    view.set_telemetry([edited])
    assert view.get("n1").placement.free_units == 16 - 3


def test_a_node_with_many_residents_changing_keeps_no_copy_of_them() -> None:
    """Past MEMO_RESIDENTS a node's placement is computed, not memoised: every change of a
    large resident set would otherwise keep one more copy of it. The answer is the same."""
    many = [
        intent_to_spec(normalize_intent(intent_from_document(_batch(f"b{k}", 1 + k % 3))), k)
        for k in range(MEMO_RESIDENTS + 50)
    ]
    view = ClusterView()
    node = NodeState(name="n1", cpu_units=64)
    for step in range(5):  # one resident leaves, the set changes each time
        residents = tuple(many[step:])
        view.set_telemetry([NodeTelemetry("n1", 64, 0.0, None, residents, float(step))])
        assert view.get("n1").placement == view_of(node, residents, {}, view.dmug)
    assert len(view._placements) == 0
    small = tuple(many[:3])
    view.set_telemetry([NodeTelemetry("n1", 64, 0.0, None, small, 9.0)])
    assert view.get("n1").placement == view_of(node, small, {}, view.dmug)
    assert len(view._placements) == 1  # small sets are still memoised
