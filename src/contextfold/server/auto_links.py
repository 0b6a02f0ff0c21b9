"""``POST /api/edges/auto``: seed 003's automatic edges over HTTP.

``shared_tag`` edges join every two nodes of one tenant that share at least ``min_shared``
tags (``GraphStorage.auto_link_shared_tags``); ``similar`` edges join each node to its
``top_k`` nearest nodes of its tenant whose cosine similarity is at least ``threshold``
(``GraphStorage.auto_link_similar``, with the memory engine's embedder: the offline MiniLM by
default). Existing edges are kept as they are, so running it again adds only what is new.
Only the caller's tenants are linked: those named in ``tenant_ids`` (each must be the
caller's, or 403), or all of the caller's when none are named.
"""

# No ``from __future__ import annotations``: FastAPI reads these models' annotations.
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StringConstraints

from contextfold.server.config import ID_PATTERN
from contextfold.server.guards import ApiError

__all__ = ["AutoLinkRequest", "AutoLinkResult", "auto_link"]

TenantId = Annotated[str, StringConstraints(pattern=ID_PATTERN)]


class AutoLinkRequest(BaseModel):
    """Which automatic edges to add, among which tenants."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            "examples": [{"tenant_ids": ["support"], "shared_tag": True, "similar": True}]
        },
    )

    tenant_ids: list[TenantId] = Field(default_factory=list, max_length=100)
    shared_tag: StrictBool = True
    min_shared: int = Field(default=1, ge=1, le=100)
    shared_tag_weight: float = Field(default=0.5, gt=0, le=1)
    similar: StrictBool = False
    threshold: float = Field(default=0.8, gt=0, le=1)
    top_k: int = Field(default=5, ge=1, le=100)
    similar_weight: float | None = Field(
        default=None, gt=0, le=1, description="default: the similarity itself"
    )


class AutoLinkResult(BaseModel):
    """How many edges of each kind were added, and over which tenants (``null``: every
    tenant, in the open mode)."""

    shared_tag: int
    similar: int
    tenant_ids: list[str] | None


def auto_link(
    graph: Any, body: AutoLinkRequest, tenants: list[str] | None, embedder: Any
) -> AutoLinkResult:
    """Add the requested edges among ``tenants`` (None: all) of ``graph``."""
    if body.similar and embedder is None:
        raise ApiError(
            409,
            "conflict",
            "similar edges need an embedder, and this server's memory runs without one "
            "(recall.embedder: none); ask for shared_tag edges only",
        )
    if tenants is not None and not tenants:
        return AutoLinkResult(shared_tag=0, similar=0, tenant_ids=[])
    shared = (
        graph.auto_link_shared_tags(body.min_shared, body.shared_tag_weight, tenant_ids=tenants)
        if body.shared_tag
        else 0
    )
    similar = (
        graph.auto_link_similar(
            embedder, body.threshold, body.top_k, body.similar_weight, tenant_ids=tenants
        )
        if body.similar
        else 0
    )
    return AutoLinkResult(shared_tag=shared, similar=similar, tenant_ids=tenants)
