"""DocumentStore: migrations, atomic writes, content addressing, filters, versions."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from contextfold.errors import ConfigError, StoreError
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


def test_add_stores_document_chunks_and_vectors_and_bumps_version() -> None:
    store = DocumentStore()
    doc = _doc("alpha beta. gamma delta.")
    before = store.version
    store.add(
        doc,
        _chunks(doc, ["alpha beta.", "gamma delta."]),
        np.eye(2, 3, dtype=np.float32),
        model="m",
    )
    assert store.count() == (1, 2)
    assert store.version == before + 1
    ids, matrix = store.vectors("m")
    assert len(ids) == 2 and matrix.shape == (2, 3)
    assert store.find("t1", doc.content_hash) == doc.id


def test_a_failed_add_stores_nothing() -> None:
    store = DocumentStore()
    doc = _doc("one. two.")
    chunk = _chunks(doc, ["one."])[0]
    with pytest.raises(sqlite3.IntegrityError):
        store.add(doc, [chunk, chunk])  # duplicate chunk id fails half-way
    assert store.count() == (0, 0)
    assert store.version == 0


def test_vectors_need_a_model_and_matching_rows() -> None:
    store = DocumentStore()
    doc = _doc("x y")
    with pytest.raises(ConfigError, match=r"2 chunks of document \w+ need as many vectors"):
        store.add(doc, _chunks(doc, ["x", "y"]), np.zeros((1, 3), np.float32), model="m")


def test_remove_cascades_to_chunks_and_vectors() -> None:
    store = DocumentStore()
    doc = _doc("a b")
    chunks = _chunks(doc, ["a", "b"])
    store.add(doc, chunks, np.ones((2, 2), np.float32), model="m")
    assert sorted(store.remove(doc.id)) == sorted(c.id for c in chunks)
    assert store.count() == (0, 0)
    assert store.vectors("m")[0] == []


def test_matching_chunks_filters_by_tenant_and_metadata() -> None:
    store = DocumentStore()
    d1, d2 = _doc("first", tenant="t1", region="eu"), _doc("second", tenant="t2", region="us")
    store.add(d1, _chunks(d1, ["first"]))
    store.add(d2, _chunks(d2, ["second"]))
    c1, c2 = _chunks(d1, ["first"])[0].id, _chunks(d2, ["second"])[0].id
    assert store.matching_chunks(tenants=["t1"]) == {c1}
    assert store.matching_chunks(filters={"region": "us"}) == {c2}
    assert store.matching_chunks(filters={"region": ["us", "eu"]}) == {c1, c2}
    assert store.matching_chunks(filters={"part": 0}, tenants=["t2"]) == {c2}  # chunk metadata
    with pytest.raises(ConfigError, match="plain names"):
        store.matching_chunks(filters={"x') OR 1=1 --": 1})


def test_chunks_join_document_metadata_under_chunk_metadata() -> None:
    store = DocumentStore()
    doc = _doc("text", part="document-level", title="T")
    chunk = _chunks(doc, ["text"])[0]
    store.add(doc, [chunk])
    row = store.chunks([chunk.id])[chunk.id]
    assert row["metadata"] == {"part": 0, "title": "T"}
    assert row["tenant"] == "t1" and row["doc_id"] == doc.id


def test_reopening_a_file_keeps_everything(tmp_path) -> None:
    path = tmp_path / "d.db"
    store = DocumentStore(path)
    doc = _doc("persist me")
    store.add(doc, _chunks(doc, ["persist me"]))
    store.close()
    again = DocumentStore(path)
    assert again.count() == (1, 1)
    assert [d.text for d in again.documents()] == ["persist me"]


def test_add_many_is_one_all_or_nothing_transaction() -> None:
    store = DocumentStore()
    good, bad = _doc("first"), _doc("second")
    bad_chunk = _chunks(bad, ["second"])[0]
    with pytest.raises(sqlite3.IntegrityError):
        store.add_many(
            [(good, _chunks(good, ["first"]), None), (bad, [bad_chunk, bad_chunk], None)]
        )
    assert store.count() == (0, 0) and store.version == 0
    store.add_many([(good, _chunks(good, ["first"]), None), (bad, [bad_chunk], None)])
    assert store.count() == (2, 2) and store.version == 1
