"""PostgreSQL plumbing the document and graph stores share: a connection pool per store
object, the URL with its password masked, and named migrations applied once per database.

Migrations mirror the SQLite ones (``contextfold.store.sqlite.connection``): an ordered
registry of functions named ``m001_…``, each applied in its own transaction and recorded in
``schema_migrations (schema, name, applied_at)``. Every process that opens a store applies
them under one ``pg_advisory_lock``, so two processes starting at once never race to create
the same table.

``psycopg`` and ``psycopg_pool`` come with ``contextfold[postgres]``; they are imported when a
store is opened, never by ``import contextfold``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from contextfold.errors import ConfigError, StoreError

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

__all__ = ["PgMigration", "PgMigrationRegistry", "Pooled", "masked"]

PgMigration = Callable[["psycopg.Connection[Any]"], None]

#: One lock for every contextfold schema in a database (``hashtext`` of this name).
_LOCK_NAME = "contextfold.schema_migrations"


def masked(url: str) -> str:
    """``url`` with any password replaced by ``***``.

    >>> masked("postgresql://me:secret@db.example:5432/ctx")
    'postgresql://me:***@db.example:5432/ctx'
    """
    return re.sub(r"^(\w+://[^:/@]+):[^@]*@", r"\1:***@", url)


def _open_pool(url: str, max_size: int) -> ConnectionPool:
    try:
        from psycopg_pool import ConnectionPool
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError(
            "a postgresql:// store needs psycopg: pip install 'contextfold[postgres]'"
        ) from exc
    pool = ConnectionPool(
        url, min_size=1, max_size=max_size, kwargs={"autocommit": True}, open=False
    )
    try:
        pool.open(wait=True, timeout=30.0)
    except Exception as exc:
        pool.close()
        raise StoreError(f"cannot connect to {masked(url)}: {exc}") from exc
    return pool


class Pooled:
    """A store's connections: a pool, and the connection of the transaction this thread
    has open (``transaction`` joins it, so writes nest like SQLite's ``transaction``)."""

    def __init__(self, url: str, *, max_size: int = 4) -> None:
        self.url = url
        self.pool = _open_pool(url, max_size)
        self._local = threading.local()

    def close(self) -> None:
        self.pool.close()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """This thread's open transaction's connection, else one from the pool (autocommit:
        each statement commits on its own)."""
        held = getattr(self._local, "conn", None)
        if held is not None:
            yield held
            return
        with self.pool.connection() as conn:
            yield conn

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """``BEGIN`` … ``COMMIT`` on one connection, rolled back on any exception; inside a
        transaction this thread already has open, it joins that one."""
        held = getattr(self._local, "conn", None)
        if held is not None:
            yield held
            return
        with self.pool.connection() as conn:
            self._local.conn = conn
            try:
                with conn.transaction():
                    yield conn
            finally:
                self._local.conn = None


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
