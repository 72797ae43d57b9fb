"""PARFusion-owned worker pools: processes with one BLAS thread each, resizable at run time.

A pool serves one intent. Each worker is a child process (services.nodeagent.worker) fed by
one thread here that takes a task from the pool's source when the worker is free, so the
queue survives any resize. The pool applies the plan's OS knobs (CPU set, nice, scheduling
policy) to its own workers through osctl; stopping closes every worker's stdin, waits, and
kills what is left, so no process outlives the pool.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, Protocol

from services.nodeagent import osctl
from services.nodeagent.sources import Task

log = logging.getLogger(__name__)

BLAS_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class TaskSource(Protocol):
    def take(self, timeout: float) -> Task | None: ...

    def done(self, task: Task) -> None: ...

    def requeue(self, task: Task) -> None: ...

    def backlog(self, now: float | None = None) -> int: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Completion:
    """One finished task, with the worker's own clock (CLOCK_MONOTONIC is system-wide)."""

    intent_id: str
    kind: str
    due: float
    start: float
    end: float
    cpu_ms: float

    @property
    def latency_ms(self) -> float:
        """From the scheduled arrival, so queueing and dispatch delay are counted."""
        return (self.end - self.due) * 1000.0

    @property
    def service_ms(self) -> float:
        return (self.end - self.start) * 1000.0

    @property
    def start_delay_ms(self) -> float:
        return (self.start - self.due) * 1000.0


@dataclass(frozen=True)
class OsKnobs:
    cpu_set: tuple[int, ...] = ()  # empty = leave affinity alone (the arena)
    nice: int = 0
    sched_policy: str = "other"


def worker_env() -> dict[str, str]:
    """The child's environment: one BLAS thread, the project importable."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, **BLAS_ENV, "PYTHONPATH": root + (os.pathsep + path if path else "")}


class WorkerProcess:
    """One child process speaking the line-JSON protocol of services.nodeagent.worker."""

    def __init__(self) -> None:
        # start_new_session stays False: the worker must share the agent's session (autogroup).
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.nodeagent.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=worker_env(),
            text=True,
            bufsize=1,
            close_fds=True,
        )
        self.pid = self.proc.pid

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        stdin: IO[str] = self.proc.stdin  # type: ignore[assignment]
        stdout: IO[str] = self.proc.stdout  # type: ignore[assignment]
        stdin.write(json.dumps(request) + "\n")
        stdin.flush()
        line = stdout.readline()
        if not line:
            raise BrokenPipeError(f"worker {self.pid} exited")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self, wait_s: float = 2.0) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(wait_s)
        if self.proc.stdout:
            self.proc.stdout.close()


class _Slot:
    def __init__(self, worker: WorkerProcess) -> None:
        self.worker = worker
        self.retire = threading.Event()
        self.ready = threading.Event()  # the worker answered (its numpy import is done)
        self.thread: threading.Thread | None = None


class WorkerPool:
    """Workers for one intent; ``resize`` and ``set_knobs`` take effect while requests flow."""

    def __init__(
        self,
        intent_id: str,
        kind: str,
        source: TaskSource,
        *,
        matrix_n: int,
        reps: int,
        on_complete: Callable[[Completion], None],
        on_start: Callable[[Task], None] | None = None,
        on_finish: Callable[[Task], None] | None = None,
        duty: float = 1.0,
    ) -> None:
        self.intent_id = intent_id
        self.kind = kind
        self.source = source
        self.matrix_n = matrix_n
        self.reps = reps
        self.duty = duty  # fraction of wall time each worker may be busy (load cap)
        self.knobs = OsKnobs()
        self._on_complete = on_complete
        self._on_start = on_start
        self._on_finish = on_finish
        self._slots: list[_Slot] = []
        self._retiring: list[_Slot] = []
        self._lock = threading.RLock()
        self._stopped = False
        self.last_enforcement_error = ""

    # -- size ---------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        with self._lock:
            return len(self._slots)

    def pids(self) -> list[int]:
        with self._lock:
            return [s.worker.pid for s in self._slots]

    def all_pids(self) -> set[int]:
        """Active and still-retiring workers (every process this pool started and not reaped)."""
        with self._lock:
            return {
                s.worker.pid for s in self._slots + self._retiring if s.worker.proc.poll() is None
            }

    def resize(self, workers: int) -> None:
        with self._lock:
            if self._stopped:
                return
            while len(self._slots) < workers:
                slot = _Slot(WorkerProcess())
                self._enforce(slot.worker.pid)
                slot.thread = threading.Thread(
                    target=self._feed,
                    args=(slot,),
                    name=f"pool-{self.kind}-{slot.worker.pid}",
                    daemon=True,
                )
                self._slots.append(slot)
                slot.thread.start()
            while len(self._slots) > workers:
                slot = self._slots.pop()
                slot.retire.set()  # finishes the task it holds, then closes its worker
                self._retiring.append(slot)
            self._reap()

    def _reap(self) -> None:
        self._retiring = [s for s in self._retiring if s.thread is not None and s.thread.is_alive()]

    # -- OS knobs -----------------------------------------------------------------------------
    def set_knobs(self, knobs: OsKnobs) -> None:
        with self._lock:
            self.knobs = knobs
            for slot in self._slots:
                self._enforce(slot.worker.pid)

    def _enforce(self, pid: int) -> None:
        knobs = self.knobs
        try:
            osctl.set_sched_policy(pid, knobs.sched_policy)
            osctl.set_nice(pid, knobs.nice)
            osctl.set_affinity(pid, knobs.cpu_set or osctl.online_cpus())
            self.last_enforcement_error = ""
        except ProcessLookupError:
            pass  # the worker just exited; its successor gets the knobs on start
        except (PermissionError, OSError) as exc:
            # Without CAP_SYS_NICE a negative nice is refused: keep serving, report it.
            self.last_enforcement_error = f"{type(exc).__name__}: {exc}"
            log.warning("os enforcement failed", extra={"pid": pid, "error": str(exc)})

    # -- serving ------------------------------------------------------------------------------
    def ready_count(self) -> int:
        """Workers that have started serving (a fresh process needs a moment to import numpy)."""
        with self._lock:
            return sum(1 for s in self._slots if s.ready.is_set())

    def _feed(self, slot: _Slot) -> None:
        worker = slot.worker
        try:
            try:
                worker.call({"op": "ping"})
            except (BrokenPipeError, ValueError, OSError):
                with self._lock:
                    if slot in self._slots:
                        self._slots.remove(slot)
                return
            slot.ready.set()
            while not slot.retire.is_set():
                task = self.source.take(0.05)
                if task is None:
                    continue
                if self._on_start:
                    self._on_start(task)
                try:
                    answer = worker.call(
                        {"op": "run", "id": task.seq, "n": self.matrix_n, "reps": self.reps}
                    )
                except (BrokenPipeError, ValueError, OSError):
                    self.source.requeue(task)
                    log.warning(
                        "worker lost; task requeued",
                        extra={"pid": worker.pid, "pool": self.intent_id},
                    )
                    with self._lock:
                        if slot in self._slots:
                            self._slots.remove(slot)  # the next resize starts a replacement
                    return
                finally:
                    if self._on_finish:
                        self._on_finish(task)
                self.source.done(task)
                done = Completion(
                    intent_id=self.intent_id,
                    kind=self.kind,
                    due=task.due,
                    start=float(answer["start"]),
                    end=float(answer["end"]),
                    cpu_ms=float(answer["cpu_ms"]),
                )
                self._on_complete(done)
                if self.duty < 1.0:
                    time.sleep(done.service_ms / 1000.0 * (1.0 / max(self.duty, 0.01) - 1.0))
        finally:
            worker.close()

    # -- lifecycle ----------------------------------------------------------------------------
    def stop(self, wait_s: float = 3.0) -> None:
        with self._lock:
            self._stopped = True
            slots = self._slots + self._retiring
            self._slots, self._retiring = [], []
            for slot in slots:
                slot.retire.set()
        for slot in slots:
            if slot.thread is not None:
                slot.thread.join(wait_s)
            if slot.worker.proc.poll() is None:
                slot.worker.proc.kill()
                slot.worker.proc.wait(wait_s)


def measure_rep_ms(sizes: tuple[int, ...]) -> dict[int, float]:
    """CPU milliseconds of one n x n product per size, measured in a one-BLAS-thread worker."""
    worker = WorkerProcess()
    try:
        return {
            n: float(worker.call({"op": "calibrate", "n": n, "target_ms": 1.0})["rep_ms"])
            for n in sizes
        }
    finally:
        worker.close()
