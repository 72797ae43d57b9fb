"""The durable intent store: SQLite in WAL mode under run/, group-committed, mirrored in memory.

Changes (submit, delete) are committed in groups: all the changes queued so far together, each
run of one kind as one statement over its rows (executemany: three statement texts in all, so
SQLite's cache of prepared statements stays small), a lone change on its own and more in one
transaction, one group at a time. Blocking callers (``submit``, ``delete``)
queue for a writer thread; asyncio callers (``submit_async``, ``delete_async``, which the gRPC
servicer awaits) are committed on their own event loop, every change queued during one pass of
the loop in one group, with no hand-over to another thread and back (each such hand-over waits
for a core and the interpreter lock: 4-8 ms at the p99 beside a 10,000-intent tick,
docs/performance.md). A caller is answered only after the commit returned, so an acknowledged
SubmitIntent is in the database. With ``journal_mode=WAL`` and
``synchronous=NORMAL`` (the default here) the committed frames are written to the WAL file with
write(2) before the commit returns: a process crash (``kill -9``) cannot lose them; only an OS
crash or power cut can lose the last transactions. ``synchronous=FULL`` (config
``db_synchronous: full``) adds an fsync per commit for power-loss durability. The commits only
append to the WAL: a thread of the store's own, on a connection of its own, checkpoints it into
the database file every second, so no commit (most run on the server's event loop) copies and
syncs the WAL as SQLite's automatic checkpoint made one commit in 1,000 pages do.

The store never lies about itself: a file that exists but is not an intent store (0 bytes, not
SQLite, another program's tables, corrupt pages) or that this process cannot write makes
:class:`StoreUnusable` at open, naming the file and what to do; nothing is created or replaced.
A single row that cannot be read is skipped with an ERROR log naming it and
``parfusion_store_skipped_rows_total``; the rest of the store starts. ``max_intents`` bounds
the store: a submit beyond it is RESOURCE_EXHAUSTED naming the limit.

Reads are served from an in-memory mirror updated after each commit, so GetIntent/ListIntents
and the control loop never wait on a commit. ``version`` grows with every change, and
``changes_since`` names the intents a recent version range changed, so the loop updates its
intent list by what changed instead of reading every intent again.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from parfusion.v1 import intent_pb2
from services.allocator.metrics import (
    STORE_CHECKPOINT_SECONDS,
    STORE_COMMIT_SECONDS,
    STORE_GROUP_CHANGES,
    STORE_SKIPPED_ROWS,
)
from services.allocator.store_batch import (
    Changes,
    Op,
    StoredIntent,
    SubmitResult,
    answer,
    execute,
    resolve,
)
from services.allocator.store_file import (
    SYNCHRONOUS_LEVELS,
    StoreUnusable,
    next_seq,
    open_store_db,
    unreadable,
)
from services.common.errors import FailedPrecondition, NotFound, Unavailable
from services.common.malloc import FlushPoint
from services.common.memory import ShrinkWatch

log = logging.getLogger(__name__)

MAX_BATCH = 256  # changes committed together at most
WRITER_CHECK_S = 1.0  # a blocked caller checks this often that the writer thread is alive
DEFAULT_MAX_INTENTS = 10_000  # allocator setting max_intents
CHECKPOINT_S = 1.0  # between the checkpointer's WAL checkpoints
WAL_RESTART_FRAMES = 4096  # 16 MB of WAL (4 KiB pages): the checkpoint waits for the commits
WAL_KEPT_BYTES = 16 * 2**20  # journal_size_limit: what a WAL file grown in a burst is cut to
JOURNAL_VERSIONS = 1024  # versions whose changed ids changes_since can name
# ...naming at most as many ids as the store holds, or this many: a reader further behind takes
# a snapshot, which costs no more than those changes, and the ids of intents long deleted go
JOURNAL_IDS_FLOOR = 256


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
        self._shrink = ShrinkWatch()  # the mirror's tables are rebuilt after a large shrink
        self.version = 0
        # (version, ids it changed) for the last JOURNAL_VERSIONS versions: changes_since
        self._journal: collections.deque[tuple[int, tuple[str, ...]]] = collections.deque()
        self._journal_ids = 0  # ids it names, in all
        self.skipped_rows = 0
        self._db = open_store_db(self.path, synchronous)
        try:
            self._load()
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StoreUnusable(unreadable(self.path, exc)) from exc
        self._next_seq = next_seq(self._db)
        self._ops: collections.deque[Op] = collections.deque()
        self._wake = threading.Condition(threading.Lock())  # ops queued, or closing
        self._closing = False
        # per event loop: its callers' changes waiting for the loop's next pass (under _wake)
        self._loop_ops: dict[asyncio.AbstractEventLoop, list[Op]] = {}
        self._commit_lock = threading.Lock()  # one group commits at a time; none once closed
        self._closed = False
        self.commits = 0  # batches committed (ops / commits = mean group size)
        self.committed_ops = 0
        self._writer = threading.Thread(
            target=self._write_loop, name="intent-store-writer", daemon=True
        )
        self._writer.start()
        # WAL checkpoints on a connection and a thread of their own: the commits (most of
        # them on the server's event loop) only append to the WAL (SQLite's automatic
        # checkpoint, on the committing connection every 1,000 pages, held a commit 5-24 ms)
        self._db.execute("PRAGMA wal_autocheckpoint=0")
        # a WAL file that grew in a burst goes back to this size when the WAL starts over
        self._db.execute(f"PRAGMA journal_size_limit={WAL_KEPT_BYTES}")
        self.checkpoints = 0
        self._checkpoint_stop = threading.Event()
        self._checkpointer = threading.Thread(
            target=self._checkpoint_loop,
            args=(sqlite3.connect(self.path, check_same_thread=False, isolation_level=None),),
            name="intent-store-checkpoint",
            daemon=True,
        )
        self._checkpointer.start()
        log.info(
            "intent store open",
            extra={
                "path": str(self.path),
                "intents": len(self._mirror),
                "synchronous": synchronous,
            },
        )

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

    def changes_since(self, version: int) -> tuple[int, dict[str, StoredIntent | None]] | None:
        """(version now, per intent id changed since `version`: its StoredIntent now, None when
        it left), consistent with each other; None when `version` is not one of the last
        JOURNAL_VERSIONS versions (take a whole ``snapshot`` then). An intent changed since is
        always a StoredIntent made after every other one, with a higher seq."""
        with self._lock:
            now = self.version
            if version == now:
                return now, {}
            journal = self._journal
            if version > now or not journal or journal[0][0] > version + 1:
                return None
            ids: set[str] = set()
            for at, changed in reversed(journal):
                if at <= version:
                    break
                ids.update(changed)
            mirror = self._mirror
            return now, {intent_id: mirror.get(intent_id) for intent_id in ids}

    def _journal_append(self, ids: tuple[str, ...]) -> None:
        """This version's ids into the journal, the oldest versions out past its bounds (the
        caller holds the lock)."""
        journal = self._journal
        journal.append((self.version, ids))
        self._journal_ids += len(ids)
        most = max(len(self._mirror), JOURNAL_IDS_FLOOR)
        while journal and (len(journal) > JOURNAL_VERSIONS or self._journal_ids > most):
            self._journal_ids -= len(journal.popleft()[1])

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

    def release_memory(self) -> None:
        """Hand back SQLite's page cache (up to 2 MB: the default cache_size), after a large
        shrink; it fills again from the file as rows are read."""
        with self._db_lock:
            self._db.execute("PRAGMA shrink_memory")

    # --- writes (through the writer thread) --------------------------------------------------

    def submit(self, intent: intent_pb2.ResourceIntent) -> SubmitResult:
        """Store a validated intent. Empty id: one is assigned. Same id + same content: no-op
        (``already_existed``). Same id + other content: AlreadyExists, nothing changed."""
        result = self._run(Op("submit", intent, intent.id))
        assert isinstance(result, SubmitResult)
        return result

    def delete(self, intent_id: str) -> intent_pb2.ResourceIntent:
        result = self._run(Op("delete", None, intent_id))
        assert isinstance(result, intent_pb2.ResourceIntent)
        return result

    def set_meta(self, key: str, value: str) -> None:
        self._run(Op("meta", None, f"{key}={value}"))

    async def submit_async(self, intent: intent_pb2.ResourceIntent) -> SubmitResult:
        """``submit`` for a caller on an asyncio loop: waits without holding a thread."""
        result = await self._run_async(Op("submit", intent, intent.id, asyncio.get_running_loop()))
        assert isinstance(result, SubmitResult)
        return result

    async def delete_async(self, intent_id: str) -> intent_pb2.ResourceIntent:
        """``delete`` for a caller on an asyncio loop."""
        result = await self._run_async(Op("delete", None, intent_id, asyncio.get_running_loop()))
        assert isinstance(result, intent_pb2.ResourceIntent)
        return result

    def close(self) -> None:
        """Commit what is queued, stop the writer, close the database (later writes are refused)."""
        with self._wake:
            if self._closing:
                return
            self._closing = True
            # what a loop queued for a pass it has not had since: the writer drains it too
            for ops in self._loop_ops.values():
                self._ops.extend(ops)
            self._loop_ops = {}
            self._wake.notify()
        self._writer.join()
        self._checkpoint_stop.set()
        self._checkpointer.join()
        with self._commit_lock:
            self._closed = True
            with self._db_lock:
                self._db.close()

    def _enqueue(self, op: Op) -> None:
        with self._wake:
            if self._closing:
                raise FailedPrecondition("intent store is closed")
            self._ops.append(op)
            self._wake.notify()

    def _run(self, op: Op) -> object:
        assert op.done is not None
        self._enqueue(op)
        while not op.done.acquire(timeout=WRITER_CHECK_S):
            if not self._writer.is_alive():  # only a bug ends it with ops queued
                raise FailedPrecondition("intent store writer stopped")
        if op.failed:
            raise op.outcome  # type: ignore[misc]
        return op.outcome

    async def _run_async(self, op: Op) -> object:
        assert op.future is not None and op.loop is not None
        loop = op.loop
        with self._wake:
            if self._closing:
                raise FailedPrecondition("intent store is closed")
            waiting = self._loop_ops.get(loop)
            if waiting is None:  # the first this pass: the group commits at the loop's next
                waiting = self._loop_ops[loop] = []
                loop.call_soon(self._commit_on_loop, loop)
            waiting.append(op)
        return await op.future

    def _commit_on_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """`loop`'s callers' changes queued so far, committed and answered on that loop, at
        most MAX_BATCH a pass: the rest (and what comes meanwhile) waits for the next pass, so a
        burst of thousands does not hold the loop from its other calls for all its commits."""
        with self._wake:
            ops = self._loop_ops.pop(loop, [])
            if len(ops) > MAX_BATCH:
                self._loop_ops[loop] = ops[MAX_BATCH:]
                loop.call_soon(self._commit_on_loop, loop)
                ops = ops[:MAX_BATCH]
        self._commit_group(ops)
        resolve(ops)

    def _commit_group(self, batch: list[Op]) -> None:
        """``_commit`` one group, one at a time whoever calls; every op is settled after."""
        with self._commit_lock:
            if self._closed:
                for op in batch:
                    op.settle(FailedPrecondition("intent store is closed"), True)
                return
            started = time.perf_counter()
            try:
                self._commit(batch)
            except BaseException as exc:  # never leave a caller waiting
                log.exception("intent store commit failed", extra={"batch": len(batch)})
                for op in batch:
                    op.settle(exc, True)
            STORE_COMMIT_SECONDS.observe(time.perf_counter() - started)
            STORE_GROUP_CHANGES.observe(len(batch))

    def _checkpoint_loop(self, db: sqlite3.Connection) -> None:
        """Copy the WAL's committed frames into the database file every CHECKPOINT_S (PASSIVE:
        commits go on meanwhile; the next commit after a whole checkpoint starts the WAL over,
        so it stays the size of about a second of commits). Commits that land during every
        checkpoint keep any from being whole: past WAL_RESTART_FRAMES the checkpoint waits
        for them (RESTART) once, so that the WAL starts over."""
        try:
            db.execute("PRAGMA busy_timeout=5000")
            while not self._checkpoint_stop.wait(CHECKPOINT_S):
                started = time.perf_counter()
                try:
                    _, frames, _ = db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    if frames >= WAL_RESTART_FRAMES:
                        db.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
                except sqlite3.Error:
                    log.exception("intent store checkpoint failed")
                    continue
                STORE_CHECKPOINT_SECONDS.observe(time.perf_counter() - started)
                self.checkpoints += 1
        finally:
            db.close()

    def _write_loop(self) -> None:
        """The writer thread: commit everything queued, answer its callers, repeat; on close,
        drain the queue first. An op is queued only while not closing, and the writer leaves only
        when closing with an empty queue, so no op is left unanswered."""
        flush = FlushPoint()  # this thread's malloc cache, emptied after a large shrink
        while True:
            with self._wake:
                while not self._ops and not self._closing:
                    self._wake.wait(1.0)  # idle: wakes to flush its cache when asked
                    flush()
                if not self._ops:
                    return
                batch = [self._ops.popleft() for _ in range(min(len(self._ops), MAX_BATCH))]
            self._commit_group(batch)
            answer(batch)

    def _commit(self, batch: list[Op]) -> None:
        """One batch: outcomes decided in order, then its statements, then the mirror. A domain
        error answers its own caller only; a failed commit answers every caller with it and
        leaves the mirror as it was."""
        changes = Changes(
            self._mirror, self._content, self._next_seq, self.max_intents, self._clock
        )
        for op in batch:
            try:
                op.settle(changes.apply(op), False)
            except Exception as exc:
                op.settle(exc, True)
        statements = changes.statements()
        if statements:
            try:
                with self._db_lock:
                    execute(self._db, statements)
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
            if self._shrink.shrunk(len(self._mirror)):  # see services/common/memory.py
                self._mirror, self._content = dict(self._mirror), dict(self._content)
            if changes.mirror:
                self.version += 1
                self._journal_append(tuple(i for i, _, _ in changes.mirror))
            self.commits += 1
            self.committed_ops += len(batch)


def _now_ns() -> int:
    return time.time_ns()
