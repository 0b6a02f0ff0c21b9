"""SQLite plumbing every store shares: connections (WAL, foreign keys) and migrations.

A schema is an ordered registry of named migration functions. ``migrate`` applies the ones a
database has not seen yet, each in its own transaction, and records them in a
``schema_migrations`` table — so a database created by any earlier version upgrades in place,
and a crash mid-migration leaves the previous schema intact.

>>> registry = MigrationRegistry("demo")
>>> @registry.migration
... def m001_create_notes(conn: sqlite3.Connection) -> None:
...     conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")
>>> conn = connect(":memory:")
>>> registry.apply(conn)
['m001_create_notes']
>>> registry.apply(conn)
[]
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from contextfold.errors import StoreError

__all__ = [
    "FairLock",
    "Migration",
    "MigrationRegistry",
    "connect",
    "home_dir",
    "select_in",
    "transaction",
]

Migration = Callable[[sqlite3.Connection], None]


class FairLock:
    """A re-entrant lock handed to its waiters in the order they came (first in, first out).

    ``threading.RLock`` lets the thread that releases it take it straight back, so a writer
    that commits a long history in chunks, releasing the lock between them, could still keep
    every other writer waiting to the end; with this lock, a writer waiting when a chunk ends
    goes before the next chunk.

    >>> lock = FairLock()
    >>> with lock, lock:  # re-entrant
    ...     lock.owned()
    True
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._queue: deque[int] = deque()

    def owned(self) -> bool:
        return self._owner == threading.get_ident()

    def acquire(self) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return
            if self._owner is None and not self._queue:
                self._owner, self._depth = me, 1
                return
            self._queue.append(me)
            while self._owner is not None or self._queue[0] != me:
                self._cond.wait()
            self._queue.popleft()
            self._owner, self._depth = me, 1

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("release of a FairLock this thread does not hold")
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                if self._queue:
                    self._cond.notify_all()

    def __enter__(self) -> FairLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def home_dir() -> Path:
    """contextfold's home: ``$CONTEXTFOLD_HOME`` or ``.contextfold/`` in the working directory
    (created on first use)."""
    home = Path(os.environ.get("CONTEXTFOLD_HOME") or ".contextfold")
    home.mkdir(parents=True, exist_ok=True)
    return home


def connect(
    path: str | Path,
    *,
    check_same_thread: bool = False,
    factory: type[sqlite3.Connection] = sqlite3.Connection,
) -> sqlite3.Connection:
    """Open ``path`` (or ``":memory:"``) with WAL journaling, foreign keys on, a 5 s busy
    timeout and autocommit mode (transactions are explicit, see ``transaction``); the
    connection is made by ``factory`` (a ``sqlite3.Connection`` subclass)."""
    target = str(path)
    if target != ":memory:":
        Path(target).parent.mkdir(parents=True, exist_ok=True)
    try:
        conn = sqlite3.connect(
            target,
            timeout=5.0,
            isolation_level=None,
            check_same_thread=check_same_thread,
            factory=factory,
        )
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA foreign_keys = ON")
        if target != ":memory:":
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"cannot open the SQLite database {target}: {exc}") from exc
    return conn


#: Values per statement of ``select_in``: a long list is run a chunk at a time, well under
#: SQLite's limit on host parameters.
IN_CHUNK = 500


def select_in(
    conn: sqlite3.Connection,
    query: str,
    values: Sequence[Any],
    *,
    before: Sequence[Any] = (),
    after: Sequence[Any] = (),
) -> list[Any]:
    """The rows of ``query`` for all of ``values``: ``query`` holds one ``{}`` where the
    ``?, ?, …`` of an ``IN (…)`` list goes, and runs once per ``IN_CHUNK`` values, with the
    parameters ``before`` and ``after`` around each chunk's."""
    rows: list[Any] = []
    for start in range(0, len(values), IN_CHUNK):
        part = list(values[start : start + IN_CHUNK])
        marks = ",".join("?" * len(part))
        rows += conn.execute(query.format(marks), [*before, *part, *after]).fetchall()
    return rows


def pairs(conn: sqlite3.Connection, query: str, params: Sequence[Any]) -> dict[Any, Any]:
    """The two-column rows of ``query`` as a dict, read as plain tuples (not ``sqlite3.Row``:
    a session's thousands of tag counts are read a quarter faster)."""
    cursor = conn.cursor()
    cursor.row_factory = None
    return dict(cursor.execute(query, params).fetchall())


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on any exception. Inside a transaction
    already open on ``conn`` it joins that one: its writes commit or roll back with it."""
    if conn.in_transaction:
        yield conn
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


class MigrationRegistry:
    """Ordered, named migrations for one schema (``name`` separates schemas that share a
    database file)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._migrations: list[tuple[str, Migration]] = []

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self._migrations]

    def migration(self, fn: Migration) -> Migration:
        """Register ``fn`` as the next migration; its ``__name__`` is its permanent id."""
        if fn.__name__ in self.names:
            raise StoreError(f"migration {fn.__name__} is registered twice in {self.name}")
        self._migrations.append((fn.__name__, fn))
        return fn

    def apply(self, conn: sqlite3.Connection, *, upto: str | None = None) -> list[str]:
        """Apply pending migrations in order (stopping after ``upto`` when given); returns the
        names applied. Each runs in its own transaction with its bookkeeping row."""
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " schema TEXT NOT NULL, name TEXT NOT NULL,"
            " applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),"
            " PRIMARY KEY (schema, name))"
        )
        done = {
            row[0]
            for row in conn.execute(
                "SELECT name FROM schema_migrations WHERE schema = ?", (self.name,)
            )
        }
        applied: list[str] = []
        for name, fn in self._migrations:
            if name not in done:
                try:
                    with transaction(conn):
                        # Another process may have applied it while this one waited for
                        # the write lock (several server workers starting on one file).
                        ran = not conn.execute(
                            "SELECT 1 FROM schema_migrations WHERE schema = ? AND name = ?",
                            (self.name, name),
                        ).fetchone()
                        if ran:
                            fn(conn)
                            conn.execute(
                                "INSERT INTO schema_migrations (schema, name) VALUES (?, ?)",
                                (self.name, name),
                            )
                except sqlite3.DatabaseError as exc:
                    raise StoreError(f"migration {self.name}/{name} failed: {exc}") from exc
                if ran:
                    applied.append(name)
            if name == upto:
                break
        return applied
