"""The SQLite intent store: durability across reopen, idempotent ids, group commit, ordering."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from parfusion.v1 import intent_pb2
from services.allocator.store import IntentStore
from services.allocator.validation import normalize_intent
from services.common.errors import AlreadyExists, NotFound


def intent(name: str, intent_id: str = "", deadline: float = 50.0) -> intent_pb2.ResourceIntent:
    return normalize_intent(
        intent_pb2.ResourceIntent(
            id=intent_id,
            name=name,
            workload_class=intent_pb2.WORKLOAD_CLASS_ONLINE,
            slo=intent_pb2.Slo(deadline_ms=deadline),
        )
    )


@pytest.fixture
def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    s = IntentStore(tmp_path / "run" / "allocator.db")
    yield s
    s.close()


def test_wal_mode_and_schema(store: IntentStore) -> None:
    with sqlite3.connect(store.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        cols = {row[1] for row in db.execute("PRAGMA table_info(intents)")}
    assert {"id", "name", "workload_class", "priority", "node", "created_at_ns", "body"} <= cols


def test_server_assigns_id_and_timestamp(store: IntentStore) -> None:
    result = store.submit(intent("web"))
    assert result.intent.id.startswith("intent-") and not result.already_existed
    assert result.intent.created_at.seconds > 0
    assert store.get(result.intent.id) == result.intent


def test_same_id_same_content_is_idempotent(store: IntentStore) -> None:
    first = store.submit(intent("web", "web-1"))
    again = store.submit(intent("web", "web-1"))
    assert again.already_existed
    assert again.intent == first.intent  # the original, created_at included
    assert len(store) == 1


def test_same_id_other_content_conflicts_and_changes_nothing(store: IntentStore) -> None:
    first = store.submit(intent("web", "web-1", deadline=50))
    version = store.version
    with pytest.raises(AlreadyExists) as err:
        store.submit(intent("web", "web-1", deadline=80))
    assert err.value.field == "intent.id"
    assert store.get("web-1") == first.intent
    assert store.version == version


def test_reopen_keeps_intents_in_order(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    s = IntentStore(path)
    ids = [s.submit(intent(f"svc-{i}")).intent.id for i in range(5)]
    s.delete(ids[2])
    s.close()
    s2 = IntentStore(path)
    try:
        assert [x.intent.id for x in s2.list_intents()] == [ids[0], ids[1], ids[3], ids[4]]
        assert s2.submit(intent("svc-0", ids[0])).already_existed  # idempotency survives a restart
    finally:
        s2.close()


def test_delete_unknown_is_not_found(store: IntentStore) -> None:
    with pytest.raises(NotFound):
        store.delete("nope")
    with pytest.raises(NotFound):
        store.get("nope")


def test_list_filters_by_class(store: IntentStore) -> None:
    store.submit(intent("web"))
    batch = normalize_intent(
        intent_pb2.ResourceIntent(name="job", workload_class=intent_pb2.WORKLOAD_CLASS_BATCH)
    )
    store.submit(batch)
    assert [s.intent.name for s in store.list_intents(intent_pb2.WORKLOAD_CLASS_BATCH)] == ["job"]
    assert len(store.list_intents()) == 2
    assert store.count_by_class() == {
        intent_pb2.WORKLOAD_CLASS_ONLINE: 1,
        intent_pb2.WORKLOAD_CLASS_BATCH: 1,
    }


def test_concurrent_submits_are_group_committed(store: IntentStore) -> None:
    """Many concurrent callers, the same id raced by several: exactly one stores it."""
    results: list[bool] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        for i in range(20):
            r = store.submit(intent(f"svc-{k}-{i}", f"id-{k}-{i}"))
            raced = store.submit(intent("shared", "shared-id"))
            with lock:
                results.append(raced.already_existed)
            assert not r.already_existed

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(store) == 8 * 20 + 1
    assert results.count(False) == 1  # one caller stored the shared id, the rest saw it


def test_meta_roundtrip(store: IntentStore) -> None:
    assert store.meta("seeded") is None
    store.set_meta("seeded", "yes")
    assert store.meta("seeded") == "yes"
