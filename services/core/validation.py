"""Validation of a submitted ResourceIntent against docs/intent-spec.md, with defaults applied.

SubmitIntent calls :func:`normalize_intent` before anything touches the store: the first rule
an intent breaks becomes an InvalidArgument naming the field path (``intent.slo.deadline_ms``),
and nothing is stored. The returned copy carries every server-side default explicitly, so what
GetIntent shows is exactly what the policies plan with.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection

from parfusion.v1 import intent_pb2
from services.common.errors import InvalidArgument

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
INTENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")

MAX_PRIORITY = 1000
MAX_DEADLINE_MS = 3_600_000.0  # one hour: beyond that a deadline is not a control-loop concern
MAX_BASE_SERVICE_MS = 3_600_000.0
# 1 µs: below it the node counts items per second beyond any counter (1e-300 ms was accepted
# and then overflowed the node agent's uint64 telemetry on every later call)
MIN_BASE_SERVICE_MS = 0.001
MAX_UNITS = 4096
MAX_ARRIVAL_RATE_PER_S = 1_000_000.0
MAX_WORK_UNITS = 1e12
MAX_GPU_MEMORY_BYTES = 1 << 50  # 1 PiB: catches unit mistakes (bits, KiB), not real limits
MAX_GPU_CONCURRENCY = 128
MAX_LABELS = 64

DEFAULT_PRIORITY = {
    intent_pb2.WORKLOAD_CLASS_URGENT: 900,
    intent_pb2.WORKLOAD_CLASS_ROBOT: 700,
    intent_pb2.WORKLOAD_CLASS_ONLINE: 500,
    intent_pb2.WORKLOAD_CLASS_BATCH: 300,
}
DEADLINE_CLASSES = {
    intent_pb2.WORKLOAD_CLASS_ONLINE,
    intent_pb2.WORKLOAD_CLASS_ROBOT,
    intent_pb2.WORKLOAD_CLASS_URGENT,
}
DEFAULT_TARGET_PERCENTILE = 99.0
DEFAULT_MAX_MISS_RATIO = 0.01
DEFAULT_PARALLEL_FRACTION = 0.9
DEFAULT_BASE_SERVICE_MS = 10.0
LADDER = (
    intent_pb2.DEGRADATION_LEVEL_NORMAL,
    intent_pb2.DEGRADATION_LEVEL_FP16,
    intent_pb2.DEGRADATION_LEVEL_INT8,
)


def class_name(value: int) -> str:
    """``WORKLOAD_CLASS_ONLINE`` -> ``ONLINE`` (the short form error messages use)."""
    try:
        return intent_pb2.WorkloadClass.Name(value).removeprefix("WORKLOAD_CLASS_")
    except ValueError:
        return str(value)


def _bad(field: str, message: str) -> InvalidArgument:
    return InvalidArgument(message, field=f"intent.{field}")


def _number(field: str, value: float, low: float, high: float, *, low_open: bool = False) -> None:
    if not math.isfinite(value):
        raise _bad(field, "must be a finite number")
    if value < low or (low_open and value == low) or value > high:
        bracket = "(" if low_open else "["
        raise _bad(field, f"must be in {bracket}{low:g}, {high:g}], got {value:g}")


def validate_id(intent_id: str, field: str = "intent.id") -> None:
    """Ids are opaque to the allocator but travel in URLs, label values and file names."""
    if not INTENT_ID.match(intent_id):
        raise InvalidArgument(
            "must be 1-128 characters of [A-Za-z0-9._-] starting with a letter or digit",
            field=field,
        )


def normalize_intent(
    intent: intent_pb2.ResourceIntent,
    *,
    known_lanes: Collection[str] = (),
    default_node: str = "",
) -> intent_pb2.ResourceIntent:
    """Check every field and return a copy with the defaults written in (input is untouched).

    ``known_lanes``: the lane names the node is configured with; when given, gpu.lane must be
    one of them. ``default_node``: written into an empty ``node`` (this allocator's node).
    ``id`` may be empty (the store assigns one); ``created_at`` is output only and cleared.
    """
    out = intent_pb2.ResourceIntent()
    out.CopyFrom(intent)
    out.ClearField("created_at")
    if out.id:
        validate_id(out.id)
    _check_name(out)
    cls = out.workload_class
    if cls not in DEFAULT_PRIORITY:
        if cls == intent_pb2.WORKLOAD_CLASS_UNSPECIFIED:
            raise _bad("workload_class", "required: ONLINE, BATCH, ROBOT or URGENT")
        raise _bad("workload_class", f"unknown value {cls}")
    _number("priority", out.priority, 0, MAX_PRIORITY)
    if out.priority == 0:
        out.priority = DEFAULT_PRIORITY[cls]
    _check_slo(out)
    _check_parallelism(out)
    _check_speedup(out)
    _check_demand(out)
    _check_gpu(out, known_lanes)
    _check_degradation(out)
    if out.preemptible and cls == intent_pb2.WORKLOAD_CLASS_URGENT:
        raise _bad("preemptible", "URGENT intents cannot be preemptible")
    if out.node:
        if len(out.node) > 253 or not DNS1123_SUBDOMAIN.match(out.node):
            raise _bad("node", "must be a DNS-1123 subdomain (lower-case, at most 253 characters)")
    else:
        out.node = default_node
    _check_labels(out)
    return out


def _check_name(out: intent_pb2.ResourceIntent) -> None:
    if not out.name:
        raise _bad("name", "required")
    if len(out.name) > 63 or not DNS1123_LABEL.match(out.name):
        raise _bad(
            "name",
            f"must be a DNS-1123 label (lower-case letters, digits and '-', at most 63), got {out.name!r}",
        )


def _check_slo(out: intent_pb2.ResourceIntent) -> None:
    slo = out.slo
    cls = out.workload_class
    _number("slo.deadline_ms", slo.deadline_ms, 0.0, MAX_DEADLINE_MS)
    if cls in DEADLINE_CLASSES and slo.deadline_ms == 0:
        raise _bad("slo.deadline_ms", f"required for {class_name(cls)} (> 0)")
    _number("slo.target_percentile", slo.target_percentile, 0.0, 100.0)
    if slo.target_percentile == 0:
        slo.target_percentile = DEFAULT_TARGET_PERCENTILE
    _number("slo.max_miss_ratio", slo.max_miss_ratio, 0.0, 1.0)
    if slo.max_miss_ratio == 0:
        slo.max_miss_ratio = DEFAULT_MAX_MISS_RATIO


def _check_parallelism(out: intent_pb2.ResourceIntent) -> None:
    par = out.parallelism
    for name in ("min", "max", "preferred"):
        value = getattr(par, name)
        if value > MAX_UNITS:
            raise _bad(f"parallelism.{name}", f"must be at most {MAX_UNITS}, got {value}")
    if par.min == 0:
        par.min = 1
    if par.max and par.max < par.min:
        raise _bad("parallelism.max", f"must be >= parallelism.min ({par.min}), got {par.max}")
    if par.preferred:
        if par.preferred < par.min:
            raise _bad("parallelism.preferred", f"must be >= parallelism.min ({par.min})")
        if par.max and par.preferred > par.max:
            raise _bad("parallelism.preferred", f"must be <= parallelism.max ({par.max})")


def _check_speedup(out: intent_pb2.ResourceIntent) -> None:
    if not out.HasField("speedup"):
        out.speedup.parallel_fraction = DEFAULT_PARALLEL_FRACTION
        out.speedup.base_service_ms = DEFAULT_BASE_SERVICE_MS
        return
    sp = out.speedup
    _number("speedup.parallel_fraction", sp.parallel_fraction, 0.0, 1.0)
    if sp.base_service_ms == 0:
        raise _bad("speedup.base_service_ms", "required when speedup is given (> 0)")
    _number("speedup.base_service_ms", sp.base_service_ms, MIN_BASE_SERVICE_MS, MAX_BASE_SERVICE_MS)


def _check_demand(out: intent_pb2.ResourceIntent) -> None:
    _number("demand.arrival_rate_per_s", out.demand.arrival_rate_per_s, 0.0, MAX_ARRIVAL_RATE_PER_S)
    _number("demand.work_units", out.demand.work_units, 0.0, MAX_WORK_UNITS)


def _check_gpu(out: intent_pb2.ResourceIntent, known_lanes: Collection[str]) -> None:
    gpu = out.gpu
    if gpu.lane:
        if not DNS1123_LABEL.match(gpu.lane):
            raise _bad("gpu.lane", f"must be a lane name (DNS-1123 label), got {gpu.lane!r}")
        if known_lanes and gpu.lane not in known_lanes:
            raise _bad(
                "gpu.lane",
                f"unknown lane {gpu.lane!r}; configured: {', '.join(sorted(known_lanes))}",
            )
    _number("gpu.share", gpu.share, 0.0, 1.0)
    if gpu.memory_bytes > MAX_GPU_MEMORY_BYTES:
        raise _bad("gpu.memory_bytes", f"must be at most {MAX_GPU_MEMORY_BYTES}")
    _number("gpu.stream_priority_hint", gpu.stream_priority_hint, -1, 1)
    if gpu.concurrency > MAX_GPU_CONCURRENCY:
        raise _bad("gpu.concurrency", f"must be at most {MAX_GPU_CONCURRENCY}")


def _check_degradation(out: intent_pb2.ResourceIntent) -> None:
    seen: set[int] = set()
    for index, level in enumerate(out.degradation):
        if level not in LADDER:
            raise _bad(f"degradation[{index}]", "must be NORMAL, FP16 or INT8")
        if level in seen:
            raise _bad(
                f"degradation[{index}]", f"duplicate {intent_pb2.DegradationLevel.Name(level)}"
            )
        seen.add(level)
    # Stored in ladder order and always starting at NORMAL: the ladder is walked downwards.
    seen.add(intent_pb2.DEGRADATION_LEVEL_NORMAL)
    del out.degradation[:]
    out.degradation.extend(level for level in LADDER if level in seen)


def _check_labels(out: intent_pb2.ResourceIntent) -> None:
    if len(out.labels) > MAX_LABELS:
        raise _bad("labels", f"at most {MAX_LABELS} labels, got {len(out.labels)}")
    for key in sorted(out.labels):
        value = out.labels[key]
        prefix, _, name = key.rpartition("/")
        if not name or len(name) > 63 or not LABEL_NAME.match(name):
            raise _bad(
                f"labels[{key}]", "key must be [prefix/]name with name a 1-63 character label"
            )
        if prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)):
            raise _bad(f"labels[{key}]", "key prefix must be a DNS-1123 subdomain")
        if len(value) > 63 or not LABEL_NAME.match(value):
            raise _bad(f"labels[{key}]", "value must be at most 63 characters of [A-Za-z0-9._-]")
