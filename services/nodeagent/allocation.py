"""What every node backend checks in a NodePlan before it touches anything.

``check_allocation`` validates one allocation's fields (a precise InvalidArgument naming the
field) and ``check_unique`` that no intent appears twice; the real and the modeled backend
both call them, so a plan one accepts the other accepts too (but for which CPUs exist).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

from parfusion.v1 import intent_pb2
from services.common.errors import InvalidArgument
from services.core.convert import CLASS_TO_MODEL
from services.core.model import WorkloadClass
from services.core.validation import (
    MAX_ARRIVAL_RATE_PER_S,
    MAX_BASE_SERVICE_MS,
    MAX_DEADLINE_MS,
    MIN_BASE_SERVICE_MS,
)
from services.nodeagent.osctl import NICE_MAX, NICE_MIN, SCHED_POLICIES

# A plan's numbers are bounded like the intents they come from (services/core/validation.py):
# a pool or the model is sized by them (an arrival rate of 1e300 broke the model's Poisson
# draw; a service time of 1e-300 ms overflowed the telemetry counters).
ALLOCATION_BOUNDS = {
    "base_service_ms": MAX_BASE_SERVICE_MS,
    "arrival_rate_per_s": MAX_ARRIVAL_RATE_PER_S,
    "deadline_ms": MAX_DEADLINE_MS,
}


def check_allocation(
    index: int, a: intent_pb2.Allocation, cpus: Collection[int], not_cpus: str
) -> tuple[WorkloadClass, str]:
    """(workload class, scheduling policy) of allocations[index]; `cpus` are the CPUs its cpu
    set may name, `not_cpus` ends the message for one that names others."""
    where = f"allocations[{index}]"
    if not a.intent_id:
        raise InvalidArgument("required", field=f"{where}.intent_id")
    cls = CLASS_TO_MODEL.get(a.workload_class)
    if cls is None:
        raise InvalidArgument(
            "must be ONLINE, BATCH, ROBOT or URGENT", field=f"{where}.workload_class"
        )
    if not NICE_MIN <= a.nice <= NICE_MAX:
        raise InvalidArgument(f"{a.nice} outside -20..19", field=f"{where}.nice")
    policy = a.sched_policy or "other"
    if policy not in SCHED_POLICIES:
        raise InvalidArgument(
            f"{policy!r} is not other, batch or idle", field=f"{where}.sched_policy"
        )
    unknown = sorted(set(a.cpu_set) - set(cpus))
    if unknown:
        raise InvalidArgument(f"cpus {unknown} {not_cpus}", field=f"{where}.cpu_set")
    for name, limit in ALLOCATION_BOUNDS.items():
        value = getattr(a, name)
        if not (math.isfinite(value) and 0 <= value <= limit):
            raise InvalidArgument(
                f"must be a finite number in [0, {limit:g}], got {value}", field=f"{where}.{name}"
            )
    if 0 < a.base_service_ms < MIN_BASE_SERVICE_MS:  # 0 is "the default"
        raise InvalidArgument(
            f"must be 0 (default) or at least {MIN_BASE_SERVICE_MS:g}, got {a.base_service_ms}",
            field=f"{where}.base_service_ms",
        )
    if not 0.0 <= a.parallel_fraction <= 1.0:
        raise InvalidArgument("must be in [0, 1]", field=f"{where}.parallel_fraction")
    return cls, policy


def check_unique(intent_ids: Sequence[str]) -> None:
    """InvalidArgument when an intent appears twice in the plan."""
    if len(set(intent_ids)) != len(intent_ids):
        raise InvalidArgument("an intent appears twice", field="plan.allocations")
