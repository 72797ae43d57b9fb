"""The cyclic garbage collector paused for the length of one tick (the allocator loop's choice).

A tick builds many short-lived containers, none in a reference cycle, and the collector's
young-generation passes over them find nothing (docs/performance.md has what the pause is
worth). Deallocations still count down the collector's allocation counter, so what the tick
leaves behind is collected as usual after it. Ticks may overlap (the loop and a preview): the
collector resumes when the last one ends, and only if it was enabled when the first began.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0  # ticks running now
_resume = False  # whether the collector was enabled when the first of them began


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.enable()
