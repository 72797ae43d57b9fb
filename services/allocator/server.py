"""AllocatorService wiring: the gRPC surface over the intent store and the node control loop.

``build_allocator(settings)`` builds the store, the loop and the servicer (used by ``main()``,
by this service's tests and by other services' integration tests); ``start_allocator`` also
starts a server on the common bootstrap. The servicer only translates: validation lives in
validation.py, durability in store.py, planning in loop.py.
"""

from __future__ import annotations

import gc
import logging
import math
import sys
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from parfusion.v1 import allocator_pb2, allocator_pb2_grpc
from services.allocator.kubestatus import KubeSync, start_kube_sync
from services.allocator.loop import ControlLoop, LoopConfig
from services.allocator.store import DEFAULT_MAX_INTENTS, IntentStore, StoreUnusable
from services.allocator.watch import END, PlanSnapshot, ReplyCache
from services.common.config import ServiceSettings, parse_service_args, resolve_input
from services.common.errors import InvalidArgument
from services.common.grpc_server import (
    Registration,
    RunningServer,
    start_grpc_server,
    wait_for_shutdown_signal,
)
from services.common.logs import configure_logging
from services.common.malloc import active_malloc
from services.common.memory import freeze_startup_objects
from services.core import convert, model
from services.core.policies.registry import list_policies
from services.core.validation import normalize_intent

log = logging.getLogger(__name__)

SERVICE_NAME = allocator_pb2.DESCRIPTOR.services_by_name["AllocatorService"].full_name
MAX_ARRIVAL_RATE_SCALE = 1000.0
# How long the tick thread may hold the interpreter lock before a waiting RPC thread gets it
# (CPython's default is 5 ms): every wait of a handler behind a tick in progress costs up to
# this, several times per call, so a shorter interval bounds RPC latency during a long tick.
GIL_SWITCH_INTERVAL_S = 0.0002
# Net new tracked objects before the cyclic collector's youngest pass (CPython's default is
# 700). A tick pauses the collector and leaves a few thousand survivors behind, among them
# tens of 10,000-row columns: at 700 a young pass ran after every tick and held the interpreter
# lock 3-6 ms while it walked them, each one a stall of every call on the server's loop. Above
# what a tick leaves, a pass runs every few ticks (docs/performance.md).
GC_YOUNG_THRESHOLD = 20_000


def tune_interpreter() -> None:
    """The allocator process's interpreter settings: the switch interval and the collector's
    young threshold (main() calls it; in-process harnesses that serve the allocator as main()
    does call it too)."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


@dataclass
class AllocatorHandle:
    """What build_allocator made, for in-process callers: the store, the loop, the servicer."""

    store: IntentStore
    loop: ControlLoop
    servicer: AllocatorServicer
    settings: ServiceSettings
    kube: KubeSync | None = None  # with allocator.kube_api: intents and state via the API

    def stop(self) -> None:
        if self.kube is not None:
            self.kube.stop()
        self.loop.stop()
        self.store.close()


class AllocatorServicer(allocator_pb2_grpc.AllocatorServiceServicer):
    def __init__(
        self,
        store: IntentStore,
        loop: ControlLoop,
        *,
        known_lanes: tuple[str, ...],
        node_name: str,
        watch_queue: int = 16,
    ) -> None:
        self.store = store
        self.loop = loop
        self.known_lanes = known_lanes
        self.node_name = node_name
        self._plan_replies = ReplyCache()  # GetPlan replies, shared within a tick
        # GetPlan deltas against the tick before; GetPlan asks only of a snapshot with changes,
        # so the whole plan stands in for a delta that is never missing
        self._delta_replies = ReplyCache(lambda s: s.get_plan_delta_wire or s.wire)
        self._lists: dict[int, tuple[int, bytes]] = {}  # ListIntents: class -> version, reply
        self._lists_lock = threading.Lock()
        self.watch_queue = watch_queue

    # --- intents -----------------------------------------------------------------------------

    # SubmitIntent, DeleteIntent and WatchPlans are coroutines: they wait (for the commit, for
    # the next plan) on the server's loop without holding a thread; GetPlan is one because it
    # never blocks (the plan's bytes are built once per tick), which spares each call the two
    # thread hops of the pool; the rest are plain methods run in the server's thread pool
    # (services/common/grpc_server.py)

    async def SubmitIntent(self, request: Any, context: Any) -> Any:  # noqa: N802
        if not request.HasField("intent"):
            raise InvalidArgument("required", field="intent")
        intent = normalize_intent(
            request.intent, known_lanes=self.known_lanes, default_node=self.node_name
        )
        result = await self.store.submit_async(intent)
        self._drop_lists()
        return allocator_pb2.SubmitIntentResponse(
            intent=result.intent, already_existed=result.already_existed
        )

    def GetIntent(self, request: Any, context: Any) -> Any:  # noqa: N802
        if not request.id:
            raise InvalidArgument("required", field="id")
        reply = allocator_pb2.GetIntentResponse(intent=self.store.get(request.id))
        allocation = self.loop.allocation(request.id)
        if allocation is not None:
            reply.allocation.CopyFrom(allocation)
        return reply

    def ListIntents(self, request: Any, context: Any) -> Any:  # noqa: N802
        cls = request.workload_class
        if cls and cls not in convert.CLASS_TO_MODEL:
            raise InvalidArgument(f"unknown value {cls}", field="workload_class")
        # serialized once per store version and filter: pollers (the dashboard every second,
        # the extender) would otherwise copy and serialize every intent on every call
        version = self.store.version  # read first: the list is at least this new
        with self._lists_lock:
            held = self._lists.get(cls)
        if held is not None and held[0] == version:
            return held[1]
        wire = allocator_pb2.ListIntentsResponse(
            intents=[s.intent for s in self.store.list_intents(cls)]
        ).SerializeToString()
        with self._lists_lock:
            self._lists[cls] = (version, wire)
        return wire

    def _drop_lists(self) -> None:
        """The store changed: no held ListIntents reply can be served again (each is for one
        version), and one of 10,000 intents is a megabyte kept for nothing."""
        if self._lists:
            with self._lists_lock:
                self._lists.clear()

    async def DeleteIntent(self, request: Any, context: Any) -> Any:  # noqa: N802
        if not request.id:
            raise InvalidArgument("required", field="id")
        await self.store.delete_async(request.id)  # NotFound for an unknown id
        self._drop_lists()
        self.loop.metrics.forget([request.id])
        return allocator_pb2.DeleteIntentResponse(deleted=True)

    # --- plans -------------------------------------------------------------------------------

    async def GetPlan(self, request: Any, context: Any) -> Any:  # noqa: N802
        # bytes: the plans as serialized once per tick (PlanSnapshot.wire), then this call's own
        # fields; serialize_reply passes them through
        current = self.loop.current()
        reply = allocator_pb2.GetPlanResponse(policy=self.loop.policy_name)
        stale, last_at = self.loop.node_status()
        reply.node_stale = stale
        if last_at is not None:
            reply.last_telemetry_at.CopyFrom(last_at)
        if current is None:
            return reply.SerializeToString()
        reply.generation = current.generation
        if request.known_generation == current.generation:
            reply.unchanged = True  # the caller holds this plan: only the small fields
            return reply.SerializeToString()
        if request.omit_allocations:  # the plans' own fields: no copy of the allocations
            return current.header_wire + reply.SerializeToString()
        changes = current.changes
        # a delta only on the plan before the current one, which the caller says it holds
        held = request.known_generation
        if request.deltas and held and changes is not None and changes.base == held:
            return self._delta_replies.reply(current, reply.SerializeToString())
        return self._plan_replies.reply(current, reply.SerializeToString())

    async def WatchPlans(self, request: Any, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        sub = self.loop.feed.subscribe(self.watch_queue)
        last_sent = 0
        try:
            if request.include_current:
                current = self.loop.current()
                if current is not None:
                    last_sent = current.generation
                    yield current.wire
            while True:  # a cancelled call (client gone) ends here with CancelledError
                item = await sub.next()
                if item is END:
                    return
                if isinstance(item, PlanSnapshot) and item.generation > last_sent:
                    # a delta only on the plan this stream sent last; a stream that fell
                    # behind (its queue dropped plans) gets the whole plan
                    changes = item.changes
                    follows = bool(request.deltas and last_sent) and (
                        changes is not None and changes.base == last_sent
                    )
                    last_sent = item.generation
                    yield item.delta_wire if follows else item.wire
        finally:
            self.loop.feed.unsubscribe(sub)

    def PreviewPlan(self, request: Any, context: Any) -> Any:  # noqa: N802
        disturbance: model.Disturbance | None = None
        if request.HasField("disturbance"):
            convert.validate_disturbance(request.disturbance)
            disturbance = convert.disturbance_to_model(request.disturbance)
        scale = request.arrival_rate_scale
        if not math.isfinite(scale) or not 0 <= scale <= MAX_ARRIVAL_RATE_SCALE:
            raise InvalidArgument(
                f"must be in [0, {MAX_ARRIVAL_RATE_SCALE:g}] (0 = unchanged)",
                field="arrival_rate_scale",
            )
        try:
            preview = self.loop.preview(disturbance, scale, request.policy)
        except InvalidArgument as exc:
            if exc.field == "name":  # the registry names its own argument; here it is `policy`
                raise InvalidArgument(f"unknown policy {request.policy!r}", field="policy") from exc
            raise
        reply = allocator_pb2.PreviewPlanResponse()
        reply.preview.CopyFrom(preview.node_plan)
        reply.preview_gpu.CopyFrom(preview.gpu_plan)
        current = self.loop.current()
        if current is not None:
            reply.current.CopyFrom(current.node_plan)
        return reply

    # --- policy and telemetry ----------------------------------------------------------------

    def SetPolicy(self, request: Any, context: Any) -> Any:  # noqa: N802
        if not request.name:
            raise InvalidArgument("required", field="name")
        previous, active = self.loop.set_policy(request.name)
        return allocator_pb2.SetPolicyResponse(previous=previous, active=active)

    def ListPolicies(self, request: Any, context: Any) -> Any:  # noqa: N802
        reply = allocator_pb2.ListPoliciesResponse(active=self.loop.policy_name)
        for p in list_policies():
            reply.policies.add(name=p.name, kind=p.kind, description=p.description)
        return reply

    def ReportTelemetry(self, request: Any, context: Any) -> Any:  # noqa: N802
        node = request.node if request.HasField("node") else None
        gpu = request.gpu if request.HasField("gpu") else None
        return allocator_pb2.ReportTelemetryResponse(plan_generation=self.loop.report(node, gpu))


def serialize_reply(reply: Any) -> bytes:
    """A reply as it goes on the wire: bytes already serialized pass through as they are."""
    return reply if isinstance(reply, bytes) else reply.SerializeToString()  # type: ignore[no-any-return]


def add_allocator_service(servicer: AllocatorServicer, server: Any) -> None:
    """The generated registration, with GetPlan, WatchPlans and ListIntents answering
    serialized bytes."""
    handlers: dict[str, Any] = {}

    class _Collect:
        def add_generic_rpc_handlers(self, generic: Any) -> None:
            pass

        def add_registered_method_handlers(self, service: str, methods: Any) -> None:
            handlers.update(methods)

    allocator_pb2_grpc.add_AllocatorServiceServicer_to_server(servicer, _Collect())
    for method in ("GetPlan", "WatchPlans", "ListIntents"):
        handlers[method] = handlers[method]._replace(response_serializer=serialize_reply)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


# --- construction ----------------------------------------------------------------------------


def configured_lanes(settings: ServiceSettings) -> dict[str, list[int]]:
    """The lane map from the gpulane section of the same config document."""
    section = settings.document.get("gpulane") or {}
    lanes = section.get("lanes") or {}
    return (
        {str(name): [int(i) for i in (indexes or [])] for name, indexes in lanes.items()}
        if isinstance(lanes, dict)
        else {}
    )


def loop_config(settings: ServiceSettings) -> LoopConfig:
    dmug = model.DmugConfig()  # the core's defaults, where the settings leave a value out
    return LoopConfig(
        node_name=settings.node_name,
        tick_s=settings.get_float("tick_ms", 250.0) / 1000.0,
        nodeagent_address=settings.get_str("nodeagent_address", ""),
        gpulane_address=settings.get_str("gpulane_address", ""),
        cpu_units=settings.get_int("cpu_units", 0),
        stale_after_s=settings.get_float("stale_after_ms", 1500.0) / 1000.0,
        dmug=model.DmugConfig(
            hysteresis_min_gain=settings.get_float("hysteresis_min_gain", dmug.hysteresis_min_gain),
            hysteresis_dwell_ticks=settings.get_int(
                "hysteresis_dwell_ticks", dmug.hysteresis_dwell_ticks
            ),
            light_load_cores=settings.get_float("light_load_cores", dmug.light_load_cores),
        ),
        configured_lanes=configured_lanes(settings),
        api_token=settings.api_token,
    )


def seed_intents(store: IntentStore, settings: ServiceSettings) -> int:
    """Load the demo intents into a store that has never held any (once per database)."""
    if store.meta("seeded") is not None:
        return 0
    if len(store):
        store.set_meta("seeded", "skipped: store not empty")
        return 0
    directory = resolve_input(
        settings.get_str("intents_dir", "")
        or str(settings.document.get("demo_intents") or "configs/intents")
    )
    files = sorted([*Path(directory).glob("*.yaml"), *Path(directory).glob("*.json")])
    lanes = tuple(configured_lanes(settings))
    loaded = 0
    for path in files:
        try:
            for intent in convert.intents_in_file(path):
                store.submit(
                    normalize_intent(intent, known_lanes=lanes, default_node=settings.node_name)
                )
                loaded += 1
        except Exception as exc:
            log.error("demo intent not loaded", extra={"file": str(path), "error": str(exc)})
    store.set_meta("seeded", str(directory))
    log.info("demo intents loaded", extra={"count": loaded, "from": str(directory)})
    return loaded


def build_allocator(
    settings: ServiceSettings, *, start_loop: bool = True
) -> tuple[list[Registration], list[Callable[[], None]], AllocatorHandle]:
    """Store (opened, seeded if configured), loop (started unless ``start_loop=False``, for
    tests that drive ``handle.loop.tick()`` themselves) and servicer, ready to register."""
    settings.ensure_dirs()
    store = IntentStore(
        settings.path("db_path", "run/allocator.db"),
        synchronous=settings.get_str("db_synchronous", "normal").lower(),
        max_intents=settings.get_int("max_intents", DEFAULT_MAX_INTENTS),
    )
    try:
        if settings.get_bool("seed_intents", False):
            seed_intents(store, settings)
        loop = ControlLoop(
            store, loop_config(settings), policy=settings.get_str("policy", "parfusion")
        )
    except Exception:
        store.close()
        raise
    servicer = AllocatorServicer(
        store,
        loop,
        known_lanes=tuple(configured_lanes(settings)),
        node_name=settings.node_name,
        watch_queue=settings.get_int("watch_queue", 16),
    )
    handle = AllocatorHandle(store=store, loop=loop, servicer=servicer, settings=settings)
    if start_loop:
        loop.start()
    try:
        handle.kube = start_kube_sync(settings, loop, tuple(configured_lanes(settings)))
    except Exception:
        handle.stop()
        raise
    registrations: list[Registration] = [(add_allocator_service, servicer, SERVICE_NAME)]
    return registrations, [handle.stop], handle


@dataclass
class RunningAllocator:
    server: RunningServer
    handle: AllocatorHandle

    @property
    def address(self) -> str:
        return self.server.address

    def stop(self, grace: float = 1.0) -> None:
        """Health NOT_SERVING, end WatchPlans streams cleanly, drain RPCs, close the store."""
        self.server.stop(grace)


def start_allocator(
    settings: ServiceSettings,
    *,
    port: int | None = None,
    metrics_port: int | None = None,
    start_loop: bool = True,
) -> RunningAllocator:
    """build_allocator + start_grpc_server on 127.0.0.1 (port 0 = any free port)."""
    registrations, hooks, handle = build_allocator(settings, start_loop=start_loop)
    try:
        server = start_grpc_server(
            registrations,
            host=settings.host,
            port=settings.port if port is None else port,
            metrics_port=metrics_port,
            api_token=settings.api_token,
        )
    except Exception:
        handle.stop()
        raise
    server.on_drain(handle.loop.feed.close)
    for hook in hooks:
        server.on_stop(hook)
    return RunningAllocator(server=server, handle=handle)


def main(argv: list[str] | None = None) -> None:
    settings, _ = parse_service_args("allocator", argv)
    configure_logging(settings.log_level, settings.log_format, "allocator")
    tune_interpreter()
    try:
        running = start_allocator(settings, metrics_port=settings.metrics_port)
    except StoreUnusable as exc:  # the file and what to do, not a traceback
        log.error("cannot start", extra={"error": str(exc)})
        raise SystemExit(f"allocator: {exc}") from None
    log.info(
        "serving",
        extra={
            "address": f"{settings.host}:{running.server.port}",
            "metrics_port": running.server.metrics_port,
            "db": str(running.handle.store.path),
            "frozen_objects": freeze_startup_objects(),
            "malloc": active_malloc(),  # jemalloc where preloaded (common/malloc.py)
        },
    )
    wait_for_shutdown_signal()
    running.stop(grace=2.0)
    log.info("stopped")
