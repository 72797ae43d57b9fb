"""The store never lies about its state: limits, unusable files, unreadable rows (issue items
11-14). Every failure names the file (or row) and leaves the file as it was."""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from parfusion.v1 import allocator_pb2, intent_pb2
from services.allocator.server import RunningAllocator, main
from services.allocator.store import IntentStore, StoreUnusable
from services.common.errors import ResourceExhausted
from tests.allocator.test_store import intent


def test_the_intent_limit_is_resource_exhausted_naming_it(tmp_path: Path) -> None:
    store = IntentStore(tmp_path / "a.db", max_intents=3)
    try:
        for name in ("a", "b", "c"):
            store.submit(intent(name, name))
        with pytest.raises(ResourceExhausted, match="limit of 3 intents.*max_intents"):
            store.submit(intent("d", "d"))
        assert store.submit(intent("a", "a")).already_existed  # idempotent resubmit still fine
        store.delete("a")
        store.submit(intent("d", "d"))  # room again after a delete
        assert len(store) == 3
    finally:
        store.close()


def test_the_limit_reaches_grpc_as_resource_exhausted(
    start: Callable[..., RunningAllocator], stub_for: Callable[[str], object]
) -> None:
    running = start(max_intents=1)
    stub = stub_for(running.address)
    stub.SubmitIntent(allocator_pb2.SubmitIntentRequest(intent=intent("one")), timeout=5)  # type: ignore[attr-defined]
    with pytest.raises(grpc.RpcError) as err:
        stub.SubmitIntent(allocator_pb2.SubmitIntentRequest(intent=intent("two")), timeout=5)  # type: ignore[attr-defined]
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "limit of 1 intents" in err.value.details()


def test_a_zero_byte_db_is_refused_not_reseeded(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = home / "run" / "allocator.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    db.write_bytes(b"")
    with pytest.raises(StoreUnusable, match=f"{db} is 0 bytes.*Move it aside"):
        IntentStore(db)
    assert db.stat().st_size == 0 and not db.with_name("allocator.db-wal").exists()
    with pytest.raises(SystemExit, match="is 0 bytes"):  # main: a message, no traceback
        monkeypatch.setenv("PARFUSION_ALLOCATOR_DB_PATH", str(db))
        monkeypatch.setenv("PARFUSION_ALLOCATOR_SEED_INTENTS", "true")
        main(["--port", "0"])
    assert db.stat().st_size == 0


@pytest.mark.parametrize(
    "content",
    [b"not a database at all " * 200, b"SQLite format 3\x00" + b"\x07" * 4000],
    ids=["garbage", "torn-header"],
)
def test_a_file_that_is_not_a_store_is_refused_and_left_alone(
    tmp_path: Path, content: bytes
) -> None:
    db = tmp_path / "allocator.db"
    db.write_bytes(content)
    with pytest.raises(StoreUnusable, match=f"{db} is not a readable intent store"):
        IntentStore(db)
    assert db.read_bytes() == content


def test_another_programs_sqlite_db_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE photos (id INTEGER)")
    with pytest.raises(StoreUnusable, match="not an intent store \\(tables: photos\\)"):
        IntentStore(db)


def test_a_torn_store_names_the_file(tmp_path: Path) -> None:
    db = tmp_path / "allocator.db"
    store = IntentStore(db)
    for i in range(300):
        store.submit(intent(f"i{i}", f"id-{i}"))
    store.close()
    size = db.stat().st_size
    assert size > 8 * 4096
    with db.open("r+b") as f:  # a torn write: the second half of the file is zeros
        f.seek(size // 2)
        f.write(b"\x00" * (size - size // 2))
    with pytest.raises(StoreUnusable, match=f"{db} is not a readable intent store"):
        IntentStore(db)


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Callable[[Path], None]]:
    """Make a file read-only for this process: chmod for a normal user; root ignores modes, so
    the immutable attribute there (skip when the filesystem or capabilities refuse it)."""
    made: list[Path] = []

    def make(path: Path) -> None:
        if os.geteuid() != 0:
            path.chmod(0o444)
            return
        if shutil.which("chattr") is None:
            pytest.skip("root ignores file modes and chattr is not installed")
        done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot make a file read-only for root here: {done.stderr.strip()}")
        made.append(path)

    yield make
    for path in made:
        subprocess.run(["chattr", "-i", str(path)], check=False)


def test_a_read_only_store_refuses_to_start(
    tmp_path: Path, read_only: Callable[[Path], None]
) -> None:
    db = tmp_path / "allocator.db"
    store = IntentStore(db)
    store.submit(intent("a", "a"))
    store.close()
    read_only(db)
    with pytest.raises(StoreUnusable, match=f"{db} cannot be written by this process"):
        IntentStore(db)


def test_one_bad_row_is_skipped_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "allocator.db"
    store = IntentStore(db)
    for name in ("good-a", "bad-b", "good-c", "swapped-d"):
        store.submit(intent(name, name))
    store.close()
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE intents SET body = x'ffffffff0a' WHERE id = 'bad-b'")
        other = conn.execute("SELECT body FROM intents WHERE id = 'good-a'").fetchone()[0]
        conn.execute("UPDATE intents SET body = ? WHERE id = 'swapped-d'", (other,))
    before = REGISTRY.get_sample_value("parfusion_store_skipped_rows_total") or 0.0
    with caplog.at_level(logging.ERROR, logger="services.allocator.store"):
        reopened = IntentStore(db)
    try:
        assert [s.intent.id for s in reopened.list_intents()] == ["good-a", "good-c"]
        assert reopened.skipped_rows == 2
        assert REGISTRY.get_sample_value("parfusion_store_skipped_rows_total") == before + 2
        skipped = [r for r in caplog.records if r.getMessage() == "intent row skipped: unreadable"]
        assert [getattr(r, "intent_id", None) for r in skipped] == ["bad-b", "swapped-d"]
        assert all(getattr(r, "path", None) == str(db) for r in skipped)
        reopened.submit(intent("after", "after"))  # the rest of the store works
    finally:
        reopened.close()


def test_submit_still_reaches_the_store_that_started(
    start: Callable[..., RunningAllocator], stub_for: Callable[[str], object]
) -> None:
    running = start()
    stub = stub_for(running.address)
    reply = stub.SubmitIntent(  # type: ignore[attr-defined]
        allocator_pb2.SubmitIntentRequest(intent=intent("fine")), timeout=5
    )
    assert reply.intent.workload_class == intent_pb2.WORKLOAD_CLASS_ONLINE
