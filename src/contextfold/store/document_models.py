"""The values every document store backend takes and returns: the ``DocumentRecord`` of a
stored document (its chunks are ``contextfold.retrieval.base.Chunk``), the
``CatalogueEntry`` of a document the context API loaded into the knowledge graph, and
``now`` — the UTC timestamp text (milliseconds) documents and their ids are stamped with.

>>> DocumentRecord(id="d", tenant="t", content_hash="h", source=None, text="x", metadata={},
...                created_at=now()).tenant
't'
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["CatalogueEntry", "DocumentRecord", "now"]


class DocumentRecord(BaseModel):
    """A stored document (without its chunks)."""

    model_config = ConfigDict(frozen=True)
    id: str
    tenant: str
    content_hash: str
    source: str | None
    text: str
    metadata: dict[str, Any]
    created_at: str


class CatalogueEntry(BaseModel):
    """A document the context API chunked into graph nodes: where its chunks went
    (``node_ids``, in order, as loaded), their node type, size and the caller's metadata,
    under ``(tenant_id, document_id)``."""

    model_config = ConfigDict(frozen=True)
    tenant_id: str
    document_id: str
    title: str
    node_type: str
    node_ids: list[int]
    tokens: int
    metadata: dict[str, Any]
    created_at: str


def now() -> str:
    """The current UTC time as ISO text, to the millisecond."""
    return datetime.now(UTC).isoformat(timespec="milliseconds")
