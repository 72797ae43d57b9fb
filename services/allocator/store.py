"""The durable intent store: SQLite in WAL mode under run/, group-committed, mirrored in memory.

Every change (submit, delete) is queued; the caller that finds no commit in progress leads and
commits every queued change in one transaction, the others are answered by that commit. A
caller is answered only after COMMIT returned, so an acknowledged SubmitIntent is in the
database. With ``journal_mode=WAL`` and ``synchronous=NORMAL`` (the default here) the committed
frames are written to the WAL file with write(2) before COMMIT returns: a process crash
(``kill -9``) cannot lose them; only an OS crash or power cut can lose the last transactions.
``synchronous=FULL`` (config ``db_synchronous: full``) adds an fsync per group commit for
power-loss durability.

Reads are served from an in-memory mirror updated after each commit, so GetIntent/ListIntents
and the control loop never wait on a commit. ``version`` grows with every change; the loop
uses it to invalidate its cached intent list.
"""

from __future__ import annotations

import collections
import logging
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.timestamp_pb2 import Timestamp

from parfusion.v1 import intent_pb2
from services.common.errors import AlreadyExists, FailedPrecondition, NotFound

log = logging.getLogger(__name__)

SYNCHRONOUS_LEVELS = ("normal", "full")
MAX_BATCH = 256
STRAND_GUARD_S = 0.5

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
    __slots__ = ("kind", "intent", "intent_id", "future")

    def __init__(self, kind: str, intent: intent_pb2.ResourceIntent | None, intent_id: str) -> None:
        self.kind = kind
        self.intent = intent
        self.intent_id = intent_id
        self.future: Future[object] = Future()


class IntentStore:
    """Intents keyed by id, in submission order (``seq``), durable once a call returns."""

    def __init__(
        self, path: Path, *, synchronous: str = "normal", clock: Callable[[], int] | None = None
    ) -> None:
        if synchronous not in SYNCHRONOUS_LEVELS:
            raise ValueError(
                f"db_synchronous must be one of {SYNCHRONOUS_LEVELS}, got {synchronous!r}"
            )
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._clock = clock or _now_ns
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={synchronous.upper()}")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()  # guards the mirror; held only for dict updates
        self._db_lock = threading.Lock()  # guards the connection (writer thread + meta reads)
        self._mirror: dict[str, StoredIntent] = {}
        self._content: dict[str, bytes] = {}
        self.version = 0
        for seq, body, content in self._db.execute(
            "SELECT seq, body, content FROM intents ORDER BY seq"
        ):
            intent = intent_pb2.ResourceIntent.FromString(body)
            self._mirror[intent.id] = StoredIntent(seq, intent)
            self._content[intent.id] = content
        self._ops: collections.deque[_Op] = collections.deque()
        self._leader = threading.Lock()  # held by the caller committing the current group
        self._closed = False
        self.commits = 0  # transactions committed (ops / commits = mean group size)
        self.committed_ops = 0
        log.info(
            "intent store open",
            extra={
                "path": str(self.path),
                "intents": len(self._mirror),
                "synchronous": synchronous,
            },
        )

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

    # --- writes (through the group-committing writer) ----------------------------------------

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

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with self._leader:  # let the group in flight finish
            self._drain()
        with self._db_lock:
            self._db.close()

    def _run(self, op: _Op) -> object:
        """Group commit without a writer thread: the caller that finds no commit running leads,
        committing every op queued so far in one transaction; callers that arrive meanwhile
        queue up and wait, and are committed by the leader's next round.

        No op is stranded: a caller queues *before* trying to lead, and a leader looks at the
        queue again *after* releasing, so an op queued while a leader held the lock is either
        in that leader's drain, seen by its re-check, or led by its own caller."""
        if self._closed:
            raise FailedPrecondition("intent store is closed")
        self._ops.append(op)
        while not op.future.done():
            if self._lead():
                continue
            try:
                op.future.result(timeout=STRAND_GUARD_S)
            except FutureTimeout:
                pass  # belt and braces: re-check and lead if nobody did
            except Exception:
                break
        return op.future.result()

    def _lead(self) -> bool:
        """Commit queued ops while there are any and nobody else is committing them."""
        led = False
        while self._ops and self._leader.acquire(blocking=False):
            led = True
            try:
                self._drain()
            finally:
                self._leader.release()
        return led

    def _drain(self) -> None:
        while self._ops:
            batch: list[_Op] = []
            while self._ops and len(batch) < MAX_BATCH:
                batch.append(self._ops.popleft())
            self._commit(batch)

    def _commit(self, batch: list[_Op]) -> None:
        """One transaction for the whole batch; futures resolve only after COMMIT."""
        outcomes: list[tuple[_Op, object]] = []
        mirror_changes: list[tuple[str, StoredIntent | None, bytes | None]] = []
        pending: dict[str, tuple[StoredIntent | None, bytes | None]] = {}

        def current(intent_id: str) -> tuple[StoredIntent | None, bytes | None]:
            if intent_id in pending:
                return pending[intent_id]
            return self._mirror.get(intent_id), self._content.get(intent_id)

        try:
            with self._db_lock:
                self._db.execute("BEGIN IMMEDIATE")
                for op in batch:
                    try:
                        outcome = self._apply(op, current, pending, mirror_changes)
                    except Exception as exc:  # domain errors answer this caller only
                        outcome = exc
                    outcomes.append((op, outcome))
                self._db.execute("COMMIT")
            with self._lock:
                for intent_id, stored, content in mirror_changes:
                    if stored is None:
                        self._mirror.pop(intent_id, None)
                        self._content.pop(intent_id, None)
                    else:
                        self._mirror[intent_id] = stored
                        self._content[intent_id] = content or b""
                if mirror_changes:
                    self.version += 1
                self.commits += 1
                self.committed_ops += len(batch)
        except Exception as exc:
            log.exception("intent store commit failed", extra={"batch": len(batch)})
            try:
                with self._db_lock:
                    self._db.execute("ROLLBACK")
            except sqlite3.Error:
                pass
            for op in batch:
                if not op.future.done():
                    op.future.set_exception(exc)
            return
        for op, outcome in outcomes:
            if isinstance(outcome, BaseException):
                op.future.set_exception(outcome)
            else:
                op.future.set_result(outcome)

    def _apply(
        self,
        op: _Op,
        current: Callable[[str], tuple[StoredIntent | None, bytes | None]],
        pending: dict[str, tuple[StoredIntent | None, bytes | None]],
        changes: list[tuple[str, StoredIntent | None, bytes | None]],
    ) -> object:
        if op.kind == "meta":
            name, _, value = op.intent_id.partition("=")
            self._db.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (name, value)
            )
            return True
        if op.kind == "delete":
            existing, _ = current(op.intent_id)
            if existing is None:
                raise NotFound(f"no intent with id {op.intent_id!r}", field="id")
            self._db.execute("DELETE FROM intents WHERE id = ?", (op.intent_id,))
            pending[op.intent_id] = (None, None)
            changes.append((op.intent_id, None, None))
            return existing.intent
        assert op.intent is not None
        intent = intent_pb2.ResourceIntent()
        intent.CopyFrom(op.intent)
        key = content_key(intent)
        if intent.id:
            existing, existing_key = current(intent.id)
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
        created = Timestamp()
        created.FromNanoseconds(self._clock())
        intent.created_at.CopyFrom(created)
        cursor = self._db.execute(
            "INSERT INTO intents (id, name, workload_class, priority, node, created_at_ns, content, body)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
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
        stored = StoredIntent(int(cursor.lastrowid or 0), intent)
        pending[intent.id] = (stored, key)
        changes.append((intent.id, stored, key))
        return SubmitResult(intent, already_existed=False)


def _now_ns() -> int:
    return time.time_ns()
