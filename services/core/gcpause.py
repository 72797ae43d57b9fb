"""The cyclic garbage collector paused for the length of one tick.

A tick builds tens of thousands of short-lived containers (column lists, argument tuples,
Decision objects), none of them in a reference cycle: reference counting frees every one. The
cyclic collector still starts a young-generation pass every 700 net new containers, and each
pass walks every young container in full (a 10,000-item column list is 10,000 visits), so at
10,000 intents a cold tick spent about a fifth of its time in collections that found nothing.
Pausing the collector for the tick skips those passes; deallocations still count down the
collector's allocation counter, so what the tick leaves behind is collected as usual after it.

Ticks may overlap (the allocator loop and a what-if preview run on different threads): the
collector is paused while at least one tick runs and resumed when the last one ends, and only if
it was enabled when the first one began (a process that turned it off keeps it off).
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
