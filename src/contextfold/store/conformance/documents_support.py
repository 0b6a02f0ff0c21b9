"""What the document- and graph-store conformance suites share: an opener that closes every
store a test opened, and the documents and chunks they store. The tests use only the
``DocumentStorage`` / ``GraphStorage`` Protocols' API (and, for the graph's catalogue and
``KnowledgeStore``, contextfold's openers at the place's location).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contextfold.retrieval.base import Chunk, chunk_id, content_hash
from contextfold.store.document_models import DocumentRecord


class Opener:
    """``opener()`` opens another store object on the test's location; all are closed at
    teardown."""

    def __init__(
        self,
        open_fn: Callable[[str], Any],
        where: str,
        backend: str,
        integrity_error: type[Exception] = Exception,
    ) -> None:
        self._open, self.location, self.backend = open_fn, where, backend
        #: The error a write breaking a uniqueness or reference rule raises on the backend.
        self.integrity_error = integrity_error
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
