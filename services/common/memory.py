"""Hand memory freed by a shrinking state back to the operating system.

After thousands of intents are deleted, their objects are freed but glibc's malloc keeps the
pages in its arenas: the process's RSS stays at its peak (the node agent stayed at about 250 MB
after the store shrank). ``malloc_trim(0)`` returns the free pages at the top of each arena and
the free whole pages inside them. It costs a few milliseconds, so callers use it only after a
large shrink. Without glibc (musl, macOS) it does nothing. Where the service runs on jemalloc
(services/common/malloc.py) every arena's free pages are purged instead.

Freed objects are not all: a dict or set never shrinks its table when entries are removed, so
one that held 10,000 intents keeps a table for 10,000 (hundreds of KB) after they are all
gone. Holders of per-intent state watch their size with ``ShrinkWatch`` and copy their
tables after a large shrink (``dict(d)`` builds a table sized for what is left), before the
trim.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import logging
from typing import Any

from services.common.malloc import purge_jemalloc, request_cache_flush

log = logging.getLogger(__name__)

# a shrink by at least this many entries, and at least this fraction of what was held
SHRINK_ENTRIES = 500
SHRINK_FRACTION = 0.25


@functools.cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


class ShrinkWatch:
    """Says when a state has shrunk enough since its peak to be worth trimming after (intents
    are deleted a few hundred per tick: no single step is large)."""

    def __init__(self) -> None:
        self._peak = 0

    def shrunk(self, size: int) -> bool:
        self._peak = max(self._peak, size)
        gone = self._peak - size
        if gone >= SHRINK_ENTRIES and gone >= SHRINK_FRACTION * self._peak:
            self._peak = size
            return True
        return False


def release_freed_memory() -> bool:
    """Collect cycles, then return free heap pages to the OS; True when glibc or jemalloc
    (services/common/malloc.py) did it."""
    gc.collect()
    request_cache_flush()  # every thread's malloc cache, as it next passes its FlushPoint
    if purge_jemalloc():  # glibc's malloc_trim would only trim glibc's own, unused heap
        return True
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.malloc_trim(0))


def freeze_startup_objects() -> int:
    """Move every object alive now (modules, classes, functions, the built service) to the
    collector's permanent generation, so a full collection no longer walks them: in the
    allocator at 10,000 intents a full collection went from 35-71 to 13-14 ms, and it holds the
    interpreter lock, so every RPC waits that long. Called once a service is built, before it
    serves. Frozen objects are still freed when their last reference goes; only a reference
    cycle among them would stay (start-up state holds none that is ever dropped). Returns how
    many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
