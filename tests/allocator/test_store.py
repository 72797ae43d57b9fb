"""The SQLite intent store: durability across reopen, idempotent ids, group commit, ordering."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from parfusion.v1 import intent_pb2
from services.allocator import store as store_module
from services.allocator.store import JOURNAL_IDS_FLOOR, MAX_BATCH, IntentStore
from services.allocator.store_batch import Op, SubmitResult
from services.allocator.store_batch import execute as real_execute
from services.common.errors import AlreadyExists, FailedPrecondition, NotFound, Unavailable
from services.core.validation import normalize_intent


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


def _batch_behind_a_held_commit(store: IntentStore, calls: list[Callable[[], object]]):
    """Run `calls` from threads so that the writer commits them as one batch: a first submit
    is held inside its commit (the connection lock) until all of them are queued behind it.
    Returns each call's result or the exception it raised, in order."""
    results: list[object] = [None] * len(calls)

    def run(k: int) -> None:
        try:
            results[k] = calls[k]()
        except Exception as exc:
            results[k] = exc

    opener = Op("submit", intent("opener", "opener"), "opener")
    with store._db_lock:
        store._enqueue(opener)
        deadline = time.monotonic() + 5
        while store._ops and time.monotonic() < deadline:  # the writer took the opener
            time.sleep(0.001)
        threads = []
        for k in range(len(calls)):
            threads.append(threading.Thread(target=run, args=(k,)))
            threads[-1].start()
            while len(store._ops) < k + 1 and time.monotonic() < deadline:
                time.sleep(0.001)
        assert len(store._ops) == len(calls)
    assert opener.done is not None and opener.done.acquire(timeout=5)
    for t in threads:
        t.join(5)
    return results


def test_one_batch_keeps_the_order_of_its_changes(tmp_path: Path) -> None:
    """Deletes, resubmits, duplicates and conflicts inside one batch (several statements in one
    transaction) answer each caller as if committed one by one, and survive a reopen."""
    path = tmp_path / "a.db"
    store = IntentStore(path)
    store.submit(intent("web", "web", deadline=50))
    commits = store.commits
    results = _batch_behind_a_held_commit(
        store,
        [
            lambda: store.delete("web"),
            lambda: store.submit(intent("web", "web", deadline=80)),  # same id, new content
            lambda: store.submit(intent("web", "web", deadline=80)),  # the same again: a no-op
            lambda: store.submit(intent("api", "api")),
            lambda: store.submit(intent("api", "api", deadline=99)),  # conflicts with the one above
            lambda: store.delete("nope"),
            lambda: store.submit(intent("job", "job")),
        ],
    )
    assert store.commits == commits + 2  # the opener, then the seven together
    deleted, resubmitted, again, api, conflict, missing, job = results
    assert isinstance(deleted, intent_pb2.ResourceIntent) and deleted.slo.deadline_ms == 50
    assert not resubmitted.already_existed and resubmitted.intent.slo.deadline_ms == 80  # type: ignore[union-attr]
    assert again.already_existed  # type: ignore[union-attr]
    assert not api.already_existed  # type: ignore[union-attr]
    assert isinstance(conflict, AlreadyExists) and isinstance(missing, NotFound)
    assert not job.already_existed  # type: ignore[union-attr]
    order = ["opener", "web", "api", "job"]
    assert [s.intent.id for s in store.list_intents()] == order
    store.close()
    reopened = IntentStore(path)
    try:
        assert [s.intent.id for s in reopened.list_intents()] == order
        assert reopened.get("web").slo.deadline_ms == 80
    finally:
        reopened.close()


def test_a_failed_commit_answers_every_caller_and_stores_nothing(store: IntentStore) -> None:
    with sqlite3.connect(store.path) as db:  # a real SQLite failure inside the batch's statement
        db.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON intents WHEN NEW.name = 'poison' "
            "BEGIN SELECT RAISE(ABORT, 'refused by trigger'); END"
        )
    version = store.version
    results = _batch_behind_a_held_commit(
        store,
        [lambda: store.submit(intent("fine", "fine")), lambda: store.submit(intent("poison"))],
    )
    assert all(isinstance(r, Unavailable) and "refused by trigger" in str(r) for r in results)
    assert store.version == version + 1  # the opener only
    with pytest.raises(NotFound):
        store.get("fine")
    assert store.submit(intent("fine", "fine")).intent.id == "fine"  # the writer goes on


def test_seq_is_never_reused_after_deleting_the_newest(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    s = IntentStore(path)
    s.submit(intent("a", "a"))
    s.submit(intent("b", "b"))
    b_seq = max(x.seq for x in s.list_intents())
    s.delete("b")
    s.close()
    s2 = IntentStore(path)
    try:
        s2.submit(intent("c", "c"))
        assert {x.intent.id: x.seq for x in s2.list_intents()}["c"] > b_seq
    finally:
        s2.close()


def test_async_callers_are_answered_on_their_loop(
    store: IntentStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[int] = []

    def execute(db: sqlite3.Connection, statements: Any) -> None:
        threads.append(threading.get_ident())  # which thread commits (the real execute runs)
        real_execute(db, statements)

    monkeypatch.setattr(store_module, "execute", execute)

    async def main() -> tuple[list[bool], intent_pb2.ResourceIntent, Exception]:
        stored = await asyncio.gather(
            *(store.submit_async(intent(f"svc-{k}", f"svc-{k}")) for k in range(50))
        )
        gone = await store.delete_async("svc-0")
        try:
            await store.delete_async("svc-0")
        except NotFound as exc:
            return [r.already_existed for r in stored], gone, exc
        raise AssertionError("deleting twice succeeded")

    commits = store.commits
    groups_before = _sample("parfusion_store_commit_group_changes_count")
    changes_before = _sample("parfusion_store_commit_group_changes_sum")
    timed_before = _sample("parfusion_store_commit_duration_seconds_count")
    existed, gone, missing = asyncio.run(main())
    assert existed == [False] * 50 and gone.id == "svc-0"
    assert missing.field == "id"
    assert len(store) == 49
    # committed on the loop, a group per pass: the 50 gathered submits together, then each delete
    assert store.committed_ops == 52 and store.commits == commits + 3
    assert threads and set(threads) == {threading.get_ident()}  # asyncio.run's loop: this thread
    # what an operator sees: each group's size and commit time
    assert _sample("parfusion_store_commit_group_changes_count") == groups_before + 3
    assert _sample("parfusion_store_commit_group_changes_sum") == changes_before + 52
    assert _sample("parfusion_store_commit_duration_seconds_count") == timed_before + 3


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def test_a_burst_on_one_loop_commits_in_groups_with_the_loop_running_between(
    store: IntentStore,
) -> None:
    """600 submits queued in one pass: committed MAX_BATCH at a time, and the loop's other work
    (here a coroutine that looks at the store every pass) runs between the groups."""
    seen: list[int] = []

    async def main() -> list[SubmitResult]:
        done = asyncio.Event()

        async def look() -> None:
            while not done.is_set():
                seen.append(store.committed_ops - base)
                await asyncio.sleep(0)

        watcher = asyncio.ensure_future(look())
        stored = await asyncio.gather(
            *(store.submit_async(intent(f"b-{k}", f"b-{k}")) for k in range(600))
        )
        done.set()
        await watcher
        return stored

    base, commits = store.committed_ops, store.commits
    stored = asyncio.run(main())
    assert [r.intent.id for r in stored] == [f"b-{k}" for k in range(600)]
    assert store.commits == commits + 3 and len(store) == 600  # 256 + 256 + 88
    assert {MAX_BATCH, 2 * MAX_BATCH} <= set(seen)  # looked at between the groups


def test_close_commits_what_an_event_loop_has_queued(tmp_path: Path) -> None:
    """A change queued for the loop's next pass when the store closes is committed by close()
    and answered, never dropped."""
    s = IntentStore(tmp_path / "a.db")

    async def main() -> intent_pb2.ResourceIntent:
        task = asyncio.ensure_future(s.submit_async(intent("queued", "queued")))
        await asyncio.sleep(0)  # the submit ran to its wait: queued for the next pass
        assert not task.done()
        s.close()
        return (await task).intent

    assert asyncio.run(main()).id == "queued"
    reopened = IntentStore(tmp_path / "a.db")
    try:
        assert reopened.get("queued").name == "queued"
    finally:
        reopened.close()


def test_writes_after_close_are_refused(tmp_path: Path) -> None:
    s = IntentStore(tmp_path / "a.db")
    s.close()
    with pytest.raises(FailedPrecondition):
        s.submit(intent("late"))
    s.close()  # closing twice is harmless


def test_changes_since_names_what_changed_and_admits_a_gap(store: IntentStore) -> None:
    a = store.submit(intent("a", "a")).intent
    store.submit(intent("b", "b"))
    version = store.version
    assert store.changes_since(version) == (version, {})
    store.delete("b")
    c = store.submit(intent("c", "c")).intent
    store.delete("a")
    store.submit(intent("a", "a", deadline=60.0))  # the same id, other content
    now, changed = store.changes_since(version)  # type: ignore[misc]
    assert now == store.version == version + 4
    assert set(changed) == {"a", "b", "c"} and changed["b"] is None
    _, stored = store.snapshot()
    assert [s.intent.id for s in stored] == ["c", "a"]
    assert changed["c"] is stored[0] and changed["a"] is stored[1]
    assert changed["a"].intent != a and changed["c"].intent == c  # type: ignore[union-attr]
    assert store.changes_since(version + 3)[1].keys() == {"a"}  # type: ignore[index]
    assert store.changes_since(now + 1) is None  # a version the store never had
    store._journal.clear()  # the journal no longer reaches back: read everything
    store._journal_ids = 0
    assert store.changes_since(version) is None
    assert store.changes_since(now) == (now, {})


def test_the_journal_names_no_more_ids_than_the_store_holds_or_its_floor(
    store: IntentStore,
) -> None:
    for i in range(600):
        store.submit(intent("web", f"web-{i}"))
    full = store.version
    assert len(store.changes_since(full - 600)[1]) == 600  # 600 stored: all 600 versions kept
    for i in range(599):  # one by one, 599 versions
        store.delete(f"web-{i}")
    now = store.version
    assert len(store) == 1
    assert store.changes_since(full) is None  # too far behind: a snapshot (of 1 intent)
    assert store.changes_since(now - JOURNAL_IDS_FLOOR - 1) is None
    since, changed = store.changes_since(now - JOURNAL_IDS_FLOOR)
    assert since == now and len(changed) == JOURNAL_IDS_FLOOR
    assert set(changed.values()) == {None}  # the last deletes, the ids of the earlier ones gone
    store.delete("web-599")
    assert store.changes_since(now) == (now + 1, {"web-599": None})


def test_commits_leave_the_checkpoints_to_the_checkpointer(
    store: IntentStore, tmp_path: Path
) -> None:
    """The serving connection never checkpoints (a checkpoint held its commit 5-24 ms, on
    the server's event loop); the checkpointer's own connection copies the committed WAL
    frames into the database file: the file alone, without its WAL, holds the intents."""
    assert store._db.execute("PRAGMA wal_autocheckpoint").fetchone() == (0,)
    for k in range(50):
        store.submit(intent(f"web-{k}", f"web-{k}"))
    done = store.checkpoints
    deadline = time.monotonic() + 10
    while store.checkpoints < done + 2:  # one whole checkpoint after the last commit
        assert time.monotonic() < deadline, "no checkpoint ran"
        time.sleep(0.05)
    alone = tmp_path / "copy" / "allocator.db"
    alone.parent.mkdir()
    shutil.copyfile(store.path, alone)  # the main file only: what the checkpoints wrote
    copy = sqlite3.connect(alone)
    try:
        assert copy.execute("SELECT COUNT(*) FROM intents").fetchone() == (50,)
    finally:
        copy.close()


@pytest.fixture
def sqlite_memory() -> Callable[[], int]:
    """Bytes SQLite's own allocator holds in this process (caches, prepared statements)."""
    library = ctypes.util.find_library("sqlite3")
    if library is None:
        pytest.skip("this Python's sqlite3 is not a shared libsqlite3 whose memory can be read")
    sqlite = ctypes.CDLL(library)
    sqlite.sqlite3_memory_used.restype = ctypes.c_int64
    return lambda: int(sqlite.sqlite3_memory_used())


def test_commits_of_every_size_prepare_one_statement_per_kind(
    store: IntentStore, sqlite_memory: Callable[[], int]
) -> None:
    """The connection keeps every statement it prepared: group commits of 1 to 60 changes
    leave no more prepared than commits of one size (a statement text per row count kept up to
    100 per kind, 4.4 MB of inserts after a burst)."""

    async def groups(sizes: range | list[int], prefix: str) -> None:
        for k in sizes:  # one group commit of k submits, then one of k deletes
            ids = [f"{prefix}-{k}-{i}" for i in range(k)]
            await asyncio.gather(*(store.submit_async(intent("web", i)) for i in ids))
            await asyncio.gather(*(store.delete_async(i) for i in ids))

    asyncio.run(groups([3] * 5, "warm"))  # every kind prepared once
    commits, before = store.commits, sqlite_memory()
    asyncio.run(groups(range(1, 61), "burst"))
    assert store.commits == commits + 120 and len(store) == 0
    assert sqlite_memory() - before < 200_000


def test_release_memory_hands_back_sqlites_page_cache(
    store: IntentStore, sqlite_memory: Callable[[], int]
) -> None:

    async def fill() -> None:  # one group commit after another, as the served submits are
        for start in range(0, 4_000, 500):
            await asyncio.gather(
                *(store.submit_async(intent("web", f"web-{i}")) for i in range(start, start + 500))
            )

    asyncio.run(fill())
    filled = sqlite_memory()
    store.release_memory()
    assert sqlite_memory() < filled - 1_000_000  # the ~2 MB cache, not a few pages
    assert len(store) == 4_000 and store.get("web-3999").name == "web"  # nothing else changed
