"""What the allocator knows of its node: the last telemetry, and the NodeState a tick plans on.

``Telemetry`` holds the last node and GPU telemetry the loop accepted (pulled or pushed);
``node_state`` turns it into the NodeState for the policy core: capacity (configured, else the
agent's arena, else the machine's CPUs), GPU lanes, contention, an active disturbance, and
whether the node is stale.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from google.protobuf.timestamp_pb2 import Timestamp

from parfusion.v1 import telemetry_pb2
from services.core import convert, model


@dataclass
class Telemetry:
    node: telemetry_pb2.NodeTelemetry | None = None
    # (monotonic receipt, wall time) of `node`, replaced whole with it: GetPlan reads it from
    # the server's event loop without the loop's lock
    node_seen: tuple[float, Timestamp] | None = None
    gpu: telemetry_pb2.GpuTelemetry | None = None
    contention: float = 0.0


def is_stale(seen: tuple[float, Timestamp] | None, now: float, stale_after_s: float) -> bool:
    """Whether node telemetry received at monotonic ``seen[0]`` (None: never) is too old at
    ``now``."""
    return seen is None or now - seen[0] > stale_after_s


def node_state(
    tel: Telemetry,
    now: float,
    *,
    node_name: str,
    cpu_units: int,
    stale_after_s: float,
    configured_lanes: Mapping[str, Sequence[int]],
) -> model.NodeState:
    """Capacity, lanes, contention and disturbance from the last known telemetry, at monotonic
    time `now` (telemetry older than stale_after_s makes the node stale); cpu_units 0: the
    agent's arena size, else os.cpu_count()."""
    node = tel.node
    arena = tuple(node.arena_cpus) if node is not None else ()
    units = cpu_units or len(arena) or os.cpu_count() or 1
    # More units than arena cores (allocator.cpu_units set by hand) oversubscribe the real
    # cores: CPU sets must only ever name CPUs the node agent has.
    cpu_ids = arena[:units] if arena else tuple(range(units))
    seen = tel.node_seen
    stale = node is None or is_stale(seen, now, stale_after_s)
    disturbance = model.Disturbance()
    gpu_pressure = tel.gpu.gpu_pressure if tel.gpu is not None else 0.0
    if node is not None and seen is not None and node.disturbance_remaining_s > now - seen[0]:
        disturbance = convert.active_disturbance(node, gpu_pressure)
    elif gpu_pressure:
        disturbance = convert.active_disturbance(None, gpu_pressure)
    return model.NodeState(
        name=node_name,
        cpu_units=units,
        cpu_ids=cpu_ids,
        lanes=convert.lanes_from_telemetry(tel.gpu, configured_lanes),
        contention=tel.contention,
        disturbance=disturbance,
        stale=stale,
    )
