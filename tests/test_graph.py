"""Knowledge-graph context: store, entry-point search, BFS expansion, entities, budget."""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from contextfold.errors import ConfigError
from contextfold.items import SourceType
from contextfold.retrieval.graph import (
    ContextNodeResult,
    GraphContextRequest,
    GraphContextResponse,
    KnowledgeGraph,
    entity_text,
    graph_context,
    node_text,
    to_context_items,
)
from contextfold.store.sqlite import connect
from contextfold.store.sqlite.graph import MIGRATIONS, KnowledgeEdge


class KeywordEmbedder:
    """A deterministic ``Embedder``: each concept word is one basis direction; a text with none
    of them points along the last ("other") axis, orthogonal to every concept."""

    def __init__(self, concepts: dict[str, int]) -> None:
        self.concepts = concepts
        self._dim = max(concepts.values()) + 2

    @property
    def name(self) -> str:
        return f"keywords-{self._dim}"

    @property
    def dim(self) -> int:
        return self._dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                if word in self.concepts:
                    out[row, self.concepts[word]] += 1.0
            if not out[row].any():
                out[row, -1] = 1.0
            out[row] /= np.linalg.norm(out[row])
        return out


def _ask(graph: KnowledgeGraph, query: str = "refund", **fields) -> GraphContextResponse:
    fields.setdefault("tenant_ids", ["t"])
    return graph_context(graph, GraphContextRequest(query=query, **fields))


def _chain(weight: float = 1.0, length: int = 3) -> tuple[KnowledgeGraph, list[int]]:
    """An entry point ``refund`` followed by ``length`` playbooks, one hop apart."""
    graph = KnowledgeGraph()
    ids = [graph.add_node("t", "faq", "How to refund").id]
    for n in range(length):
        ids.append(graph.add_node("t", "playbook", f"Step {n}").id)
        graph.add_edge(ids[-2], ids[-1], "related", weight)
    return graph, ids


def _context(response: GraphContextResponse) -> dict[int, ContextNodeResult]:
    return {c.id: c for c in response.context}


# -- expansion -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("weight", "table"), [(1.0, [0.50, 0.33, 0.25]), (0.8, [0.40, 0.27, 0.20])]
)
def test_scores_follow_the_seed_table(weight: float, table: list[float]) -> None:
    graph, ids = _chain(weight)
    context = _ask(graph, max_depth=3).context
    assert [c.id for c in context] == ids[1:]
    assert [c.distance for c in context] == [1, 2, 3]
    assert [c.score for c in context] == [1 / 2 * weight, 1 / 3 * weight, 1 / 4 * weight]
    assert [round(c.score, 2) for c in context] == table
    assert [c.path for c in context] == [ids[:2], ids[:3], ids[:4]]


@pytest.mark.parametrize(
    ("max_depth", "found", "expanded"), [(0, 0, 0), (1, 1, 1), (2, 2, 2), (3, 3, 3)]
)
def test_max_depth_bounds_the_walk(max_depth: int, found: int, expanded: int) -> None:
    graph, _ = _chain(length=4)
    stats = _ask(graph, max_depth=max_depth).stats
    assert stats.context_nodes_found == found
    assert stats.max_depth_reached == found
    assert stats.nodes_expanded == expanded


def test_expand_false_returns_entry_points_only() -> None:
    graph, ids = _chain()
    response = _ask(graph, expand=False)
    assert [e.id for e in response.entry_points] == [ids[0]]
    assert response.context == []
    assert response.stats.nodes_expanded == 0


def test_expansion_follows_directed_edges_both_ways() -> None:
    graph = KnowledgeGraph()
    entry = graph.add_node("t", "faq", "Refund rules").id
    parent = graph.add_node("t", "concept", "Payments").id
    child = graph.add_node("t", "playbook", "Escalation").id
    stranger = graph.add_node("t", "playbook", "Card limits").id
    graph.add_edge(parent, entry, "parent")  # the entry point is the child: reached backwards
    graph.add_edge(entry, child, "parent")  # reached forwards
    context = _context(_ask(graph, query="rules"))
    assert (context[parent].path, context[parent].edge_type) == ([entry, parent], "parent")
    assert (context[child].path, context[child].edge_type) == ([entry, child], "parent")
    assert stranger not in context


def test_entry_points_and_visited_nodes_are_never_revisited() -> None:
    graph = KnowledgeGraph()
    a = graph.add_node("t", "faq", "Refund by card").id
    b = graph.add_node("t", "faq", "Refund by cash").id
    c = graph.add_node("t", "playbook", "Cashier checklist").id
    for s, t in [(a, b), (a, c), (b, c)]:
        graph.add_edge(s, t)
    response = _ask(graph, max_depth=3)
    assert {e.id for e in response.entry_points} == {a, b}
    assert [(n.id, n.distance) for n in response.context] == [(c, 1)]


def test_a_diamond_keeps_the_best_last_hop() -> None:
    graph = KnowledgeGraph()
    e = graph.add_node("t", "faq", "Refund").id
    a, b, d = (graph.add_node("t", "playbook", name).id for name in ("A", "B", "D"))
    graph.add_edge(e, a)
    graph.add_edge(e, b)
    graph.add_edge(a, d, "related", 0.4)
    graph.add_edge(b, d, "similar", 0.9)
    node = _context(_ask(graph))[d]
    assert node.score == pytest.approx(0.9 / 3)
    assert (node.path, node.edge_type, node.distance) == ([e, b, d], "similar", 2)


def test_a_diamond_tie_goes_to_the_first_found_path() -> None:
    graph = KnowledgeGraph()
    e = graph.add_node("t", "faq", "Refund").id
    a, b, d = (graph.add_node("t", "playbook", name).id for name in ("A", "B", "D"))
    for s, t in [(e, a), (e, b), (b, d), (a, d)]:
        graph.add_edge(s, t, "related", 0.5)
    assert _context(_ask(graph))[d].path == [e, a, d]  # a has the smaller id


def test_the_heaviest_of_parallel_edges_wins() -> None:
    graph = KnowledgeGraph()
    e = graph.add_node("t", "faq", "Refund").id
    x = graph.add_node("t", "concept", "Ledger").id
    graph.add_edge(e, x, "shared_tag", 0.5)
    graph.add_edge(x, e, "example_of", 0.7)
    node = _context(_ask(graph))[x]
    assert (node.edge_type, node.score) == ("example_of", pytest.approx(0.35))


def test_expansion_types_filter_and_block_the_walk() -> None:
    graph = KnowledgeGraph()
    e = graph.add_node("t", "faq", "Refund").id
    concept = graph.add_node("t", "concept", "Ledger").id
    behind = graph.add_node("t", "playbook", "Close the books").id
    direct = graph.add_node("t", "playbook", "Issue credit").id
    graph.add_edge(e, concept)
    graph.add_edge(concept, behind)
    graph.add_edge(e, direct)
    assert set(_context(_ask(graph))) == {concept, behind, direct}
    filtered = _ask(graph, expansion_types=["playbook"])
    assert set(_context(filtered)) == {direct}  # `behind` is reachable only through a concept


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({}, {"playbook"}),
        ({"include_schemas": True}, {"playbook", "schema_index", "schema_field"}),
        ({"include_examples": True}, {"playbook", "example"}),
        ({"expansion_types": ["entity", "example"]}, {"entity", "example"}),
    ],
)
def test_default_expansion_types_follow_the_flags(flags: dict, expected: set[str]) -> None:
    graph = KnowledgeGraph()
    e = graph.add_node("t", "faq", "Refund").id
    for kind in ("playbook", "schema_index", "schema_field", "example", "entity"):
        graph.add_edge(e, graph.add_node("t", kind, f"{kind} node").id)
    assert {c.node_type for c in _ask(graph, **flags).context} == expected


def test_context_limit_keeps_the_best_scores() -> None:
    graph = KnowledgeGraph()
    e = graph.add_node("t", "faq", "Refund").id
    weights = [0.2, 0.9, 0.5, 0.7]
    ids = [graph.add_node("t", "playbook", f"P{w}").id for w in weights]
    for node_id, weight in zip(ids, weights, strict=True):
        graph.add_edge(e, node_id, "related", weight)
    response = _ask(graph, context_limit=2)
    assert [c.id for c in response.context] == [ids[1], ids[3]]
    assert response.stats.context_nodes_found == 2


# -- entry points --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, {"faq", "playbook", "permission_rule", "concept"}),
        (
            {"include_schemas": True},
            {"faq", "playbook", "permission_rule", "concept"} | {"schema_index", "schema_field"},
        ),
        ({"include_examples": True}, {"faq", "playbook", "permission_rule", "concept", "example"}),
        ({"entry_types": ["schema_index", "entity"]}, {"schema_index", "entity"}),
    ],
)
def test_entry_types_default_and_flags(fields: dict, expected: set[str]) -> None:
    graph = KnowledgeGraph()
    kinds = ["faq", "playbook", "permission_rule", "concept", "schema_index", "schema_field"]
    for kind in [*kinds, "example", "entity"]:
        graph.add_node("t", kind, f"Refund {kind}")
    response = _ask(graph, entry_limit=20, **fields)
    assert {e.node_type for e in response.entry_points} == expected
    assert response.stats.nodes_searched == len(expected)


def test_entry_limit_and_bm25_order() -> None:
    graph = KnowledgeGraph()
    graph.add_node("t", "faq", "Refund", summary="shipping shipping shipping")
    strong = graph.add_node("t", "faq", "Refund refund policy").id
    graph.add_node("t", "faq", "Hotel caps")
    response = _ask(graph, entry_limit=1)
    assert [e.id for e in response.entry_points] == [strong]
    assert response.entry_points[0].score == 1 / 61


def test_a_blank_query_finds_nothing_but_counts_the_candidates() -> None:
    graph, _ = _chain()
    response = _ask(graph, query="   ")
    assert response.entry_points == [] and response.context == []
    assert response.stats.nodes_searched == 4


def test_match_source_says_which_signal_found_the_node() -> None:
    graph = KnowledgeGraph()
    hybrid = graph.add_node("t", "faq", "Refund policy").id
    vector = graph.add_node("t", "faq", "Reimbursement of expenses").id
    bm25 = graph.add_node("t", "faq", "Submission deadline").id
    graph.add_node("t", "faq", "Hotel caps")
    embedder = KeywordEmbedder({"refund": 0, "reimbursement": 0, "hotel": 1})
    request = GraphContextRequest(query="refund deadline", tenant_ids=["t"])
    entries = graph_context(graph, request, embedder=embedder).entry_points
    sources = {e.id: e.match_source for e in entries}
    assert sources == {hybrid: "hybrid", vector: "vector", bm25: "bm25"}
    assert entries[0].id == hybrid and entries[0].score == pytest.approx(2 / 61)


def test_without_an_embedder_every_match_is_bm25() -> None:
    graph = KnowledgeGraph()
    graph.add_node("t", "faq", "Refund policy")
    graph.add_node("t", "playbook", "Refund approvals")
    entries = _ask(graph).entry_points
    assert len(entries) == 2
    assert {e.match_source for e in entries} == {"bm25"}


# -- tenants -------------------------------------------------------------------------------


def test_another_tenants_perfect_match_is_never_returned_nor_counted() -> None:
    graph = KnowledgeGraph()
    mine = graph.add_node("mine", "faq", "Refund window").id
    theirs = graph.add_node("theirs", "faq", "Refund refund refund").id
    near_theirs = graph.add_node("theirs", "playbook", "Secret steps").id
    their_entity = graph.add_node("theirs", "entity", "Secret entity").id
    graph.add_edge(mine, theirs)
    graph.add_edge(mine, their_entity)
    graph.add_edge(theirs, near_theirs)
    embedder = KeywordEmbedder({"refund": 0})
    request = GraphContextRequest(query="refund", tenant_ids=["mine"])
    response = graph_context(graph, request, embedder=embedder)
    returned = {n.id for n in (*response.entry_points, *response.context, *response.entities)}
    assert returned == {mine}
    assert response.stats.nodes_searched == 1


def test_several_tenants_are_searched_together() -> None:
    graph = KnowledgeGraph()
    a = graph.add_node("purchasing", "faq", "Refund window").id
    b = graph.add_node("shared", "playbook", "Approval chain").id
    graph.add_edge(a, b)
    response = _ask(graph, tenant_ids=["purchasing", "shared"])
    assert [c.id for c in response.context] == [b]
    assert _ask(graph, tenant_ids=[]).stats.nodes_searched == 0


# -- entities ------------------------------------------------------------------------------


def test_entities_adjacent_to_returned_nodes_are_collected() -> None:
    graph, ids = _chain(length=1)
    content = {"entity_path": "orders.refund_requests", "related_schemas": ["orders"]}
    near = graph.add_node("t", "entity", "Refund Request", content=content).id
    far = graph.add_node("t", "entity", "Invoice").id
    graph.add_edge(ids[1], near)
    graph.add_edge(far, graph.add_node("t", "concept", "Unrelated").id)
    entities = _ask(graph).entities
    assert [(e.id, e.entity_path, e.related_schemas) for e in entities] == [
        (near, "orders.refund_requests", ["orders"])
    ]
    assert _ask(graph, include_entities=False).entities == []


def test_at_most_ten_entities() -> None:
    graph = KnowledgeGraph()
    e = graph.add_node("t", "faq", "Refund").id
    ids = [graph.add_node("t", "entity", f"Entity {n}").id for n in range(12)]
    for node_id in ids:
        graph.add_edge(e, node_id)
    assert [x.id for x in _ask(graph).entities] == ids[:10]


# -- token budget --------------------------------------------------------------------------


def _budget_graph() -> KnowledgeGraph:
    """Two entry points, the better-ranked one much bigger in tokens (stop words cost tokens
    but not BM25 length), each with one context node that has one entity."""
    graph = KnowledgeGraph()
    big = graph.add_node("t", "faq", "Refund refund policy", summary="the " * 40)
    small = graph.add_node("t", "faq", "Refund card", summary="the " * 3)
    for n, entry in enumerate([big, small]):
        node = graph.add_node("t", "playbook", f"Context {n}", summary="step " * 10).id
        graph.add_edge(entry.id, node)
        graph.add_edge(node, graph.add_node("t", "entity", f"Entity {n}").id)
    return graph


def test_without_max_tokens_everything_is_counted_and_kept(cl100k) -> None:
    response = _ask(_budget_graph())
    used = response.stats.tokens_used
    assert used.entry_points == sum(
        cl100k.count(node_text(e.title, e.summary, e.content)) for e in response.entry_points
    )
    assert used.context_nodes == sum(
        cl100k.count(node_text(c.title, c.summary, c.content)) for c in response.context
    )
    assert used.entities == sum(cl100k.count(entity_text(e)) for e in response.entities)
    assert response.stats.total_tokens == used.entry_points + used.context_nodes + used.entities
    assert (len(response.entry_points), len(response.context), len(response.entities)) == (2, 2, 2)


def test_the_budget_splits_60_30_10_and_stops_at_the_first_misfit(cl100k) -> None:
    full = _ask(_budget_graph())
    cost = [cl100k.count(node_text(e.title, e.summary, e.content)) for e in full.entry_points]
    assert cost[0] > cost[1]  # the better-ranked entry point is the bigger one
    max_tokens = int((cost[1] + cost[0] // 2) / 0.6) + 1  # room for the second, not the first
    response = _ask(_budget_graph(), max_tokens=max_tokens)
    assert response.entry_points == []  # break, not skip: nothing jumps the queue
    assert response.stats.tokens_used.entry_points == 0
    assert response.stats.tokens_used.context_nodes <= int(max_tokens * 0.3)
    assert response.stats.tokens_used.entities <= int(max_tokens * 0.1)


def test_the_budget_keeps_a_prefix_per_category(cl100k) -> None:
    full = _ask(_budget_graph())
    context_costs = [cl100k.count(node_text(c.title, c.summary, c.content)) for c in full.context]
    max_tokens = int(context_costs[0] / 0.3) + 1  # one context node fits in 30 %
    response = _ask(_budget_graph(), max_tokens=max_tokens)
    assert [c.id for c in response.context] == [full.context[0].id]
    assert response.stats.tokens_used.context_nodes == context_costs[0]
    assert response.entry_points == full.entry_points[: len(response.entry_points)]


def test_to_context_items_carry_sections_and_metadata(cl100k) -> None:
    response = _ask(_budget_graph())
    items = to_context_items(response)
    by_section: dict[str, int] = {}
    for item in items:
        assert item.source is SourceType.RETRIEVAL
        by_section[item.section or ""] = by_section.get(item.section or "", 0) + cl100k.count(
            item.content
        )
    used = response.stats.tokens_used
    assert by_section == {
        "entry_points": used.entry_points,
        "expanded": used.context_nodes,
        "entities": used.entities,
    }
    context_item = next(i for i in items if i.section == "expanded")
    assert context_item.metadata["path"] == response.context[0].path
    assert context_item.metadata["score"] == response.context[0].score  # the graph's score
    lowest_entry = min(e.score for e in response.entry_points)
    assert context_item.score == pytest.approx(response.context[0].score * lowest_entry)


# -- the SQLite store's own schema (the contract: tests/store/test_graph_conformance.py) -----


def test_the_graph_persists_across_instances(tmp_path) -> None:
    path = tmp_path / "graph.db"
    with KnowledgeGraph(path) as graph:
        a = graph.add_node("t", "faq", "Refund", summary="s", content={"k": [1]}, tags=["x"])
        b = graph.add_node("t", "playbook", "Steps")
        graph.add_edge(a.id, b.id, "parent", 0.25)
    with KnowledgeGraph(path) as reopened:
        assert reopened.nodes() == [a, b]
        assert reopened.edges() == [
            KnowledgeEdge(source_id=a.id, target_id=b.id, edge_type="parent", weight=0.25)
        ]
    conn = connect(path)
    names = conn.execute("SELECT name FROM schema_migrations WHERE schema = 'graph'").fetchall()
    conn.close()
    assert [r[0] for r in names] == MIGRATIONS.names


def test_the_autoincrement_migration_keeps_rows_edges_and_the_highest_id(tmp_path) -> None:
    path = tmp_path / "graph.db"
    conn = connect(path)
    MIGRATIONS.apply(conn, upto="m001_create_graph")  # a graph written by an older version
    conn.executemany(
        "INSERT INTO graph_nodes (id, tenant_id, node_type, title, tags)"
        " VALUES (?, 't', 'faq', ?, '[\"x\"]')",
        [(1, "a"), (2, "b"), (7, "c")],
    )
    conn.execute("INSERT INTO graph_edges VALUES (1, 7, 'parent', 0.5)")
    conn.close()
    with KnowledgeGraph(path) as graph:
        assert [(n.id, n.title, n.tags) for n in graph.nodes()] == [
            (1, "a", ["x"]),
            (2, "b", ["x"]),
            (7, "c", ["x"]),
        ]
        assert graph.edges() == [
            KnowledgeEdge(source_id=1, target_id=7, edge_type="parent", weight=0.5)
        ]
        assert graph.remove_node(7) and graph.edges() == []  # the cascade survives
        assert graph.add_node("t", "faq", "d").id == 8
    conn = connect(path)
    indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"graph_nodes_by_tenant", "graph_edges_by_target"} <= indexes
    assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
    conn.close()


# -- validation and JSON -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"max_depth": -1}, "max_depth"),
        ({"entry_limit": 0}, "entry_limit"),
        ({"entry_types": ["faq", "wiki"]}, "entry_types"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"tenant": "t"}, "tenant"),
    ],
)
def test_bad_requests_name_the_field(fields: dict, field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        GraphContextRequest(**fields)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"weight": 0.0}, "greater than 0"),
        ({"weight": 1.5}, "less than or equal to 1"),
        ({"target_id": 1}, "two different nodes"),
        ({"edge_type": "friend"}, "edge_type"),
    ],
)
def test_bad_edges_are_rejected(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        KnowledgeEdge(**{"source_id": 1, "target_id": 2, **fields})


def test_edges_to_missing_nodes_and_bad_entities_are_rejected() -> None:
    graph = KnowledgeGraph()
    a = graph.add_node("t", "faq", "A").id
    with pytest.raises(ConfigError, match=r"\[99\]"):
        graph.add_edge(a, 99)
    with pytest.raises(ValidationError, match="related_schemas"):
        graph.add_node("t", "entity", "E", content={"related_schemas": "orders"})


def test_the_seed_request_and_a_response_round_trip_as_json() -> None:
    payload = (
        '{"query": "How do I process a refund request?", "tenant_ids": ["purchasing", "shared"],'
        ' "entry_types": ["faq", "playbook", "permission_rule"], "entry_limit": 10,'
        ' "expand": true, "max_depth": 2, "context_limit": 50, "include_entities": true,'
        ' "include_schemas": false, "include_examples": false, "max_tokens": 8000,'
        ' "token_model": "gpt-4"}'
    )
    request = GraphContextRequest.model_validate_json(payload)
    graph, _ = _chain()
    response = graph_context(graph, request.model_copy(update={"tenant_ids": ["t"]}))
    assert GraphContextResponse.model_validate_json(response.model_dump_json()) == response
    assert set(response.model_dump()["stats"]["tokens_used"]) == {
        "entry_points",
        "context_nodes",
        "entities",
    }


# -- property ------------------------------------------------------------------------------

_WORDS = ["refund", "card", "hotel", "policy", "steps", "cash"]
_TYPES = ["faq", "playbook", "concept", "example", "schema_index", "entity"]


@st.composite
def _graphs(draw: st.DrawFn) -> tuple[KnowledgeGraph, GraphContextRequest]:
    n = draw(st.integers(2, 10))
    nodes = [
        {
            "tenant_id": draw(st.sampled_from(["a", "b"])),
            "node_type": draw(st.sampled_from(_TYPES)),
            "title": " ".join(draw(st.lists(st.sampled_from(_WORDS), min_size=1, max_size=8))),
        }
        for _ in range(n)
    ]
    pairs = st.tuples(st.integers(1, n), st.integers(1, n)).filter(lambda p: p[0] != p[1])
    kinds = st.sampled_from(["related", "parent", "example_of", "similar"])
    edges = draw(st.lists(st.tuples(pairs, kinds, st.sampled_from([0.25, 0.5, 1.0])), max_size=20))
    graph = KnowledgeGraph()
    graph.add_nodes(nodes)
    graph.add_edges(
        KnowledgeEdge(source_id=s, target_id=t, edge_type=kind, weight=w)
        for (s, t), kind, w in edges
    )
    request = GraphContextRequest(
        query=" ".join(draw(st.lists(st.sampled_from(_WORDS), min_size=1, max_size=3))),
        tenant_ids=draw(st.sampled_from([["a"], ["a", "b"]])),
        entry_limit=draw(st.integers(1, 4)),
        max_depth=draw(st.integers(0, 3)),
        context_limit=draw(st.integers(0, 10)),
        include_examples=draw(st.booleans()),
        max_tokens=draw(st.none() | st.integers(1, 120)),
    )
    return graph, request


@given(_graphs())
def test_every_response_keeps_the_walk_and_budget_invariants(
    case: tuple[KnowledgeGraph, GraphContextRequest],
) -> None:
    graph, request = case
    response = graph_context(graph, request)
    full = graph_context(graph, request.model_copy(update={"max_tokens": None}))
    tenants = set(request.tenant_ids)
    adjacent = {frozenset((e.source_id, e.target_id)) for e in graph.edges(tenant_ids=tenants)}
    entry_ids = {e.id for e in full.entry_points}
    for node in full.context:
        assert 1 <= node.distance <= request.max_depth and len(node.path) == node.distance + 1
        assert node.path[0] in entry_ids
        assert all(frozenset(hop) in adjacent for hop in pairwise(node.path))
        assert all(graph.get_node(i).tenant_id in tenants for i in node.path)
    assert response.entry_points == full.entry_points[: len(response.entry_points)]
    assert response.context == full.context[: len(response.context)]
    if request.max_tokens is not None:
        used = response.stats.tokens_used
        assert used.entry_points <= int(request.max_tokens * 0.6)
        assert used.context_nodes <= int(request.max_tokens * 0.3)
        assert used.entities <= int(request.max_tokens * 0.1)
    assert {e.id for e in response.entities} <= {e.id for e in full.entities}
