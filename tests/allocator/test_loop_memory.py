"""After thousands of intents are submitted and deleted, the loop holds nothing sized for them.

A dict or set keeps the table of its largest size when its entries are removed; each holder of
per-intent state (the store's mirror, the loop's rows, the allocation cache, the decision
series and their gauges, the predictor) rebuilds its tables after a large shrink
(services/common/memory.py). A table left sized for the peak is what these tests catch.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from services.allocator.loop import ControlLoop, LoopConfig
from services.allocator.store import IntentStore
from services.common.memory import SHRINK_ENTRIES
from services.core.validation import normalize_intent
from tests.allocator.conftest import batch_intent, online_intent

N = 3000
# the largest table a holder may keep: a shrink smaller than SHRINK_ENTRIES is not acted on
MOST = sys.getsizeof(dict.fromkeys(range(SHRINK_ENTRIES)))


def _intent(k: int) -> Any:
    if k % 3 == 2:
        return normalize_intent(batch_intent(f"job-{k}", f"mem-{k}"))
    return normalize_intent(online_intent(f"web-{k}", f"mem-{k}"))


def _tables(loop: ControlLoop, store: IntentStore) -> dict[str, Any]:
    cache, series, predictor = loop._allocation_cache, loop.metrics, loop.predictor
    tables: dict[str, Any] = {
        "store mirror": store._mirror,
        "store content": store._content,
        "loop rows": loop._rows,
        "loop specs": loop._mine_specs,
        "loop intents": loop._mine_intents,
        "cache decisions": cache._decision,
        "cache intents": cache._intent,
        "cache entries": cache._entry,
        "cache workers": cache.workers,
        "series decisions": series._decision,
        "series names": series._name,
        "predictor regimes": predictor._current,
        "predictor snapshot": predictor._snapshot,
    }
    return tables


def test_no_table_stays_sized_for_deleted_intents(tmp_path: Path) -> None:
    store = IntentStore(tmp_path / "allocator.db", max_intents=N)
    loop = ControlLoop(store, LoopConfig(cpu_units=64))
    try:
        with ThreadPoolExecutor(16) as pool:  # concurrent submits commit in batches
            ids = [r.intent.id for r in pool.map(lambda k: store.submit(_intent(k)), range(N))]
        assert loop.tick() is not None
        for intent_id in ids:
            loop.predictor.observe_many(intent_id, [20.0] * 5, units=2)
        snapshot = loop.tick()
        assert snapshot is not None and len(snapshot.node_plan.allocations) == N
        peak = {name: sys.getsizeof(t) for name, t in _tables(loop, store).items()}
        assert min(peak.values()) > 2 * MOST  # each table held every intent

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(store.delete, ids))
        snapshot = loop.tick()
        assert snapshot is not None and len(snapshot.node_plan.allocations) == 0

        left = {name: sys.getsizeof(t) for name, t in _tables(loop, store).items()}
        assert {name: size for name, size in left.items() if size > MOST} == {}
        gone = set(ids)
        for metric, _, rows in loop.metrics.series():  # what a scrape would read
            assert not [r for r in rows if r[1] in gone], metric
    finally:
        loop.stop()
        store.close()
