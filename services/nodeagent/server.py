"""Node agent gRPC wiring: NodeAgentService over the configured backend.

ApplyNodePlan, GetNodeTelemetry and InjectDisturbance go straight to the backend;
ControlProcess changes affinity/nice only for a PID the backend started (anything else is
PERMISSION_DENIED and nothing changes). The backend is chosen once from nodeagent.backend.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from parfusion.v1 import nodeagent_pb2, nodeagent_pb2_grpc
from services.common.config import ConfigError, ServiceSettings, parse_service_args
from services.common.errors import InvalidArgument, PermissionDenied
from services.common.grpc_server import (
    Registration,
    RunningServer,
    serve_forever,
    start_grpc_server,
)
from services.common.logs import configure_logging
from services.nodeagent import metrics, osctl
from services.nodeagent.backend import (
    BackendOptions,
    NodeBackend,
    check_generation,
    create_backend,
)

log = logging.getLogger(__name__)
SERVICE_NAME = nodeagent_pb2.DESCRIPTOR.services_by_name["NodeAgentService"].full_name


class NodeAgentServicer(nodeagent_pb2_grpc.NodeAgentServiceServicer):
    def __init__(self, backend: NodeBackend) -> None:
        self.backend = backend
        metrics.ARENA_CPUS.set(len(getattr(backend, "arena", ()) or ()))

    def ApplyNodePlan(self, request: Any, context: Any) -> Any:  # noqa: N802
        try:
            check_generation(request.plan.generation)
            applied = self.backend.apply(request.plan)
        except Exception:
            metrics.PLANS_APPLIED.labels("rejected").inc()
            raise
        metrics.PLANS_APPLIED.labels("applied").inc()
        metrics.OWNED_PROCESSES.set(len(self.backend.owned_pids()))
        return nodeagent_pb2.ApplyNodePlanResponse(
            generation=request.plan.generation,
            applied=applied,
            cgroup_plan_path=self.backend.cgroup_plan_path(),
        )

    def GetNodeTelemetry(self, request: Any, context: Any) -> Any:  # noqa: N802
        telemetry = self.backend.telemetry(drain=request.drain_samples)
        for kind in ("online", "batch"):
            metrics.POOL_WORKERS.labels(kind).set(
                sum(p.workers for p in telemetry.pools if p.kind == kind)
            )
        return nodeagent_pb2.GetNodeTelemetryResponse(telemetry=telemetry)

    def InjectDisturbance(self, request: Any, context: Any) -> Any:  # noqa: N802
        accepted, expires = self.backend.inject_disturbance(request.disturbance)
        return nodeagent_pb2.InjectDisturbanceResponse(
            accepted=accepted, backend=self.backend.name, expires_in_s=expires
        )

    def ControlProcess(self, request: Any, context: Any) -> Any:  # noqa: N802
        pid = request.pid
        if pid == 0 or pid not in self.backend.owned_pids():
            metrics.CONTROL_REFUSED.inc()
            raise PermissionDenied(f"pid {pid} was not started by the node agent; nothing changed")
        unknown = sorted(set(request.cpu_set) - set(osctl.online_cpus()))
        if unknown:
            raise InvalidArgument(f"cpus {unknown} do not exist on this node", field="cpu_set")
        if not osctl.NICE_MIN <= request.nice <= osctl.NICE_MAX:
            raise InvalidArgument(f"{request.nice} outside -20..19", field="nice")
        if request.cpu_set:
            osctl.set_affinity(pid, list(request.cpu_set))
        osctl.set_nice(pid, request.nice)
        state = osctl.read_sched_state(pid)
        return nodeagent_pb2.ControlProcessResponse(
            pid=pid, cpu_set=list(state.cpus_allowed), nice=state.nice
        )


def build(settings: ServiceSettings) -> tuple[list[Registration], list[Callable[[], None]]]:
    """Registrations and stop hooks for serve_forever (the backend's pools stop with the server)."""
    backend = create_backend(
        settings.get_str("backend", "real"), BackendOptions.from_settings(settings)
    )
    servicer = NodeAgentServicer(backend)
    return [(nodeagent_pb2_grpc.add_NodeAgentServiceServicer_to_server, servicer, SERVICE_NAME)], [
        backend.stop
    ]


@dataclass
class RunningNodeAgent:
    server: RunningServer
    backend: NodeBackend

    @property
    def address(self) -> str:
        return self.server.address

    def stop(self, grace: float = 1.0) -> None:
        self.server.stop(grace)


def start_nodeagent(settings: ServiceSettings, *, port: int = 0) -> RunningNodeAgent:
    """In-process agent on a free port (tests, the closed loop): stop() ends every pool."""
    settings.ensure_dirs()
    registrations, hooks = build(settings)
    server = start_grpc_server(
        registrations, host=settings.host, port=port, api_token=settings.api_token
    )
    for hook in hooks:
        server.on_stop(hook)
    servicer = registrations[0][1]
    return RunningNodeAgent(server=server, backend=servicer.backend)


def main(argv: list[str] | None = None) -> None:
    settings, _ = parse_service_args("nodeagent", argv)
    configure_logging(settings.log_level, settings.log_format, "nodeagent")
    try:
        serve_forever(settings, build)
    except ConfigError as exc:
        log.error("cannot start", extra={"error": str(exc)})
        raise SystemExit(f"nodeagent: {exc}") from exc
