"""What the intent store's writer thread does with one batch of queued changes.

Each change is decided in order against the mirror and the batch's own earlier changes (the
caller's outcome, the mirror update), then consecutive changes of one kind become one SQL
statement run over their rows (executemany). After the commit each caller is woken: blocked
ones by their lock, asyncio ones by one callback per loop.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from google.protobuf.timestamp_pb2 import Timestamp

from parfusion.v1 import intent_pb2
from services.common.errors import AlreadyExists, NotFound, ResourceExhausted

# One statement text per kind of change, whatever the number of rows (executemany runs it once
# per row): the connection caches each prepared statement it has seen, and a text per row count
# (a multi-row VALUES list) left up to 100 of them per kind after a burst, 4.4 MB for inserts.
SQL = {
    "insert": "INSERT INTO intents"
    " (seq, id, name, workload_class, priority, node, created_at_ns, content, body)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
    "delete": "DELETE FROM intents WHERE id = ?",
    "meta": "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
}


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


class Op:
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


class Changes:
    """What one batch does, decided in order against the mirror and the batch's own earlier
    changes: each caller's outcome, the mirror updates, and the SQL, consecutive changes of one
    kind one statement over their rows."""

    def __init__(
        self,
        mirror: dict[str, StoredIntent],
        content: dict[str, bytes],
        next_seq: int,
        max_intents: int,
        clock: Callable[[], int],
    ) -> None:
        # the store's mirror as it stands: only the writer thread changes it, after the commit
        self.stored = mirror
        self.content = content
        self.max_intents = max_intents
        self.clock = clock
        self.next_seq = next_seq
        self.count = len(mirror)
        self.pending: dict[str, tuple[StoredIntent | None, bytes | None]] = {}
        self.mirror: list[tuple[str, StoredIntent | None, bytes | None]] = []
        self.groups: list[tuple[str, list[tuple[object, ...]]]] = []

    def current(self, intent_id: str) -> tuple[StoredIntent | None, bytes | None]:
        if intent_id in self.pending:
            return self.pending[intent_id]
        return self.stored.get(intent_id), self.content.get(intent_id)

    def _add(self, kind: str, row: tuple[object, ...]) -> None:
        if self.groups and self.groups[-1][0] == kind:
            self.groups[-1][1].append(row)
        else:
            self.groups.append((kind, [row]))

    def statements(self) -> list[tuple[str, list[tuple[object, ...]]]]:
        """Each run of changes of one kind, in order, as its statement and rows."""
        return [(SQL[kind], rows) for kind, rows in self.groups]

    def apply(self, op: Op) -> object:
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
        limit = self.max_intents
        if self.count >= limit:
            raise ResourceExhausted(
                f"the intent store holds its limit of {limit} intents (allocator setting "
                "max_intents); delete intents or raise the limit"
            )
        self.count += 1
        created = Timestamp()
        created.FromNanoseconds(self.clock())
        intent.created_at.CopyFrom(created)
        seq = self.next_seq
        self.next_seq += 1
        body = intent.SerializeToString(deterministic=True)
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
                body,
            ),
        )
        # the message kept is parsed from its row's body: its arena holds just the intent (the
        # copy edited above grew its arena, to about 1.6 KB for a 90-byte intent, 1.1 parsed)
        intent = intent_pb2.ResourceIntent.FromString(body)
        stored = StoredIntent(seq, intent)
        self.pending[intent.id] = (stored, key)
        self.mirror.append((intent.id, stored, key))
        return SubmitResult(intent, already_existed=False)


def execute(db: sqlite3.Connection, statements: list[tuple[str, list[tuple[object, ...]]]]) -> None:
    """One row commits on its own (autocommit); more run in one transaction."""
    if len(statements) == 1 and len(statements[0][1]) == 1:
        sql, rows = statements[0]
        db.execute(sql, rows[0])
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        for sql, rows in statements:
            db.executemany(sql, rows)
        db.execute("COMMIT")
    except BaseException:
        try:
            db.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        raise


def answer(batch: list[Op]) -> None:
    """Wake each caller: blocked ones by their lock, asyncio ones by one callback per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Op]] = {}
    for op in batch:
        if op.done is not None:
            op.done.release()
        elif op.loop is not None:
            by_loop.setdefault(op.loop, []).append(op)
    for loop, ops in by_loop.items():
        try:
            loop.call_soon_threadsafe(resolve, ops)
        except RuntimeError:  # that loop is closed: nobody is waiting any more
            pass


def resolve(ops: list[Op]) -> None:
    """Answer asyncio callers, on their loop."""
    for op in ops:
        future = op.future
        if future is None or future.done():  # the caller was cancelled meanwhile
            continue
        if op.failed:
            future.set_exception(op.outcome)  # type: ignore[arg-type]
        else:
            future.set_result(op.outcome)
