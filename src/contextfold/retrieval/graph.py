"""Knowledge-graph context for agents (what ``POST /api/context`` serves).

``graph_context(graph, request)`` answers a ``GraphContextRequest`` in four steps:

1. **Entry points.** The candidates are the nodes of the requested tenants whose type is an
   entry type — other tenants are filtered out before anything is ranked or counted. BM25
   (and, given an embedder, cosine similarity) rank them; reciprocal rank fusion (k = 60)
   merges the rankings. ``score`` is the fused score ``Σ 1 / (60 + rank)`` over the signals
   that found the node: 1/61 ≈ 0.0164 at best for one signal, 2/61 ≈ 0.0328 for both.
   ``match_source`` says which found it: ``bm25``, ``vector`` or ``hybrid``.
2. **Expansion.** A breadth-first walk from all entry points at once, along edges in both
   directions, to ``max_depth`` hops. A node first reached at depth ``d`` scores
   ``1 / (d + 1) × weight`` of the edge that reached it (0.5, 0.333, 0.25 … for weight 1).
   Visited nodes (entry points included) are never revisited, so a node's ``distance`` is its
   hop count from the nearest entry point; among several edges reaching it at that depth the
   heaviest wins, and on a tie the first found (entry points in rank order, then discovery
   order, then neighbour id and edge type). The walk does not pass through a node whose type
   is not an expansion type. Context nodes are sorted by score (ties: nearer, then found
   first) and capped at ``context_limit``.
3. **Entities.** Entity nodes of the requested tenants that are among the returned nodes or
   adjacent to one, in the rank order of the node that brought them, at most 10.
4. **Budget.** Every returned node is counted with the ``token_model``'s tokenizer, as the
   text ``node_text`` renders. With ``max_tokens``, entry points get 60 %, context 30 % and
   entities 10 % (``graph_budget``'s shares, strict: a share left unused is not lent). Each
   category keeps its nodes in rank order until the first that does not fit, and stops there
   — so what is returned is always a prefix of the ranking and a smaller node never jumps
   ahead of a better-ranked one. Entities are collected from the nodes that survived the
   budget, so every entity returned belongs to returned context.

``graph`` is any ``GraphStorage``: ``KnowledgeGraph`` (SQLite, the default) or what
``contextfold.store.open_graph_store`` opens for a ``postgresql://`` URL.

>>> graph = KnowledgeGraph()
>>> faq = graph.add_node("support", "faq", "How to process refunds", summary="Refund steps")
>>> flow = graph.add_node("support", "playbook", "Approval chain over $100")
>>> _ = graph.add_edge(faq.id, flow.id, "related")
>>> response = graph_context(graph, GraphContextRequest(query="refund", tenant_ids=["support"]))
>>> [(n.title, n.match_source) for n in response.entry_points]
[('How to process refunds', 'bm25')]
>>> [(n.title, n.score, n.path) for n in response.context]
[('Approval chain over $100', 0.5, [1, 2])]
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from contextfold.budget import graph_budget
from contextfold.errors import EmbeddingError
from contextfold.items import ContextItem, SourceType
from contextfold.retrieval.base import MatchSource
from contextfold.retrieval.floor import RelevanceFloor, resolve_floor
from contextfold.retrieval.fusion import rrf
from contextfold.store.graph_models import (
    EdgeType,
    GraphView,
    KnowledgeEdge,
    KnowledgeNode,
    NodeType,
    search_text,
)
from contextfold.store.sqlite.graph import KnowledgeGraph  # the embedded default, re-exported
from contextfold.tokens import TokenCounter, counter_for_model

if TYPE_CHECKING:
    from contextfold.retrieval.base import Embedder
    from contextfold.retrieval.dense import NumpyVectorIndex
    from contextfold.retrieval.sparse import BM25Index
    from contextfold.store.protocols import GraphStorage

__all__ = [
    "DEFAULT_ENTRY_TYPES",
    "ENTITY_LIMIT",
    "RRF_K",
    "ContextNodeResult",
    "ContextStats",
    "EdgeType",
    "EntityResult",
    "EntryPointResult",
    "GraphContextRequest",
    "GraphContextResponse",
    "KnowledgeEdge",
    "KnowledgeGraph",
    "KnowledgeNode",
    "NodeType",
    "TokensUsed",
    "entity_text",
    "graph_context",
    "node_text",
    "to_context_items",
]

#: Entry types searched when a request names none.
DEFAULT_ENTRY_TYPES = (NodeType.FAQ, NodeType.PLAYBOOK, NodeType.PERMISSION_RULE, NodeType.CONCEPT)
_SCHEMA_TYPES = (NodeType.SCHEMA_INDEX, NodeType.SCHEMA_FIELD)
#: At most this many entities per response (ContextForge's ``LIMIT 10``).
ENTITY_LIMIT = 10
#: The RRF constant for fusing BM25 and dense entry-point rankings.
RRF_K = 60

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class GraphContextRequest(BaseModel):
    """What an agent asks for; field names and defaults follow ContextForge's
    ``/api/context``.

    ``entry_types`` None means faq, playbook, permission_rule and concept, plus schema_index
    and schema_field with ``include_schemas`` and example with ``include_examples``; an
    explicit list is used as given. ``expansion_types`` None means every type but entity
    (entities are collected separately), schema and example types only with their flags.
    An empty ``tenant_ids`` searches nothing.

    >>> GraphContextRequest(query="refunds", tenant_ids=["support"]).max_depth
    2
    """

    model_config = _FROZEN

    query: str = ""
    tenant_ids: list[str] = Field(default_factory=list)
    entry_types: list[NodeType] | None = None
    entry_limit: int = Field(default=10, gt=0)
    expand: bool = True
    expansion_types: list[NodeType] | None = None
    max_depth: int = Field(default=2, ge=0)
    context_limit: int = Field(default=50, ge=0)
    include_entities: bool = True
    include_schemas: bool = False
    include_examples: bool = False
    max_tokens: int | None = Field(default=None, gt=0)
    token_model: str = Field(default="gpt-4", min_length=1)

    def _flagged(self) -> set[NodeType]:
        extra = set(_SCHEMA_TYPES) if self.include_schemas else set()
        if self.include_examples:
            extra.add(NodeType.EXAMPLE)
        return extra

    def resolved_entry_types(self) -> frozenset[NodeType]:
        if self.entry_types is not None:
            return frozenset(self.entry_types)
        return frozenset(DEFAULT_ENTRY_TYPES) | self._flagged()

    def resolved_expansion_types(self) -> frozenset[NodeType]:
        if self.expansion_types is not None:
            return frozenset(self.expansion_types)
        optional = {*_SCHEMA_TYPES, NodeType.EXAMPLE, NodeType.ENTITY}
        return frozenset(t for t in NodeType if t not in optional) | self._flagged()


class _NodeResult(BaseModel):
    model_config = _FROZEN

    id: int
    node_type: NodeType
    title: str
    summary: str | None = None
    content: dict[str, Any] = Field(default_factory=dict)
    tags: list[str] = Field(default_factory=list)


class EntryPointResult(_NodeResult):
    """A node that matched the query; ``score`` is its RRF score (see the module docs).

    >>> EntryPointResult(id=42, node_type="faq", title="Refunds", score=1 / 61,
    ...                  match_source="bm25").model_dump(mode="json")["node_type"]
    'faq'
    """

    score: float
    match_source: MatchSource


class ContextNodeResult(_NodeResult):
    """A node reached by expansion: ``distance`` hops from the entry point ``path[0]``,
    ``path`` the node ids walked, ``edge_type`` the edge of the last hop.

    >>> node = ContextNodeResult(id=55, node_type="playbook", title="Approvals", score=0.5,
    ...                          distance=1, path=[42, 55], edge_type="related")
    >>> node.path[0], node.edge_type.value
    (42, 'related')
    """

    score: float
    distance: int
    path: list[int]
    edge_type: EdgeType | None = None


class EntityResult(BaseModel):
    """A business entity related to the returned context (``entity_path`` is None when the
    entity node's content has none).

    >>> EntityResult(id=101, title="Refund Request", entity_path="orders.refund_requests").id
    101
    """

    model_config = _FROZEN

    id: int
    title: str
    entity_path: str | None = None
    related_schemas: list[str] = Field(default_factory=list)


class TokensUsed(BaseModel):
    """Tokens of the returned nodes per category.

    >>> TokensUsed(entry_points=4200, context_nodes=1800, entities=500).model_dump()
    {'entry_points': 4200, 'context_nodes': 1800, 'entities': 500}
    """

    model_config = _FROZEN

    entry_points: int = 0
    context_nodes: int = 0
    entities: int = 0


class ContextStats(BaseModel):
    """How the answer was found.

    ``nodes_searched``: candidate nodes ranked for entry points (requested tenants and entry
    types only). ``nodes_expanded``: nodes whose neighbours the walk read. ``max_depth_reached``:
    the deepest level at which the walk found a node (before ``context_limit`` and the
    budget). ``entry_points_found`` / ``context_nodes_found``: nodes returned. Tokens are
    always counted; ``total_tokens`` is the sum of ``tokens_used``. ``encoding`` names the
    encoding they were counted with and ``encoding_fallback`` says whether it was a fallback
    (``token_model`` is a model with no known tokenizer: the counts are estimates).

    >>> ContextStats().tokens_used.entities
    0
    """

    model_config = _FROZEN

    nodes_searched: int = 0
    nodes_expanded: int = 0
    max_depth_reached: int = 0
    entry_points_found: int = 0
    context_nodes_found: int = 0
    total_tokens: int = 0
    tokens_used: TokensUsed = Field(default_factory=TokensUsed)
    encoding: str | None = None
    encoding_fallback: bool = False


class GraphContextResponse(BaseModel):
    """Entry points, expanded context and entities, each in rank order, with stats.

    >>> GraphContextResponse().model_dump_json()[:40]
    '{"entry_points":[],"context":[],"entitie'
    """

    model_config = _FROZEN

    entry_points: list[EntryPointResult] = Field(default_factory=list)
    context: list[ContextNodeResult] = Field(default_factory=list)
    entities: list[EntityResult] = Field(default_factory=list)
    stats: ContextStats = Field(default_factory=ContextStats)


# -- rendering -----------------------------------------------------------------------------


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def node_text(title: str, summary: str | None, content: Mapping[str, Any]) -> str:
    """The text a node contributes to a prompt — and what its tokens are counted on: the
    title, the summary, then one ``key: value`` line per content field (non-strings as JSON).

    >>> print(node_text("Refunds", "How to refund", {"steps": ["check", "pay"]}))
    Refunds
    How to refund
    steps: ["check", "pay"]
    """
    lines = [title, *([summary] if summary else [])]
    lines.extend(f"{key}: {_value(value)}" for key, value in content.items())
    return "\n".join(lines)


def entity_text(entity: EntityResult) -> str:
    """The prompt text of an entity: its title, path and related schemas."""
    lines = [entity.title]
    if entity.entity_path:
        lines.append(f"entity_path: {entity.entity_path}")
    if entity.related_schemas:
        lines.append(f"related_schemas: {', '.join(entity.related_schemas)}")
    return "\n".join(lines)


def _fields(node: KnowledgeNode) -> dict[str, Any]:
    return {
        "id": node.id,
        "node_type": node.node_type,
        "title": node.title,
        "summary": node.summary,
        "content": node.content,
        "tags": node.tags,
    }


# -- the four steps ------------------------------------------------------------------------


def _bm25(candidates: Sequence[KnowledgeNode]) -> BM25Index:
    from contextfold.retrieval.sparse import BM25Index

    index = BM25Index()
    index.add([str(n.id) for n in candidates], [search_text(n) for n in candidates])
    return index


def _vectors(
    graph: GraphStorage, embedder: Embedder, candidates: Sequence[KnowledgeNode]
) -> NumpyVectorIndex:
    from contextfold.retrieval.dense import NumpyVectorIndex

    index = NumpyVectorIndex(embedder.dim)
    index.add([str(n.id) for n in candidates], graph.embed_nodes(embedder, candidates))
    return index


def _entry_points(
    graph: GraphStorage,
    view: GraphView,
    request: GraphContextRequest,
    embedder: Embedder | None,
    fetch_k: int,
    min_similarity: float,
    floor: RelevanceFloor | None,
) -> tuple[list[EntryPointResult], int]:
    types = request.resolved_entry_types()
    candidates = [n for n in view.nodes.values() if n.node_type in types]
    if not candidates or not request.query.strip():
        return [], len(candidates)
    depth = max(request.entry_limit, fetch_k)
    bm25 = view.memo(("bm25", types), lambda: _bm25(candidates))
    bm25_hits = bm25.search(request.query, depth)
    rankings = {"bm25": [i for i, _ in bm25_hits]}
    shares = bm25.shares(request.query, [i for i, _ in bm25_hits])
    cosines: dict[str, float] = {}
    if embedder is not None:
        dense = view.memo(
            ("dense", types, embedder.name), lambda: _vectors(graph, embedder, candidates)
        )
        query = np.asarray(embedder.embed([request.query]), dtype=np.float32)
        if query.shape != (1, embedder.dim):
            raise EmbeddingError(
                f"embedder {embedder.name!r} returned shape {query.shape} for one query; "
                f"expected (1, {embedder.dim})"
            )
        hits = dense.search(query[0], depth)
        rankings["vector"] = [i for i, sim in hits if sim > min_similarity]
        cosines = dict(hits)
    if floor is not None:  # a node stays when either signal clears its floor
        mode = "hybrid" if embedder is not None else "bm25"
        keep = {
            i
            for ranked in rankings.values()
            for i in ranked
            if floor.keeps(mode, shares.get(i), cosines.get(i))
        }
        rankings = {signal: [i for i in ranked if i in keep] for signal, ranked in rankings.items()}
    results = []
    for hit in rrf(rankings, k=RRF_K, limit=request.entry_limit):
        source: MatchSource = (
            "hybrid" if len(hit.ranks) > 1 else ("bm25" if "bm25" in hit.ranks else "vector")
        )
        node = view.nodes[int(hit.id)]
        results.append(EntryPointResult(**_fields(node), score=hit.score, match_source=source))
    return results, len(candidates)


def _expand(
    view: GraphView, entry_ids: Sequence[int], types: frozenset[NodeType], max_depth: int
) -> tuple[list[ContextNodeResult], int, int]:
    """Breadth-first from all entry points; ``(found by score, nodes expanded, deepest)``."""
    visited = set(entry_ids)
    paths = {i: [i] for i in entry_ids}
    frontier = list(entry_ids)
    found: list[ContextNodeResult] = []
    expanded = deepest = 0
    for depth in range(1, max_depth + 1):
        if not frontier:
            break
        base = 1.0 / (depth + 1)
        best: dict[int, tuple[float, int, EdgeType]] = {}  # neighbour -> (score, parent, edge)
        for node_id in frontier:
            expanded += 1
            for hop in view.neighbors(node_id):
                if hop.neighbor in visited or view.nodes[hop.neighbor].node_type not in types:
                    continue
                score = base * hop.weight
                if hop.neighbor not in best or score > best[hop.neighbor][0]:
                    best[hop.neighbor] = (score, node_id, hop.edge_type)
        for node_id, (score, parent, edge_type) in best.items():
            visited.add(node_id)
            paths[node_id] = [*paths[parent], node_id]
            node = view.nodes[node_id]
            found.append(
                ContextNodeResult(
                    **_fields(node),
                    score=score,
                    distance=depth,
                    path=paths[node_id],
                    edge_type=edge_type,
                )
            )
        if best:
            deepest = depth
        frontier = list(best)
    found.sort(key=lambda n: (-n.score, n.distance))  # stable: ties keep discovery order
    return found, expanded, deepest


def _entities(view: GraphView, node_ids: Sequence[int]) -> list[EntityResult]:
    chosen: dict[int, KnowledgeNode] = {}
    for node_id in node_ids:
        near = sorted({h.neighbor for h in view.neighbors(node_id)})
        for candidate in [node_id, *near]:
            node = view.nodes[candidate]
            if node.node_type is NodeType.ENTITY and candidate not in chosen:
                chosen[candidate] = node
                if len(chosen) == ENTITY_LIMIT:
                    break
        if len(chosen) == ENTITY_LIMIT:
            break
    return [
        EntityResult(
            id=n.id, title=n.title, entity_path=n.entity_path, related_schemas=n.related_schemas
        )
        for n in chosen.values()
    ]


def _fit(texts: Sequence[str], counter: TokenCounter, cap: int | None) -> tuple[int, int]:
    """``(how many of texts fit in order, their tokens)``: stop at the first misfit."""
    used = 0
    for kept, text in enumerate(texts):
        tokens = counter.count(text)
        if cap is not None and used + tokens > cap:
            return kept, used
        used += tokens
    return len(texts), used


@lru_cache(maxsize=16)
def _counter(model: str) -> TokenCounter:
    return counter_for_model(model)


def graph_context(
    graph: GraphStorage,
    request: GraphContextRequest,
    *,
    embedder: Embedder | None = None,
    counter: TokenCounter | None = None,
    fetch_k: int = 100,
    min_similarity: float = 0.0,
    relevance_floor: RelevanceFloor | Mapping[str, float] | bool | None = True,
) -> GraphContextResponse:
    """Answer ``request`` from ``graph`` (the four steps in the module docs).

    ``embedder`` adds dense search to BM25; a dense hit counts only when its cosine
    similarity exceeds ``min_similarity``. Each signal ranks at most
    ``max(entry_limit, fetch_k)`` candidates before fusion. Entry points must clear the
    relevance floor (``contextfold.retrieval.floor``; ``relevance_floor=False`` turns it off):
    a query the graph does not cover gets no entry points, hence no context. ``counter``
    overrides the ``token_model``'s tokenizer.
    """
    view = graph.view(request.tenant_ids)
    counter = counter if counter is not None else _counter(request.token_model)
    floor = resolve_floor(relevance_floor, embedder.name if embedder is not None else None)
    entries, searched = _entry_points(
        graph, view, request, embedder, fetch_k, min_similarity, floor
    )
    context: list[ContextNodeResult] = []
    expanded = deepest = 0
    if request.expand and request.max_depth > 0 and entries:
        types = request.resolved_expansion_types()
        found, expanded, deepest = _expand(view, [e.id for e in entries], types, request.max_depth)
        context = found[: request.context_limit]

    shares: dict[str, int | None] = {"entry_points": None, "expanded": None, "entities": None}
    if request.max_tokens is not None:
        shares = {s.name: s.max for s in graph_budget(request.max_tokens).sections}
    n_entries, entry_tokens = _fit(
        [node_text(e.title, e.summary, e.content) for e in entries], counter, shares["entry_points"]
    )
    n_context, context_tokens = _fit(
        [node_text(c.title, c.summary, c.content) for c in context], counter, shares["expanded"]
    )
    entries, context = entries[:n_entries], context[:n_context]
    entities: list[EntityResult] = []
    if request.include_entities:
        entities = _entities(view, [n.id for n in (*entries, *context)])
    n_entities, entity_tokens = _fit(
        [entity_text(e) for e in entities], counter, shares["entities"]
    )
    entities = entities[:n_entities]

    used = TokensUsed(
        entry_points=entry_tokens, context_nodes=context_tokens, entities=entity_tokens
    )
    stats = ContextStats(
        nodes_searched=searched,
        nodes_expanded=expanded,
        max_depth_reached=deepest,
        entry_points_found=len(entries),
        context_nodes_found=len(context),
        total_tokens=entry_tokens + context_tokens + entity_tokens,
        tokens_used=used,
        encoding=getattr(counter, "encoding_name", None),
        encoding_fallback=bool(getattr(counter, "fallback", False)),
    )
    return GraphContextResponse(
        entry_points=entries, context=context, entities=entities, stats=stats
    )


def to_context_items(response: GraphContextResponse) -> list[ContextItem]:
    """The response as retrieval ``ContextItem``s for the window packer, in the sections
    ``graph_budget`` defines (``entry_points``, ``expanded``, ``entities``); the content is
    the text the tokens were counted on, the metadata carries node id, type, the graph's
    score and path.

    An item's ``score`` (what the packer ranks by) is on the entry points' scale: an entry
    point's is its RRF score, an expanded node's its graph score (``1 / (d + 1) × weight``,
    at most 0.5) times the lowest entry point's. So every entry point ranks above every
    expanded node (a plain pipeline under pressure keeps the node that matched the query
    before its neighbours, as ``graph_budget``'s section priorities do), and the expanded
    nodes keep the graph's own order among themselves.

    >>> response = GraphContextResponse(entities=[EntityResult(id=7, title="Refund Request")])
    >>> [(i.id, i.section, i.content) for i in to_context_items(response)]
    [('graph-entity:7', 'entities', 'Refund Request')]
    """
    # With no entry point (a budget that fit none), the best a single signal scores.
    scale = min((e.score for e in response.entry_points), default=1.0 / (RRF_K + 1))
    items = [
        ContextItem(
            id=f"graph-node:{e.id}",
            content=node_text(e.title, e.summary, e.content),
            source=SourceType.RETRIEVAL,
            section="entry_points",
            score=e.score,
            metadata={
                "node_id": e.id,
                "node_type": e.node_type.value,
                "score": e.score,
                "match_source": e.match_source,
                "distance": 0,
                "path": [e.id],
                "tags": list(e.tags),
            },
        )
        for e in response.entry_points
    ]
    items.extend(
        ContextItem(
            id=f"graph-node:{c.id}",
            content=node_text(c.title, c.summary, c.content),
            source=SourceType.RETRIEVAL,
            section="expanded",
            score=c.score * scale,
            metadata={
                "node_id": c.id,
                "node_type": c.node_type.value,
                "score": c.score,
                "distance": c.distance,
                "path": list(c.path),
                "edge_type": None if c.edge_type is None else c.edge_type.value,
                "tags": list(c.tags),
            },
        )
        for c in response.context
    )
    items.extend(
        ContextItem(
            id=f"graph-entity:{n.id}",
            content=entity_text(n),
            source=SourceType.RETRIEVAL,
            section="entities",
            metadata={
                "node_id": n.id,
                "node_type": NodeType.ENTITY.value,
                "entity_path": n.entity_path,
                "related_schemas": list(n.related_schemas),
            },
        )
        for n in response.entities
    )
    return items
