"""Translation at the allocator's edges: protos and intent documents <-> the policy core's model.

The policy core (services/core/model.py) never sees a protobuf. This module turns stored
ResourceIntents into IntentSpecs, telemetry into NodeState ingredients, and the YAML/JSON intent
documents that ``parfusion submit`` and the demo seed read into ResourceIntent protos.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from google.protobuf import json_format

from parfusion.v1 import intent_pb2, telemetry_pb2
from services.common.errors import InvalidArgument
from services.core import model

CLASS_TO_MODEL: dict[int, model.WorkloadClass] = {
    intent_pb2.WORKLOAD_CLASS_ONLINE: "ONLINE",
    intent_pb2.WORKLOAD_CLASS_BATCH: "BATCH",
    intent_pb2.WORKLOAD_CLASS_ROBOT: "ROBOT",
    intent_pb2.WORKLOAD_CLASS_URGENT: "URGENT",
}
DEGRADATION_TO_MODEL: dict[int, model.Degradation] = {
    intent_pb2.DEGRADATION_LEVEL_NORMAL: "NORMAL",
    intent_pb2.DEGRADATION_LEVEL_FP16: "FP16",
    intent_pb2.DEGRADATION_LEVEL_INT8: "INT8",
}
DEGRADATION_TO_PROTO: dict[str, intent_pb2.DegradationLevel] = {
    "NORMAL": intent_pb2.DEGRADATION_LEVEL_NORMAL,
    "FP16": intent_pb2.DEGRADATION_LEVEL_FP16,
    "INT8": intent_pb2.DEGRADATION_LEVEL_INT8,
}
STATE_TO_PROTO: dict[str, intent_pb2.AllocationState] = {
    "ADMITTED": intent_pb2.ALLOCATION_STATE_ADMITTED,
    "THROTTLED": intent_pb2.ALLOCATION_STATE_THROTTLED,
    "DEGRADED": intent_pb2.ALLOCATION_STATE_DEGRADED,
    "PREEMPTED": intent_pb2.ALLOCATION_STATE_PREEMPTED,
}


def intent_to_spec(intent: intent_pb2.ResourceIntent, seq: int = 0) -> model.IntentSpec:
    """A stored (validated, defaulted) ResourceIntent as the policy core's IntentSpec."""
    return model.IntentSpec(
        id=intent.id,
        name=intent.name,
        workload_class=CLASS_TO_MODEL[intent.workload_class],
        priority=intent.priority,
        deadline_ms=intent.slo.deadline_ms,
        target_percentile=intent.slo.target_percentile,
        max_miss_ratio=intent.slo.max_miss_ratio,
        min_units=intent.parallelism.min,
        max_units=intent.parallelism.max,
        preferred_units=intent.parallelism.preferred,
        parallel_fraction=intent.speedup.parallel_fraction,
        base_service_ms=intent.speedup.base_service_ms,
        arrival_rate_per_s=intent.demand.arrival_rate_per_s,
        work_units=intent.demand.work_units,
        gpu_lane=intent.gpu.lane,
        gpu_share=intent.gpu.share,
        gpu_memory_bytes=intent.gpu.memory_bytes,
        gpu_stream_priority_hint=intent.gpu.stream_priority_hint,
        gpu_concurrency=intent.gpu.concurrency,
        degradation=tuple(DEGRADATION_TO_MODEL[d] for d in intent.degradation) or ("NORMAL",),
        preemptible=intent.preemptible,
        elastic=intent.elastic,
        node=intent.node,
        seq=seq,
    )


def disturbance_to_model(d: telemetry_pb2.Disturbance) -> model.Disturbance:
    return model.Disturbance(
        cpu=_unit(d.cpu_pressure), gpu=_unit(d.gpu_pressure), network=_unit(d.network_pressure)
    )


def validate_disturbance(d: telemetry_pb2.Disturbance, field: str = "disturbance") -> None:
    for name in ("cpu_pressure", "gpu_pressure", "network_pressure"):
        value = getattr(d, name)
        if not math.isfinite(value) or not 0.0 <= value <= 1.0:
            raise InvalidArgument(f"must be in [0, 1], got {value:g}", field=f"{field}.{name}")
    if not math.isfinite(d.duration_s) or d.duration_s < 0:
        raise InvalidArgument("must be >= 0", field=f"{field}.duration_s")


def node_contention(tel: telemetry_pb2.NodeTelemetry) -> float:
    """Measured CPU contention in [0, 1]: PSI cpu 'some' avg10 where the kernel has it, else the
    mean per-core utilisation (a weaker signal: busy is not the same as contended)."""
    if tel.cpu_pressure.available:
        return _unit(tel.cpu_pressure.some_avg10 / 100.0)
    if tel.cpu_percent_per_core:
        return _unit(sum(tel.cpu_percent_per_core) / len(tel.cpu_percent_per_core) / 100.0)
    return 0.0


def active_disturbance(
    tel: telemetry_pb2.NodeTelemetry | None, gpu_pressure: float = 0.0
) -> model.Disturbance:
    """The disturbance the node agent reports as active, plus the GPU pressure gpulane measures."""
    if tel is None or tel.disturbance_remaining_s <= 0:
        return model.Disturbance(gpu=_unit(gpu_pressure))
    d = disturbance_to_model(tel.active_disturbance)
    return model.Disturbance(cpu=d.cpu, gpu=max(d.gpu, _unit(gpu_pressure)), network=d.network)


def lanes_from_telemetry(
    gpu: telemetry_pb2.GpuTelemetry | None, configured: Mapping[str, Sequence[int]]
) -> tuple[model.LaneCapacity, ...]:
    """Lanes with the GPU indexes actually present; without GPU telemetry every configured lane
    is listed with no GPUs (unavailable): never a placeholder GPU."""
    if gpu is not None and gpu.lanes:
        return tuple(
            model.LaneCapacity(
                name=lane.name,
                gpu_indexes=tuple(lane.present_indexes) if lane.available else (),
                share_units=100 * len(lane.present_indexes) if lane.available else 0,
            )
            for lane in gpu.lanes
        )
    return tuple(
        model.LaneCapacity(name=name, gpu_indexes=(), share_units=0) for name in configured
    )


def _unit(value: float) -> float:
    if not math.isfinite(value):
        return 0.0
    return min(1.0, max(0.0, float(value)))


# --- intent documents (YAML / JSON files, the proto JSON mapping) ------------------------------

_ENUM_FIELDS = {
    "workload_class": "WORKLOAD_CLASS_",
    "workloadClass": "WORKLOAD_CLASS_",
}
_ENUM_LIST_FIELDS = {"degradation": "DEGRADATION_LEVEL_"}


def _enum_name(value: Any, prefix: str) -> Any:
    if isinstance(value, str):
        upper = value.strip().upper().replace("-", "_")
        return upper if upper.startswith(prefix) else prefix + upper
    return value


def intent_from_document(doc: Mapping[str, Any]) -> intent_pb2.ResourceIntent:
    """One intent from its proto JSON form (snake_case or lowerCamelCase keys). Enum values may
    be short (``ONLINE``, ``fp16``) or full (``WORKLOAD_CLASS_ONLINE``). A SubmitIntentRequest
    shape (``{"intent": {...}}``) is accepted too, so grpcurl payloads can be reused."""
    if not isinstance(doc, Mapping):
        raise InvalidArgument("an intent must be a mapping of fields", field="intent")
    if set(doc) == {"intent"} and isinstance(doc["intent"], Mapping):
        doc = doc["intent"]
    fixed: dict[str, Any] = dict(doc)
    for key, prefix in _ENUM_FIELDS.items():
        if key in fixed:
            fixed[key] = _enum_name(fixed[key], prefix)
    for key, prefix in _ENUM_LIST_FIELDS.items():
        if isinstance(fixed.get(key), list):
            fixed[key] = [_enum_name(v, prefix) for v in fixed[key]]
    if isinstance(fixed.get("labels"), Mapping):
        fixed["labels"] = {str(k): str(v) for k, v in fixed["labels"].items()}
    intent = intent_pb2.ResourceIntent()
    try:
        json_format.ParseDict(json.loads(json.dumps(fixed, default=str)), intent)
    except (json_format.ParseError, OverflowError, ValueError) as exc:
        # OverflowError: protobuf converting an infinite float to an enum or integer field
        raise InvalidArgument(str(exc), field="intent") from exc
    return intent


def documents_in_file(path: Path) -> list[Mapping[str, Any]]:
    """The intents a YAML or JSON file holds: one mapping, a list, or ``{intents: [...]}``."""
    text = Path(path).read_text()
    try:
        doc = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise InvalidArgument(
            f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}"
        ) from exc
    if isinstance(doc, Mapping) and isinstance(doc.get("intents"), list):
        doc = doc["intents"]
    docs: Iterable[Any] = doc if isinstance(doc, list) else [doc]
    out = []
    for item in docs:
        if not isinstance(item, Mapping):
            raise InvalidArgument(f"{path}: each intent must be a mapping of fields")
        out.append(item)
    return out


def intents_in_file(path: Path) -> list[intent_pb2.ResourceIntent]:
    return [intent_from_document(doc) for doc in documents_in_file(Path(path))]
