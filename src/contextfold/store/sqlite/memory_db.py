"""The connections of one SQLite memory store, shared by ``MemoryStore`` and its facets
(``SqliteRecords``, ``SqliteVocab``, ``SqliteJobs``, ``SqliteCosts``, ``SqlitePaging``,
``SqliteTransfer``): each of them is made with the one ``MemoryDb`` of its store and reads
and writes through it, so a write of any of them joins the transaction ``store.batch()``
holds.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from contextfold.items import Message
from contextfold.store.models import _iso, _message_json, _now, message_key
from contextfold.store.sqlite.connection import FairLock, connect, transaction
from contextfold.tokens import TokenCounter

__all__ = ["MemoryDb", "insert_turns", "last_seq", "turn_rows"]


class MemoryDb:
    """This process's connections to the memory store at ``path`` (a file or ``":memory:"``).

    A file store gives each thread its own connection: WAL lets readers run beside the one
    writer, and a transaction never takes in another thread's writes. An in-memory database
    exists only on its one connection, so threads share it (``shared``) and take turns at its
    transactions (``tx``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.shared = path == ":memory:"
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._guard = threading.RLock()
        self._writer = FairLock()  # this process's writers, one at a time, in order (``tx``)
        first = connect(path)
        self._local.conn = first
        self._connections.append(first)

    @property
    def conn(self) -> sqlite3.Connection:
        """This thread's connection."""
        if self.shared:
            return self._connections[0]
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self.path)
            self._local.conn = conn
            with self._guard:
                self._connections.append(conn)
        return conn

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction on this thread's connection (joining one already open).

        The writers of this process queue on a lock before SQLite's: SQLite has one writer at
        a time and its busy handler polls, so under many concurrent writers a waiting one can
        lose every race until its timeout ("database is locked", measured at 50 concurrent
        proxy sessions); blocked on the lock, writers take their turns, first come first
        served (``FairLock``), so a long write done in chunks lets the others in between.
        Writers of other processes still meet at SQLite's lock, with its busy timeout."""
        with self._writer, transaction(self.conn) as conn:
            yield conn

    def close(self) -> None:
        """Close every connection, once no write of another thread is in flight: a connection
        closed while a thread is inside SQLite on it is freed under that thread (CI saw a
        segfault: a dashboard record flush beside a test closing its in-memory store)."""
        with self._writer, self._guard:
            for conn in self._connections:
                conn.close()
            self._connections.clear()
            self._local = threading.local()


def last_seq(conn: sqlite3.Connection, session_id: str) -> int:
    """The seq of the session's last turn (0 when it has none), read on ``conn``."""
    row = conn.execute(
        "SELECT COALESCE(MAX(seq), 0) FROM turns WHERE session_id = ?", (session_id,)
    ).fetchone()
    return int(row[0])


def turn_rows(
    counter: TokenCounter,
    messages: Sequence[Message],
    timestamps: Sequence[datetime] | None = None,
    partial: Sequence[bool] | None = None,
) -> list[tuple[Any, ...]]:
    """The column values of new turns, computed before a write transaction opens (token
    counts and hashes take time the write lock should not be held for)."""
    now = _now()
    rows = []
    for i, message in enumerate(messages):
        body = _message_json(message)
        text = message.text()
        rows.append(
            (
                message.role,
                text,
                body,
                hashlib.sha256(body.encode("utf-8")).hexdigest(),
                _iso(timestamps[i] if timestamps is not None else now),
                counter.count(text),
                message_key(message),
                int(bool(partial[i])) if partial is not None else 0,
            )
        )
    return rows


def insert_turns(
    conn: sqlite3.Connection, session_id: str, rows: Sequence[tuple[Any, ...]]
) -> list[int]:
    """Insert ``turn_rows`` after the session's last turn, on ``conn`` (in its transaction);
    their seqs."""
    first = last_seq(conn, session_id) + 1
    seqs = list(range(first, first + len(rows)))
    conn.executemany(
        "INSERT INTO turns (session_id, seq, role, content_text, message_json,"
        " content_hash, created_at, token_count, match_key, partial)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [(session_id, seq, *row) for seq, row in zip(seqs, rows, strict=True)],
    )
    return seqs
