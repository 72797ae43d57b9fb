"""Where pool workers take their next task from: timed requests or an Amdahl batch job.

Queued work lives here, not in the workers, so a pool can grow or shrink without losing a
request: a worker takes a task only when it is free, and a retiring worker finishes the
task it holds. Online/urgent requests become due at their scheduled arrival time (the
latency clock starts there, so dispatch delay is never hidden); batch items come from jobs
with a serial head and a parallel body, so batch throughput follows Amdahl's law.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from dataclasses import dataclass, field


@dataclass(order=True)
class Task:
    due: float  # time.monotonic() of the scheduled arrival (batch: when released)
    seq: int
    kind: str = field(compare=False, default="online")
    serial: bool = field(compare=False, default=False)


class RequestSource:
    """Requests due at scheduled times (open loop: arrivals never wait for completions)."""

    def __init__(self) -> None:
        self._heap: list[Task] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._closed = False

    def schedule(self, due_times: list[float], kind: str = "online") -> None:
        with self._cond:
            for due in due_times:
                heapq.heappush(self._heap, Task(due=due, seq=next(self._seq), kind=kind))
            self._cond.notify_all()

    def take(self, timeout: float) -> Task | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                if self._heap and self._heap[0].due <= now:
                    return heapq.heappop(self._heap)
                wait = deadline - now
                if self._heap:
                    wait = min(wait, self._heap[0].due - now)
                if wait <= 0 and now >= deadline:
                    return None
                self._cond.wait(max(wait, 0.0005))
        return None

    def done(self, task: Task) -> None:
        """Completion needs no bookkeeping for independent requests."""

    def requeue(self, task: Task) -> None:
        with self._cond:
            heapq.heappush(self._heap, task)
            self._cond.notify_all()

    def backlog(self, now: float | None = None) -> int:
        """Requests already due and not yet taken (the pool's queue length)."""
        now = time.monotonic() if now is None else now
        with self._cond:
            return sum(1 for t in self._heap if t.due <= now)

    def pending(self) -> int:
        with self._cond:
            return len(self._heap)

    def clear(self) -> None:
        with self._cond:
            self._heap.clear()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class AmdahlJobSource:
    """Endless batch jobs of ``items_per_job`` idempotent items; the first (1 - f) share are serial.

    A job's serial items run one at a time, then its parallel items are released together, and
    the next job starts when they are all done: with p workers a job takes s + (n - s) / p item
    times, i.e. S(p) = 1 / ((1 - f) + f / p). ``pause`` holds back new items (urgent work
    preempting batch at an item boundary); items already running finish.
    """

    def __init__(self, parallel_fraction: float = 0.9, items_per_job: int = 10) -> None:
        self.items_per_job = max(1, items_per_job)
        self.serial_items = min(
            self.items_per_job, max(0, round((1.0 - parallel_fraction) * self.items_per_job))
        )
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._ready: list[Task] = []
        self._outstanding = 0
        self._serial_left = 0
        self._paused = 0
        self._closed = False
        self._requeued: list[Task] = []
        self._start_job()

    def _start_job(self) -> None:
        self._serial_left = self.serial_items
        if self._serial_left == 0:
            self._release_parallel()

    def _release_parallel(self) -> None:
        now = time.monotonic()
        n = self.items_per_job - self.serial_items
        self._ready.extend(Task(due=now, seq=next(self._seq), kind="batch") for _ in range(n))

    def _next(self) -> Task | None:
        if self._requeued:
            return self._requeued.pop()
        if self._ready:
            return self._ready.pop()
        if self._serial_left > 0 and self._outstanding == 0:
            self._serial_left -= 1
            return Task(due=time.monotonic(), seq=next(self._seq), kind="batch", serial=True)
        return None

    def take(self, timeout: float) -> Task | None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._closed:
                if not self._paused:
                    task = self._next()
                    if task is not None:
                        self._outstanding += 1
                        return task
                wait = deadline - time.monotonic()
                if wait <= 0:
                    return None
                self._cond.wait(wait)
        return None

    def done(self, task: Task) -> None:
        with self._cond:
            self._outstanding -= 1
            if self._outstanding == 0 and not self._ready and not self._requeued:
                if self._serial_left > 0:
                    pass  # the next serial item is handed out by _next
                elif task.serial:
                    self._release_parallel()
                else:
                    self._start_job()
            self._cond.notify_all()

    def requeue(self, task: Task) -> None:
        with self._cond:
            self._outstanding -= 1
            if task.serial:
                self._serial_left += 1
            else:
                self._requeued.append(task)
            self._cond.notify_all()

    def pause(self) -> None:
        with self._cond:
            self._paused += 1

    def resume(self) -> None:
        with self._cond:
            self._paused = max(0, self._paused - 1)
            self._cond.notify_all()

    @property
    def paused(self) -> bool:
        return self._paused > 0

    def backlog(self, now: float | None = None) -> int:
        with self._cond:
            return len(self._ready) + len(self._requeued)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
