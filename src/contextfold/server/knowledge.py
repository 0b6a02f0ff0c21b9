"""The context API's store: the knowledge graph plus a registry of loaded documents, in one
SQLite file.

A document is chunked (``TextChunker``, ``MarkdownChunker`` or ``RecursiveChunker``) into
nodes of one type; each chunk node's ``content`` is ``{"document_id", "chunk_index",
"text"}``, and consecutive chunks are joined by ``related`` edges so that graph expansion
reaches a chunk's neighbours. The registry keeps each document's title, metadata and node
ids under ``(tenant_id, document_id)``; deleting a document deletes its nodes.

>>> import tempfile, pathlib
>>> with tempfile.TemporaryDirectory() as home, KnowledgeStore(
...     pathlib.Path(home) / "graph.db"
... ) as store:
...     doc = store.add_document(DocumentSpec(tenant_id="support", id="refunds",
...         title="Policy", text="# Refunds\\nWithin 14 days.\\n# Large\\nA manager approves.",
...         chunker="markdown"))
...     doc.chunks, [n.title for n in store.graph.nodes()]
(2, ['Policy › Refunds (1/2)', 'Policy › Large (2/2)'])
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import threading
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from contextfold.store.graph import EdgeType, KnowledgeEdge, KnowledgeGraph, NodeType
from contextfold.store.sqlite import MigrationRegistry, connect, transaction

__all__ = [
    "DOCUMENT_MIGRATIONS",
    "DocumentConflict",
    "DocumentInfo",
    "DocumentSpec",
    "KnowledgeStore",
]

DOCUMENT_MIGRATIONS = MigrationRegistry("context_api_documents")


@DOCUMENT_MIGRATIONS.migration
def m001_create_documents(conn: sqlite3.Connection) -> None:
    conn.execute(
        "CREATE TABLE api_documents ("
        " tenant_id TEXT NOT NULL, document_id TEXT NOT NULL, title TEXT NOT NULL,"
        " node_type TEXT NOT NULL, node_ids TEXT NOT NULL, tokens INTEGER NOT NULL,"
        " metadata TEXT NOT NULL DEFAULT '{}', created_at TEXT NOT NULL,"
        " PRIMARY KEY (tenant_id, document_id))"
    )


Chunking = Literal["text", "markdown", "recursive"]


class DocumentSpec(BaseModel):
    """A document to load: its text is split into chunks of at most ``chunk_size`` tokens
    (cl100k_base), each stored as a node of ``node_type``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tenant_id: str
    id: str | None = None
    title: str
    text: str
    node_type: NodeType = NodeType.CONCEPT
    tags: list[str] = Field(default_factory=list)
    chunker: Chunking = "text"
    chunk_size: int = Field(default=256, ge=16, le=8192)
    overlap: int = Field(default=0, ge=0, le=1024)
    link_chunks: bool = True
    metadata: dict[str, Any] = Field(default_factory=dict)


class DocumentInfo(BaseModel):
    """A loaded document: where its chunks are (``node_ids``, in order) and their size."""

    model_config = ConfigDict(frozen=True)

    tenant_id: str
    id: str
    title: str
    node_type: NodeType
    node_ids: list[int]
    chunks: int
    tokens: int
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime


class DocumentConflict(Exception):
    """A document with this id already exists in the tenant."""


def _chunker(spec: DocumentSpec) -> Any:
    from contextfold.retrieval.chunking import MarkdownChunker, RecursiveChunker, TextChunker

    kinds = {"text": TextChunker, "markdown": MarkdownChunker, "recursive": RecursiveChunker}
    return kinds[spec.chunker](chunk_size=spec.chunk_size, overlap=spec.overlap)


class KnowledgeStore:
    """The graph (``graph``) and the document registry, sharing the file at ``path``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.graph = KnowledgeGraph(self.path)
        self._conn = connect(self.path)
        DOCUMENT_MIGRATIONS.apply(self._conn)
        self._lock = threading.RLock()

    def close(self) -> None:
        self.graph.close()
        self._conn.close()

    def __enter__(self) -> KnowledgeStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def add_document(self, spec: DocumentSpec) -> DocumentInfo:
        """Chunk ``spec.text`` into nodes, link consecutive chunks, register the document.
        Raises ``DocumentConflict`` when the tenant already has a document with this id."""
        document_id = spec.id or uuid.uuid4().hex[:16]
        chunks = _chunker(spec).split(spec.text, doc_id=document_id)
        count = len(chunks)
        nodes: list[dict[str, Any]] = []
        for chunk in chunks:
            headings = chunk.metadata.get("heading_path") or []
            title = spec.title
            if headings:
                title = f"{title} › {' › '.join(headings)}"
            if count > 1:
                title = f"{title} ({chunk.index + 1}/{count})"
            nodes.append(
                {
                    "tenant_id": spec.tenant_id,
                    "node_type": spec.node_type,
                    "title": title,
                    "content": {
                        "document_id": document_id,
                        "chunk_index": chunk.index,
                        "text": chunk.text,
                    },
                    "tags": spec.tags,
                }
            )
        with self._lock:
            if self._row(spec.tenant_id, document_id) is not None:
                raise DocumentConflict(
                    f"tenant {spec.tenant_id!r} already has a document {document_id!r}; "
                    "DELETE it first to load a new version"
                )
            stored = self.graph.add_nodes(nodes)
            ids = [n.id for n in stored]
            try:
                if spec.link_chunks and len(ids) > 1:
                    self.graph.add_edges(
                        KnowledgeEdge(source_id=a, target_id=b, edge_type=EdgeType.RELATED)
                        for a, b in itertools.pairwise(ids)
                    )
                created = datetime.now(UTC)
                with transaction(self._conn) as conn:
                    conn.execute(
                        "INSERT INTO api_documents (tenant_id, document_id, title, node_type,"
                        " node_ids, tokens, metadata, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            spec.tenant_id,
                            document_id,
                            spec.title,
                            spec.node_type.value,
                            json.dumps(ids),
                            sum(c.token_count for c in chunks),
                            json.dumps(spec.metadata, ensure_ascii=False),
                            created.isoformat(),
                        ),
                    )
            except BaseException:
                self.graph.remove_nodes(ids)  # no orphan chunks without their document
                raise
        info = self._row(spec.tenant_id, document_id)
        assert info is not None
        return info

    def _row(self, tenant_id: str, document_id: str) -> DocumentInfo | None:
        row = self._conn.execute(
            "SELECT * FROM api_documents WHERE tenant_id = ? AND document_id = ?",
            (tenant_id, document_id),
        ).fetchone()
        return None if row is None else self._info(row, None)

    def _info(self, row: sqlite3.Row, existing: set[int] | None) -> DocumentInfo:
        ids = [int(i) for i in json.loads(row["node_ids"])]
        if existing is not None:  # chunk nodes deleted one by one drop out of the list
            ids = [i for i in ids if i in existing]
        return DocumentInfo(
            tenant_id=row["tenant_id"],
            id=row["document_id"],
            title=row["title"],
            node_type=NodeType(row["node_type"]),
            node_ids=ids,
            chunks=len(ids),
            tokens=int(row["tokens"]),
            metadata=json.loads(row["metadata"]),
            created_at=datetime.fromisoformat(row["created_at"]),
        )

    def documents(self, tenant_ids: Iterable[str] | None = None) -> list[DocumentInfo]:
        """Registered documents (of ``tenant_ids`` when given), by tenant then id."""
        sql, params = "SELECT * FROM api_documents", []
        if tenant_ids is not None:
            tenants = sorted(set(tenant_ids))
            if not tenants:
                return []
            sql += f" WHERE tenant_id IN ({','.join('?' * len(tenants))})"
            params = tenants
        with self._lock:
            rows = self._conn.execute(sql + " ORDER BY tenant_id, document_id", params).fetchall()
        all_ids = {int(i) for row in rows for i in json.loads(row["node_ids"])}
        existing = self.graph.existing(all_ids)
        return [self._info(row, existing) for row in rows]

    def document(self, tenant_id: str, document_id: str) -> DocumentInfo | None:
        with self._lock:
            info = self._row(tenant_id, document_id)
        if info is None:
            return None
        existing = self.graph.existing(info.node_ids)
        kept = [i for i in info.node_ids if i in existing]
        return info.model_copy(update={"node_ids": kept, "chunks": len(kept)})

    def remove_document(self, tenant_id: str, document_id: str) -> bool:
        """Delete a document and its chunk nodes (and their edges); False when absent."""
        with self._lock:
            info = self._row(tenant_id, document_id)
            if info is None:
                return False
            self.graph.remove_nodes(info.node_ids)
            with transaction(self._conn) as conn:
                conn.execute(
                    "DELETE FROM api_documents WHERE tenant_id = ? AND document_id = ?",
                    (tenant_id, document_id),
                )
        return True

    def document_counts(self) -> dict[str, int]:
        with self._lock:
            rows = self._conn.execute(
                "SELECT tenant_id, count(*) FROM api_documents GROUP BY tenant_id"
            ).fetchall()
        return {str(r[0]): int(r[1]) for r in rows}
