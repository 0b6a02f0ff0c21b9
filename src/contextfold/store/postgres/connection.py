"""PostgreSQL plumbing of the memory store: the connection pool and per-thread transactions.

``Database`` holds a ``psycopg_pool.ConnectionPool`` of autocommit connections. One that has
been idle in the pool for ``CHECK_IDLE_S`` or more is checked (one empty query) as it is taken
out, and replaced if the server dropped it (a restart drops them all: each failed its next
call, an exchange the proxy could not store among them); a connection in steady use skips
that round trip. Connections are taken through the checkout every PostgreSQL store shares
(``pool.Checkout``). A call waits ``FIRST_WAIT_S`` for a pooled connection; when none comes
while connections are free (the pool cannot open one), it opens one of its own, and when that
fails the server is taken to be down (``StoreUnavailable``): the calls after it wait
``DOWN_CHECKOUT_S`` for a pooled connection, then try their own, so a stopped server fails
each call in about a second at first and in milliseconds after (the proxy's commit, which the
client's last byte waits for, among them: it waited ``CHECKOUT_TIMEOUT_S``), and the first
call that reaches the server again ends it. A connection the server dropped under a call
marks it down too, and has the pool test its idle connections in the background. Every
connection gives up on a server that stops acknowledging what it sent after 10 s
(``tcp_user_timeout``). A write takes
one connection for its transaction (``tx``); while a thread is inside one, every other write
and read of that thread joins it, so ``store.batch()`` makes several writes one transaction,
like the SQLite store's ``_tx``. One-statement writes run in autocommit (``statement``).

Migrations use every PostgreSQL store's registry (``pool.PgMigrationRegistry``: named
functions recorded in ``schema_migrations``, applied under one advisory lock, so processes
opening any of the stores at the same moment take turns).
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from contextfold.errors import ConfigError, StoreError
from contextfold.store import masked_location

if TYPE_CHECKING:
    import psycopg

__all__ = ["CHECK_IDLE_S", "Database", "IdleCheck", "from_text", "to_text", "utc"]

#: A pooled connection idle this many seconds is checked before it is used.
CHECK_IDLE_S = 2.0
#: How long a call waits for a pooled connection before it fails (``PoolTimeout``).
CHECKOUT_TIMEOUT_S = 10.0
#: Every connection: autocommit, and a connection whose server stops answering (a failover,
#: a partition) fails once data it sent goes unacknowledged for 10 s, instead of hanging for
#: the system's TCP timeout (many minutes).
_CONNECTION_OPTIONS: dict[str, Any] = {"autocommit": True, "tcp_user_timeout": 10_000}
#: How long a call waits for a pooled connection before it asks whether the pool cannot
#: open one (then a connection of its own tells whether the server is down).
FIRST_WAIT_S = 1.0
#: While the server is known to be down: how long a call waits for a pooled connection, and
#: for a connection of its own.
DOWN_CHECKOUT_S = 0.01
DOWN_CONNECT_S = 2


class IdleCheck:
    """The pool's ``reset`` (stamps a connection as it is returned) and ``check`` (an empty
    query on a connection idle ``CHECK_IDLE_S`` or more, or never stamped) callbacks."""

    def __init__(self) -> None:
        self._returned: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def reset(self, conn: psycopg.Connection[Any]) -> None:
        with self._lock:
            self._returned[conn] = time.monotonic()

    def check(self, conn: psycopg.Connection[Any]) -> None:
        with self._lock:
            returned = self._returned.get(conn)
        if returned is None or time.monotonic() - returned >= CHECK_IDLE_S:
            conn.execute("")  # raises on a dropped connection: the pool replaces it


def utc(moment: datetime) -> datetime:
    """``moment`` in UTC (a naive one taken as UTC): how times are written, and how the
    ``timestamptz`` values read back are given (whatever the server's time zone), as the
    SQLite store gives them.
    """
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return aware.astimezone(UTC)


# PostgreSQL text cannot hold NUL, which a message may: such a text (or one starting with
# the marker itself) is stored as the marker and the JSON of the string, and read back
# exactly. Any other text is stored as it is.
_ENCODED = "\x01"


def to_text(value: str) -> str:
    """``value`` as a PostgreSQL text column can hold it (``from_text`` reads it back).

    >>> from_text(to_text("a" + chr(0))) == "a" + chr(0), to_text("plain")
    (True, 'plain')
    """
    if "\x00" in value or value.startswith(_ENCODED):
        return _ENCODED + json.dumps(value)
    return value


def from_text(stored: str) -> str:
    """The text ``to_text`` stored."""
    if stored.startswith(_ENCODED):
        return str(json.loads(stored[1:]))
    return stored


class Database:
    """A pool of connections to ``url`` (``min_size`` kept open, at most ``max_size``)."""

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 10) -> None:
        try:
            import psycopg
            from psycopg_pool import ConnectionPool, PoolTimeout
        except ImportError as exc:
            raise ConfigError(
                'the PostgreSQL store needs psycopg 3: pip install "contextfold[postgres]"'
            ) from exc
        if max_size < 1 or min_size < 0 or min_size > max_size:
            raise ConfigError(f"pool sizes must satisfy 0 <= min ({min_size}) <= max ({max_size})")
        from contextfold.store.postgres.pool import Checkout, remember, scrub

        remember(url)
        self.masked = masked_location(url)
        self._local = threading.local()
        # One connection first: an unreachable server or a refused login fails here at once,
        # with the server's reason, instead of after the pool's retries time out.
        try:
            psycopg.connect(url, connect_timeout=10).close()
        except psycopg.Error as exc:
            text = scrub(str(exc).strip())
            reason = text.splitlines()[0] if text else type(exc).__name__
            raise StoreError(
                f"cannot connect to the PostgreSQL store at {self.masked}: {reason};"
                " check that the server runs and the URL's host, port, user and database"
            ) from exc
        self._url = url
        idle = IdleCheck()
        self.pool: ConnectionPool[Any] = ConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            kwargs={"connect_timeout": 10, **_CONNECTION_OPTIONS},
            open=False,
            name="contextfold-memory",
            check=idle.check,
            reset=idle.reset,
            timeout=CHECKOUT_TIMEOUT_S,
        )
        try:
            self.pool.open(wait=True, timeout=30.0)
        except PoolTimeout as exc:
            self.pool.close()
            raise StoreError(
                f"the PostgreSQL store at {self.masked} accepted one connection but not"
                f" {min_size} more within 30 s; is the server at its max_connections?"
            ) from exc
        self._checkout = Checkout(
            url,
            self.pool,
            first_wait=FIRST_WAIT_S,
            busy_wait=CHECKOUT_TIMEOUT_S,
            down_wait=DOWN_CHECKOUT_S,
            connect_timeout=DOWN_CONNECT_S,
            connect_options=_CONNECTION_OPTIONS,
        )

    def close(self) -> None:
        self.pool.close()

    @contextmanager
    def _pooled(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection through the checkout every PostgreSQL store shares
        (``pool.Checkout``: see the module docs)."""
        with self._checkout.connection() as conn:
            yield conn

    @contextmanager
    def tx(self) -> Iterator[psycopg.Connection[Any]]:
        """A transaction on one pooled connection; inside one already open on this thread,
        that one (its writes commit or roll back with it)."""
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is not None:
            yield conn
            return
        with self._pooled() as conn, conn.transaction():
            self._local.conn = conn
            try:
                yield conn
            finally:
                self._local.conn = None

    @contextmanager
    def statement(self, *, guarded: bool = False) -> Iterator[psycopg.Connection[Any]]:
        """A connection for one write statement that is its own transaction (autocommit);
        inside a transaction already open on this thread, that one — within a savepoint when
        ``guarded`` (a statement expected to fail at times, e.g. a duplicate id, then leaves
        the transaction usable, as a failed statement leaves SQLite's)."""
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is not None:
            if guarded:
                with conn.transaction():
                    yield conn
            else:
                yield conn
            return
        with self._pooled() as pooled:
            yield pooled

    @contextmanager
    def locking(self) -> Iterator[tuple[psycopg.Connection[Any], bool]]:
        """``read()``'s connection and whether it is this thread's open transaction (where a
        read may lock the rows it reads until the transaction ends)."""
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is not None:
            yield conn, True
            return
        with self._pooled() as pooled:
            yield pooled, False

    @contextmanager
    def read(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection to read with: this thread's open transaction when there is one (it
        sees its own writes), else a pooled one in autocommit."""
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is not None:
            yield conn
            return
        with self._pooled() as pooled:
            yield pooled
