"""The document store's conformance suite (``contextfold.store.conformance.documents``), run
here on SQLite and PostgreSQL, and the PostgreSQL document store's migrations."""

from __future__ import annotations

import threading

import pytest

from contextfold.store import open_document_store
from contextfold.store.conformance.documents import *  # noqa: F403
from contextfold.store.protocols import DocumentStorage

# -- PostgreSQL migrations ------------------------------------------------------------------


def test_postgres_migrations_are_recorded_once_even_when_opened_at_once(
    postgres_url: str,
) -> None:
    import psycopg

    from contextfold.store.postgres.documents import MIGRATIONS

    opened: list[DocumentStorage] = []
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            opened.append(open_document_store(postgres_url))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert errors == [] and len(opened) == 4
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT name FROM schema_migrations WHERE schema = 'documents' ORDER BY name"
            ).fetchall()
            assert [r[0] for r in rows] == MIGRATIONS.names
            assert MIGRATIONS.apply(conn) == []
    finally:
        for store in opened:
            store.close()


def test_a_failing_postgres_migration_leaves_the_previous_schema(postgres_url: str) -> None:
    import psycopg

    from contextfold.errors import StoreError
    from contextfold.store.postgres.pool import PgMigrationRegistry

    registry = PgMigrationRegistry("demo")

    @registry.migration
    def m001_ok(conn: psycopg.Connection) -> None:
        conn.execute("CREATE TABLE a (x INTEGER)")

    @registry.migration
    def m002_broken(conn: psycopg.Connection) -> None:
        conn.execute("CREATE TABLE b (y INTEGER)")
        conn.execute("THIS IS NOT SQL")

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        with pytest.raises(StoreError, match="m002_broken"):
            registry.apply(conn)
        tables = {
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            ).fetchall()
        }
        assert "a" in tables and "b" not in tables
        # the advisory lock was released: another apply runs (and fails the same way)
        with pytest.raises(StoreError, match="m002_broken"):
            registry.apply(conn)
