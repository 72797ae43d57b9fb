"""Telemetry enrichment of the node view: the allocator's plan and intents, the GPU-lane map.

A background thread polls the configured allocator (GetPlan, ListIntents) and GPU-lane service
(GetGpuTelemetry) every ``telemetry_interval_s`` with a short per-call timeout, and swaps the
result into the ClusterView. Verbs never wait for it: they read whatever the last poll left,
and a node whose telemetry is older than ``telemetry_stale_s`` falls back to its Node object.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace
from typing import Any

import grpc

from parfusion.v1 import allocator_pb2, allocator_pb2_grpc, gpulane_pb2, gpulane_pb2_grpc
from services.common.clients import channel
from services.core.convert import intent_to_spec, lanes_from_telemetry
from services.core.model import IntentSpec

from .nodeview import ClusterView, NodeTelemetry

log = logging.getLogger(__name__)


@dataclass
class TelemetrySource:
    allocator_address: str
    gpulane_address: str = ""
    timeout_s: float = 0.5
    token: str | None = None

    def __post_init__(self) -> None:
        self._specs: dict[str, tuple[Any, IntentSpec]] = {}  # id -> the message, its spec
        self._alloc_channel = channel(self.allocator_address, self.token)
        self._allocator = allocator_pb2_grpc.AllocatorServiceStub(self._alloc_channel)
        self._gpu_channel = (
            channel(self.gpulane_address, self.token) if self.gpulane_address else None
        )
        self._gpulane = (
            gpulane_pb2_grpc.GpuLaneServiceStub(self._gpu_channel) if self._gpu_channel else None
        )

    def read(self) -> NodeTelemetry | None:
        """One node's telemetry, or None when the allocator is not reachable."""
        try:
            # the plan's own fields only: at 10,000 intents the whole plan is 1.8 MB a poll
            plan = self._allocator.GetPlan(
                allocator_pb2.GetPlanRequest(omit_allocations=True), timeout=self.timeout_s
            )
            listed = self._allocator.ListIntents(
                allocator_pb2.ListIntentsRequest(), timeout=self.timeout_s
            )
        except grpc.RpcError as exc:
            log.debug("allocator telemetry unavailable", extra={"code": str(exc.code())})
            return None
        node = plan.node_plan
        if not node.node:
            return None
        lanes = None
        if self._gpulane is not None:
            try:
                gpu = self._gpulane.GetGpuTelemetry(
                    gpulane_pb2.GetGpuTelemetryRequest(), timeout=self.timeout_s
                ).telemetry
                lanes = lanes_from_telemetry(gpu, {})
            except grpc.RpcError:
                lanes = None
        residents = self._residents(listed.intents, node.node)
        return NodeTelemetry(
            node=node.node,
            cpu_units=node.cpu_units,
            contention=node.contention,
            lanes=lanes,
            residents=residents,
            observed_at=time.time(),
        )

    def _residents(self, intents: Any, node: str) -> tuple[IntentSpec, ...]:
        """The node's intents as specs, each converted once while its message stays the same
        (a poll of a 10,000-intent node would otherwise convert every one every time)."""
        held, kept = self._specs, {}
        out = []
        for seq, intent in enumerate(intents):
            if intent.node not in ("", node):
                continue
            entry = held.get(intent.id)
            if entry is None or entry[0] != intent:
                spec = intent_to_spec(intent, seq)
            else:
                spec = entry[1] if entry[1].seq == seq else replace(entry[1], seq=seq)
            kept[intent.id] = (intent, spec)
            out.append(spec)
        self._specs = kept
        return tuple(out)

    def close(self) -> None:
        self._alloc_channel.close()
        if self._gpu_channel is not None:
            self._gpu_channel.close()


class TelemetryPoller:
    """Polls the sources on a daemon thread until stop()."""

    def __init__(
        self, view: ClusterView, sources: list[TelemetrySource], interval_s: float, stale_s: float
    ) -> None:
        self.view = view
        self.sources = sources
        self.interval_s = interval_s
        self.stale_s = stale_s
        self.last_poll_at: float | None = None
        self.reachable = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="extender-telemetry", daemon=True)
        self._latest: dict[str, NodeTelemetry] = {}

    def start(self) -> None:
        self._thread.start()

    def poll_once(self) -> None:
        now = time.time()
        reachable = 0
        for source in self.sources:
            report = source.read()
            if report is not None:
                reachable += 1
                self._latest[report.node] = report
        fresh = [r for r in self._latest.values() if now - r.observed_at <= self.stale_s]
        self._latest = {r.node: r for r in fresh}
        self.view.set_telemetry(fresh)
        self.reachable = reachable
        self.last_poll_at = now

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:  # the poller must never die; the verbs keep serving without it
                log.exception("telemetry poll failed")
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(
                timeout=2 * max(s.timeout_s for s in self.sources) + 1 if self.sources else 1
            )
        for source in self.sources:
            source.close()
