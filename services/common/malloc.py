"""jemalloc as the malloc of the services whose per-intent state churns (allocator, node agent).

CPython's own small-object allocator takes memory in 1 MiB arenas and returns an arena only
when every block in it is free; glibc's malloc returns little of a fragmented heap either.
After 10,000 intents were submitted and deleted, the few objects made during the churn that
lived on kept the allocator and the node agent at +54-75 % of their start RSS
(docs/performance.md, "memory after the deletes"). With every object taken from jemalloc
instead (PYTHONMALLOC=malloc), a survivor holds one slab of one page, and jemalloc's
background thread hands free pages back within a second; the blocks each thread keeps cached
are handed back after a large shrink too (FlushPoint, below).

`reexec_with_jemalloc()` is called first thing by those services' `__main__`: where
libjemalloc.so.2 is installed (Debian's libjemalloc2; the container image has it) and
PARFUSION_MALLOC is not "system", it re-executes the same command line in the same process
(same pid) with LD_PRELOAD, PYTHONMALLOC and MALLOC_CONF set. Without the library it returns
and the service runs on CPython's allocator as before. A MALLOC_CONF of the caller's own is
kept as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from collections.abc import Mapping
from typing import Any

ENV = "PARFUSION_MALLOC"  # "jemalloc" (the default: where installed) or "system"
# free pages back after about a second, by jemalloc's own thread, without a lazy (MADV_FREE)
# stage whose pages would still count in RSS; two arenas: the services' Python code allocates
# under one interpreter lock, and fewer arenas leave fewer partly used slabs; slabs of one
# page for every small size class: a block that lives on holds 4 KiB, not up to 28; thread
# caches for blocks up to 4 KiB only (gRPC's own threads, whose caches nothing empties, cached
# its buffers of up to 32 KiB)
MALLOC_CONF = (
    "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0,narenas:2,"
    "slab_sizes:1-4096:1,tcache_max:4096"
)
MALLCTL_ARENAS_ALL = 4096  # jemalloc 5's index for "every arena" in arena.<i>.* names


def planned_malloc(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """What the allocator and the node agent will run on with this environment, and why:
    ("jemalloc", the library's name) or ("pymalloc", the reason); also for `check-env`."""
    env = os.environ if environ is None else environ
    choice = env.get(ENV, "jemalloc")
    if choice not in ("jemalloc", "system"):
        raise SystemExit(f"{ENV}={choice!r}: expected 'jemalloc' or 'system'")
    if choice == "system":
        return "pymalloc", f"{ENV}=system"
    library = ctypes.util.find_library("jemalloc")
    if library is None:
        return "pymalloc", "libjemalloc.so.2 not installed (Debian: libjemalloc2)"
    return "jemalloc", library


def reexec_with_jemalloc(environ: Mapping[str, str] | None = None) -> None:
    """Re-execute this interpreter's command line with jemalloc preloaded, where it is
    installed and not already in use; returns when nothing is to be done."""
    env = os.environ if environ is None else environ
    if "jemalloc" in env.get("LD_PRELOAD", "") and env.get(ENV, "jemalloc") == "jemalloc":
        return  # preloaded: this is the re-executed process (or the caller preloaded it)
    malloc, library = planned_malloc(env)
    if malloc != "jemalloc":
        return
    preload = " ".join(p for p in (library, env.get("LD_PRELOAD", "")) if p)
    extra = {"LD_PRELOAD": preload, "PYTHONMALLOC": "malloc"}
    extra["MALLOC_CONF"] = env.get("MALLOC_CONF") or MALLOC_CONF
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**env, **extra})


@functools.cache
def _mallctl() -> Any:
    return getattr(ctypes.CDLL(None), "mallctl", None)


def active_malloc() -> str:
    """What this process's objects come from: "jemalloc" or "pymalloc" (CPython's own)."""
    return "jemalloc" if _mallctl() is not None else "pymalloc"


def purge_jemalloc() -> bool:
    """Hand every arena's free pages back now rather than at the decay time; False without
    jemalloc."""
    mallctl = _mallctl()
    if mallctl is None:
        return False
    return bool(mallctl(f"arena.{MALLCTL_ARENAS_ALL}.purge".encode(), None, None, None, 0) == 0)


def jemalloc_stats() -> dict[str, float]:
    """MB jemalloc counts: live (allocated), in pages holding live blocks (active), resident,
    mapped, free blocks held in thread caches; empty without jemalloc."""
    mallctl = _mallctl()
    if mallctl is None:
        return {}
    epoch = ctypes.c_uint64(1)  # refreshes the statistics read below
    mallctl(b"epoch", None, None, ctypes.byref(epoch), ctypes.c_size_t(8))
    found: dict[str, float] = {}
    keys = {
        name: f"stats.{name}" for name in ("allocated", "active", "metadata", "resident", "mapped")
    }
    keys["thread_caches"] = f"stats.arenas.{MALLCTL_ARENAS_ALL}.tcache_bytes"
    for name, key in keys.items():
        value, size = ctypes.c_size_t(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t))
        if mallctl(key.encode(), ctypes.byref(value), ctypes.byref(size), None, 0) == 0:
            found[f"{name}_mb"] = value.value / 2**20
    return found


# Thread caches: each thread keeps blocks it freed for its next allocations, and only that
# thread can hand them back; a block held there keeps its slab's pages. A long-lived thread
# holds a FlushPoint where it passes often (the event loop's timer, a tick, a pool worker's
# method, an idle writer's timed wait) and empties its cache once after each
# request_cache_flush() (a large shrink); a thread that allocates seldom and then waits
# untimed (the cgroup record's writer) calls disable_thread_cache() as it starts.
_flush_requests = 0


def request_cache_flush() -> None:
    """Ask every FlushPoint's thread to empty its cache the next time it passes."""
    global _flush_requests
    _flush_requests += 1


class FlushPoint:
    """One thread's check, called where it passes often: empties the thread's cache once
    after each request_cache_flush()."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen = _flush_requests

    def __call__(self) -> None:
        if self._seen != _flush_requests:
            self._seen = _flush_requests
            flush_thread_cache()


def flush_thread_cache() -> bool:
    """Hand the calling thread's cached free blocks back to their arenas; False without
    jemalloc."""
    mallctl = _mallctl()
    if mallctl is None:
        return False
    return bool(mallctl(b"thread.tcache.flush", None, None, None, 0) == 0)


def disable_thread_cache() -> bool:
    """The calling thread allocates from and frees to its arena directly from now on; False
    without jemalloc."""
    mallctl = _mallctl()
    if mallctl is None:
        return False
    off = ctypes.c_bool(False)  # jemalloc flushes the cache as it turns it off
    return bool(
        mallctl(b"thread.tcache.enabled", None, None, ctypes.byref(off), ctypes.c_size_t(1)) == 0
    )


def thread_cache_enabled() -> bool | None:
    """Whether the calling thread has a cache; None without jemalloc."""
    mallctl = _mallctl()
    if mallctl is None:
        return None
    value, size = ctypes.c_bool(False), ctypes.c_size_t(1)
    if mallctl(b"thread.tcache.enabled", ctypes.byref(value), ctypes.byref(size), None, 0) != 0:
        return None
    return value.value
