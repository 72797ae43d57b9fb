"""The current plan and its WatchPlans subscribers.

The loop publishes each tick's plans here. Each subscriber has its own bounded queue; when a
slow subscriber's queue is full the oldest plan in it is dropped (it still gets the newest), so
a stalled stream never blocks the loop. ``close()`` (shutdown) wakes every subscriber with an
end marker so streams finish with OK instead of being cancelled. A subscriber waits in asyncio
(``next``: the WatchPlans servicer, so an open stream holds no thread); the loop's thread wakes
it through its event loop.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from parfusion.v1 import intent_pb2
from services.allocator.plans import length_delimited, node_plan_wire, varint, wire_key

DEFAULT_QUEUE = 16


@dataclass(frozen=True)
class PlanChanges:
    """What a plan changed against the plan of generation ``base``: its own fields (the
    NodePlan without allocations, serialized), the serialized entries of the allocations that
    changed and the ids of the intents that left."""

    base: int
    header_wire: bytes
    entries: Sequence[bytes]
    removed: Sequence[str]
    changed: Sequence[str]  # the intent ids of ``entries``, in order


@dataclass(frozen=True)
class PlanSnapshot:
    """One tick's plans. The NodePlan is held serialized, as its own fields and its entries
    (the loop keeps them, see plans.AllocationCache), joined when a caller first needs it whole
    and parsed only when a caller reads it."""

    node_header_wire: bytes  # the NodePlan without allocations, serialized
    node_entries: Sequence[bytes]  # per allocation, a NodePlan holding it, serialized
    gpu_plan: intent_pb2.GpuPlan
    generation: int
    changes: PlanChanges | None = None  # against the tick before; None: only whole plans

    @classmethod
    def of(
        cls, node_plan: intent_pb2.NodePlan, gpu_plan: intent_pb2.GpuPlan, generation: int
    ) -> PlanSnapshot:
        return cls(node_plan.SerializeToString(), (), gpu_plan, generation)

    @functools.cached_property
    def node_plan_wire(self) -> bytes:
        """The NodePlan, serialized: joined on first use, by a whole GetPlan reply or a
        stream's whole plan, so a tick whose readers all take deltas or `unchanged` never
        copies its 2 MB (at 10,000 intents)."""
        return node_plan_wire(self.node_header_wire, self.node_entries)

    @functools.cached_property
    def node_plan(self) -> intent_pb2.NodePlan:
        """The NodePlan, parsed once (about 10-20 ms at 10,000 allocations): GetPlan and
        WatchPlans send the bytes and never need it."""
        return intent_pb2.NodePlan.FromString(self.node_plan_wire)

    @functools.cached_property
    def wire(self) -> bytes:
        """The two plans as fields 1 and 2, serialized once per plan.

        GetPlanResponse and WatchPlansResponse both carry them as fields 1 and 2, so every
        GetPlan and every stream of this plan sends these bytes (plus its own small fields)
        instead of copying and serializing 10,000 allocations again (about 50 ms each)."""
        return length_delimited(1, self.node_plan_wire) + self._gpu_wire

    @functools.cached_property
    def header_wire(self) -> bytes:
        """The two plans as fields 1 and 2, the NodePlan without its allocations."""
        return length_delimited(1, self.node_header_wire) + self._gpu_wire

    @functools.cached_property
    def delta_wire(self) -> bytes | None:
        """A WatchPlansResponse holding what changed since the plan of ``changes.base``
        (fields 1-4), serialized once per plan; None when the loop gave no changes."""
        return self._delta(base_field=3, removed_field=4)

    @functools.cached_property
    def get_plan_delta_wire(self) -> bytes | None:
        """The same delta as GetPlanResponse's fields 1, 2, 8 and 9 (the call adds its own)."""
        return self._delta(base_field=8, removed_field=9)

    def _delta(self, base_field: int, removed_field: int) -> bytes | None:
        c = self.changes
        if c is None:
            return None
        removed = b"".join(
            length_delimited(removed_field, intent_id.encode()) for intent_id in c.removed
        )
        return self._delta_plans + wire_key(base_field, 0) + varint(c.base) + removed

    @functools.cached_property
    def _delta_plans(self) -> bytes:
        """Fields 1 and 2 of either delta: the NodePlan's own fields and the changed entries,
        the GPU plan; joined once for both (``changes`` is set)."""
        c = self.changes
        assert c is not None
        return length_delimited(1, c.header_wire + b"".join(c.entries)) + self._gpu_wire

    @functools.cached_property
    def _gpu_wire(self) -> bytes:
        return length_delimited(2, self.gpu_plan.SerializeToString())


class ReplyCache:
    """The last reply built from a snapshot's plans (``plans``: its whole ``wire`` unless
    told otherwise) and a call's own fields: calls in the same tick with the same staleness
    and policy share one bytes object (each reply would otherwise be a new 1.8 MB copy at
    10,000 intents, held until it is sent). The snapshot is held weakly and the reply dropped
    with it: once the loop has moved on, a cache no call asks again (pollers gone, or all
    asking for deltas) keeps neither a 10,000-intent plan nor its reply."""

    def __init__(self, plans: Callable[[PlanSnapshot], bytes] = lambda s: s.wire) -> None:
        self._plans = plans
        self._lock = threading.RLock()  # the weakref callback may run in a thread holding it
        self._key: tuple[weakref.ref[PlanSnapshot], bytes] | None = None
        self._reply = b""

    def reply(self, snapshot: PlanSnapshot, own: bytes) -> bytes:
        with self._lock:
            if self._key is not None and self._key[0]() is snapshot and self._key[1] == own:
                return self._reply
        reply = self._plans(snapshot) + own
        with self._lock:
            self._key, self._reply = (weakref.ref(snapshot, self._forget), own), reply
        return reply

    def _forget(self, gone: weakref.ref[PlanSnapshot]) -> None:
        with self._lock:
            if self._key is not None and self._key[0] is gone:
                self._key, self._reply = None, b""

    def held(self) -> int:
        """Bytes of the reply held (0 once its snapshot is gone)."""
        with self._lock:
            return len(self._reply)


class _End:
    """Marker: the feed closed."""


END = _End()


class Subscription:
    def __init__(self, maxsize: int) -> None:
        self._items: collections.deque[PlanSnapshot | _End] = collections.deque()
        self._maxsize = max(maxsize, 1)
        self._lock = threading.Lock()
        self._wake: Callable[[], None] | None = None  # set while the subscriber waits
        self.dropped = 0

    def offer(self, item: PlanSnapshot | _End) -> None:
        with self._lock:
            if len(self._items) >= self._maxsize:
                self._items.popleft()
                self.dropped += 1
            self._items.append(item)
            wake = self._wake
        if wake is not None:
            wake()

    async def next(self) -> PlanSnapshot | _End:
        """The next plan, or END when the feed closed, waiting on the running asyncio loop."""
        loop = asyncio.get_running_loop()
        while True:
            arrived = asyncio.Event()
            with self._lock:
                if self._items:
                    return self._items.popleft()
                self._wake = _waker(loop, arrived)
            try:
                await arrived.wait()
            finally:
                with self._lock:
                    self._wake = None


def _waker(loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> Callable[[], None]:
    """Sets `event` on its own loop, from any thread."""

    def wake() -> None:
        try:
            loop.call_soon_threadsafe(event.set)
        except RuntimeError:  # the loop closed: nobody waits any more
            pass

    return wake


class PlanFeed:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: PlanSnapshot | None = None
        self._subscribers: list[Subscription] = []
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def current(self) -> PlanSnapshot | None:
        with self._lock:
            return self._current

    def publish(self, snapshot: PlanSnapshot) -> None:
        with self._lock:
            self._current = snapshot
            subscribers = list(self._subscribers)
        for sub in subscribers:
            sub.offer(snapshot)

    def subscribe(self, maxsize: int = DEFAULT_QUEUE) -> Subscription:
        sub = Subscription(maxsize)
        with self._lock:
            if self._closed:
                sub.offer(END)
            else:
                self._subscribers.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subscribers:
                self._subscribers.remove(sub)

    def subscriber_count(self) -> int:
        with self._lock:
            return len(self._subscribers)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            subscribers, self._subscribers = self._subscribers, []
        for sub in subscribers:
            sub.offer(END)


class OutOfStep(Exception):
    """A delta against a plan the mirror does not hold: watch again with include_current."""


class PlanMirror:
    """A WatchPlans client's copy of the current plan, kept from whole plans and deltas.

    ``apply`` takes each WatchPlansResponse of a stream opened with ``deltas``, or each
    GetPlanResponse of a poller asking for deltas (``known_generation`` the mirror's
    ``generation``); ``node_plan`` gives the plan as a whole one would read. Allocations keep
    the position they first had (an intent that moved in the whole plan's order stays where
    it was here)."""

    def __init__(self) -> None:
        self.generation = 0
        self.header = intent_pb2.NodePlan()
        self.gpu_plan = intent_pb2.GpuPlan()
        self.allocations: dict[str, intent_pb2.Allocation] = {}

    def apply(self, reply: Any) -> None:
        """Apply one WatchPlansResponse or GetPlanResponse (an ``unchanged`` one changes
        nothing); raises OutOfStep for a delta on another base."""
        if getattr(reply, "unchanged", False):
            return
        base = reply.base_generation
        if base and base != self.generation:
            raise OutOfStep(f"a delta on generation {base}, the mirror holds {self.generation}")
        plan = reply.node_plan
        if not base:
            self.allocations = {}
        for intent_id in reply.removed_intent_ids:
            self.allocations.pop(intent_id, None)
        for alloc in plan.allocations:
            self.allocations[alloc.intent_id] = alloc
        header = intent_pb2.NodePlan()
        header.CopyFrom(plan)
        del header.allocations[:]
        self.header, self.generation = header, plan.generation
        self.gpu_plan = reply.gpu_plan

    def node_plan(self) -> intent_pb2.NodePlan:
        plan = intent_pb2.NodePlan()
        plan.CopyFrom(self.header)
        plan.allocations.extend(self.allocations.values())
        return plan
