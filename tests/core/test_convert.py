"""Proto/document <-> model translation: intent files, IntentSpec, telemetry, plans."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from parfusion.v1 import intent_pb2, telemetry_pb2
from services.allocator import plans
from services.common.errors import InvalidArgument
from services.core import convert, model
from services.core.cpuset import format_cpuset
from services.core.validation import normalize_intent
from tests.conftest import ROOT


def test_document_accepts_short_and_full_enum_names_and_both_key_styles() -> None:
    a = convert.intent_from_document(
        {
            "name": "web",
            "workload_class": "online",
            "slo": {"deadline_ms": 40},
            "degradation": ["NORMAL", "fp16"],
        }
    )
    b = convert.intent_from_document(
        {
            "name": "web",
            "workloadClass": "WORKLOAD_CLASS_ONLINE",
            "slo": {"deadlineMs": 40},
            "degradation": ["DEGRADATION_LEVEL_NORMAL", "DEGRADATION_LEVEL_FP16"],
        }
    )
    assert a == b
    assert a.workload_class == intent_pb2.WORKLOAD_CLASS_ONLINE
    assert list(a.degradation) == [
        intent_pb2.DEGRADATION_LEVEL_NORMAL,
        intent_pb2.DEGRADATION_LEVEL_FP16,
    ]


def test_document_accepts_submit_request_shape() -> None:
    doc = {"intent": {"name": "web", "workload_class": "BATCH"}}
    assert convert.intent_from_document(doc).name == "web"


def test_document_unknown_field_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument) as err:
        convert.intent_from_document({"name": "web", "deadline": 3})
    assert "deadline" in str(err.value)


@pytest.mark.parametrize(
    "doc",
    [{"workloadClass": float("inf")}, {"priority": float("inf")}, {"priority": float("nan")}],
)
def test_document_with_non_finite_numbers_is_invalid_argument(doc: dict[str, float]) -> None:
    with pytest.raises(InvalidArgument) as err:
        convert.intent_from_document(doc)
    assert err.value.field == "intent"


def test_files_hold_one_a_list_or_intents_key(tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text("name: a\nworkload_class: BATCH\n")
    (tmp_path / "list.yaml").write_text(
        "- {name: a, workload_class: BATCH}\n- {name: b, workload_class: BATCH}\n"
    )
    (tmp_path / "wrapped.json").write_text('{"intents": [{"name": "c", "workloadClass": "BATCH"}]}')
    assert [i.name for i in convert.intents_in_file(tmp_path / "one.yaml")] == ["a"]
    assert [i.name for i in convert.intents_in_file(tmp_path / "list.yaml")] == ["a", "b"]
    assert [i.name for i in convert.intents_in_file(tmp_path / "wrapped.json")] == ["c"]
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    with pytest.raises(InvalidArgument):
        convert.intents_in_file(tmp_path / "bad.yaml")


def test_demo_intents_are_valid_with_fixed_ids() -> None:
    files = sorted((ROOT / "configs" / "intents").glob("*.yaml"))
    intents = [
        normalize_intent(i, known_lanes=("online", "batch", "robot", "urgent"))
        for f in files
        for i in convert.intents_in_file(f)
    ]
    classes = {i.workload_class for i in intents}
    assert {
        intent_pb2.WORKLOAD_CLASS_ONLINE,
        intent_pb2.WORKLOAD_CLASS_BATCH,
        intent_pb2.WORKLOAD_CLASS_ROBOT,
    } <= classes
    assert all(i.id.startswith("demo-") for i in intents)


def test_intent_to_spec_carries_every_planning_field() -> None:
    intent = normalize_intent(
        convert.intent_from_document(
            {
                "id": "x1",
                "name": "web",
                "workload_class": "ONLINE",
                "priority": 800,
                "slo": {"deadline_ms": 60, "target_percentile": 95},
                "parallelism": {"min": 2, "max": 6, "preferred": 3},
                "speedup": {"parallel_fraction": 0.8, "base_service_ms": 30},
                "demand": {"arrival_rate_per_s": 12},
                "gpu": {
                    "lane": "online",
                    "share": 0.5,
                    "memory_bytes": 1024,
                    "stream_priority_hint": 1,
                    "concurrency": 2,
                },
                "degradation": ["FP16"],
                "elastic": True,
                "node": "node-0",
            }
        )
    )
    spec = convert.intent_to_spec(intent, seq=7)
    assert spec == model.IntentSpec(
        id="x1", name="web", workload_class="ONLINE", priority=800, deadline_ms=60, target_percentile=95,
        max_miss_ratio=0.01, min_units=2, max_units=6, preferred_units=3, parallel_fraction=0.8,
        base_service_ms=30, arrival_rate_per_s=12, work_units=0, gpu_lane="online", gpu_share=0.5,
        gpu_memory_bytes=1024, gpu_stream_priority_hint=1, gpu_concurrency=2,
        degradation=("NORMAL", "FP16"), preemptible=False, elastic=True, node="node-0", seq=7,
    )  # fmt: skip


def test_contention_prefers_psi_then_utilisation() -> None:
    tel = telemetry_pb2.NodeTelemetry(cpu_percent_per_core=[50, 100])
    assert convert.node_contention(tel) == pytest.approx(0.75)
    tel.cpu_pressure.CopyFrom(telemetry_pb2.Pressure(some_avg10=20.0, available=True))
    assert convert.node_contention(tel) == pytest.approx(0.2)


def test_lanes_without_gpus_are_unavailable() -> None:
    none = convert.lanes_from_telemetry(None, {"online": [0, 1], "batch": [2]})
    assert [(lane.name, lane.available) for lane in none] == [("online", False), ("batch", False)]
    gpu = telemetry_pb2.GpuTelemetry(
        lanes=[
            telemetry_pb2.LaneStatus(
                name="online", configured_indexes=[0, 1], present_indexes=[0], available=True
            ),
            telemetry_pb2.LaneStatus(
                name="batch", configured_indexes=[2], present_indexes=[], available=False
            ),
        ]
    )
    lanes = convert.lanes_from_telemetry(gpu, {})
    assert lanes[0] == model.LaneCapacity("online", (0,), 100)
    assert not lanes[1].available


def test_disturbance_validation_and_activity() -> None:
    with pytest.raises(InvalidArgument) as err:
        convert.validate_disturbance(telemetry_pb2.Disturbance(cpu_pressure=1.5))
    assert err.value.field == "disturbance.cpu_pressure"
    tel = telemetry_pb2.NodeTelemetry(
        active_disturbance=telemetry_pb2.Disturbance(cpu_pressure=0.4), disturbance_remaining_s=0
    )
    assert convert.active_disturbance(tel) == model.Disturbance()
    tel.disturbance_remaining_s = 3
    assert convert.active_disturbance(tel, gpu_pressure=0.2) == model.Disturbance(cpu=0.4, gpu=0.2)


def test_cpuset_format() -> None:
    assert format_cpuset([0, 1, 2, 3, 6]) == "0-3,6"
    assert format_cpuset([5]) == "5"
    assert format_cpuset([]) == ""


def test_decisions_become_allocations_and_gpu_assignments() -> None:
    intent = normalize_intent(
        convert.intent_from_document(
            {
                "id": "a",
                "name": "web",
                "workload_class": "ONLINE",
                "slo": {"deadline_ms": 50},
                "gpu": {"lane": "online", "share": 0.5, "memory_bytes": 99},
            }
        )
    )
    decisions = (
        model.Decision(
            "a",
            3,
            degradation="FP16",
            state="DEGRADED",
            cpu_set=(0, 1, 2),
            gpu_lane="online",
            gpu_indexes=(0,),
            gpu_share_percent=50,
            slack_ms=5,
        ),
        model.Decision("b", 1),
    )
    result = model.PlanResult(policy="parfusion", decisions=decisions)
    node = model.NodeState(name="node-0", cpu_units=4, stale=True)
    ts = Timestamp(seconds=10)
    np_ = plans.node_plan(result, {"a": intent}, node, generation=7, created_at=ts, decision_ms=0.3)
    assert (np_.generation, np_.policy, np_.cpu_units, np_.node_stale) == (7, "parfusion", 4, True)
    a = np_.allocations[0]
    assert (a.intent_name, a.workers, a.cgroup.cpuset_cpus, a.degradation, a.state) == (
        "web",
        3,
        "0-2",
        intent_pb2.DEGRADATION_LEVEL_FP16,
        intent_pb2.ALLOCATION_STATE_DEGRADED,
    )
    assert a.deadline_ms == 50 and a.base_service_ms == 10
    gp = plans.gpu_plan(result, {"a": intent}, node, generation=7, created_at=ts)
    assert [
        (g.intent_id, g.lane, g.share_percent, g.memory_limit_bytes) for g in gp.assignments
    ] == [("a", "online", 50, 99)]


def test_allocation_cache_gives_the_plan_an_uncached_build_gives() -> None:
    web = intent_pb2.ResourceIntent(
        id="a", name="web", workload_class=intent_pb2.WORKLOAD_CLASS_ONLINE
    )
    job = intent_pb2.ResourceIntent(
        id="b", name="job", workload_class=intent_pb2.WORKLOAD_CLASS_BATCH
    )
    node = model.NodeState(name="node-0", cpu_units=4)
    ts = Timestamp(seconds=10)
    cache = plans.AllocationCache()

    def both(decisions, intents):
        result = model.PlanResult(policy="parfusion", decisions=tuple(decisions))
        args = (result, intents, node)
        kw = {"generation": 1, "created_at": ts, "decision_ms": 0.1}
        return plans.node_plan(*args, **kw, cache=cache), plans.node_plan(*args, **kw)

    a, b = model.Decision("a", 2, cpu_set=(0, 1)), model.Decision("b", 1)
    cached, plain = both([a, b], {"a": web, "b": job})
    assert cached == plain
    cached.allocations[0].units = 99  # a plan handed out never aliases the cache
    cached, plain = both([a, b], {"a": web, "b": job})
    assert cached == plain and cached.allocations[0].units == 2
    # a new Decision object, and a replaced intent message, are built again
    renamed = intent_pb2.ResourceIntent(
        id="b", name="job-2", workload_class=intent_pb2.WORKLOAD_CLASS_BATCH
    )
    cached, plain = both([model.Decision("a", 3), b], {"a": web, "b": renamed})
    assert cached == plain
    assert [(x.units, x.intent_name) for x in cached.allocations] == [(3, "web"), (1, "job-2")]
    # rows that left and rows in another order
    cached, plain = both([b], {"b": renamed})
    assert cached == plain


def test_allocation_cache_with_the_same_intents_looks_only_at_changed_rows() -> None:
    intents = {
        k: intent_pb2.ResourceIntent(
            id=k, name=f"w-{k}", workload_class=intent_pb2.WORKLOAD_CLASS_BATCH
        )
        for k in ("a", "b", "c")
    }
    node = model.NodeState(name="node-0", cpu_units=8)
    cache = plans.AllocationCache()
    built: list[str] = []
    real = plans.allocation

    def counting(d, intent):
        built.append(d.intent_id)
        return real(d, intent)

    def plan(decisions, cached=True):
        result = model.PlanResult(policy="parfusion", decisions=tuple(decisions))
        kw = {"generation": 1, "created_at": Timestamp(), "decision_ms": 0.1}
        return plans.node_plan(result, intents, node, **kw, cache=cache if cached else None)

    rows = [model.Decision(k, 1, workers=2) for k in ("a", "b", "c")]
    plans.allocation = counting
    try:
        assert plan(rows) == plan(rows, cached=False)
        built.clear()
        assert plan(rows) == plan(rows, cached=False)
        assert built == ["a", "b", "c"]  # the uncached plan only
        built.clear()
        rows[1] = model.Decision("b", 3, workers=5)
        assert plan(rows) == plan(rows, cached=False)
        assert built == ["b", "a", "b", "c"]  # the cached plan rebuilt b alone
    finally:
        plans.allocation = real
    assert list(cache.by_intent()) == ["a", "b", "c"]
    assert cache.workers == {"a": 2, "b": 5, "c": 2}
    # the same intents in another order: matched by id, rows follow
    assert plan([rows[2], rows[0], rows[1]]) == plan([rows[2], rows[0], rows[1]], cached=False)
    assert list(cache.by_intent()) == ["c", "a", "b"]
