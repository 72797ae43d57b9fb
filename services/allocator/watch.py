"""The current plan and its WatchPlans subscribers.

The loop publishes each tick's plans here. Each subscriber has its own bounded queue; when a
slow subscriber's queue is full the oldest plan in it is dropped (it still gets the newest), so
a stalled stream never blocks the loop. ``close()`` (shutdown) wakes every subscriber with an
end marker so streams finish with OK instead of being cancelled.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

from parfusion.v1 import intent_pb2

DEFAULT_QUEUE = 16


@dataclass(frozen=True)
class PlanSnapshot:
    node_plan: intent_pb2.NodePlan
    gpu_plan: intent_pb2.GpuPlan
    generation: int


class _End:
    """Marker: the feed closed."""


END = _End()


class Subscription:
    def __init__(self, maxsize: int) -> None:
        self._queue: queue.Queue[PlanSnapshot | _End] = queue.Queue(maxsize=maxsize)
        self.dropped = 0

    def offer(self, item: PlanSnapshot | _End) -> None:
        while True:
            try:
                self._queue.put_nowait(item)
                return
            except queue.Full:
                try:
                    self._queue.get_nowait()
                    self.dropped += 1
                except queue.Empty:
                    pass

    def next(self, timeout: float) -> PlanSnapshot | _End | None:
        """The next plan, END when the feed closed, or None after ``timeout`` seconds."""
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None


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
