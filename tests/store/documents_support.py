"""What the document- and graph-store conformance suites share: the backends, a place on
each, and an opener that closes every store a test opened.

``sqlite`` is a file in the test's ``tmp_path`` (so two store objects share it, as two
processes would); ``postgres`` is a new database of the test's own on the session's real
server (``postgres_url``). Stores are opened through ``open_document_store`` /
``open_graph_store`` — the way the index and the server open theirs — and the tests use
only the ``DocumentStorage`` / ``GraphStorage`` Protocols' API.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contextfold.retrieval.base import Chunk, chunk_id, content_hash
from contextfold.store.document_models import DocumentRecord

BACKENDS = ["sqlite", "postgres"]


def location(backend: str, request: pytest.FixtureRequest, tmp_path: Path, name: str) -> str:
    """Where a test's store lives on ``backend``."""
    if backend == "sqlite":
        return str(tmp_path / name)
    url: str = request.getfixturevalue("postgres_url")  # starts the server only for these
    return url


def integrity_error(backend: str) -> type[Exception]:
    """The error a write breaking a uniqueness or reference rule raises on ``backend``."""
    if backend == "sqlite":
        return sqlite3.IntegrityError
    import psycopg

    return psycopg.IntegrityError


class Opener:
    """``opener()`` opens another store object on the test's location; all are closed at
    teardown."""

    def __init__(self, open_fn: Callable[[str], Any], where: str, backend: str) -> None:
        self._open, self.location, self.backend = open_fn, where, backend
        self.opened: list[Any] = []

    def __call__(self) -> Any:
        store = self._open(self.location)
        self.opened.append(store)
        return store

    def close(self) -> None:
        for store in reversed(self.opened):
            store.close()


def doc(text: str, tenant: str = "t1", *, id: str | None = None, **metadata: Any) -> DocumentRecord:
    digest = content_hash(text)
    return DocumentRecord(
        id=id or digest[:12],
        tenant=tenant,
        content_hash=digest,
        source=None,
        text=text,
        metadata=metadata,
        created_at="2026-01-01T00:00:00",
    )


def chunks(record: DocumentRecord, parts: list[str]) -> list[Chunk]:
    return [
        Chunk(
            id=chunk_id(record.id, i, p),
            doc_id=record.id,
            index=i,
            text=p,
            start=0,
            end=len(p),
            token_count=len(p.split()),
            metadata={"part": i},
        )
        for i, p in enumerate(parts)
    ]
