"""Opening and checking the intent store's SQLite file.

A file that exists but is not an intent store (0 bytes, not SQLite, another program's tables,
corrupt pages) or that this process cannot write makes :class:`StoreUnusable`, naming the file
and what to do; nothing is created or replaced. A new or empty database gets the schema.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

SYNCHRONOUS_LEVELS = ("normal", "full")

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


class StoreUnusable(RuntimeError):
    """The database file cannot serve as the intent store; the message names it and the fix."""


def open_store_db(path: Path, synchronous: str) -> sqlite3.Connection:
    """Connect, check that the file is an intent store this process can write, and create
    the schema only in a new or empty database."""
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
        raise StoreUnusable(unreadable(path, exc)) from exc
    except sqlite3.DatabaseError as exc:
        db.close()
        raise StoreUnusable(unreadable(path, exc)) from exc
    return db


def next_seq(db: sqlite3.Connection) -> int:
    """The seq for the next intent: seq is given explicitly (so one statement can insert many
    rows) and, as AUTOINCREMENT would, never reuses the number of a deleted intent, across
    restarts too."""
    (highest,) = db.execute("SELECT coalesce(max(seq), 0) FROM intents").fetchone()
    used = db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'intents'").fetchone()
    return max(int(highest), int(used[0]) if used else 0) + 1


def unreadable(path: Path, exc: Exception) -> str:
    return (
        f"{path} is not a readable intent store ({exc}); it is left as it is. Restore it from a "
        f"backup, or move it aside (a new store is then created; `sqlite3 {path} .recover` may "
        "salvage its rows)"
    )
