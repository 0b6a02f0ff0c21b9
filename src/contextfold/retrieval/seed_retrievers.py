"""Seed 002's named retrievers: ``VectorRetriever(memory=index)`` (dense search over a
``DocumentIndex``) and ``GraphRetriever`` (the knowledge-graph context of seed 003 as a
retriever). Both speak the ``Retriever`` protocol, so they plug into ``ContextEngine`` and
``retriever_step``; both take a ``str`` or a ``QueryBundle``.

>>> from contextfold.retrieval.graph import KnowledgeGraph
>>> graph = KnowledgeGraph()
>>> faq = graph.add_node("support", "faq", "How to process refunds", summary="Refund steps")
>>> flow = graph.add_node("support", "playbook", "Approval chain over $100")
>>> _ = graph.add_edge(faq.id, flow.id, "related")
>>> items = GraphRetriever(graph, ["support"]).retrieve("refund", 4)
>>> [(i.section, i.metadata["node_id"]) for i in items]
[('entry_points', 1), ('expanded', 2)]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from contextfold.errors import ConfigError
from contextfold.items import ContextItem, QueryBundle

if TYPE_CHECKING:
    from contextfold.retrieval.base import Embedder
    from contextfold.retrieval.index import DocumentIndex
    from contextfold.store.protocols import GraphStorage

__all__ = ["GraphRetriever", "VectorRetriever"]


def _bundle(query: str | QueryBundle) -> QueryBundle:
    return query if isinstance(query, QueryBundle) else QueryBundle(query_str=query)


class VectorRetriever:
    """Dense (embedding) search over a ``DocumentIndex``: the seed's
    ``VectorRetriever(memory=index)``. ``HybridRetriever(memory=index)`` adds BM25."""

    def __init__(self, memory: DocumentIndex | None = None) -> None:
        if memory is None:
            from contextfold.retrieval.index import DocumentIndex

            memory = DocumentIndex()
        if not callable(getattr(memory, "search", None)):
            raise ConfigError(
                f"VectorRetriever needs memory= a DocumentIndex, got {type(memory).__name__}"
            )
        self.memory = memory

    def retrieve(self, query: str | QueryBundle, top_k: int = 5) -> list[ContextItem]:
        from contextfold.retrieval.index import hits_to_items

        return hits_to_items(self.memory.search(_bundle(query), top_k, mode="dense"))


class GraphRetriever:
    """The knowledge-graph context (``graph_context``: entry points, their neighbourhood,
    entities) of ``tenant_ids`` as a retriever.

    Of ``top_k`` items, up to ``entry_share`` (half, rounded up) are entry points, and the
    rest are filled with expanded nodes, then entities, each in rank order; entry points
    fill any room the others leave. Items carry ``section`` (``entry_points``, ``expanded``,
    ``entities``) and ``node_id``, ``node_type``, ``path`` in their metadata; their scores
    rank every entry point above every expanded node (``to_context_items``), so a packer
    under pressure keeps the nodes that matched the query first."""

    def __init__(
        self,
        graph: GraphStorage,
        tenant_ids: Sequence[str],
        *,
        max_depth: int = 2,
        include_entities: bool = True,
        entry_share: float = 0.5,
        embedder: Embedder | None = None,
        **request: Any,
    ) -> None:
        if not tenant_ids:
            raise ConfigError("GraphRetriever needs at least one tenant id (tenant_ids=[...])")
        if not 0.0 < entry_share <= 1.0:
            raise ConfigError(f"entry_share must be in (0, 1], got {entry_share}")
        from contextfold.retrieval.graph import GraphContextRequest

        self.graph = graph
        self.tenant_ids = list(tenant_ids)
        self.entry_share = entry_share
        self.embedder = embedder
        self._request = {"max_depth": max_depth, "include_entities": include_entities, **request}
        GraphContextRequest(query="", tenant_ids=self.tenant_ids, **self._request)  # fail early

    def retrieve(self, query: str | QueryBundle, top_k: int = 5) -> list[ContextItem]:
        from contextfold.retrieval.graph import GraphContextRequest, graph_context, to_context_items

        if top_k <= 0:
            return []
        bundle = _bundle(query)
        request = GraphContextRequest(
            query=bundle.query_str,
            tenant_ids=self.tenant_ids,
            entry_limit=top_k,
            context_limit=top_k,
            **self._request,
        )
        items = to_context_items(graph_context(self.graph, request, embedder=self.embedder))
        entries = [i for i in items if i.section == "entry_points"]
        others = [i for i in items if i.section != "entry_points"]
        n_entries = min(len(entries), max(1, math.ceil(top_k * self.entry_share)))
        n_entries = max(n_entries, min(len(entries), top_k - len(others)))
        return [*entries[:n_entries], *others[: top_k - n_entries]]
