"""The connections of one SQLite memory store, shared by ``MemoryStore`` and its facets
(``SqliteRecords``, ``SqliteVocab``, ``SqliteJobs``, ``SqliteCosts``, ``SqlitePaging``,
``SqliteTransfer``): each of them is made with the one ``MemoryDb`` of its store and reads
and writes through it, so a write of any of them joins the transaction ``store.batch()``
holds.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from contextfold.errors import StoreError
from contextfold.items import Message
from contextfold.store.models import _iso, _message_json, _now, message_key
from contextfold.store.sqlite.connection import FairLock, connect, transaction
from contextfold.tokens import TokenCounter

__all__ = ["MemoryDb", "insert_turns", "last_seq", "turn_rows"]


CLOSED = "the memory store is closed; open a new store (or engine) to use it again"


class _StoreCursor(sqlite3.Cursor):
    """A cursor of a ``_StoreConnection``: its statements after the store's ``close()``
    raise ``StoreError``, not sqlite3's ``ProgrammingError``."""

    def execute(self, sql: str, parameters: Any = (), /) -> _StoreCursor:
        try:
            return super().execute(sql, parameters)
        except sqlite3.ProgrammingError as exc:
            _raise_if_closed(self.connection, exc)
            raise

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> _StoreCursor:
        try:
            return super().executemany(sql, seq_of_parameters)
        except sqlite3.ProgrammingError as exc:
            _raise_if_closed(self.connection, exc)
            raise


class _StoreConnection(sqlite3.Connection):
    """A connection of a ``MemoryDb``. A thread can hold its connection when another thread
    closes the store (it took it just before): its next statement raises ``StoreError``
    ("the memory store is closed"), not sqlite3's ``ProgrammingError``."""

    closed_by_store = False

    def cursor(self, factory: Any = _StoreCursor) -> Any:
        try:
            return super().cursor(factory)
        except sqlite3.ProgrammingError as exc:
            _raise_if_closed(self, exc)
            raise

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        try:
            return super().execute(sql, parameters)
        except sqlite3.ProgrammingError as exc:
            _raise_if_closed(self, exc)
            raise

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        try:
            return super().executemany(sql, parameters)
        except sqlite3.ProgrammingError as exc:
            _raise_if_closed(self, exc)
            raise

    def executescript(self, sql_script: str, /) -> sqlite3.Cursor:
        try:
            return super().executescript(sql_script)
        except sqlite3.ProgrammingError as exc:
            _raise_if_closed(self, exc)
            raise


def _raise_if_closed(conn: sqlite3.Connection, exc: BaseException) -> None:
    if getattr(conn, "closed_by_store", False):
        raise StoreError(CLOSED) from exc


class _ThreadConnection:
    """One thread's connection, held in the thread's ``threading.local`` data: CPython drops
    that data when the thread ends, and this holder's finaliser then closes the connection
    and takes it off its store's list (a thread per request must not leave a connection per
    request open). No other thread uses it, so nothing is inside SQLite on it then."""

    __slots__ = ("conn", "key", "registry")

    def __init__(
        self, conn: sqlite3.Connection, key: int, registry: dict[int, sqlite3.Connection]
    ) -> None:
        self.conn = conn
        self.key = key
        self.registry = registry

    def __del__(self) -> None:
        # ``dict.pop`` is atomic: the connection is closed once, here or by ``close()``.
        conn = self.registry.pop(self.key, None)
        if conn is not None:
            with contextlib.suppress(Exception):  # a finaliser must not raise (at shutdown)
                conn.close()


class MemoryDb:
    """This process's connections to the memory store at ``path`` (a file or ``":memory:"``).

    A file store gives each thread its own connection: WAL lets readers run beside the one
    writer, and a transaction never takes in another thread's writes; a thread's connection
    is closed when the thread ends. An in-memory database exists only on its one connection,
    so threads share it (``shared``) and take turns at its transactions (``tx``).

    After ``close()`` every use raises ``StoreError``; nothing reopens the store."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.shared = path == ":memory:"
        self.closed = False
        self._local = threading.local()
        # The open connections by key: a thread's leaves when the thread ends.
        self._connections: dict[int, sqlite3.Connection] = {}
        self._keys = itertools.count()
        self._guard = threading.RLock()
        self._writer = FairLock()  # this process's writers, one at a time, in order (``tx``)
        first = self._open()
        self._shared: sqlite3.Connection | None = first if self.shared else None

    def _open(self) -> sqlite3.Connection:
        """A new connection, this thread's from now on (the shared one for ``:memory:``)."""
        with self._guard:
            if self.closed:
                raise StoreError(CLOSED)
            conn = connect(self.path, factory=_StoreConnection)
            key = next(self._keys)
            self._connections[key] = conn
            if not self.shared:
                self._local.holder = _ThreadConnection(conn, key, self._connections)
            return conn

    @property
    def conn(self) -> sqlite3.Connection:
        """This thread's connection."""
        if self.closed:
            raise StoreError(CLOSED)
        if self._shared is not None:
            return self._shared
        holder: _ThreadConnection | None = getattr(self._local, "holder", None)
        if holder is None:
            return self._open()
        return holder.conn

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
        segfault: a dashboard record flush beside a test closing its in-memory store). Then
        every use raises ``StoreError``; closing again does nothing."""
        with self._writer, self._guard:
            self.closed = True
            for key in list(self._connections):
                conn = self._connections.pop(key, None)
                if conn is not None:
                    conn.closed_by_store = True  # type: ignore[attr-defined]
                    conn.close()
            self._shared = None
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
