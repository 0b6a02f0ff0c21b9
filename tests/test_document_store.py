"""The SQLite DocumentStore's own plumbing: migrations. The store's contract (atomic writes,
content addressing, filters, versions) is checked on every backend by
``tests/store/test_document_conformance.py``."""

from __future__ import annotations

import sqlite3

import pytest

from contextfold.errors import StoreError
from contextfold.retrieval.base import Chunk, chunk_id, content_hash
from contextfold.store.sqlite import MigrationRegistry, connect
from contextfold.store.sqlite.documents import MIGRATIONS, DocumentRecord, DocumentStore


def _doc(text: str, tenant: str = "t1", **metadata) -> DocumentRecord:
    digest = content_hash(text)
    return DocumentRecord(
        id=digest[:12],
        tenant=tenant,
        content_hash=digest,
        source=None,
        text=text,
        metadata=metadata,
        created_at="2026-01-01T00:00:00",
    )


def _chunks(doc: DocumentRecord, parts: list[str]) -> list[Chunk]:
    return [
        Chunk(
            id=chunk_id(doc.id, i, p),
            doc_id=doc.id,
            index=i,
            text=p,
            start=0,
            end=len(p),
            token_count=len(p.split()),
            metadata={"part": i},
        )
        for i, p in enumerate(parts)
    ]


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
