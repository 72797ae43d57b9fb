"""ResourceIntent status and conversion, without an API server (tests/kube has the real one)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parfusion.v1 import intent_pb2
from services.allocator.kube import SOURCE_LABEL, ResourceIntentObject, resource_intent
from services.allocator.kubestatus import NEVER_MS, conditions, intent_status
from services.common.errors import DomainError, InvalidArgument
from services.common.kube import ObjectMeta, TokenBucket


def _object(spec: dict[str, Any], uid: str = "0f1e2d3c-0000-4000-8000-000000000001") -> Any:
    return ResourceIntentObject(
        metadata=ObjectMeta(name="web.v2", namespace="default", uid=uid, generation=3),
        spec=spec,
    )


def test_a_resource_intent_is_stored_under_its_uid_on_its_node() -> None:
    spec = {"workloadClass": "ONLINE", "slo": {"deadlineMs": 40}, "id": "chosen", "node": "n1"}
    intent = resource_intent(_object(spec), "n1", ())
    assert intent.id == "0f1e2d3c-0000-4000-8000-000000000001"  # not spec.id
    assert intent.name == "web-v2"  # the object's name as a DNS-1123 label
    assert intent.node == "n1" and intent.labels[SOURCE_LABEL] == "kubernetes"


def test_an_invalid_resource_intent_names_the_field() -> None:
    with pytest.raises(InvalidArgument, match="deadline_ms"):
        resource_intent(_object({"workloadClass": "ONLINE"}), "n1", ())


@settings(max_examples=150, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["workloadClass", "slo", "parallelism", "priority", "gpu", "labels", "x"]),
        st.one_of(
            st.integers(-(2**70), 2**70),
            st.floats(allow_nan=True),
            st.text(max_size=80),
            st.dictionaries(st.text(max_size=12), st.one_of(st.integers(), st.text(max_size=8))),
            st.lists(st.integers(), max_size=3),
        ),
    )
)
def test_any_spec_is_adopted_or_refused_with_a_domain_error(spec: dict[str, Any]) -> None:
    try:
        intent = resource_intent(_object(spec), "n1", ("online",))
    except DomainError as exc:
        assert str(exc)
    else:
        assert intent.node == "n1"


def _allocation(**fields: Any) -> intent_pb2.Allocation:
    base = {
        "intent_id": "i",
        "state": intent_pb2.ALLOCATION_STATE_DEGRADED,
        "units": 3,
        "workers": 3,
        "degradation": intent_pb2.DEGRADATION_LEVEL_FP16,
        "predicted_p99_ms": 31.25,
        "slack_ms": 8.75,
        "deadline_risk": 0.123456,
        "reason": "FP16 meets the deadline",
    }
    return intent_pb2.Allocation(**{**base, **fields})


def test_status_from_an_allocation() -> None:
    status = intent_status(_allocation(), 29.5, 2, "n1")
    assert status == {
        "observedGeneration": 2,
        "node": "n1",
        "decision": "Degraded",
        "units": 3,
        "workers": 3,
        "degradation": "FP16",
        "predictedP99Ms": 31.25,
        "slackMs": 8.75,
        "deadlineRisk": 0.1235,
        "reason": "FP16 meets the deadline",
        "observedP99Ms": 29.5,
    }
    never = intent_status(_allocation(predicted_p99_ms=float("inf"), slack_ms=-1e12), None, 2, "n")
    assert never["predictedP99Ms"] == NEVER_MS and never["slackMs"] == NEVER_MS
    assert "observedP99Ms" not in never
    assert intent_status(None, None, 1, "n")["decision"] == "Pending"
    invalid = intent_status(None, None, 1, "n", error="intent.slo.deadline_ms: required")
    assert invalid["decision"] == "Invalid" and "deadline_ms" in invalid["reason"]


def test_conditions_follow_the_decision_and_keep_unchanged_transition_times() -> None:
    first = conditions(intent_status(_allocation(), None, 1, "n"), None)
    by_type = {c["type"]: c for c in first}
    assert by_type["Admitted"]["status"] == "True" and by_type["Degraded"]["status"] == "True"
    assert by_type["Throttled"]["status"] == "False"
    for c in first:
        c["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    admitted = _allocation(state=intent_pb2.ALLOCATION_STATE_ADMITTED)
    second = {c["type"]: c for c in conditions(intent_status(admitted, None, 1, "n"), first)}
    assert second["Admitted"]["lastTransitionTime"] == "2020-01-01T00:00:00Z"  # still True
    assert second["Degraded"]["status"] == "False"
    assert second["Degraded"]["lastTransitionTime"] != "2020-01-01T00:00:00Z"
    pending = {c["type"]: c["status"] for c in conditions(intent_status(None, None, 1, "n"), None)}
    assert set(pending.values()) == {"False"}


def test_token_bucket_bounds_writes() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=2.0, burst=2, clock=lambda: now[0])
    assert [bucket.take() for _ in range(3)] == [True, True, False]
    now[0] = 0.5
    assert bucket.take() and not bucket.take()
