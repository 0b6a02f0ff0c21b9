"""The context API's store: the knowledge graph plus a registry of loaded documents, in one
SQLite file or one PostgreSQL database (a ``postgresql://`` URL) — ``open_catalogue``.

A document is chunked (``TextChunker``, ``MarkdownChunker`` or ``RecursiveChunker``) into
nodes of one type; each chunk node's ``content`` is ``{"document_id", "chunk_index",
"text"}``, and consecutive chunks are joined by ``related`` edges so that graph expansion
reaches a chunk's neighbours. The registry keeps each document's title, metadata and node
ids under ``(tenant_id, document_id)``, in the graph's file.

Loading a document is one transaction — its nodes, their edges and its registry row
commit together or not at all, so a failure or a killed process never leaves chunks without
their document. Deleting a document deletes, in one transaction, the nodes that are still its
chunks: of its tenant, with ``content.document_id`` naming it. Node ids are never reused
(``contextfold.store.sqlite.graph``), so an id the registry holds can never name another tenant's
node.

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
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from contextfold.store import open_catalogue
from contextfold.store.document_models import CatalogueEntry
from contextfold.store.graph_models import EdgeType, KnowledgeEdge, KnowledgeNode, NodeType
from contextfold.store.protocols import CatalogueStorage, GraphStorage
from contextfold.store.sqlite.catalogue import MIGRATIONS as DOCUMENT_MIGRATIONS

__all__ = [
    "DOCUMENT_MIGRATIONS",
    "DocumentConflict",
    "DocumentInfo",
    "DocumentSpec",
    "KnowledgeStore",
]

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


def _is_chunk_of(node: KnowledgeNode, tenant_id: str, document_id: str) -> bool:
    return node.tenant_id == tenant_id and node.content.get("document_id") == document_id


def _chunker(spec: DocumentSpec) -> Any:
    from contextfold.retrieval.chunking import MarkdownChunker, RecursiveChunker, TextChunker

    kinds = {"text": TextChunker, "markdown": MarkdownChunker, "recursive": RecursiveChunker}
    return kinds[spec.chunker](chunk_size=spec.chunk_size, overlap=spec.overlap)


class KnowledgeStore:
    """The graph (``graph``) and the document registry (``catalogue``), sharing the SQLite
    file or PostgreSQL database at ``location``."""

    def __init__(self, location: str | Path) -> None:
        self.catalogue: CatalogueStorage = open_catalogue(location)
        self.graph: GraphStorage = self.catalogue.graph
        self.path = self.graph.path

    def close(self) -> None:
        self.catalogue.close()

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
        tokens = sum(c.token_count for c in chunks)
        with self.graph.transaction():  # the nodes, edges and entry: all or nothing
            if self.catalogue.get(spec.tenant_id, document_id) is not None:
                raise DocumentConflict(
                    f"tenant {spec.tenant_id!r} already has a document {document_id!r}; "
                    "DELETE it first to load a new version"
                )
            ids = [n.id for n in self.graph.add_nodes(nodes)]
            if spec.link_chunks and len(ids) > 1:
                self.graph.add_edges(
                    KnowledgeEdge(source_id=a, target_id=b, edge_type=EdgeType.RELATED)
                    for a, b in itertools.pairwise(ids)
                )
            self._register(spec, document_id, ids, tokens)
        info = self.document(spec.tenant_id, document_id)
        assert info is not None
        return info

    def _register(
        self, spec: DocumentSpec, document_id: str, node_ids: list[int], tokens: int
    ) -> None:
        self.catalogue.insert(
            CatalogueEntry(
                tenant_id=spec.tenant_id,
                document_id=document_id,
                title=spec.title,
                node_type=spec.node_type.value,
                node_ids=node_ids,
                tokens=tokens,
                metadata=spec.metadata,
                created_at=datetime.now(UTC).isoformat(),
            )
        )

    def _info(self, entry: CatalogueEntry, nodes: Mapping[int, KnowledgeNode]) -> DocumentInfo:
        """The document of ``entry``, listing the nodes (of ``nodes``) still its chunks: a
        chunk deleted alone, moved to another tenant or given content that names another
        document (``PUT``) has left it."""
        ids = [
            i
            for i in entry.node_ids
            if i in nodes and _is_chunk_of(nodes[i], entry.tenant_id, entry.document_id)
        ]
        return DocumentInfo(
            tenant_id=entry.tenant_id,
            id=entry.document_id,
            title=entry.title,
            node_type=NodeType(entry.node_type),
            node_ids=ids,
            chunks=len(ids),
            tokens=entry.tokens,
            metadata=entry.metadata,
            created_at=datetime.fromisoformat(entry.created_at),
        )

    def documents(self, tenant_ids: Iterable[str] | None = None) -> list[DocumentInfo]:
        """Registered documents (of ``tenant_ids`` when given), by tenant then id."""
        entries = self.catalogue.entries(tenant_ids)
        nodes = self._nodes(entries)
        return [self._info(entry, nodes) for entry in entries]

    def _nodes(self, entries: Iterable[CatalogueEntry]) -> dict[int, KnowledgeNode]:
        ids = {i for entry in entries for i in entry.node_ids}
        return {node.id: node for node in self.graph.get_nodes(ids)}

    def document(self, tenant_id: str, document_id: str) -> DocumentInfo | None:
        entry = self.catalogue.get(tenant_id, document_id)
        return None if entry is None else self._info(entry, self._nodes([entry]))

    def remove_document(self, tenant_id: str, document_id: str) -> bool:
        """Delete a document and the nodes still its chunks (and their edges), in one
        transaction; False when absent. Only nodes of ``tenant_id`` whose content names
        ``document_id`` are deleted, whatever ids the registry holds."""
        with self.graph.transaction():
            entry = self.catalogue.get(tenant_id, document_id)
            if entry is None:
                return False
            chunks = self._info(entry, self._nodes([entry])).node_ids
            self.graph.remove_nodes(chunks, tenant_ids=[tenant_id])
            self.catalogue.delete(tenant_id, document_id)
        return True

    def document_counts(self) -> dict[str, int]:
        return self.catalogue.counts()
