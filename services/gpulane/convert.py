"""Plain lane-service data -> parfusion.v1 messages (and JSON for the run/ record)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from parfusion.v1 import gpulane_pb2, telemetry_pb2
from services.gpulane.backend import LaneLoad
from services.gpulane.lanes import LaneView
from services.gpulane.nvml import NvmlSnapshot
from services.gpulane.planner import LanePlacement
from services.gpulane.previews import CommandSpec


def decision(p: LanePlacement) -> gpulane_pb2.LaneDecision:
    return gpulane_pb2.LaneDecision(
        intent_id=p.intent_id,
        lane=p.lane,
        gpu_indexes=list(p.gpu_indexes),
        share_percent=p.share_percent,
        cuda_stream_priority=p.cuda_stream_priority,
        concurrency=p.concurrency,
        mig_profile=p.mig_profile,
        available=p.available,
        reason=p.reason,
    )


def command(c: CommandSpec) -> gpulane_pb2.GpuCommand:
    return gpulane_pb2.GpuCommand(
        argv=list(c.argv), stdin=c.stdin, env=dict(c.env), purpose=c.purpose, intent_id=c.intent_id
    )


def placement_json(p: LanePlacement) -> dict[str, Any]:
    out = asdict(p)
    out["gpu_indexes"] = list(p.gpu_indexes)
    out["reference_indexes"] = list(p.reference_indexes)
    return out


def command_json(c: CommandSpec) -> dict[str, Any]:
    return {
        "argv": list(c.argv),
        "stdin": c.stdin,
        "env": dict(c.env),
        "purpose": c.purpose,
        "intent_id": c.intent_id,
        "kind": c.kind,
    }


def telemetry(
    snapshot: NvmlSnapshot,
    lanes: tuple[LaneView, ...],
    shares: Mapping[str, float],
    load: LaneLoad,
    idle: Mapping[int, bool],
) -> telemetry_pb2.GpuTelemetry:
    observed = Timestamp()
    observed.FromNanoseconds(int(snapshot.observed_at * 1e9))
    return telemetry_pb2.GpuTelemetry(
        observed_at=observed,
        nvml_available=snapshot.available,
        nvml_error=snapshot.error,
        driver_version=snapshot.driver_version,
        devices=[
            telemetry_pb2.GpuDevice(
                index=d.index,
                name=d.name,
                uuid=d.uuid,
                utilization_percent=d.utilization_percent,
                memory_total_bytes=d.memory_total_bytes,
                memory_used_bytes=d.memory_used_bytes,
                power_watts=d.power_watts,
                temperature_c=d.temperature_c,
                processes=[
                    telemetry_pb2.GpuProcess(pid=p.pid, used_memory_bytes=p.used_memory_bytes)
                    for p in d.processes
                ],
                idle=idle.get(d.index, False),
            )
            for d in snapshot.devices
        ],
        lanes=[
            telemetry_pb2.LaneStatus(
                name=v.name,
                configured_indexes=list(v.configured),
                present_indexes=list(v.present),
                available=v.available,
                reason=v.reason,
                allocated_share_percent=shares.get(v.name, 0.0),
            )
            for v in lanes
        ],
        backend=load.backend,
        gpu_pressure=load.gpu_pressure,
    )
