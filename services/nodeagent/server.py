"""Node agent gRPC wiring: NodeAgentService over the configured backend.

ApplyNodePlan, GetNodeTelemetry and InjectDisturbance go to the backend; ControlProcess changes
affinity/nice only for a PID the backend started (anything else is PERMISSION_DENIED and nothing
changes). The backend is chosen once from nodeagent.backend.

Plans and the loop's telemetry travel as deltas (services.common.delta): the servicer holds the
plan in force, one serialized entry per intent, and applies a delta only against the generation
it holds (anything else is answered resync_required, nothing applied); a backend with
``apply_changes`` enforces only what changed, any other gets the merged whole plan. Telemetry
for the loop carries the pools that changed and the intents with new samples since the
generation the allocator says it holds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from parfusion.v1 import intent_pb2, nodeagent_pb2, nodeagent_pb2_grpc, telemetry_pb2
from services.common.config import ConfigError, ServiceSettings, parse_service_args
from services.common.delta import DeltaSender, HeldState
from services.common.errors import InvalidArgument, PermissionDenied
from services.common.grpc_server import (
    Registration,
    RunningServer,
    serve_forever,
    start_grpc_server,
)
from services.common.logs import configure_logging
from services.common.memory import ShrinkWatch, release_freed_memory
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
        self.plan = HeldState()  # the plan in force: NodePlan-wrapped allocation per intent
        self._telemetry_sent = DeltaSender()  # the loop's telemetry stream
        self._telemetry_generation = 0
        # one plan at a time, in arrival order: a delta sent after a push that ran past its
        # deadline finds that push applied; likewise one delta telemetry reply at a time
        self._plan_lock = threading.Lock()
        self._shrink = ShrinkWatch()
        self._telemetry_lock = threading.Lock()
        metrics.ARENA_CPUS.set(len(getattr(backend, "arena", ()) or ()))

    def ApplyNodePlan(self, request: Any, context: Any) -> Any:  # noqa: N802
        with self._plan_lock:
            return self._apply_plan(request)

    def _apply_plan(self, request: Any) -> Any:
        base = request.base_generation
        removed = list(request.removed_intent_ids)
        if base and not self.plan.accepts(base, removed):
            metrics.PLANS_APPLIED.labels("resync").inc()
            return nodeagent_pb2.ApplyNodePlanResponse(
                generation=self.plan.generation, resync_required=True
            )
        changed = {
            a.intent_id: intent_pb2.NodePlan(allocations=[a]).SerializeToString()
            for a in request.plan.allocations
        }
        if len(changed) != len(request.plan.allocations):
            raise InvalidArgument("an intent appears twice", field="plan.allocations")
        try:
            check_generation(request.plan.generation)
            applied = self._enforce(request.plan, base, changed, removed)
        except Exception:
            metrics.PLANS_APPLIED.labels("rejected").inc()
            raise
        self.plan.apply(base, request.plan.generation, changed, removed)
        if self._shrink.shrunk(len(self.plan.entries)):
            release_freed_memory()  # thousands of intents left: give their memory back
        metrics.PLANS_APPLIED.labels("applied" if not base else "applied_delta").inc()
        metrics.OWNED_PROCESSES.set(len(self.backend.owned_pids()))
        return nodeagent_pb2.ApplyNodePlanResponse(
            generation=request.plan.generation,
            applied=applied,
            cgroup_plan_path=self.backend.cgroup_plan_path(),
        )

    def _enforce(
        self, plan: Any, base: int, changed: dict[str, bytes], removed: list[str]
    ) -> list[nodeagent_pb2.AppliedAllocation]:
        """The backend enforces the delta itself when it can, else the merged whole plan."""
        if not base:
            return self.backend.apply(plan)
        apply_changes = getattr(self.backend, "apply_changes", None)
        if apply_changes is not None:
            result: list[nodeagent_pb2.AppliedAllocation] = apply_changes(plan, removed)
            return result
        entries = dict(self.plan.entries)
        for k in removed:
            del entries[k]
        entries.update(changed)
        header = intent_pb2.NodePlan()
        header.CopyFrom(plan)
        del header.allocations[:]
        whole = intent_pb2.NodePlan.FromString(
            header.SerializeToString() + b"".join(entries.values())
        )
        return [a for a in self.backend.apply(whole) if a.intent_id in changed]

    def GetNodeTelemetry(self, request: Any, context: Any) -> Any:  # noqa: N802
        if not request.delta:
            telemetry = self.backend.telemetry(drain=request.drain_samples)
            self._pool_gauges(telemetry)
            return nodeagent_pb2.GetNodeTelemetryResponse(telemetry=telemetry)
        with self._telemetry_lock:
            return self._telemetry_delta(request.drain_samples, request.known_generation)

    def _telemetry_delta(self, drain: bool, known: int) -> Any:
        """The reply against what the loop holds (see GetNodeTelemetryRequest.delta): when it
        holds the last reply, the backend reports only pools that may have changed and the
        intents with samples, and the reply names the pools that are gone."""
        sender = self._telemetry_sent
        in_step = bool(known) and known == sender.held_generation
        if not in_step:
            sender.forget()
        telemetry = self.backend.telemetry(
            drain=drain, sampled_only=True, changed_pools_only=in_step
        )
        pools = {p.intent_id: _pool_key(p) for p in telemetry.pools}
        delta = sender.diff(pools, self.backend.pool_ids() if in_step else None)
        self._telemetry_generation += 1
        generation = self._telemetry_generation
        # optimistic: a reply that never arrives shows as a known_generation that is not this one
        sender.advance(delta, pools, generation)
        if delta.base:
            keep = set(delta.changed)
            _keep_only(telemetry.pools, lambda p: p.intent_id in keep)
        else:
            self._pool_gauges(telemetry)
        return nodeagent_pb2.GetNodeTelemetryResponse(
            telemetry=telemetry,
            generation=generation,
            base_generation=delta.base,
            removed_intent_ids=delta.removed,
        )

    @staticmethod
    def _pool_gauges(telemetry: Any) -> None:
        for kind in ("online", "batch"):
            metrics.POOL_WORKERS.labels(kind).set(
                sum(p.workers for p in telemetry.pools if p.kind == kind)
            )

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


def _keep_only(field: Any, wanted: Callable[[Any], bool]) -> None:
    """Leave only the wanted elements in a repeated message field (copied out first: an element
    taken from a field is not to be relied on after the field is cleared)."""
    kept = [m.SerializeToString() for m in field if wanted(m)]
    del field[:]
    for data in kept:
        field.add().MergeFromString(data)


def _pool_key(pool: telemetry_pb2.PoolStatus) -> bytes:
    """A pool as compared for the delta: without its queue length and throughput, which move
    every tick and which nobody plans on (the full telemetry has them)."""
    queued, rate = pool.queued, pool.items_per_s
    pool.queued, pool.items_per_s = 0, 0.0
    key = pool.SerializeToString()
    pool.queued, pool.items_per_s = queued, rate
    return key


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
    servicer: NodeAgentServicer

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
    return RunningNodeAgent(server=server, backend=servicer.backend, servicer=servicer)


def main(argv: list[str] | None = None) -> None:
    settings, _ = parse_service_args("nodeagent", argv)
    configure_logging(settings.log_level, settings.log_format, "nodeagent")
    try:
        serve_forever(settings, build)
    except ConfigError as exc:
        log.error("cannot start", extra={"error": str(exc)})
        raise SystemExit(f"nodeagent: {exc}") from exc
