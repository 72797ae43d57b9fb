"""The collector's permanent generation after start-up, and the shrink watch."""

from __future__ import annotations

import gc
import weakref

from services.common.memory import ShrinkWatch, freeze_startup_objects


class _Held:
    pass


def test_frozen_objects_are_skipped_by_collections_but_still_freed() -> None:
    held = _Held()
    gone = weakref.ref(held)
    try:
        frozen = freeze_startup_objects()
        assert frozen == gc.get_freeze_count() > 0
        assert not any(o is held for o in gc.get_objects())  # no collection walks it now
        del held  # its last reference: freed at once, frozen or not
        assert gone() is None
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0


def test_shrink_watch_fires_once_per_large_shrink_from_the_peak() -> None:
    watch = ShrinkWatch()
    assert not watch.shrunk(2_000)
    assert not watch.shrunk(1_700)  # 300 gone: under 500 entries
    assert watch.shrunk(1_400)  # 600 gone, 30 % of the peak
    assert not watch.shrunk(1_300)  # measured from the new peak, 1,400: 100 gone
    assert watch.shrunk(400)  # 1,000 gone since 1,400
    assert not watch.shrunk(100)  # 300 gone since 400: under 500 entries
