"""Worker pools: real processes that start, serve, resize without losing requests, stop clean."""

from __future__ import annotations

import time

import psutil
import pytest

from services.nodeagent import osctl
from services.nodeagent.pools import Completion, OsKnobs, WorkerPool
from services.nodeagent.sources import AmdahlJobSource, RequestSource

pytestmark = pytest.mark.integration


def _children() -> set[int]:
    return {
        p.pid
        for p in psutil.Process().children(recursive=True)
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    }


def _wait(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_pool_serves_resizes_without_loss_and_stops_with_no_orphan() -> None:
    before = _children()
    done: list[Completion] = []
    source = RequestSource()
    pool = WorkerPool("online-a", "online", source, matrix_n=32, reps=2, on_complete=done.append)
    pool.resize(2)
    assert pool.size == 2
    assert set(pool.pids()) <= _children()
    now = time.monotonic()
    source.schedule([now + i * 0.002 for i in range(120)])
    assert _wait(lambda: len(done) >= 20)
    pool.resize(1)  # shrink while requests are queued
    pool.resize(3)
    assert _wait(lambda: len(done) == 120), f"lost requests: {len(done)} of 120"
    assert all(c.latency_ms >= c.service_ms - 0.5 for c in done)
    pids = pool.all_pids()
    assert len(pool.pids()) == 3
    pool.stop()
    assert _wait(lambda: not (pids & _children()), 5.0)
    assert _children() <= before


def test_workers_run_one_blas_thread_and_take_the_knobs() -> None:
    pool = WorkerPool(
        "batch-a", "batch", AmdahlJobSource(0.9), matrix_n=64, reps=3, on_complete=lambda c: None
    )
    try:
        pool.resize(1)
        pool.set_knobs(OsKnobs(cpu_set=(0,), nice=7, sched_policy="batch"))
        time.sleep(0.3)
        state = osctl.read_sched_state(pool.pids()[0])
        assert state.cpus_allowed == (0,)
        assert state.nice == 7
        assert state.sched_policy == "batch"
        assert state.threads == 1  # OPENBLAS/OMP/MKL_NUM_THREADS=1 reached the child before numpy
        pool.set_knobs(OsKnobs(cpu_set=(), nice=19, sched_policy="idle"))
        state = osctl.read_sched_state(pool.pids()[0])
        assert state.sched_policy == "idle"
        assert state.cpus_allowed == osctl.online_cpus()
    finally:
        pool.stop()


def test_amdahl_source_releases_parallel_items_after_the_serial_head() -> None:
    source = AmdahlJobSource(parallel_fraction=0.9, items_per_job=10)
    head = source.take(0.01)
    assert head is not None and head.serial
    assert source.take(0.01) is None  # body waits for the serial head
    source.done(head)
    body = [source.take(0.01) for _ in range(9)]
    assert all(t is not None and not t.serial for t in body)
    assert source.take(0.01) is None  # next job waits for the whole body
    source.pause()
    for t in body:
        assert t is not None
        source.done(t)
    assert source.take(0.01) is None  # paused: urgent work holds new items back
    source.resume()
    nxt = source.take(0.01)
    assert nxt is not None and nxt.serial
