"""``GraphRetriever`` items ranked by the packer: an entry point (the node that matched the
query) ranks above the nodes expanded from it, in a plain pipeline as under
``graph_budget``, whose sections keep the graph's own ranking of expanded nodes."""

from __future__ import annotations

from contextfold import (
    ContextPipeline,
    GraphRetriever,
    KnowledgeGraph,
    QueryBundle,
    graph_budget,
    retriever_step,
)
from contextfold.retrieval.graph import GraphContextRequest, graph_context, to_context_items

QUERY = "How do I process a refund?"
REFUND = "How to process a refund: open the order, press Refund, confirm the amount."
ROTA = "Escalation contacts for the night shift and the weekend on-call rota."


def _pair() -> tuple[KnowledgeGraph, int, int]:
    graph = KnowledgeGraph()
    faq = graph.add_node("support", "faq", REFUND)
    other = graph.add_node("support", "playbook", ROTA)
    graph.add_edge(faq.id, other.id, "related")
    return graph, faq.id, other.id


def test_under_a_budget_that_fits_one_the_entry_point_is_kept() -> None:
    graph, faq, other = _pair()
    result = (
        ContextPipeline(max_tokens=60)
        .add_step(retriever_step("graph", GraphRetriever(graph, ["support"]), top_k=4))
        .build(QUERY)
    )
    actions = {d.item_id: d.action.value for d in result.decisions if d.source.value == "retrieval"}
    assert actions == {f"graph-node:{faq}": "kept", f"graph-node:{other}": "dropped"}
    assert REFUND in result.text and ROTA not in result.text


def test_without_pressure_the_entry_point_is_listed_first() -> None:
    graph, _, _ = _pair()
    items = GraphRetriever(graph, ["support"]).retrieve(QueryBundle(query_str=QUERY), 4)
    assert [i.section for i in items] == ["entry_points", "expanded"]
    assert items[0].score > items[1].score
    assert items[1].metadata["score"] == 0.5  # the graph's own score stays in the metadata
    text = (
        ContextPipeline(max_tokens=400)
        .add_step(retriever_step("graph", GraphRetriever(graph, ["support"]), top_k=4))
        .build(QUERY)
        .text
    )
    assert text.index(REFUND) < text.index(ROTA)


def _two_entries() -> KnowledgeGraph:
    """Two entry points, the first better ranked; its neighbour's edge is a little lighter,
    so the graph ranks the second's neighbour first."""
    graph = KnowledgeGraph()
    strong = graph.add_node("t", "faq", "Refund refund policy")
    weak = graph.add_node("t", "faq", "Refund card and other payment questions")
    for n, (entry, weight) in enumerate([(strong, 0.99), (weak, 1.0)]):
        node = graph.add_node("t", "playbook", f"Context {n} " + "step " * 10)
        graph.add_edge(entry.id, node.id, "related", weight)
        graph.add_edge(node.id, graph.add_node("t", "playbook", f"Deeper {n}").id, "related")
    return graph


def test_every_entry_point_outranks_every_expanded_node_in_the_graphs_order() -> None:
    graph = _two_entries()
    response = graph_context(graph, GraphContextRequest(query="refund", tenant_ids=["t"]))
    assert len(response.entry_points) == 2
    assert [c.title for c in response.context[:2]] == [
        "Context 1 " + "step " * 10,  # weight 1.0 from the weaker entry point
        "Context 0 " + "step " * 10,  # weight 0.99 from the stronger one
    ]
    items = to_context_items(response)
    entries = [i for i in items if i.section == "entry_points"]
    expanded = [i for i in items if i.section == "expanded"]
    assert min(i.score for i in entries) > max(i.score for i in expanded)
    # The packer ranks by score (stable): the expanded nodes keep the graph's order.
    ranked = sorted(expanded, key=lambda i: i.score, reverse=True)
    assert [i.metadata["node_id"] for i in ranked] == [c.id for c in response.context]


def test_graph_budget_sections_keep_the_graphs_best_expanded_node() -> None:
    graph = _two_entries()
    response = graph_context(graph, GraphContextRequest(query="refund", tenant_ids=["t"]))
    best, second = response.context[0], response.context[1]
    # 30 % of 130 is 39 tokens: one "Context … step × 10" node (about 25), not two.
    result = (
        ContextPipeline(budget=graph_budget(130))
        .add_step(retriever_step("graph", GraphRetriever(graph, ["t"]), top_k=8))
        .build("refund")
    )
    kept = {d.item_id for d in result.decisions if d.action.value == "kept"}
    assert f"graph-node:{best.id}" in kept
    assert f"graph-node:{second.id}" not in kept
    assert {f"graph-node:{e.id}" for e in response.entry_points} <= kept
