"""GpuPlan messages for the lane tests, shaped like the allocator's per-tick plan."""

from __future__ import annotations

from parfusion.v1 import intent_pb2

GIB = 2**30


def assignment(
    intent_id: str,
    lane: str,
    share: float,
    priority: int = 0,
    *,
    concurrency: int = 0,
    memory_gib: int = 0,
    gpus: tuple[int, ...] = (),
) -> intent_pb2.GpuAssignment:
    return intent_pb2.GpuAssignment(
        intent_id=intent_id,
        intent_name=intent_id,
        lane=lane,
        gpu_indexes=list(gpus),
        share_percent=share,
        stream_priority=priority,
        concurrency=concurrency,
        memory_limit_bytes=memory_gib * GIB,
    )


def demo_plan(
    policy: str = "parfusion", enabled: bool = True, generation: int = 1
) -> intent_pb2.GpuPlan:
    return intent_pb2.GpuPlan(
        node="node-0",
        generation=generation,
        policy=policy,
        gpu_intent_enabled=enabled,
        assignments=[
            assignment("chat", "online", 40.0, 1, concurrency=2, memory_gib=8),
            assignment("train", "batch", 57.0, -1, concurrency=1, memory_gib=16),
            assignment("arm", "robot", 25.0, 0),
            assignment("estop", "urgent", 14.0, 1),
        ],
    )
