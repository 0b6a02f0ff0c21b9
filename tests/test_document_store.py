"""The SQLite DocumentStore's own plumbing: migrations. The store's contract (atomic writes,
content addressing, filters, versions) is checked on every backend by
``tests/store/test_document_conformance.py``."""

from __future__ import annotations

import sqlite3

import pytest

from contextfold.errors import StoreError
from contextfold.store.sqlite import MigrationRegistry, connect
from contextfold.store.sqlite.documents import MIGRATIONS, DocumentStore


def test_migrations_are_recorded_once(tmp_path) -> None:
    path = tmp_path / "docs.db"
    DocumentStore(path).close()
    conn = connect(path)
    names = [
        r[0] for r in conn.execute("SELECT name FROM schema_migrations WHERE schema='documents'")
    ]
    assert names == MIGRATIONS.names
    assert MIGRATIONS.apply(conn) == []
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_failing_migration_leaves_the_previous_schema(tmp_path) -> None:
    registry = MigrationRegistry("demo")

    @registry.migration
    def m001_ok(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE a (x INTEGER)")

    @registry.migration
    def m002_broken(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE b (y INTEGER)")
        conn.execute("THIS IS NOT SQL")

    conn = connect(tmp_path / "m.db")
    with pytest.raises(StoreError, match="m002_broken"):
        registry.apply(conn)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "a" in tables and "b" not in tables
