"""gRPC wiring of the GPU-lane service: settings -> controller -> GpuLaneService servicer.

Domain modules do the work (controller, planner, previews, nvml); this file only builds them
from the gpulane config section, registers the servicer and starts the opt-in load workers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from parfusion.v1 import gpulane_pb2, gpulane_pb2_grpc
from services.common.config import ConfigError, ServiceSettings, parse_service_args
from services.common.errors import InvalidArgument
from services.common.grpc_server import Registration, serve_forever
from services.common.logs import configure_logging
from services.gpulane.backend import build_lane_load
from services.gpulane.controller import LaneController, LaneOptions
from services.gpulane.lanes import parse_lanes
from services.gpulane.load import GpuLoadWorkers
from services.gpulane.nvml import DEFAULT_IDLE_UTILIZATION_PERCENT, Nvml
from services.gpulane.priority import probe_priority_range
from services.gpulane.recorder import PlanRecorder

SERVICE_NAME = gpulane_pb2.DESCRIPTOR.services_by_name["GpuLaneService"].full_name
MODES = ("dry-run", "apply")


class GpuLaneServicer(gpulane_pb2_grpc.GpuLaneServiceServicer):
    def __init__(self, controller: LaneController) -> None:
        self.controller = controller

    def ApplyGpuPlan(self, request: Any, context: Any) -> gpulane_pb2.ApplyGpuPlanResponse:  # noqa: N802
        if request.mode not in gpulane_pb2.ApplyMode.values():
            raise InvalidArgument(f"unknown mode {request.mode}", field="mode")
        return self.controller.apply(request)

    def GetGpuTelemetry(self, request: Any, context: Any) -> gpulane_pb2.GetGpuTelemetryResponse:  # noqa: N802
        return gpulane_pb2.GetGpuTelemetryResponse(telemetry=self.controller.telemetry())

    def PreviewCommands(self, request: Any, context: Any) -> gpulane_pb2.PreviewCommandsResponse:  # noqa: N802
        return self.controller.preview(request.plan if request.HasField("plan") else None)


def build_controller(
    settings: ServiceSettings, nvml: Nvml | None = None, own_pids: Callable[[], Any] = tuple
) -> LaneController:
    mode = settings.get_str("mode", "dry-run")
    if mode not in MODES:
        raise ConfigError(f"gpulane.mode: expected one of {', '.join(MODES)}, got {mode!r}")
    options = LaneOptions(
        lanes=parse_lanes(settings.get("lanes")),
        mode=mode,
        reference_preview=settings.get_bool("reference_preview", True),
        idle_utilization_percent=settings.get_float(
            "idle_utilization_percent", DEFAULT_IDLE_UTILIZATION_PERCENT
        ),
    )
    return LaneController(
        options,
        nvml=nvml or Nvml(),
        recorder=PlanRecorder(settings.run_dir, settings.get_int("max_records", 200)),
        load_source=build_lane_load(settings.get_str("backend", "nvml"), settings.section),
        priority_probe=probe_priority_range,
        own_pids=own_pids,
    )


def build(settings: ServiceSettings) -> tuple[list[Registration], list[Callable[[], None]]]:
    workers = GpuLoadWorkers(settings)
    controller = build_controller(settings, own_pids=workers.pids)
    workers.start(controller)
    controller.telemetry()  # first NVML read: the nvml/lane gauges are right from the start
    servicer = GpuLaneServicer(controller)
    registration = (gpulane_pb2_grpc.add_GpuLaneServiceServicer_to_server, servicer, SERVICE_NAME)
    return [registration], [workers.stop]


def main(argv: Sequence[str] | None = None) -> None:
    settings, _ = parse_service_args("gpulane", argv)
    configure_logging(settings.log_level, settings.log_format, "gpulane")
    serve_forever(settings, build)
