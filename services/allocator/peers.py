"""The allocator's clients of the node agent and gpulane: one pull and one push per tick each.

Every call carries a deadline (half a tick when the tick waits for it, a whole one when the
loop's tick leaves it running while it sleeps) and is started as a future so the node and GPU
calls overlap. A peer that fails is logged once when it goes down and once when it comes back,
never once per tick, its failures are counted by status code
(parfusion_allocator_peer_call_failures_total), and it never stops the loop: after a failure
other than a missed deadline the channel is replaced, so a restarted peer is found at once.

The node agent gets plans, and sends telemetry, as deltas against a generation both sides hold
(services.common.delta): a plan carries the allocations whose serialized entry changed since the
plan the agent acknowledged, and a failed push or a resync asked for sends the whole plan next;
telemetry carries the pools that changed and the intents with new samples since the reply the
loop holds. The bytes each way are counted per peer (parfusion_allocator_peer_bytes_total).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import grpc

from parfusion.v1 import (
    gpulane_pb2,
    gpulane_pb2_grpc,
    intent_pb2,
    nodeagent_pb2,
    nodeagent_pb2_grpc,
    telemetry_pb2,
)
from services.allocator import metrics
from services.common.clients import channel
from services.common.delta import Delta, DeltaSender, HeldState

if TYPE_CHECKING:
    from services.allocator.watch import PlanChanges

log = logging.getLogger(__name__)

RECONNECT_S = 1.0
RESYNC_TIMEOUT_S = 2.0  # deadline of a telemetry pull that asks for everything


class PeerHealth:
    """Tracks whether one call kind to one peer works, counts its failures by status code and
    logs only its state changes."""

    def __init__(self, peer: str, call: str) -> None:
        self.peer = peer
        self.call = call
        self.ok: bool | None = None  # None: never tried

    def success(self) -> None:
        if self.ok is False:
            log.info("peer reachable again", extra={"peer": self.peer, "call": self.call})
        self.ok = True

    def failure(self, exc: BaseException) -> None:
        detail = exc.code().name if isinstance(exc, grpc.RpcError) else type(exc).__name__  # type: ignore[attr-defined]
        metrics.PEER_FAILURES.labels(self.peer, self.call, detail).inc()
        if self.ok is not False:
            log.warning(
                "peer call failing; planning on last known state",
                extra={"peer": self.peer, "call": self.call, "error": detail},
            )
        self.ok = False


def _in_time_only(exc: BaseException) -> bool:
    """A call that reached a live peer but not in time: its channel is sound, and closing it
    would cancel the other calls in flight on it (an overlapped tick's pull with its push)."""
    return isinstance(exc, grpc.RpcError) and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]


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
            if not _in_time_only(exc):
                self.reconnect_soon()
            return None
        health.success()
        return value


class NodeAgentClient(_Peer):
    def __init__(self, address: str, token: str | None = None) -> None:
        super().__init__("nodeagent", address, token)
        self.pull_health = PeerHealth("nodeagent", "GetNodeTelemetry")
        self.push_health = PeerHealth("nodeagent", "ApplyNodePlan")
        self.plan_sent = DeltaSender()  # the plan the agent holds
        self.pools = HeldState()  # the agent's pools as of the last telemetry reply
        self._pushing: tuple[Delta, dict[str, bytes], int] | None = None
        self._pull_missed = False  # the last pull got no reply: the agent may have moved on

    def start_pull(self, timeout_s: float) -> Any:
        stub = nodeagent_pb2_grpc.NodeAgentServiceStub(self.channel())
        request = nodeagent_pb2.GetNodeTelemetryRequest(
            drain_samples=True, delta=True, known_generation=self.pools.generation
        )
        if not self.pools.generation or self._pull_missed:
            # a whole reply (every pool) can take the agent longer than a tick at 10,000
            # intents: cut off at the usual deadline it would be asked for again, forever. After
            # a pull that got no reply the agent counts that reply as held by this side (it
            # cannot know), so the next reply is a whole one too.
            timeout_s = max(timeout_s, RESYNC_TIMEOUT_S)
        return stub.GetNodeTelemetry.future(request, timeout=timeout_s)

    def finish_pull(self, future: Any) -> telemetry_pb2.NodeTelemetry | None:
        reply = self.result(future, self.pull_health)
        self._pull_missed = reply is None
        if reply is None:
            return None
        metrics.PEER_BYTES.labels(self.name, "received").inc(reply.ByteSize())
        pools = {p.intent_id: p.SerializeToString() for p in reply.telemetry.pools}
        if not self.pools.apply(
            reply.base_generation, reply.generation, pools, reply.removed_intent_ids
        ):
            # a delta against a reply this side does not hold: its samples are still real
            # observations; the next pull asks for everything
            self.pools.clear()
            metrics.RESYNCS.labels(self.name, "telemetry").inc()
        telemetry: telemetry_pb2.NodeTelemetry = reply.telemetry
        # a delta holds only the pools that changed: the intents it reports samples for get
        # their pool as held, so the samples are read at the workers they ran with
        for summary in telemetry.latencies:
            held = self.pools.entries.get(summary.intent_id)
            if held is not None and summary.intent_id not in pools:
                telemetry.pools.add().MergeFromString(held)
        return telemetry

    def start_push(
        self,
        header: intent_pb2.NodePlan,
        entries: dict[str, bytes],
        timeout_s: float,
        changes: PlanChanges | None = None,
    ) -> Any:
        """Push the plan made of ``header`` and ``entries`` (NodePlan-wrapped allocations per
        intent id, in plan order), as the delta against the plan the agent holds; ``changes``
        (what the plan changed since the plan of generation ``changes.base``) is that delta
        when the agent holds exactly that plan, without comparing every entry."""
        if changes is None:
            delta = self.plan_sent.diff(entries)
        else:
            delta = self.plan_sent.diff_since(
                changes.base, changes.changed, changes.removed, entries
            )
        body = header.SerializeToString() + b"".join(entries[k] for k in delta.changed)
        request = nodeagent_pb2.ApplyNodePlanRequest(
            plan=intent_pb2.NodePlan.FromString(body),
            base_generation=delta.base,
            removed_intent_ids=delta.removed,
        )
        metrics.PEER_BYTES.labels(self.name, "sent").inc(request.ByteSize())
        self._pushing = (delta, entries, header.generation)
        stub = nodeagent_pb2_grpc.NodeAgentServiceStub(self.channel())
        return stub.ApplyNodePlan.future(request, timeout=timeout_s)

    def finish_push(self, future: Any) -> bool:
        reply = self.result(future, self.push_health)
        pushing, self._pushing = self._pushing, None
        if pushing is None:
            return False
        if reply is None:
            # Applied or not, unknown. A push past its deadline is usually still applied (the
            # agent finishes it and takes the next one after it), so the next goes as a delta
            # against this plan: a wrong guess costs one resync_required and a whole plan.
            self.plan_sent.advance(*pushing)
            return False
        metrics.PEER_BYTES.labels(self.name, "received").inc(reply.ByteSize())
        if reply.resync_required:
            self.plan_sent.forget()
            metrics.RESYNCS.labels(self.name, "plan").inc()
            return False
        self.plan_sent.advance(*pushing)
        return True


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
        if reply is None:
            return None
        metrics.PEER_BYTES.labels(self.name, "received").inc(reply.ByteSize())
        return reply.telemetry  # type: ignore[no-any-return]

    def start_push(self, plan: intent_pb2.GpuPlan, timeout_s: float) -> Any:
        # Mode left UNSPECIFIED: whether commands run or are only previewed is gpulane's own
        # configuration (dry-run by default), not something a plan can switch on.
        stub = gpulane_pb2_grpc.GpuLaneServiceStub(self.channel())
        request = gpulane_pb2.ApplyGpuPlanRequest(plan=plan)
        metrics.PEER_BYTES.labels(self.name, "sent").inc(request.ByteSize())
        return stub.ApplyGpuPlan.future(request, timeout=timeout_s)

    def finish_push(self, future: Any) -> bool:
        reply = self.result(future, self.push_health)
        if reply is None:
            return False
        metrics.PEER_BYTES.labels(self.name, "received").inc(reply.ByteSize())
        return True
