"""Modeled CPU / GPU / network interference: validated once, active for a duration, then gone.

Every disturbance reaches the model through ``disturbance_from_proto`` — the node agent's
InjectDisturbance RPC on the modeled backend, the dynamic experiment and a user with grpcurl all
hand in the same ``parfusion.v1.Disturbance`` message — so they share one validation and one
meaning: pressure p in [0, 1] is the fraction of that resource taken by someone else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from parfusion.v1 import telemetry_pb2
from services.common.errors import InvalidArgument

MAX_DURATION_S = 3600.0


@dataclass(frozen=True, slots=True)
class DisturbanceSpec:
    cpu: float = 0.0
    gpu: float = 0.0
    network: float = 0.0
    duration_s: float = 0.0
    source: str = ""


@dataclass(frozen=True, slots=True)
class ActiveDisturbance:
    spec: DisturbanceSpec
    started_s: float

    @property
    def expires_s(self) -> float:
        return self.started_s + self.spec.duration_s

    def remaining_s(self, now_s: float) -> float:
        return max(0.0, self.expires_s - now_s)


NONE = DisturbanceSpec()


def disturbance_from_proto(message: telemetry_pb2.Disturbance) -> DisturbanceSpec:
    """Validate an injected disturbance; a bad field is INVALID_ARGUMENT naming it."""
    for name in ("cpu_pressure", "gpu_pressure", "network_pressure"):
        value = getattr(message, name)
        if not math.isfinite(value) or not 0.0 <= value <= 1.0:
            raise InvalidArgument(f"must be in [0, 1], got {value}", field=f"disturbance.{name}")
    duration = message.duration_s
    if not math.isfinite(duration) or not 0.0 < duration <= MAX_DURATION_S:
        raise InvalidArgument(
            f"must be in (0, {MAX_DURATION_S:.0f}] seconds, got {duration}",
            field="disturbance.duration_s",
        )
    return DisturbanceSpec(
        cpu=message.cpu_pressure,
        gpu=message.gpu_pressure,
        network=message.network_pressure,
        duration_s=duration,
        source=message.source or "api",
    )


def disturbance_to_proto(spec: DisturbanceSpec) -> telemetry_pb2.Disturbance:
    return telemetry_pb2.Disturbance(
        cpu_pressure=spec.cpu,
        gpu_pressure=spec.gpu,
        network_pressure=spec.network,
        duration_s=spec.duration_s,
        source=spec.source,
    )
