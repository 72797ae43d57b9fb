"""Intent validation: every rule names its field path, defaults are written in, and every
ResourceIntent field is documented in docs/intent-spec.md."""

from __future__ import annotations

import math
import re

import pytest
from google.protobuf.descriptor import FieldDescriptor

from parfusion.v1 import intent_pb2
from services.common.errors import InvalidArgument
from services.core.validation import normalize_intent
from tests.conftest import ROOT

LANES = ("online", "batch", "robot", "urgent")


def online(**overrides: object) -> intent_pb2.ResourceIntent:
    intent = intent_pb2.ResourceIntent(
        name="web",
        workload_class=intent_pb2.WORKLOAD_CLASS_ONLINE,
        slo=intent_pb2.Slo(deadline_ms=50),
    )
    for path, value in overrides.items():
        target = intent
        *parents, leaf = path.split("__")
        for p in parents:
            target = getattr(target, p)
        setattr(target, leaf, value)
    return intent


def error_field(intent: intent_pb2.ResourceIntent) -> str:
    with pytest.raises(InvalidArgument) as err:
        normalize_intent(intent, known_lanes=LANES)
    assert err.value.field is not None
    return err.value.field


def test_defaults_are_written_into_the_stored_form() -> None:
    out = normalize_intent(online(), known_lanes=LANES, default_node="node-0")
    assert out.priority == 500
    assert out.slo.target_percentile == 99.0
    assert out.slo.max_miss_ratio == 0.01
    assert out.parallelism.min == 1
    assert out.speedup.parallel_fraction == 0.9
    assert out.speedup.base_service_ms == 10.0
    assert list(out.degradation) == [intent_pb2.DEGRADATION_LEVEL_NORMAL]
    assert out.node == "node-0"


def test_input_is_not_modified_and_created_at_is_cleared() -> None:
    intent = online()
    intent.created_at.seconds = 42
    out = normalize_intent(intent)
    assert intent.priority == 0 and intent.created_at.seconds == 42
    assert not out.HasField("created_at")


def test_class_default_priorities() -> None:
    batch = intent_pb2.ResourceIntent(name="job", workload_class=intent_pb2.WORKLOAD_CLASS_BATCH)
    assert normalize_intent(batch).priority == 300
    urgent = online(workload_class=intent_pb2.WORKLOAD_CLASS_URGENT)
    assert normalize_intent(urgent).priority == 900


def test_degradation_ladder_is_sorted_and_starts_at_normal() -> None:
    intent = online()
    intent.degradation.extend(
        [intent_pb2.DEGRADATION_LEVEL_INT8, intent_pb2.DEGRADATION_LEVEL_FP16]
    )
    out = normalize_intent(intent)
    assert list(out.degradation) == [
        intent_pb2.DEGRADATION_LEVEL_NORMAL,
        intent_pb2.DEGRADATION_LEVEL_FP16,
        intent_pb2.DEGRADATION_LEVEL_INT8,
    ]


@pytest.mark.parametrize("cls", ["ONLINE", "ROBOT", "URGENT"])
def test_deadline_required_for_deadline_classes(cls: str) -> None:
    intent = online(workload_class=intent_pb2.WorkloadClass.Value(f"WORKLOAD_CLASS_{cls}"))
    intent.slo.deadline_ms = 0
    with pytest.raises(InvalidArgument) as err:
        normalize_intent(intent)
    assert str(err.value) == f"intent.slo.deadline_ms: required for {cls} (> 0)"


def test_batch_needs_no_deadline() -> None:
    batch = intent_pb2.ResourceIntent(name="job", workload_class=intent_pb2.WORKLOAD_CLASS_BATCH)
    assert normalize_intent(batch).slo.deadline_ms == 0


@pytest.mark.parametrize(
    ("intent", "field"),
    [
        (online(name=""), "intent.name"),
        (online(name="Web_1"), "intent.name"),
        (online(name="a" * 64), "intent.name"),
        (online(id="has space"), "intent.id"),
        (online(workload_class=0), "intent.workload_class"),
        (online(workload_class=99), "intent.workload_class"),
        (online(priority=1001), "intent.priority"),
        (online(slo__deadline_ms=-1.0), "intent.slo.deadline_ms"),
        (online(slo__deadline_ms=math.nan), "intent.slo.deadline_ms"),
        (online(slo__deadline_ms=math.inf), "intent.slo.deadline_ms"),
        (online(slo__target_percentile=101.0), "intent.slo.target_percentile"),
        (online(slo__max_miss_ratio=1.5), "intent.slo.max_miss_ratio"),
        (online(parallelism__min=4, parallelism__max=2), "intent.parallelism.max"),
        (online(parallelism__max=5000), "intent.parallelism.max"),
        (online(parallelism__min=2, parallelism__preferred=1), "intent.parallelism.preferred"),
        (online(parallelism__max=2, parallelism__preferred=3), "intent.parallelism.preferred"),
        (
            online(speedup__parallel_fraction=1.2, speedup__base_service_ms=5.0),
            "intent.speedup.parallel_fraction",
        ),
        (online(speedup__parallel_fraction=0.5), "intent.speedup.base_service_ms"),
        (online(speedup__base_service_ms=-3.0), "intent.speedup.base_service_ms"),
        (online(demand__arrival_rate_per_s=-1.0), "intent.demand.arrival_rate_per_s"),
        (online(demand__work_units=-1.0), "intent.demand.work_units"),
        (online(gpu__lane="nope"), "intent.gpu.lane"),
        (online(gpu__lane="Bad Lane"), "intent.gpu.lane"),
        (online(gpu__share=1.5), "intent.gpu.share"),
        (online(gpu__memory_bytes=1 << 60), "intent.gpu.memory_bytes"),
        (online(gpu__stream_priority_hint=2), "intent.gpu.stream_priority_hint"),
        (online(gpu__concurrency=1000), "intent.gpu.concurrency"),
        (
            online(workload_class=intent_pb2.WORKLOAD_CLASS_URGENT, preemptible=True),
            "intent.preemptible",
        ),
        (online(node="Not_A_Node"), "intent.node"),
    ],
)
def test_bad_field_is_named(intent: intent_pb2.ResourceIntent, field: str) -> None:
    assert error_field(intent) == field


def test_degradation_and_label_errors_name_the_element() -> None:
    intent = online()
    intent.degradation.extend(
        [intent_pb2.DEGRADATION_LEVEL_FP16, intent_pb2.DEGRADATION_LEVEL_FP16]
    )
    assert error_field(intent) == "intent.degradation[1]"
    intent = online()
    intent.degradation.append(intent_pb2.DEGRADATION_LEVEL_UNSPECIFIED)
    assert error_field(intent) == "intent.degradation[0]"
    intent = online()
    intent.labels["ok"] = "fine"
    intent.labels["bad key!"] = "x"
    assert error_field(intent) == "intent.labels[bad key!]"
    intent = online()
    intent.labels["team"] = "x" * 64
    assert error_field(intent) == "intent.labels[team]"
    intent = online()
    intent.labels.update({f"k{i}": "v" for i in range(65)})
    assert error_field(intent) == "intent.labels"


def test_unknown_lane_allowed_when_no_lanes_configured() -> None:
    assert normalize_intent(online(gpu__lane="custom")).gpu.lane == "custom"


def _documented_fields() -> set[str]:
    text = (ROOT / "docs" / "intent-spec.md").read_text()
    return set(re.findall(r"^\|\s*`([a-z_.]+)`", text, flags=re.MULTILINE))


def _walk(descriptor, prefix: str = ""):  # type: ignore[no-untyped-def]
    for f in descriptor.fields:
        path = f"{prefix}{f.name}"
        yield path
        is_map = f.message_type is not None and f.message_type.GetOptions().map_entry
        if (
            f.type == FieldDescriptor.TYPE_MESSAGE
            and not is_map
            and f.message_type.full_name.startswith("parfusion.")
        ):
            yield from _walk(f.message_type, f"{path}.")


def test_every_resource_intent_field_is_documented() -> None:
    fields = set(_walk(intent_pb2.ResourceIntent.DESCRIPTOR))
    assert "slo.deadline_ms" in fields and "gpu.concurrency" in fields and "labels" in fields
    missing = sorted(fields - _documented_fields())
    assert not missing, f"docs/intent-spec.md lacks a table row for: {missing}"
