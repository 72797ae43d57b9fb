"""The durable intent store: SQLite in WAL mode under run/, group-committed, mirrored in memory.

Every change (submit, delete) is queued for one writer thread, which commits all the changes
queued so far together, as one SQL statement where it can (consecutive submits are one multi-row
INSERT, committed on its own) and as one transaction otherwise. A caller is answered only after
the commit returned, so an acknowledged SubmitIntent is in the database. Callers wait either
blocking (``submit``, ``delete``) or in asyncio (``submit_async``, ``delete_async``, which the
gRPC servicer awaits so that a waiting call holds no thread). With ``journal_mode=WAL`` and
``synchronous=NORMAL`` (the default here) the committed frames are written to the WAL file with
write(2) before the commit returns: a process crash (``kill -9``) cannot lose them; only an OS
crash or power cut can lose the last transactions. ``synchronous=FULL`` (config
``db_synchronous: full``) adds an fsync per commit for power-loss durability.

The store never lies about itself: a file that exists but is not an intent store (0 bytes, not
SQLite, another program's tables, corrupt pages) or that this process cannot write makes
:class:`StoreUnusable` at open, naming the file and what to do; nothing is created or replaced.
A single row that cannot be read is skipped with an ERROR log naming it and
``parfusion_store_skipped_rows_total``; the rest of the store starts. ``max_intents`` bounds
the store: a submit beyond it is RESOURCE_EXHAUSTED naming the limit.

Reads are served from an in-memory mirror updated after each commit, so GetIntent/ListIntents
and the control loop never wait on a commit. ``version`` grows with every change; the loop
uses it to invalidate its cached intent list.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.timestamp_pb2 import Timestamp

from parfusion.v1 import intent_pb2
from services.allocator.metrics import STORE_SKIPPED_ROWS
from services.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    NotFound,
    ResourceExhausted,
    Unavailable,
)

log = logging.getLogger(__name__)

SYNCHRONOUS_LEVELS = ("normal", "full")
MAX_BATCH = 256  # changes committed together at most
ROWS_PER_STATEMENT = 100  # 9 parameters a row: within SQLite's oldest limit of 999 per statement
WRITER_CHECK_S = 1.0  # a blocked caller checks this often that the writer thread is alive
DEFAULT_MAX_INTENTS = 10_000  # allocator setting max_intents

SCHEMA = """
CREATE TABLE IF NOT EXISTS intents (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL,
    workload_class INTEGER NOT NULL,
    priority INTEGER NOT NULL,
    node TEXT NOT NULL,
    created_at_ns INTEGER NOT NULL,
    content BLOB NOT NULL,
    body BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS intents_by_class ON intents (workload_class, seq);
CREATE INDEX IF NOT EXISTS intents_by_name ON intents (name);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
INSERT_ROW = "(?, ?, ?, ?, ?, ?, ?, ?, ?)"
INSERT_INTO = (
    "INSERT INTO intents"
    " (seq, id, name, workload_class, priority, node, created_at_ns, content, body) VALUES "
)


class StoreUnusable(RuntimeError):
    """The database file cannot serve as the intent store; the message names it and the fix."""


@dataclass(frozen=True)
class StoredIntent:
    seq: int
    intent: intent_pb2.ResourceIntent


@dataclass(frozen=True)
class SubmitResult:
    intent: intent_pb2.ResourceIntent
    already_existed: bool


def content_key(intent: intent_pb2.ResourceIntent) -> bytes:
    """What idempotency compares: the normalised intent without id and server timestamps."""
    copy = intent_pb2.ResourceIntent()
    copy.CopyFrom(intent)
    copy.ClearField("id")
    copy.ClearField("created_at")
    return copy.SerializeToString(deterministic=True)


def new_intent_id() -> str:
    return f"intent-{uuid.uuid4().hex[:16]}"


class _Op:
    """One queued change and how its caller learns the outcome: a lock it blocks on (sync), or
    a future of its asyncio loop (async)."""

    __slots__ = ("kind", "intent", "intent_id", "outcome", "failed", "done", "loop", "future")

    def __init__(
        self,
        kind: str,
        intent: intent_pb2.ResourceIntent | None,
        intent_id: str,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.kind = kind
        self.intent = intent
        self.intent_id = intent_id
        self.outcome: object = None
        self.failed = False
        self.loop = loop
        self.future: asyncio.Future[object] | None = None
        self.done: threading.Lock | None = None
        if loop is None:
            self.done = threading.Lock()
            self.done.acquire()  # released by the writer once the outcome is set
        else:
            self.future = loop.create_future()

    def settle(self, outcome: object, failed: bool) -> None:
        self.outcome, self.failed = outcome, failed


class _Changes:
    """What one batch does, decided in order against the mirror and the batch's own earlier
    changes: each caller's outcome, the mirror updates, and the SQL, consecutive changes of one
    kind merged into one statement (a multi-row INSERT, a DELETE ... IN)."""

    def __init__(self, store: IntentStore) -> None:
        self.store = store
        self.next_seq = store._next_seq
        self.count = len(store._mirror)
        self.pending: dict[str, tuple[StoredIntent | None, bytes | None]] = {}
        self.mirror: list[tuple[str, StoredIntent | None, bytes | None]] = []
        self.groups: list[tuple[str, list[tuple[object, ...]]]] = []

    def current(self, intent_id: str) -> tuple[StoredIntent | None, bytes | None]:
        if intent_id in self.pending:
            return self.pending[intent_id]
        return self.store._mirror.get(intent_id), self.store._content.get(intent_id)

    def _add(self, kind: str, row: tuple[object, ...]) -> None:
        if (
            self.groups
            and self.groups[-1][0] == kind
            and len(self.groups[-1][1]) < ROWS_PER_STATEMENT
        ):
            self.groups[-1][1].append(row)
        else:
            self.groups.append((kind, [row]))

    def statements(self) -> list[tuple[str, list[object]]]:
        out: list[tuple[str, list[object]]] = []
        for kind, rows in self.groups:
            if kind == "insert":
                sql = INSERT_INTO + ", ".join([INSERT_ROW] * len(rows))
            elif kind == "delete":
                sql = f"DELETE FROM intents WHERE id IN ({', '.join('?' * len(rows))})"
            else:
                sql = "INSERT OR REPLACE INTO meta (key, value) VALUES " + ", ".join(
                    ["(?, ?)"] * len(rows)
                )
            out.append((sql, [value for row in rows for value in row]))
        return out

    def apply(self, op: _Op) -> object:
        if op.kind == "meta":
            name, _, value = op.intent_id.partition("=")
            self._add("meta", (name, value))
            return True
        if op.kind == "delete":
            existing, _ = self.current(op.intent_id)
            if existing is None:
                raise NotFound(f"no intent with id {op.intent_id!r}", field="id")
            self._add("delete", (op.intent_id,))
            self.count -= 1
            self.pending[op.intent_id] = (None, None)
            self.mirror.append((op.intent_id, None, None))
            return existing.intent
        assert op.intent is not None
        intent = intent_pb2.ResourceIntent()
        intent.CopyFrom(op.intent)
        key = content_key(intent)
        if intent.id:
            existing, existing_key = self.current(intent.id)
            if existing is not None:
                if existing_key == key:
                    return SubmitResult(existing.intent, already_existed=True)
                raise AlreadyExists(
                    f"an intent with id {intent.id!r} already exists with different content "
                    "(delete it first, or submit under another id)",
                    field="intent.id",
                )
        else:
            intent.id = new_intent_id()
        limit = self.store.max_intents
        if self.count >= limit:
            raise ResourceExhausted(
                f"the intent store holds its limit of {limit} intents (allocator setting "
                "max_intents); delete intents or raise the limit"
            )
        self.count += 1
        created = Timestamp()
        created.FromNanoseconds(self.store._clock())
        intent.created_at.CopyFrom(created)
        seq = self.next_seq
        self.next_seq += 1
        self._add(
            "insert",
            (
                seq,
                intent.id,
                intent.name,
                intent.workload_class,
                intent.priority,
                intent.node,
                created.ToNanoseconds(),
                key,
                intent.SerializeToString(deterministic=True),
            ),
        )
        stored = StoredIntent(seq, intent)
        self.pending[intent.id] = (stored, key)
        self.mirror.append((intent.id, stored, key))
        return SubmitResult(intent, already_existed=False)


class IntentStore:
    """Intents keyed by id, in submission order (``seq``), durable once a call returns."""

    def __init__(
        self,
        path: Path,
        *,
        synchronous: str = "normal",
        clock: Callable[[], int] | None = None,
        max_intents: int = DEFAULT_MAX_INTENTS,
    ) -> None:
        if synchronous not in SYNCHRONOUS_LEVELS:
            raise ValueError(
                f"db_synchronous must be one of {SYNCHRONOUS_LEVELS}, got {synchronous!r}"
            )
        if max_intents < 1:
            raise ValueError(f"max_intents must be at least 1, got {max_intents}")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_intents = max_intents
        self._clock = clock or _now_ns
        self._lock = threading.Lock()  # guards the mirror; held only for dict updates
        self._db_lock = threading.Lock()  # guards the connection (writer thread + meta reads)
        self._mirror: dict[str, StoredIntent] = {}
        self._content: dict[str, bytes] = {}
        self.version = 0
        self.skipped_rows = 0
        self._db = self._open(synchronous)
        try:
            self._load()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StoreUnusable(_unreadable(self.path, exc)) from exc
        # seq is given explicitly (so one statement can insert many rows) and, as AUTOINCREMENT
        # would, never reuses the number of a deleted intent, across restarts too
        (highest,) = self._db.execute("SELECT coalesce(max(seq), 0) FROM intents").fetchone()
        used = self._db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'intents'").fetchone()
        self._next_seq = max(int(highest), int(used[0]) if used else 0) + 1
        self._ops: collections.deque[_Op] = collections.deque()
        self._wake = threading.Condition(threading.Lock())  # ops queued, or closing
        self._closing = False
        self.commits = 0  # batches committed (ops / commits = mean group size)
        self.committed_ops = 0
        self._writer = threading.Thread(
            target=self._write_loop, name="intent-store-writer", daemon=True
        )
        self._writer.start()
        log.info(
            "intent store open",
            extra={
                "path": str(self.path),
                "intents": len(self._mirror),
                "synchronous": synchronous,
            },
        )

    def _open(self, synchronous: str) -> sqlite3.Connection:
        """Connect, check that the file is an intent store this process can write, and create
        the schema only in a new or empty database."""
        path = self.path
        if path.exists() and path.stat().st_size == 0:
            raise StoreUnusable(
                f"{path} is 0 bytes: not an intent store, and it is left as it is. Move it aside "
                "(a new store is then created) or restore the store from a backup"
            )
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        try:
            db.execute("PRAGMA busy_timeout=5000")
            tables = {
                name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
            if tables and "intents" not in tables:
                raise StoreUnusable(
                    f"{path} is an SQLite database but not an intent store (tables: "
                    f"{', '.join(sorted(tables))}); it is left as it is. Point db_path at another "
                    "file or move this one aside"
                )
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(f"PRAGMA synchronous={synchronous.upper()}")
            db.executescript(SCHEMA)
            # a read-only file opens fine and fails on the first write: find out now
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('write-check', '')")
            db.execute("ROLLBACK")
        except StoreUnusable:
            db.close()
            raise
        except sqlite3.OperationalError as exc:
            db.close()
            if "readonly" in str(exc) or "read-only" in str(exc):
                raise StoreUnusable(
                    f"{path} cannot be written by this process ({exc}). Make it (and its "
                    "directory) writable by the allocator's user, or point db_path elsewhere"
                ) from exc
            raise StoreUnusable(_unreadable(path, exc)) from exc
        except sqlite3.DatabaseError as exc:
            db.close()
            raise StoreUnusable(_unreadable(path, exc)) from exc
        return db

    def _load(self) -> None:
        """Fill the mirror; a row that does not parse as its intent is skipped and reported."""
        for seq, intent_id, body, content in self._db.execute(
            "SELECT seq, id, body, content FROM intents ORDER BY seq"
        ):
            try:
                intent = intent_pb2.ResourceIntent.FromString(body)
                if intent.id != intent_id:
                    raise ValueError(f"its body holds intent id {intent.id!r}")
                if not isinstance(content, bytes):
                    raise ValueError("its content key is not a blob")
            except Exception as exc:
                self.skipped_rows += 1
                STORE_SKIPPED_ROWS.inc()
                log.error(
                    "intent row skipped: unreadable",
                    extra={
                        "path": str(self.path),
                        "seq": seq,
                        "intent_id": intent_id,
                        "error": f"{type(exc).__name__}: {exc}",
                    },
                )
                continue
            self._mirror[intent.id] = StoredIntent(seq, intent)
            self._content[intent.id] = content

    # --- reads (from the mirror) -------------------------------------------------------------

    def get(self, intent_id: str) -> intent_pb2.ResourceIntent:
        with self._lock:
            stored = self._mirror.get(intent_id)
        if stored is None:
            raise NotFound(f"no intent with id {intent_id!r}", field="id")
        return stored.intent

    def list_intents(
        self, workload_class: int = intent_pb2.WORKLOAD_CLASS_UNSPECIFIED
    ) -> list[StoredIntent]:
        with self._lock:
            items = list(self._mirror.values())
        if workload_class:
            items = [s for s in items if s.intent.workload_class == workload_class]
        return sorted(items, key=lambda s: s.seq)

    def snapshot(self) -> tuple[int, list[StoredIntent]]:
        """(version, intents in submission order), consistent with each other."""
        with self._lock:
            version = self.version
            items = list(self._mirror.values())
        return version, sorted(items, key=lambda s: s.seq)

    def __len__(self) -> int:
        with self._lock:
            return len(self._mirror)

    def count_by_class(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        with self._lock:
            for stored in self._mirror.values():
                cls = stored.intent.workload_class
                counts[cls] = counts.get(cls, 0) + 1
        return counts

    def meta(self, key: str) -> str | None:
        with self._db_lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    # --- writes (through the writer thread) --------------------------------------------------

    def submit(self, intent: intent_pb2.ResourceIntent) -> SubmitResult:
        """Store a validated intent. Empty id: one is assigned. Same id + same content: no-op
        (``already_existed``). Same id + other content: AlreadyExists, nothing changed."""
        result = self._run(_Op("submit", intent, intent.id))
        assert isinstance(result, SubmitResult)
        return result

    def delete(self, intent_id: str) -> intent_pb2.ResourceIntent:
        result = self._run(_Op("delete", None, intent_id))
        assert isinstance(result, intent_pb2.ResourceIntent)
        return result

    def set_meta(self, key: str, value: str) -> None:
        self._run(_Op("meta", None, f"{key}={value}"))

    async def submit_async(self, intent: intent_pb2.ResourceIntent) -> SubmitResult:
        """``submit`` for a caller on an asyncio loop: waits without holding a thread."""
        result = await self._run_async(_Op("submit", intent, intent.id, asyncio.get_running_loop()))
        assert isinstance(result, SubmitResult)
        return result

    async def delete_async(self, intent_id: str) -> intent_pb2.ResourceIntent:
        """``delete`` for a caller on an asyncio loop."""
        result = await self._run_async(_Op("delete", None, intent_id, asyncio.get_running_loop()))
        assert isinstance(result, intent_pb2.ResourceIntent)
        return result

    def close(self) -> None:
        """Commit what is queued, stop the writer, close the database (later writes are refused)."""
        with self._wake:
            if self._closing:
                return
            self._closing = True
            self._wake.notify()
        self._writer.join()
        with self._db_lock:
            self._db.close()

    def _enqueue(self, op: _Op) -> None:
        with self._wake:
            if self._closing:
                raise FailedPrecondition("intent store is closed")
            self._ops.append(op)
            self._wake.notify()

    def _run(self, op: _Op) -> object:
        assert op.done is not None
        self._enqueue(op)
        while not op.done.acquire(timeout=WRITER_CHECK_S):
            if not self._writer.is_alive():  # only a bug ends it with ops queued
                raise FailedPrecondition("intent store writer stopped")
        if op.failed:
            raise op.outcome  # type: ignore[misc]
        return op.outcome

    async def _run_async(self, op: _Op) -> object:
        assert op.future is not None
        self._enqueue(op)
        return await op.future

    def _write_loop(self) -> None:
        """The writer thread: commit everything queued, answer its callers, repeat; on close,
        drain the queue first. An op is queued only while not closing, and the writer leaves only
        when closing with an empty queue, so no op is left unanswered."""
        while True:
            with self._wake:
                while not self._ops and not self._closing:
                    self._wake.wait()
                if not self._ops:
                    return
                batch = [self._ops.popleft() for _ in range(min(len(self._ops), MAX_BATCH))]
            try:
                self._commit(batch)
            except BaseException as exc:  # never leave a caller waiting
                log.exception("intent store writer failed", extra={"batch": len(batch)})
                for op in batch:
                    op.settle(exc, True)
            _answer(batch)

    def _commit(self, batch: list[_Op]) -> None:
        """One batch: outcomes decided in order, then its statements, then the mirror. A domain
        error answers its own caller only; a failed commit answers every caller with it and
        leaves the mirror as it was."""
        changes = _Changes(self)
        for op in batch:
            try:
                op.settle(changes.apply(op), False)
            except Exception as exc:
                op.settle(exc, True)
        statements = changes.statements()
        if statements:
            try:
                with self._db_lock:
                    self._execute(statements)
            except Exception as exc:
                log.exception("intent store commit failed", extra={"batch": len(batch)})
                failure = Unavailable(f"intent store {self.path} could not commit: {exc}")
                for op in batch:
                    op.settle(failure, True)
                return
        self._next_seq = changes.next_seq
        with self._lock:
            for intent_id, stored, content in changes.mirror:
                if stored is None:
                    self._mirror.pop(intent_id, None)
                    self._content.pop(intent_id, None)
                else:
                    self._mirror[intent_id] = stored
                    self._content[intent_id] = content or b""
            if changes.mirror:
                self.version += 1
            self.commits += 1
            self.committed_ops += len(batch)

    def _execute(self, statements: list[tuple[str, list[object]]]) -> None:
        """One statement commits on its own (autocommit); several run in one transaction."""
        if len(statements) == 1:
            sql, params = statements[0]
            self._db.execute(sql, params)
            return
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for sql, params in statements:
                self._db.execute(sql, params)
            self._db.execute("COMMIT")
        except BaseException:
            try:
                self._db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            raise


def _unreadable(path: Path, exc: Exception) -> str:
    return (
        f"{path} is not a readable intent store ({exc}); it is left as it is. Restore it from a "
        f"backup, or move it aside (a new store is then created; `sqlite3 {path} .recover` may "
        "salvage its rows)"
    )


def _answer(batch: list[_Op]) -> None:
    """Wake each caller: blocked ones by their lock, asyncio ones by one callback per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[_Op]] = {}
    for op in batch:
        if op.done is not None:
            op.done.release()
        elif op.loop is not None:
            by_loop.setdefault(op.loop, []).append(op)
    for loop, ops in by_loop.items():
        try:
            loop.call_soon_threadsafe(_resolve, ops)
        except RuntimeError:  # that loop is closed: nobody is waiting any more
            pass


def _resolve(ops: list[_Op]) -> None:
    for op in ops:
        future = op.future
        if future is None or future.done():  # the caller was cancelled meanwhile
            continue
        if op.failed:
            future.set_exception(op.outcome)  # type: ignore[arg-type]
        else:
            future.set_result(op.outcome)


def _now_ns() -> int:
    return time.time_ns()
