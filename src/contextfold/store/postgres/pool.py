"""PostgreSQL plumbing the document and graph stores share: a connection pool per store
object, the URL with its password masked, and named migrations applied once per database.

Migrations mirror the SQLite ones (``contextfold.store.sqlite.connection``): an ordered
registry of functions named ``m001_…``, each applied in its own transaction and recorded in
``schema_migrations (schema, name, applied_at)``. Every process that opens a store applies
them under one ``pg_advisory_lock``, so two processes starting at once never race to create
the same table.

The PostgreSQL server may restart or go away for a while. A connection idle a while is checked
as it leaves the pool (one empty query), so one the server dropped is replaced instead of
failing the request. Every store's connections are taken through one ``Checkout`` (the memory
store's too): a request waits ``first_wait`` seconds for a pooled connection; when none comes
while connections are free (the pool cannot open one: it backs off between its own attempts,
and may not yet know the server is back), it tries one direct connection, used when it works,
else ``StoreUnavailable`` with the server's reason, which the HTTP server answers 503. Until
a connection works again, requests wait only ``down_wait`` for a pooled one and fail in
milliseconds. A pool whose connections are all in use is waited for up to ``busy_wait``. A
connection the server dropped under a request marks it down too, and has the pool test its
idle connections in the background.

``psycopg`` and ``psycopg_pool`` come with ``contextfold[postgres]``; they are imported when a
store is opened, never by ``import contextfold``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any

from contextfold.errors import ConfigError, StoreError

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

__all__ = [
    "CHECKOUT_TIMEOUT",
    "Checkout",
    "PgMigration",
    "PgMigrationRegistry",
    "Pooled",
    "StoreUnavailable",
    "masked",
    "reason_of",
    "remember",
    "scrub",
    "unavailable",
]

PgMigration = Callable[["psycopg.Connection[Any]"], None]

#: One lock for every contextfold schema in a database (``hashtext`` of this name).
_LOCK_NAME = "contextfold.schema_migrations"
#: Seconds a request waits for a pooled connection when every one is in use (``PoolTimeout``).
CHECKOUT_TIMEOUT = 5.0
#: Seconds a request waits for a pooled connection before it asks whether the pool cannot
#: open one (then a direct connection tells whether the server is down).
FIRST_WAIT = 1.0
#: ``connect_timeout`` (seconds) of a direct connection.
CONNECT_TIMEOUT = 5
#: Seconds a failed reconnection keeps being retried in the background before the pool gives
#: up on it (the next request that finds no connection starts a new attempt at once): short,
#: so a pool never waits long in a back-off once the server is back.
RECONNECT_TIMEOUT = 10.0


class StoreUnavailable(StoreError):
    """The PostgreSQL server of a store cannot be reached (stopped, restarting, refusing
    connections); ``location`` is its URL, password masked, and ``reason`` the server's."""

    def __init__(self, location: str, reason: str) -> None:
        super().__init__(f"the PostgreSQL store at {location} is unavailable: {reason}")
        self.location = location
        self.reason = reason


def reason_of(exc: BaseException, url: str = "") -> str:
    """The last line of a driver error, scrubbed of ``url``'s password (``scrub``)."""
    text = str(exc).strip()
    return scrub(text.splitlines()[-1].strip() if text else type(exc).__name__, url)


#: The passwords of the store URLs this process opened (``remember``), scrubbed from every
#: error text a store reports (``scrub``).
_SECRETS: set[str] = set()


def _passwords(url: str) -> set[str]:
    from urllib.parse import unquote

    found = re.match(r"^\s*[\w+.-]+://[^:/@]+:([^@]*)@", url)
    if not found or not found.group(1):
        return set()
    return {s for s in (found.group(1), unquote(found.group(1))) if len(s) >= 3}


def remember(url: str) -> None:
    """Scrub ``url``'s password from every error text from now on (``scrub``)."""
    _SECRETS.update(_passwords(url))


def scrub(text: str, url: str = "") -> str:
    """``text`` with the password of ``url`` and of every store URL opened (``remember``),
    as written and percent-decoded, and any ``password=…``, replaced by ``***``: libpq
    repeats a password in some errors (``invalid percent-encoded token: "<password>"``),
    which must reach no log or response.

    >>> scrub('invalid percent-encoded token: "Tr0ub%dor"', "postgresql://app:Tr0ub%dor@db/x")
    'invalid percent-encoded token: "***"'
    """
    for secret in sorted(_SECRETS | _passwords(url), key=len, reverse=True):
        text = text.replace(secret, "***")
    return re.sub(r"(password\s*=\s*)('[^']*'|[^\s;,'\"]+)", r"\1***", text, flags=re.IGNORECASE)


def masked(url: str) -> str:
    """``url`` with any password replaced by ``***``.

    >>> masked("postgresql://me:secret@db.example:5432/ctx")
    'postgresql://me:***@db.example:5432/ctx'
    """
    return re.sub(r"^(\w+://[^:/@]+):[^@]*@", r"\1:***@", url)


class Checkout:
    """The connections of one pool, taken so that an outage fails fast (the module docs): a
    pooled connection within ``first_wait`` seconds, else — when connections are free but
    none came (the pool cannot open one) — a direct one (``connect_options`` and
    ``connect_timeout``), ``StoreUnavailable`` when that fails too; then ``down`` says why
    until a connection works again, and requests wait ``down_wait`` for a pooled one. Every
    connection in use: waited for up to ``busy_wait`` in all (then ``PoolTimeout``). "In use"
    is counted here: the pool's own ``pool_size`` also counts the connections it is still
    trying to open again, for minutes in an outage. A connection the server dropped under a
    call (``OperationalError`` leaving it broken) is an outage too: ``StoreUnavailable``, and
    the pool's idle connections are tested in a thread of their own."""

    def __init__(
        self,
        url: str,
        pool: ConnectionPool[Any],
        *,
        first_wait: float = FIRST_WAIT,
        busy_wait: float = CHECKOUT_TIMEOUT,
        down_wait: float = 0.01,
        connect_timeout: int = CONNECT_TIMEOUT,
        connect_options: dict[str, Any] | None = None,
    ) -> None:
        self.url = url
        self.masked = masked(url)
        self.pool = pool
        self.first_wait = first_wait
        self.busy_wait = busy_wait
        self.down_wait = down_wait
        self.connect_timeout = connect_timeout
        self.connect_options = connect_options or {"autocommit": True}
        self.down: str | None = None  # why the server could not be reached, until it can
        self._in_use = 0  # connections checked out
        self._checking = False  # a ``_drop_stale`` thread runs
        self._lock = threading.Lock()

    def _direct(self, connect_timeout: int) -> psycopg.Connection[Any]:
        """A connection of its own, not the pool's; ``StoreUnavailable`` when that fails."""
        import psycopg

        try:
            return psycopg.connect(
                self.url, connect_timeout=connect_timeout, **self.connect_options
            )
        except psycopg.Error as exc:
            self.down = reason_of(exc, self.url)
            raise StoreUnavailable(self.masked, self.down) from exc

    @contextmanager
    def connection(
        self, first_wait: float | None = None, *, connect_timeout: int | None = None
    ) -> Iterator[psycopg.Connection[Any]]:
        """A connection (see the class docs); ``first_wait`` and ``connect_timeout`` override
        the checkout's own for this call."""
        import psycopg
        from psycopg_pool import PoolTimeout

        down = self.down
        wait = self.down_wait if down else (self.first_wait if first_wait is None else first_wait)
        conn: psycopg.Connection[Any] | None = None
        try:
            conn = self.pool.getconn(timeout=wait)
        except PoolTimeout:
            if down is None and self._in_use >= self.pool.max_size:
                if self.busy_wait <= wait:
                    raise
                conn = self.pool.getconn(timeout=self.busy_wait - wait)  # busy: waited for
        pooled = conn is not None
        if conn is None:
            conn = self._direct(
                self.connect_timeout if connect_timeout is None else connect_timeout
            )
        self.down = None
        with self._lock:
            self._in_use += 1
        try:
            yield conn
        except psycopg.OperationalError as exc:
            if not (conn.broken or conn.closed):
                raise
            # the server went away under the call (stopped, restarted): an outage, and the
            # pool's other idle connections are as dead as this one
            self.down = reason_of(exc, self.url)
            self._drop_stale()
            raise StoreUnavailable(self.masked, self.down) from exc
        finally:
            with self._lock:
                self._in_use -= 1
            if pooled:
                self.pool.putconn(conn)
            else:
                conn.close()

    def _drop_stale(self) -> None:
        """Test the pool's idle connections in a thread of its own (``ConnectionPool.check``:
        the dead ones are replaced), so the calls after a restart get no connection it
        dropped; one such thread at a time."""
        with self._lock:
            if self._checking:
                return
            self._checking = True

        def check() -> None:
            try:
                with suppress(Exception):
                    self.pool.check()
            finally:
                with self._lock:
                    self._checking = False

        threading.Thread(target=check, name="contextfold-pool-check", daemon=True).start()


def _open_pool(url: str, max_size: int) -> ConnectionPool:
    try:
        from psycopg_pool import ConnectionPool
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError(
            "a postgresql:// store needs psycopg: pip install 'contextfold[postgres]'"
        ) from exc
    from contextfold.store.postgres.connection import IdleCheck

    idle = IdleCheck()
    pool = ConnectionPool(
        url,
        min_size=1,
        max_size=max_size,
        kwargs={"autocommit": True},
        open=False,
        # a connection idle a while is checked (one the server dropped is replaced); one in
        # steady use skips the round trip
        check=idle.check,
        reset=idle.reset,
        timeout=CHECKOUT_TIMEOUT,
        reconnect_timeout=RECONNECT_TIMEOUT,
    )
    try:
        pool.open(wait=True, timeout=30.0)
    except Exception as exc:
        pool.close()
        raise StoreError(f"cannot connect to {masked(url)}: {scrub(str(exc), url)}") from exc
    return pool


class Pooled:
    """A store's connections: a pool, taken through a ``Checkout``, and the connection of the
    transaction this thread has open (``transaction`` joins it, so writes nest like SQLite's
    ``transaction``)."""

    def __init__(self, url: str, *, max_size: int = 4) -> None:
        remember(url)
        self.url = url
        self.masked = masked(url)
        self.pool = _open_pool(url, max_size)
        self._local = threading.local()
        self._checkout = Checkout(url, self.pool)

    def close(self) -> None:
        self.pool.close()

    def unavailable(self, timeout: float = 2.0) -> str | None:
        """Why the server cannot be reached now (a connection checked out within ``timeout``
        seconds, or a direct one within as long), else ``None``."""
        from psycopg_pool import PoolTimeout

        try:
            with self._checkout.connection(timeout, connect_timeout=max(1, round(timeout))):
                pass
        except StoreUnavailable as exc:
            return exc.reason
        except PoolTimeout:
            return None  # every connection in use: the server answers them
        return None

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """This thread's open transaction's connection, else one from the pool (autocommit:
        each statement commits on its own)."""
        held = getattr(self._local, "conn", None)
        if held is not None:
            yield held
            return
        with self._checkout.connection() as conn:
            yield conn

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """``BEGIN`` … ``COMMIT`` on one connection, rolled back on any exception; inside a
        transaction this thread already has open, it joins that one."""
        held = getattr(self._local, "conn", None)
        if held is not None:
            yield held
            return
        with self._checkout.connection() as conn:
            self._local.conn = conn
            try:
                with conn.transaction():
                    yield conn
            finally:
                self._local.conn = None


def unavailable(store: object, timeout: float = 2.0) -> str | None:
    """Why the PostgreSQL server behind ``store`` cannot be reached now, else ``None`` (also
    for a store that is not on PostgreSQL): a graph or document store (``Pooled``) or the
    memory store (``connection.Database``: its pool's connection, checked)."""
    db = getattr(store, "_db", None)
    if isinstance(db, Pooled):
        return db.unavailable(timeout)
    pool = getattr(db, "pool", None)
    if pool is None or not hasattr(pool, "getconn"):
        return None
    import psycopg
    from psycopg_pool import PoolTimeout

    conn = None
    with suppress(PoolTimeout):
        conn = pool.getconn(timeout=timeout)
    if conn is not None:
        try:
            # one the server dropped (the pool replaces it): asked again below, directly
            with suppress(psycopg.Error):
                pool.check_connection(conn)
                return None
        finally:
            pool.putconn(conn)
    try:
        psycopg.connect(pool.conninfo, connect_timeout=max(1, round(timeout))).close()
    except psycopg.Error as exc:
        return reason_of(exc, pool.conninfo)
    return None


class PgMigrationRegistry:
    """Ordered, named migrations for one schema (``name`` keeps schemas sharing a database
    apart in ``schema_migrations``)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._migrations: list[tuple[str, PgMigration]] = []

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self._migrations]

    def migration(self, fn: PgMigration) -> PgMigration:
        """Register ``fn`` as the next migration; its ``__name__`` is its permanent id."""
        if fn.__name__ in self.names:
            raise StoreError(f"migration {fn.__name__} is registered twice in {self.name}")
        self._migrations.append((fn.__name__, fn))
        return fn

    def apply(self, conn: psycopg.Connection[Any]) -> list[str]:
        """Apply the pending migrations in order, each in its own transaction with its row in
        ``schema_migrations``, holding the advisory lock throughout; the names applied.
        ``conn`` must be in autocommit mode."""
        import psycopg

        conn.execute("SELECT pg_advisory_lock(hashtext(%s))", (_LOCK_NAME,))
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " schema TEXT NOT NULL, name TEXT NOT NULL,"
                " applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),"
                " PRIMARY KEY (schema, name))"
            )
            rows = conn.execute(
                "SELECT name FROM schema_migrations WHERE schema = %s", (self.name,)
            ).fetchall()
            done = {row[0] for row in rows}
            applied: list[str] = []
            for name, fn in self._migrations:
                if name in done:
                    continue
                try:
                    with conn.transaction():
                        fn(conn)
                        conn.execute(
                            "INSERT INTO schema_migrations (schema, name) VALUES (%s, %s)",
                            (self.name, name),
                        )
                except psycopg.Error as exc:
                    raise StoreError(f"migration {self.name}/{name} failed: {exc}") from exc
                applied.append(name)
            return applied
        finally:
            conn.execute("SELECT pg_advisory_unlock(hashtext(%s))", (_LOCK_NAME,))
