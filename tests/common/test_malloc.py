"""jemalloc as the services' malloc: the re-execution, its choices, and what it reports."""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from services.common.malloc import ENV, reexec_with_jemalloc

ROOT = Path(__file__).resolve().parents[2]
JEMALLOC = ctypes.util.find_library("jemalloc")
needs_jemalloc = pytest.mark.skipif(
    JEMALLOC is None, reason="libjemalloc2 is not installed (scripts/install_test_deps.sh)"
)

# run as `python -c`: prints its pid, re-executes, then reports from the process it became
PROBE = """
import json, os, sys
print(json.dumps({"pid": os.getpid()}), flush=True)
from services.common.malloc import active_malloc, jemalloc_stats, reexec_with_jemalloc
reexec_with_jemalloc()
from services.common.memory import release_freed_memory
held = [bytes(1000) for _ in range(20_000)]  # 20 MB of small blocks, freed below
del held
print(json.dumps({
    "pid": os.getpid(), "malloc": active_malloc(), "pythonmalloc": os.environ.get("PYTHONMALLOC"),
    "released": release_freed_memory(), "stats": jemalloc_stats(),
}))
"""


def _probe(**env: str) -> list[dict[str, object]]:
    clean = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF", ENV)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


@needs_jemalloc
def test_a_service_process_becomes_itself_again_on_jemalloc() -> None:
    first, again, report = _probe()  # the pid line once more from the re-executed command
    assert first["pid"] == again["pid"] == report["pid"]  # the same process: exec, not a child
    assert report["malloc"] == "jemalloc"
    assert report["pythonmalloc"] == "malloc"  # every object from jemalloc, not CPython's arenas
    assert report["released"] is True  # purged through jemalloc's own control
    stats = report["stats"]
    assert isinstance(stats, dict)
    assert 0 < stats["allocated_mb"] <= stats["active_mb"] <= stats["resident_mb"]


def test_system_keeps_cpythons_allocator() -> None:
    lines = _probe(**{ENV: "system"})
    assert len(lines) == 2  # no second pid line: not re-executed
    assert lines[1]["malloc"] == "pymalloc"
    assert lines[1]["pythonmalloc"] is None
    assert lines[1]["stats"] == {}


def test_already_preloaded_or_system_returns_without_executing() -> None:
    # were either to re-execute, this test's own process would be replaced
    reexec_with_jemalloc({ENV: "system"})
    reexec_with_jemalloc({"LD_PRELOAD": "/opt/lib/libjemalloc.so.2"})


def test_an_unknown_choice_names_the_variable_and_the_choices() -> None:
    with pytest.raises(SystemExit, match="PARFUSION_MALLOC='tcmalloc': expected 'jemalloc' or"):
        reexec_with_jemalloc({ENV: "tcmalloc"})


# run as `python -c` on jemalloc: what the thread caches hold around a FlushPoint, in a thread
# of its own and in a pool worker running plain gRPC methods, and a thread without a cache
THREAD_CACHES = """
import json, threading
from concurrent.futures import ThreadPoolExecutor
from services.common.malloc import reexec_with_jemalloc
reexec_with_jemalloc()
from services.common.interceptors import _in_pool
from services.common.malloc import (
    FlushPoint, disable_thread_cache, jemalloc_stats, request_cache_flush, thread_cache_enabled,
)

def cached():
    return jemalloc_stats()["thread_caches_mb"] * 2**20

def churn(request=None, context=None):
    held = [(str(i) * (1 + i % 40), float(i), (i, i)) for i in range(50_000)]
    del held  # the last of what this thread freed stays in its cache

report = {}
flush = FlushPoint()
churn()
report["freed"] = cached()
flush()  # not asked: keeps its cache
report["kept"] = cached()
request_cache_flush()
flush()
report["flushed"] = cached()
with ThreadPoolExecutor(1) as pool:  # a worker as the gRPC server's pool runs methods
    pool.submit(_in_pool, churn, None).result()
    report["pool_freed"] = cached()
    pool.submit(_in_pool, lambda request, context: None, None).result()
    report["pool_kept"] = cached()
    request_cache_flush()
    pool.submit(_in_pool, lambda request, context: None, None).result()
    report["pool_flushed"] = cached()
seen = []
def without():
    disable_thread_cache()
    seen.append(thread_cache_enabled())
worker = threading.Thread(target=without)
worker.start()
worker.join()
report["disabled"], report["main"] = seen[0], thread_cache_enabled()
print(json.dumps(report))
"""


@needs_jemalloc
def test_flush_points_empty_their_threads_cache_once_asked() -> None:
    clean = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF", ENV)}
    done = subprocess.run(
        [sys.executable, "-c", THREAD_CACHES],
        cwd=ROOT,
        env={**clean, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report = json.loads(done.stdout.splitlines()[-1])
    for prefix in ("", "pool_"):  # this thread's own FlushPoint, a pool worker's after a method
        freed = report[f"{prefix}freed"]
        assert freed > 4096  # blocks the churn freed, cached for the thread's next use
        assert report[f"{prefix}kept"] > freed / 2  # a FlushPoint does nothing until asked
        assert report[f"{prefix}flushed"] < freed / 4  # then hands them back to the arena
    assert report["disabled"] is False  # a thread that went without frees straight back
    assert report["main"] is True  # the others keep theirs
