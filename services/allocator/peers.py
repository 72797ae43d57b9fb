"""The allocator's clients of the node agent and gpulane: one pull and one push per tick each.

Every call carries a deadline (about half a tick) and is started as a future so the node and
GPU calls overlap. A peer that fails is logged once when it goes down and once when it comes
back, never once per tick, and never stops the loop: the channel reconnects by itself.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import grpc

from parfusion.v1 import (
    gpulane_pb2,
    gpulane_pb2_grpc,
    intent_pb2,
    nodeagent_pb2,
    nodeagent_pb2_grpc,
    telemetry_pb2,
)
from services.common.clients import channel

log = logging.getLogger(__name__)

RECONNECT_S = 1.0


class PeerHealth:
    """Tracks whether one call kind to one peer works and logs only its state changes."""

    def __init__(self, peer: str, call: str) -> None:
        self.peer = peer
        self.call = call
        self.ok: bool | None = None  # None: never tried

    def success(self) -> None:
        if self.ok is False:
            log.info("peer reachable again", extra={"peer": self.peer, "call": self.call})
        self.ok = True

    def failure(self, exc: BaseException) -> None:
        if self.ok is not False:
            detail = exc.code().name if isinstance(exc, grpc.RpcError) else type(exc).__name__  # type: ignore[attr-defined]
            log.warning(
                "peer call failing; planning on last known state",
                extra={"peer": self.peer, "call": self.call, "error": detail},
            )
        self.ok = False


class _Peer:
    def __init__(self, name: str, address: str, token: str | None) -> None:
        self.name = name
        self.address = address
        self._token = token
        self._channel: grpc.Channel | None = None
        self._lock = threading.Lock()
        self._reset_at = 0.0

    def channel(self) -> grpc.Channel:
        with self._lock:
            if self._channel is None:
                self._channel = channel(self.address, token=self._token)
            return self._channel

    def close(self) -> None:
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None

    def reconnect_soon(self) -> None:
        """After a failure, start over with a fresh channel (at most every RECONNECT_S): a
        channel left in its reconnect backoff can wait up to two minutes before it notices
        that a restarted peer is back; a fresh one connects on its first call."""
        now = time.monotonic()
        with self._lock:
            if self._channel is None or now - self._reset_at < RECONNECT_S:
                return
            self._reset_at = now
            stale, self._channel = self._channel, None
        stale.close()

    def result(self, future: Any, health: PeerHealth) -> Any:
        try:
            value = future.result()
        except Exception as exc:  # RpcError, or a cancelled future at shutdown
            health.failure(exc)
            self.reconnect_soon()
            return None
        health.success()
        return value


class NodeAgentClient(_Peer):
    def __init__(self, address: str, token: str | None = None) -> None:
        super().__init__("nodeagent", address, token)
        self.pull_health = PeerHealth("nodeagent", "GetNodeTelemetry")
        self.push_health = PeerHealth("nodeagent", "ApplyNodePlan")

    def start_pull(self, timeout_s: float) -> Any:
        stub = nodeagent_pb2_grpc.NodeAgentServiceStub(self.channel())
        return stub.GetNodeTelemetry.future(
            nodeagent_pb2.GetNodeTelemetryRequest(drain_samples=True), timeout=timeout_s
        )

    def finish_pull(self, future: Any) -> telemetry_pb2.NodeTelemetry | None:
        reply = self.result(future, self.pull_health)
        return None if reply is None else reply.telemetry

    def start_push(self, plan: intent_pb2.NodePlan, timeout_s: float) -> Any:
        stub = nodeagent_pb2_grpc.NodeAgentServiceStub(self.channel())
        return stub.ApplyNodePlan.future(
            nodeagent_pb2.ApplyNodePlanRequest(plan=plan), timeout=timeout_s
        )

    def finish_push(self, future: Any) -> bool:
        return self.result(future, self.push_health) is not None


class GpuLaneClient(_Peer):
    def __init__(self, address: str, token: str | None = None) -> None:
        super().__init__("gpulane", address, token)
        self.pull_health = PeerHealth("gpulane", "GetGpuTelemetry")
        self.push_health = PeerHealth("gpulane", "ApplyGpuPlan")

    def start_pull(self, timeout_s: float) -> Any:
        stub = gpulane_pb2_grpc.GpuLaneServiceStub(self.channel())
        return stub.GetGpuTelemetry.future(gpulane_pb2.GetGpuTelemetryRequest(), timeout=timeout_s)

    def finish_pull(self, future: Any) -> telemetry_pb2.GpuTelemetry | None:
        reply = self.result(future, self.pull_health)
        return None if reply is None else reply.telemetry

    def start_push(self, plan: intent_pb2.GpuPlan, timeout_s: float) -> Any:
        # Mode left UNSPECIFIED: whether commands run or are only previewed is gpulane's own
        # configuration (dry-run by default), not something a plan can switch on.
        stub = gpulane_pb2_grpc.GpuLaneServiceStub(self.channel())
        return stub.ApplyGpuPlan.future(
            gpulane_pb2.ApplyGpuPlanRequest(plan=plan), timeout=timeout_s
        )

    def finish_push(self, future: Any) -> bool:
        return self.result(future, self.push_health) is not None
